"""A script that floods its stdout with short lines (`--lines N` of them, or for `--seconds
S`), then ends well (tests/test_output.py): what the coordinator spends on it is bounded."""

import sys
import time

args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
lines = int(args.get("--lines", 10**12))
until = time.monotonic() + float(args.get("--seconds", 10**9))
line = "flood " + "x" * 70 + "\n"
n = 0
while n < lines and time.monotonic() < until:
    sys.stdout.write(line * 100)
    n += 100
sys.stdout.flush()
print(f"flooded {n} lines", flush=True)
