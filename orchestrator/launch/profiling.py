"""`tfo profile`: one capture of every training task's profiler, what each trace says of its
steps, and the task that holds the others back named, with why.

    found = profiling.profile(RunDir.find("last"), seconds=2)   # a running job's
    print("\\n".join(profiling.lines(found)))

Each training task serves TensorFlow's profiler on a port of the plan (worker_entry/profiler.py,
`TaskPlan.profiler_port`). The capture and xprof's analyses run in a helper process
(`python -m worker_entry.profiletool`: the coordinator imports neither TensorFlow nor xprof),
which asks every task's profiler at its plan's address (a lab host's, a Slurm node's) for its
trace back (worker_entry/profilerpc.py), writes the traces under the run's TensorBoard folder
(`tensorboard/plugins/profile/<session>/<task>.xplane.pb`, TensorBoard's profile tab: pip
install tf-orchestrator[profile]) and answers with figures per task: the step time, and the
time per step spent waiting for input and in communication (collectives; a ParameterServer
job's send/receive ops).

What the figures mean is decided here (pure, tests/test_profiling.py). A task's step is split
in three shares: input (waiting for the next batch), communication (waiting in collectives or
RPCs for the others), and compute (the rest). In synchronous training every task's step takes
the slowest task's time, and the others spend the difference waiting for it in the
all-reduce: so the slow task is the one that waits least in communication while another
waits much more (`SPREAD`, nearly half the step); its cause is the larger of its own input
and compute shares. Without a synchronous step (a ParameterServer job's workers), a task
whose steps take `RATIO` times the fastest's is slow, for its largest share. Where every task
waits in communication most of its step and none stands out, that is said, as no verdict (a
small model's all-reduce on one machine reads so). A balanced job gets no verdict: on a
loaded machine one 2 s trace can catch the scheduler running one worker more than another,
so the spread asked for is nearly half a step. Only tasks with MIN_STEPS steps in their
traces are compared.

A capture can crash a traced task, inside TensorFlow (2.21, CPU): when a trace stops, its host
tracer (`TraceMeRecorder::Consume`, xla/tsl) keeps pointers to the events whose start was
recorded on another thread, then grows the vector of each thread's events, which copies them
(libstdc++'s deque has no noexcept move) and frees the originals; merging the starts in
writes through the stale pointers. MWMS's `CollectiveExecutor::CompleteParamsAsync` starts on
one thread and ends on a gRPC thread of every worker but the group's leader, so each trace of
worker:1 writes freed memory: a SIGSEGV in `FindStartAndMerge` or glibc's `double free or
corruption` in 17 of 93 captures of 2-worker jobs at load 25-45, whatever the trace level or
whether the tasks are traced together or one after the other (docs/guide/slow.md). Nothing
tfo can set avoids it, so `tfo profile` says so: a note with the job's restart policy under
the table, and a task that exited while it was traced is named.
One capture at a time per run (`capture_lock`): the profiler serves one session at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import SpecError
from orchestrator.runs.rundir import RunDir, run_over

# One task waits this much more of its step for the others than another. A balanced 2-worker
# job on 2 cores shared with other work (load 20-45) read spreads of 0.27-0.44 in 2 s
# traces, as the scheduler happened to run one worker or the other; an input-starved worker
# 0.95, a worker with two busy threads of its own 0.47.
SPREAD = 0.45
RATIO = 1.5  # a task's steps this much slower than the fastest's (no synchronous step)
BOUND = 0.5  # every task waits in communication more than this of its step: said, no verdict
# A task compared has this many steps in its trace at least: a step cut by the trace's edges
# weighs too much in one or two (an 8-worker capture, 6 tasks lost to the profiler's crash,
# once named worker:4 "network" from its one step of 471 ms against worker:5's two of 304).
MIN_STEPS = 3
# Where `python -m worker_entry.profiletool` finds tfo's own worker_entry, installed or not.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELPER_SLACK_SECONDS = 120  # the helper's time beyond its traces (two when the first brought
# nothing back): its start, each capture's 2 s start delay and 30 s for the answers
# (worker_entry/profilerpc.py), the analyses
LOST_SLACK_SECONDS = 5.0  # a task's exit this long after the capture still counts as its
# (tfo's loop reaps an exit within a second or two at load 40)
REAP_WAIT_SECONDS = 2.0  # waited after the capture for the loop's record of such an exit: a
# crash comes as the trace stops, seconds before the helper's analyses end
# A ParameterServer job's ps and workers are servers: they run the chief's closures and
# variable reads, no step of their own that xprof's step analysis finds.
SERVER_NO_STEP = ("no step of its own (it serves the chief's closures): its trace is for "
                  "TensorBoard's trace viewer")
CRASH_NOTE = ("note: TensorFlow's profiler can crash a traced task (a use-after-free when a "
              "trace stops: 17 of 93 captures of 2-worker MultiWorkerMirrored jobs, "
              "docs/guide/slow.md)")


class ProfileError(SpecError):
    """What `tfo profile` cannot do, said for the user (exit 2)."""


@dataclass(frozen=True)
class TaskProfile:
    """One task's trace: its steps, and the share of a step in each part (0-1)."""

    name: str
    steps: int = 0
    step_ms: float = 0.0
    input: float = 0.0
    communication: float = 0.0
    file: str = ""
    error: str = ""  # no trace (its profiler did not answer), or no analysis

    @property
    def compute(self) -> float:
        return max(0.0, 1.0 - self.input - self.communication)

    @property
    def cause(self) -> str:
        """What most of its step goes to: input, compute, or network (communication)."""
        shares = {"input": self.input, "compute": self.compute, "network": self.communication}
        return max(shares, key=shares.__getitem__)


