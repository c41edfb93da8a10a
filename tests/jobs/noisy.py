"""A test job that prints what a console or the coordinator may choke on; it trains nothing.

- args `lines`: print that many ordinary lines (`noisy line 000001 .....`, ~100 bytes each,
  or `width` dots more), then `noisy: printed`.
- args `bad_markers`: print lines that look like markers but are not valid ones (BAD_MARKERS).
- args `big_line_mb`: print one line of that many MB (`x`s) with no newline, and exit 0 at once.
- args `sleep`: seconds to sleep before returning, so a test can signal tfo meanwhile.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # tests import BAD_MARKERS without TensorFlow
    from worker_entry.context import TaskContext

BAD_MARKERS = [
    '@tfo {"event": "hello", "task": "worker:9"}',
    '@tfo {"event": "evaluated", "metrics": "oops"}',
    '@tfo {"event": "evaluated", "epoch": 1, "metrics": {"loss": "oops"}}',
    '@tfo {"event": "ready", "task": "worker:9", "attempt": 7}',
    '@tfo {"event": "epoch", "epoch": "many"}',
    '@tfo ["event", "ready"]',
    "@tfo {not json",
    "@tfo " + "[" * 5000,
]


def main(ctx: TaskContext) -> None:
    args = ctx.args
    print("noisy: start", flush=True)
    if args.get("bad_markers"):
        for line in BAD_MARKERS:
            print(line, flush=True)
    count = int(args.get("lines", 0))
    dots = "." * int(args.get("width", 80))
    for i in range(count):
        print(f"noisy line {i:06d} {dots}")
    if count:
        print("noisy: printed", flush=True)
    if args.get("big_line_mb"):
        out = sys.stdout.buffer
        chunk = b"x" * (1 << 20)
        for _ in range(int(args["big_line_mb"])):
            out.write(chunk)
        out.flush()
        os._exit(0)  # no newline, ever
    time.sleep(float(args.get("sleep", 0)))
