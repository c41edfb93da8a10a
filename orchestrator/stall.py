"""Hangs: which training tasks have stalled, which of them to blame, and where they are stuck.

    stalls = find_stalls(watched, now, limit=300, every_task=False)   # [] while all is well
    frames = main_thread(lines)          # the main thread's stack in a faulthandler dump
    stall.where = where(frames)          # what the summary shows of it
    stalls = blame_order(stalls, {task: frames})

Pure: the supervisor gathers a Watched per live training task and acts on the answer.

A stall is a task whose step has not moved for `limit` seconds (only tasks that report
progress have a step to watch), or that has been stopped (state T, from its wrapper's usage
marker) that long. Not at once when stopped: a debugger's look or a brief SIGSTOP should not
cost an attempt, and a stopped task's step stops at the same moment anyway, so a task that
reports progress is caught `limit` seconds after it was stopped either way.

Under MultiWorkerMirrored one stuck worker blocks every peer in the next collective, so
they all stall within a second or two. Once one is over the limit, every task stuck along
with it is reported, the cause first: a stopped task (or one whose wrapper went silent, as
when the whole process group was stopped), then, once their stacks are in, one stuck in its
own code rather than waiting inside TensorFlow, then the one quiet longest.
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
        """One line for the job's reason: the innermost frame, its file's name only (the
        summary prints the frames in full below)."""
        stuck = ""
        if self.where:
            func, _, place = self.where[0].partition(" (")
            stuck = f", in {func} ({place.rsplit('/', 1)[-1]}" if place else f", in {func}"
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
# Frames in these are TensorFlow's, Python's or tfo's: where the user's code called in.
_LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ", "/worker_entry/")


@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: int

    @property
    def library(self) -> bool:
        return any(part in self.file for part in _LIBRARY)

    def __str__(self) -> str:
        return f"{self.func} ({self.file}:{self.line})"


def main_thread(lines: list[str]) -> list[Frame]:
    """The main thread's stack, innermost first, in the last faulthandler dump in `lines`.
    faulthandler lists threads newest first: the main thread, the oldest, is a dump's last
    block."""
    blocks: list[list[Frame]] = []
    current: list[Frame] | None = None
    for line in lines:
        line = line.rstrip("\r\n")
        if _THREAD.match(line):
            current = []
            blocks.append(current)
        elif current is not None and (m := _FRAME.match(line)):
            current.append(Frame(m["func"], m["file"], int(m["line"])))
        elif current is not None and line.strip() not in ("", "...", "<no Python frame>"):
            current = None  # the dump ended; a later one starts a new list of blocks
    return blocks[-1] if blocks else []


def where(frames: list[Frame], n: int = FRAMES_SHOWN) -> list[str]:
    """What a summary shows of a stack: the innermost frame, then the innermost frames of
    the user's own code (the line that called into TensorFlow, or that sleeps)."""
    if not frames:
        return []
    own = [f for f in frames if not f.library]
    shown = [frames[0], *[f for f in own if f is not frames[0]]][:n]
    return [str(f) for f in shown]


def blame_order(stalls: list[Stall], stacks: dict[str, list[Frame]]) -> list[Stall]:
    """Once the stacks are in: stopped tasks first, then one stuck in its own code (not
    waiting inside a library, as its blocked peers are), then as found."""
    def key(i_stall: tuple[int, Stall]) -> tuple[bool, bool, int]:
        i, s = i_stall
        frames = stacks.get(s.task) or []
        return (not s.stopped, not (frames and not frames[0].library), i)

    return [s for _, s in sorted(enumerate(stalls), key=key)]