@dataclass(frozen=True)
class Verdict:
    task: str  # the slow task
    cause: str  # input, compute, network
    why: str  # the figures that show it


@dataclass
class Profile:
    tasks: list[TaskProfile]
    session: str = ""  # the capture's directory under the run's tensorboard/plugins/profile
    logdir: str = ""
    tool: str = ""  # the client that traced: xprof, or tensorflow
    capture_seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    without: dict[str, str] = field(default_factory=dict)  # tasks not captured, and why
    lost: dict[str, str] = field(default_factory=dict)  # tasks that exited while traced: how
    restart: str = ""  # what the job does about a lost task (its restart policy), for the note

    @property
    def verdict(self) -> Verdict | None:
        return verdict(self.tasks)

    @property
    def traced(self) -> bool:
        """A trace was written (`tfo profile` exits 1 when none was: every task silent, or
        the traced ones crashed before their traces were sent). Traces that were written but
        not analysed (no xprof installed) are a capture: TensorBoard reads them."""
        return bool(self.session)


def task_profile(name: str, raw: Any) -> TaskProfile:
    """The helper's figures for one task (its own JSON: checked, never trusted blindly)."""
    if not isinstance(raw, dict):
        return TaskProfile(name, error="no answer")

    def num(key: str) -> float:
        value = raw.get(key, 0)
        return float(value) if isinstance(value, (int, float)) and value >= 0 else 0.0

    step, steps = num("step_ms"), int(num("steps"))
    error = str(raw.get("error", ""))[:300]
    if not error and (not steps or not step):
        error = "no step in the trace (is it training? a longer --seconds catches one)"
    if error:
        return TaskProfile(name, file=str(raw.get("file", "")), error=error)
    comm = max(num("communication_ms"), num("device_collectives_ms"))
    return TaskProfile(name, steps=steps, step_ms=step, input=min(1.0, num("input_ms") / step),
                       communication=min(1.0, comm / step), file=str(raw.get("file", "")))


def _compared(tasks: list[TaskProfile]) -> list[TaskProfile]:
    return [t for t in tasks if not t.error and t.steps >= MIN_STEPS]


def verdict(tasks: list[TaskProfile]) -> Verdict | None:
    """The task that holds the others back, and why; None for a balanced job (module doc)."""
    seen = _compared(tasks)
    if len(seen) < 2:
        return None
    least = min(seen, key=lambda t: t.communication)
    most = max(seen, key=lambda t: t.communication)
    if most.communication - least.communication >= SPREAD:
        cause = "input" if least.input >= least.compute else "compute"
        share = least.input if cause == "input" else least.compute
        return Verdict(least.name, cause, (
            f"{_pct(share)} of its {least.step_ms:.1f} ms step is {_doing[cause]}, while "
            f"{most.name} waits {_pct(most.communication)} of its step for the others"))
    slowest = max(seen, key=lambda t: t.step_ms)
    fastest = min(seen, key=lambda t: t.step_ms)
    if slowest.step_ms >= RATIO * fastest.step_ms:
        cause = slowest.cause
        share = {"input": slowest.input, "compute": slowest.compute,
                 "network": slowest.communication}[cause]
        return Verdict(slowest.name, cause, (
            f"its steps take {slowest.step_ms:.1f} ms, {fastest.name}'s "
            f"{fastest.step_ms:.1f} ms; {_pct(share)} of its step is {_doing[cause]}"))
    return None


