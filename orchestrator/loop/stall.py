"""Hangs: which training tasks have stalled, which of them to blame, and where they are stuck;
and whether a task that is not up yet has run out of its startup time.

    pace = paced(pace, now, step=41, epoch=0, step_in_epoch=41, steps=70)  # each progress
    stalls = find_stalls(watched, now, StallRule())   # [] while all is well; auto
    late = startup_over(starting, now, limit=300)     # True: fail the attempt
    frames = main_thread(lines)          # the main thread's stack in a faulthandler dump
    stalls = blame_order(stalls, stacks(lines) per task)

Pure: the supervisor gathers a Watched per live training task (and per server) and acts on
the answer.

A stall is a task whose steps stopped moving, that has been stopped (state T, from its
wrapper's usage marker), or, where steps tell nothing, a group whose every task is idle, for
the task's limit:

- `StallRule(seconds=N)`: N seconds, for every one of the three.
- `StallRule()` (auto, the default): the limit adapts to the job. Once a task's steps are
  known (WARMUP_STEPS steps after its first, or its first epoch ended), its steps may stand
  still `multiple` times the longest wait between two steps it has seen, never less than
  `floor`. The wait for the first step (tracing, compilation, the input's start) is not a
  step's; nor is the first end of an epoch (validation, checkpoints) until it is over: then
  it is part of the longest wait; nor what follows a fit's last step (evaluate, save).
  Before that, and for a task that reports no steps, only the other two signals count,
  with the same limit (the floor until a step was seen).
- Idle: no line printed and its CPU under IDLE_CPU (the wrapper's usage, every 2 s: what it
  ran and what it waited on a runqueue for, `Usage.wanted`: a task starved of CPU is not
  idle). A hung
  collective or input pipeline idles every task of a MultiWorkerMirrored job at once
  (measured: `cpu: 0.0`); one idle task alone may just be waiting for its peers' work, so
  only every training task idle is a hang, and only once the group is up (a task still
  starting is the startup limit's). PS servers count for the group (the chief waits while
  they work) but are never stalled themselves.

A stopped task is not failed at once: a debugger's look or a brief SIGSTOP should not cost
an attempt, and a stopped task's step stops at the same moment anyway.

Under MultiWorkerMirrored one stuck worker blocks every peer in the next collective, so
they all stall within a second or two. Once one is over the limit, every task stuck along
with it is reported, the cause first: a stopped task (or one whose wrapper went silent, as
when the whole process group was stopped), then, once their stacks are in, one stuck in its
own code (any thread: a `tf.py_function` or generator of the input pipeline runs in one of
TensorFlow's) rather than waiting inside TensorFlow, then the one quiet longest.

The startup limit: a task not up `limit` seconds after its start fails the attempt, unless
it is working (not idle for STARTUP_IDLE_SECONDS): a one-process script opens no port and
reports ready with its first step, and may load its data for longer than the limit first.
A task waiting for peers that never come is idle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from orchestrator.planning.policy import FLOOR_SECONDS

# Peers blocked by the same stuck task stop moving within this much of each other: progress
# markers come at most once a second (worker_entry.progress), so two tasks stuck at the
# same moment may have last reported up to that far apart, plus a poll or two.
SLACK_SECONDS = 2.0
# A wrapper writes usage every USAGE_SECONDS; silence for this long means it cannot (it is
# stopped itself, or its host is unreachable).
USAGE_SILENT_SECONDS = 5.0
FRAMES_SHOWN = 3  # innermost frames of the main thread in a summary
# auto: a task's steps are known this many steps after its first (or at its first epoch's
# end); then they may stand still MULTIPLE times the longest wait between two, at least
# FLOOR seconds (the spec's timeouts.stall_min_seconds).
WARMUP_STEPS = 20
MULTIPLE = 10.0
# Below this CPU (percent of one core, the task's whole process tree) a task does nothing:
# a worker blocked in a collective or in its input pipeline measured 0.0 here.
IDLE_CPU = 2.0
# A task not up by the startup limit fails only once it has been idle this long: two usage
# markers (USAGE_SECONDS apart) in a row under IDLE_CPU, and no line.
STARTUP_IDLE_SECONDS = 5.0


@dataclass(frozen=True)
class Pace:
    """How one task's steps moved this attempt, folded from its progress markers (`paced`).
    Monotonic times."""

    started_at: float  # the attempt's start
    step: int | None = None  # the last step reported; None: none yet
    moved_at: float | None = None  # when the step last moved
    first: int | None = None  # the first step reported (the wait for it is not a step's)
    longest: float = 0.0  # the longest wait between two moves since the first
    first_epoch: int | None = None
    epoch: int | None = None
    epoch_end: bool = False  # the last move was its epoch's last step
    fit_over: bool = False  # ... of its last epoch: what follows (evaluate, save) is no step

    @property
    def epoch_over(self) -> bool:
        """An epoch's end has been waited out: the longest wait includes it."""
        return self.epoch is not None and self.first_epoch is not None \
            and self.epoch > self.first_epoch


