"""The slow tasks tfo named (`task_slow`: orchestrator/loop/slowness.py decides), as every view
shows them, read from the run's events.jsonl, the coordinator's own record (never from a
task's output):

    verdicts(events)          # tfo status: from the events it read
    read(path)                # the summary: only the task_slow lines of events.jsonl parsed
    words(v)                  # `worker:1, cause input (10:32:05): <why>`: summary and status

A `task_slow` event names `task`, `attempt`, `cause` and `why` (one sentence, the console's
words), plus the figures of the signal that fired (any other numbers): shown as they are,
whatever the cause. A verdict is about one attempt: a restarted task is a new process and
needs a fresh verdict, so `tfo status` marks a task (`slow` in place of `running`) only
while the attempt it was said of is its current one (`marked`; the live table reads the mark
off that attempt in the coordinator, loop/slowness.py); the summary's
and status's lines keep every verdict of the run, with the attempt where it was not the first.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.launch.printable import printable

EVENT = "task_slow"
_NEEDLE = b'"task_slow"'  # a line without it is not parsed (events.jsonl grows all run)
_KNOWN = ("time", "event", "task", "attempt", "cause", "why")
READ_AT_MOST = 1 << 20  # bytes read a call: memory stays bounded for a huge events.jsonl


@dataclass(frozen=True)
class Verdict:
    """One `task_slow` event, checked: `time` unix seconds."""

    task: str
    attempt: int | None
    cause: str
    why: str
    time: float | None
    figures: dict[str, float] = field(default_factory=dict)


def verdict(e: dict[str, Any]) -> Verdict | None:
    """The verdict an event is, if it is a `task_slow` naming a task; other fields that are
    not what the contract says are left out (None, "")."""
    if e.get("event") != EVENT or not isinstance(e.get("task"), str):
        return None
    attempt, when = e.get("attempt"), e.get("time")
    return Verdict(
        task=e["task"], attempt=attempt if isinstance(attempt, int) and _number(attempt) else None,
        cause=str(e.get("cause") or "?"), why=str(e.get("why") or ""),
        time=float(when) if _number(when) else None,
        figures={k: v for k, v in e.items() if k not in _KNOWN and _number(v)})


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def verdicts(events: Iterable[dict[str, Any]]) -> list[Verdict]:
    """The run's verdicts, in the order they were said."""
    return [v for e in events if (v := verdict(e)) is not None]


def _scan(data: bytes) -> list[Verdict]:
    """The verdicts among whole lines of events.jsonl: only the lines that hold the event's
    name are parsed (a million events, 209 MB: 1.2-1.5 s at load 12, parsed line by line
    4.4 s)."""
    found, at = [], data.find(_NEEDLE)
    while at >= 0:
        start, end = data.rfind(b"\n", 0, at) + 1, data.find(b"\n", at)
        end = len(data) if end < 0 else end
        try:
            e = json.loads(data[start:end])
        except ValueError:
            e = None
        if isinstance(e, dict) and (v := verdict(e)) is not None:
            found.append(v)
        at = data.find(_NEEDLE, end)
    return found


class Tail:
    """The verdicts of an events.jsonl being written, each call reading only what was added
    since (whole lines; at most READ_AT_MOST bytes a call): each
    task's last, by task (`said`: all, in order). A file cut shorter than what was read
    (written back after `rm -rf` of the run directory) is read again from its start."""

    def __init__(self, path: str | Path) -> None:
        self.path, self.offset = path, 0
        self.found: dict[str, Verdict] = {}
        self.said: list[Verdict] = []

    def __call__(self) -> dict[str, Verdict]:
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self.offset:
                    self.offset, self.found, self.said = 0, {}, []
                f.seek(self.offset)
                data = f.read(min(size - self.offset, READ_AT_MOST))
        except OSError:
            return self.found
        # Whole lines only; a chunk without an end of line (no event is that long) is passed.
        whole = data[:data.rfind(b"\n") + 1] if len(data) < READ_AT_MOST else \
            data[:data.rfind(b"\n") + 1] or data
        self.offset += len(whole)
        for v in _scan(whole):
            self.found[v.task] = v
            self.said.append(v)
        return self.found


def read(path: str | Path) -> list[Verdict]:
    """The verdicts in an events.jsonl, in order ([] when it cannot be read: the summary
    goes on)."""
    tail = Tail(path)
    while True:
        at = tail.offset
        tail()
        if tail.offset == at:
            return tail.said


def marked(v: Verdict | None, attempt: int | None) -> bool:
    """The task's row carries the mark: its verdict was said of its current attempt."""
    return v is not None and v.attempt is not None and v.attempt == attempt


def words(v: Verdict) -> str:
    """A verdict as the summary and `tfo status` say it, after `slow:` (printable: a line
    of our own, but its sentence could quote what a task said)."""
    when = "" if v.time is None else time.strftime("%H:%M:%S", time.localtime(v.time))
    again = f"attempt {v.attempt}" if v.attempt else ""
    said = ", ".join(w for w in (when, again) if w)
    return printable(f"{v.task}, cause {v.cause}" + (f" ({said})" if said else "")
                     + (f": {v.why}" if v.why else ""))
