"""Hangs: which training tasks have stalled, which of them to blame, and where they are stuck.

    stalls = find_stalls(watched, now, limit=300, every_task=False)   # [] while all is well
    frames = main_thread_frames(lines)   # the innermost frames of a faulthandler dump

Pure: the supervisor gathers a Watched per live training task and acts on the answer.

A stall is a task whose step has not moved for `limit` seconds (only tasks that report
progress have a step to watch), or that has been stopped (state T, from its wrapper's usage
marker) that long. Not at once when stopped: a debugger's look or a brief SIGSTOP should not
cost an attempt, and a stopped task's step stops at the same moment anyway, so a task that
reports progress is caught `limit` seconds after it was stopped either way.

Under MultiWorkerMirrored one stuck worker blocks every peer in the next collective, so
they all stall within a second or two. Once one is over the limit, every task stuck along
with it is reported, the cause first: a stopped task (or one whose wrapper went silent, as
when the whole process group was stopped), then the one quiet longest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Peers blocked by the same stuck task stop moving within this much of each other: progress
# markers come at most once a second (worker_entry.progress), so two tasks stuck at the
# same moment may have last reported up to that far apart, plus a poll or two.
SLACK_SECONDS = 2.0
# A wrapper writes usage every USAGE_SECONDS; silence for this long means it cannot (it is
# stopped itself, or its host is unreachable).
USAGE_SILENT_SECONDS = 5.0
FRAMES_SHOWN = 3  # innermost frames of the main thread in a summary


@dataclass(frozen=True)
class Watched:
    """What the supervisor knows of one live training task (monotonic times)."""

    name: str
    step: int | None  # the attempt's last progress step; None: it reports none
    progress_at: float  # when the step last moved (the attempt's start before any)
    stopped_since: float | None = None  # when its usage first said stopped; None: running
    usage_at: float | None = None  # when its last usage marker came; None: none yet


@dataclass
class Stall:
    task: str
    reason: str  # "no progress for 6 s (step 41)", "stopped (state T) for 5 s"
    stopped: bool  # stopped, or its wrapper silent: the likely cause of its peers' stall
    where: list[str] = field(default_factory=list)  # main thread's innermost frames

    def describe(self) -> str:
        stuck = f"; stuck in {' ← '.join(self.where)}" if self.where else ""
        return f"{self.task} {self.reason}{stuck}"


def _over(w: Watched, now: float, limit: float, every_task: bool) -> bool:
    if w.step is not None and now - w.progress_at >= limit:
        return True
    return (w.step is not None or every_task) and w.stopped_since is not None \
        and now - w.stopped_since >= limit


def _silent(w: Watched, now: float) -> bool:
    return w.usage_at is not None and now - w.usage_at >= USAGE_SILENT_SECONDS


def find_stalls(watched: list[Watched], now: float, limit: float,
                every_task: bool) -> list[Stall]:
    """Nothing until a task is over the limit; then it and every task stuck along with it,
    the likely cause first."""
    if not any(_over(w, now, limit, every_task) for w in watched):
        return []
    stalls: list[tuple[tuple[int, float], Stall]] = []
    for w in watched:
        quiet = now - w.progress_at
        step = f" (step {w.step})" if w.step is not None else ""
        if w.stopped_since is not None:
            reason = f"stopped (state T) for {now - w.stopped_since:.0f} s{step}"
        elif _silent(w, now) and w.usage_at is not None:
            reason = (f"silent: its wrapper has not reported for {now - w.usage_at:.0f} s "
                      f"(stopped with it?); no progress for {quiet:.0f} s{step}")
        elif w.step is not None and quiet >= limit - SLACK_SECONDS:
            reason = f"no progress for {quiet:.0f} s{step}"
        else:
            continue
        cause = w.stopped_since is not None or _silent(w, now)
        stalls.append(((0 if cause else 1, w.progress_at), Stall(w.name, reason, cause)))
    return [s for _, s in sorted(stalls, key=lambda x: x[0])]


_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+.*\(most recent call first\):$")
_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')


def main_thread_frames(lines: list[str], n: int = FRAMES_SHOWN) -> list[str]:
    """The innermost `n` frames of the main thread in the last faulthandler dump in `lines`,
    as 'func (file:line)'. faulthandler lists threads newest first: the main thread, the
    oldest, is the dump's last block."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in lines:
        line = line.rstrip("\r\n")
        if _THREAD.match(line):
            current = []
            blocks.append(current)
        elif current is not None and (m := _FRAME.match(line)):
            current.append(f"{m['func']} ({m['file']}:{m['line']})")
        elif current is not None and line.strip() not in ("", "...", "<no Python frame>"):
            current = None  # the dump ended; a later one starts a new list of blocks
    return blocks[-1][:n] if blocks else []