def paced_by_communication(tasks: list[TaskProfile]) -> str | None:
    """Every task waits in communication most of its step and none stands out: the
    all-reduce (its latency: a small model's on a loaded machine) or a ps sets the pace. Said,
    not a verdict: a balanced local job of a small model reads so."""
    seen = _compared(tasks)
    if len(seen) < 2 or verdict(tasks) is not None or \
            not all(t.communication >= BOUND for t in seen):
        return None
    least = min(t.communication for t in seen)
    return (f"every task waits {_pct(least)} or more of its step in communication: the "
            "collectives (or a ps) set the pace, not one task")


_doing = {"input": "waiting for input", "compute": "computing",
          "network": "in communication"}


def _pct(share: float) -> str:
    return f"{share * 100:.0f}%"


def profile(rd: RunDir, seconds: float = 2.0, tasks: list[str] | None = None,
            python: str = sys.executable) -> Profile:
    """Capture the run's training tasks (`tasks`: those named) for `seconds`, all in one
    request, into its TensorBoard folder; what each trace says. Raises ProfileError for a
    run that is over, or has nothing to capture."""
    from orchestrator.planning.plan import Plan

    if run_over(rd):
        raise ProfileError(f"{rd}: the run is over; tfo profile captures a running job "
                           "(tfo runs lists them)")
    try:
        with open(rd.plan_path) as f:
            plan = Plan.from_json(json.load(f), rd.plan_path)
    except (OSError, ValueError) as e:
        raise ProfileError(f"{rd}: cannot read plan.json: {e}") from None
    names = [t.name for t in plan.tasks]
    unknown = [n for n in tasks or [] if n not in names]
    if unknown:
        raise ProfileError(f"--tasks: no task {', '.join(unknown)} in {rd}; tasks: "
                           f"{', '.join(names)}")
    chosen = [t for t in plan.tasks if not tasks or t.name in tasks]
    services = {t.name: f"{t.address}:{t.profiler_port}" for t in chosen
                if t.profiler_port is not None}
    without = {t.name: ("the run's cluster file says profiler: false" if not plan.spec.profiler
                        else "not a training task" if t.role.value == "evaluator"
                        else "no profiler port in its plan") for t in chosen
               if t.profiler_port is None}
    if not services:
        raise ProfileError(f"{rd}: no task to profile: " + "; ".join(
            f"{n}: {why}" for n, why in without.items()))
    if seconds <= 0 or seconds > 600:
        raise ProfileError(f"--seconds: {seconds:g}; give 0 < seconds <= 600")
    logdir = os.path.abspath(rd.tensorboard)
    asked = {"services": services, "logdir": logdir, "ms": int(seconds * 1000)}
    with capture_lock(rd.path):
        started = time.time()
        bound = 2 * seconds + HELPER_SLACK_SECONDS
        try:
            done = subprocess.run(  # from tfo's own directory: its worker_entry, installed or not
                [python, "-m", "worker_entry.profiletool", json.dumps(asked)],
                capture_output=True, text=True, timeout=bound,
                cwd=REPO)
        except subprocess.TimeoutExpired:
            raise ProfileError(f"the capture did not end in {bound:g} s") from None
        ended = time.time()
    found = _read_answer(done, services, without, logdir)
    if ended + REAP_WAIT_SECONDS > time.time():  # the loop's record of an exit at the end
        time.sleep(ended + REAP_WAIT_SECONDS - time.time())
    found.lost = lost_while_traced(rd.read_events()[0], list(services), started, ended)
    found.restart = ", ".join(sorted({
        f"{t.role.value}: {plan.spec.restart.for_role(t.role, plan.spec.strategy).value}"
        for t in chosen if t.name in services}))
    for i, t in enumerate(found.tasks):  # why a task did not answer, where its log says
        if t.error and (why := said_in_log(plan.task(t.name).log_path)):
            found.tasks[i] = TaskProfile(t.name, error=f"{t.error} ({why})")
        elif t.error.startswith("no step") and plan.task(t.name).role in plan.rules.servers:
            found.tasks[i] = TaskProfile(t.name, file=t.file, error=SERVER_NO_STEP)
    return found