def paced(pace: Pace, now: float, step: int, epoch: int | None = None,
          step_in_epoch: int | None = None, steps: int | None = None,
          epochs: int | None = None) -> Pace:
    """`pace` after a progress marker at `now`. A step that did not move changes nothing."""
    end = steps is not None and step_in_epoch == steps
    over = end and epoch is not None and epochs is not None and epoch + 1 >= epochs
    if pace.step is None or pace.moved_at is None:
        return replace(pace, step=step, moved_at=now, first=step, first_epoch=epoch,
                       epoch=epoch, epoch_end=end, fit_over=over)
    if step <= pace.step:
        return pace
    return replace(pace, step=step, moved_at=now, longest=max(pace.longest, now - pace.moved_at),
                   epoch=epoch if epoch is not None else pace.epoch, epoch_end=end,
                   fit_over=over)


@dataclass(frozen=True)
class StallRule:
    """`seconds`: a fixed limit; None: auto (the module's doc)."""

    seconds: float | None = None
    floor: float = FLOOR_SECONDS
    multiple: float = MULTIPLE
    warmup_steps: int = WARMUP_STEPS

    def limit(self, pace: Pace) -> float:
        if self.seconds is not None:
            return self.seconds
        return max(self.floor, self.multiple * pace.longest)

    def judges_steps(self, pace: Pace) -> bool:
        """Whether steps standing still can make this task a stall now."""
        if pace.step is None or pace.first is None:
            return False
        if self.seconds is not None:
            return True
        if pace.fit_over or (pace.epoch_end and not pace.epoch_over):
            return False  # its first epoch's end, or its fit's: validation, saving, evaluate
        return pace.epoch_over or pace.step - pace.first >= self.warmup_steps

    def describe(self, limit: float) -> str:
        if self.seconds is not None:
            return f"{limit:g} s"
        return f"auto: {limit:.0f} s" if limit >= 10 else f"auto: {limit:.2g} s"


class Watched(NamedTuple):
    """What the supervisor knows of one live training task, or server (monotonic times).
    Made for every task at each stall check (4 a second): a NamedTuple is made in a third
    of a frozen dataclass's time (64 tasks: 0.1 → 0.03 ms a check)."""

    name: str
    pace: Pace  # its steps this attempt (Pace(started_at) before any)
    busy_at: float  # its last sign of work: a line, or CPU at or above IDLE_CPU; else start
    stopped_since: float | None = None  # when its usage first said stopped; None: running
    usage_at: float | None = None  # when its last usage marker came; None: none yet
    cpu: float | None = None  # its last usage's CPU wanted (% of a core); None: none yet
    up: bool = True  # ready (running); one still starting is the startup limit's
    server: bool = False  # never stalled itself; its work keeps the group from being idle

    @property
    def step(self) -> int | None:
        return self.pace.step

    def idle(self, now: float, limit: float) -> bool:
        """No sign of work for `limit` s, and its last usage (if any) says idle: a limit
        shorter than the wrapper's measuring interval must not call a busy task idle."""
        return (self.cpu is None or self.cpu < IDLE_CPU) and now - self.busy_at >= limit

    @property
    def quiet_since(self) -> float:
        """Since when it has shown nothing: its last step, or its last work without steps."""
        return self.pace.moved_at if self.pace.moved_at is not None else self.busy_at


@dataclass
class Stall:
    task: str
    reason: str  # "no progress for 6 s (step 41)", "stopped (state T) for 5 s"
    stopped: bool  # stopped, or its wrapper silent: the likely cause of its peers' stall
    where: list[str] = field(default_factory=list)  # the blamed thread's innermost frames
    limit: str = ""  # the limit it went over: "300 s", "auto: 60 s"

    def describe(self) -> str:
        """One line for the job's reason: the innermost frame, its file's name only (the
        summary prints the frames in full below)."""
        stuck = ""
        if self.where:
            func, _, place = self.where[0].partition(" (")
            stuck = f", in {func} ({place.rsplit('/', 1)[-1]}" if place else f", in {func}"
        return f"{self.task} {self.reason}{stuck}"


def _over(w: Watched, now: float, rule: StallRule) -> bool:
    # The limit only where a clock runs against it: a task neither stopped nor judged by
    # its steps (most of them, most of the time) costs two looks.
    if w.stopped_since is not None and now - w.stopped_since >= rule.limit(w.pace):
        return True
    return rule.judges_steps(w.pace) and w.pace.moved_at is not None \
        and now - w.pace.moved_at >= rule.limit(w.pace)