@contextlib.contextmanager
def capture_lock(run_dir: str) -> Iterator[None]:
    """One `tfo profile` at a time per run: TensorFlow's profiler serves one session at a
    time (a second is refused by every task), and two captures would be two chances of the
    crash (module doc). A ProfileError names the holder."""
    path = os.path.join(run_dir, "profile.lock")
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip()[:20] or "another process"
            raise ProfileError(f"{run_dir}: another tfo profile (pid {holder}) is capturing "
                               "this run; wait for its table") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            f.truncate(0)
            fcntl.flock(f, fcntl.LOCK_UN)


def lost_while_traced(events: list[dict[str, Any]], names: list[str], since: float,
                      until: float, slack: float = LOST_SLACK_SECONDS) -> dict[str, str]:
    """The traced tasks that exited while the capture ran (or `slack` after: the loop reaps
    an exit late), and how, from the run's own events (`task_exited`)."""
    lost = {}
    for e in events:
        t = e.get("time")
        if e.get("event") == "task_exited" and e.get("task") in names and \
                isinstance(t, (int, float)) and since <= t <= until + slack:
            lost[e["task"]] = str(e.get("how") or f"exit {e.get('returncode')}")[:80]
    return lost


def said_in_log(path: str, tail: int = 1 << 16) -> str | None:
    """worker_entry/profiler.py's line in the task's log, where its profiler could not start:
    the log's last `tail` bytes (the task's own output is untrusted: only this line's words)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - tail))
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    said = [ln for ln in text.splitlines() if ln.startswith("[tfo] profiler: port ")]
    return said[-1][len("[tfo] "):].split(";")[0][:200] if said else None


def _read_answer(done: subprocess.CompletedProcess[str], services: dict[str, str],
                 without: dict[str, str], logdir: str) -> Profile:
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        assert isinstance(answer, dict)
    except (IndexError, ValueError, AssertionError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise ProfileError(f"the capture failed: {tail[0][-400:]}") from None
    raw = answer.get("tasks") if isinstance(answer.get("tasks"), dict) else {}
    errors = [str(e)[:500] for e in answer.get("errors", []) if isinstance(e, str)]
    return Profile(tasks=[task_profile(n, raw.get(n)) for n in services],
                   session=str(answer.get("session", "")), logdir=logdir,
                   tool=str(answer.get("tool", "")), errors=errors, without=without,
                   capture_seconds=float(answer.get("capture_seconds") or 0))


# How the profiler's crash ends a task (a SIGSEGV, or glibc's abort on a double free): a task
# that exited otherwise while traced (a peer stopped for its group's restart) is only named.
CRASH_SIGNALS = ("signal SIGSEGV", "signal SIGABRT")


def lines(found: Profile) -> list[str]:
    """The table `tfo profile` prints, then the verdict, then where the traces are."""
    rows = [("task", "steps", "step time", "input", "compute", "communication")]
    for t in found.tasks:
        if t.error:
            rows.append((t.name, "-", "-", "-", "-", "-"))
        else:
            rows.append((t.name, str(t.steps), f"{t.step_ms:.1f} ms", _pct(t.input),
                         _pct(t.compute), _pct(t.communication)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                     for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
           for r in rows]
    out += [f"{t.name}: {t.error}" for t in found.tasks if t.error]
    out += [f"{name}: not captured: {why}" for name, why in found.without.items()]
    out += found.errors
    out += [f"{name}: exited while traced ({how})" + (
        ": the profiler's crash (below); the job goes on as its restart policy says"
        if how in CRASH_SIGNALS else "") for name, how in found.lost.items()]
    v = found.verdict
    if v is not None:
        out.append(f"slow: {v.task}, cause {v.cause}: {v.why}")
    elif sum(1 for t in found.tasks if not t.error) >= 2:
        paced = paced_by_communication(found.tasks)
        out.append(f"slow: none; {paced}" if paced else "slow: none; the tasks are balanced")
    if found.session:
        out.append(f"traces: {found.session} (tensorboard --logdir {found.logdir}: its "
                   "Profile tab)")
    out.append(CRASH_NOTE + (f"; restart policy {found.restart}" if found.restart else ""))
    return out