def _silent(w: Watched, now: float) -> bool:
    return w.usage_at is not None and now - w.usage_at >= USAGE_SILENT_SECONDS


def find_stalls(watched: list[Watched], now: float, rule: StallRule) -> list[Stall]:
    """Nothing until a task is over its limit (or the whole group idle that long); then it
    and every task stuck along with it, the likely cause first."""
    training = [w for w in watched if not w.server]
    over = [w for w in training if _over(w, now, rule)]
    idle = bool(training) and all(w.up and w.idle(now, rule.limit(w.pace)) for w in watched)
    if not over and not idle:
        return []
    horizon = min(rule.limit(w.pace) for w in (over or training))
    stalls: list[tuple[tuple[int, float], Stall]] = []
    for w in training:
        step = f" (step {w.step})" if w.step is not None else ""
        quiet = now - w.quiet_since
        if w.stopped_since is not None:
            reason = f"stopped (state T) for {now - w.stopped_since:.0f} s{step}"
        elif _silent(w, now) and w.usage_at is not None:
            reason = (f"silent: its wrapper has not reported for {now - w.usage_at:.0f} s "
                      f"(stopped with it?); no progress for {quiet:.0f} s{step}")
        elif idle and not over:
            seen = step or " (no step seen)"
            reason = (f"idle for {now - w.busy_at:.0f} s{seen}: no output, "
                      f"CPU under {IDLE_CPU:g} %")
        elif w.step is not None and quiet >= horizon - SLACK_SECONDS:
            reason = f"no progress for {quiet:.0f} s{step}"
        else:
            continue
        cause = w.stopped_since is not None or _silent(w, now)
        stall = Stall(w.name, reason, cause, limit=rule.describe(rule.limit(w.pace)))
        stalls.append(((0 if cause else 1, w.quiet_since), stall))
    return [s for _, s in sorted(stalls, key=lambda x: x[0])]


def startup_over(starting: list[Watched], now: float, limit: float) -> bool:
    """A task not up `limit` seconds after its start, and idle (STARTUP_IDLE_SECONDS): the
    attempt never came up. One that works (a script loading its data before its first step)
    is given its time; the stall rules watch it once it is up."""
    return any(now - w.pace.started_at > limit and w.idle(now, STARTUP_IDLE_SECONDS)
               for w in starting)


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


def threads(lines: list[str]) -> list[list[Frame]]:
    """Every thread's stack, innermost frame first, in the last faulthandler dump in `lines`.
    faulthandler lists threads newest first: the main thread, the oldest, is a dump's last
    block."""
    blocks: list[list[Frame]] = []
    current: list[Frame] | None = None
    dump_over = False
    for line in lines:
        line = line.rstrip("\r\n")
        if _THREAD.match(line):
            if dump_over:  # a later dump: it replaces the earlier one
                blocks, dump_over = [], False
            current = []
            blocks.append(current)
        elif current is not None and (m := _FRAME.match(line)):
            current.append(Frame(m["func"], m["file"], int(m["line"])))
        elif current is not None and line.strip() not in ("", "...", "<no Python frame>"):
            current, dump_over = None, True  # the dump ended
    return blocks


def main_thread(lines: list[str]) -> list[Frame]:
    """The main thread's stack, innermost first, in the last faulthandler dump in `lines`."""
    found = threads(lines)
    return found[-1] if found else []


def _own(frames: list[Frame]) -> bool:
    return bool(frames) and not frames[0].library


def stuck_thread(stacks: list[list[Frame]]) -> list[Frame]:
    """The stack that says where a task is stuck: its main thread's (the last), unless that
    waits inside a library while another thread is in the user's own code (a tf.py_function
    or generator of its input pipeline, run by one of TensorFlow's threads)."""
    if not stacks:
        return []
    main = stacks[-1]
    if _own(main):
        return main
    return next((t for t in stacks[:-1] if _own(t)), main)


def where(frames: list[Frame], n: int = FRAMES_SHOWN) -> list[str]:
    """What a summary shows of a stack: the innermost frame, then the innermost frames of
    the user's own code (the line that called into TensorFlow, or that sleeps)."""
    if not frames:
        return []
    own = [f for f in frames if not f.library]
    shown = [frames[0], *[f for f in own if f is not frames[0]]][:n]
    return [str(f) for f in shown]


def blame_order(stalls: list[Stall], stacks: dict[str, list[list[Frame]]]) -> list[Stall]:
    """Once the stacks are in (every thread's, by task): stopped tasks first, then one stuck
    in its own code (not waiting inside a library, as its blocked peers are), then as
    found."""
    def key(i_stall: tuple[int, Stall]) -> tuple[bool, bool, int]:
        i, s = i_stall
        return (not s.stopped, not _own(stuck_thread(stacks.get(s.task) or [])), i)

    return [s for _, s in sorted(enumerate(stalls), key=key)]
