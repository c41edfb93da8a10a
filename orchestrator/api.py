"""tfo from Python: a job in three lines, its result as data.

    import orchestrator
    result = orchestrator.run(entry="mypkg.steps:allreduce_ones", workers=2)
    assert result.ok, result.explain()
    [t.value for t in result.tasks.values()]    # what each task's entry returned

`run` takes a cluster file's path, its data (a dict), or `tfo run`'s flags as keywords
(quick.spec_from_command makes the cluster, as for the CLI). It is quiet unless `echo=True`;
a bad spec raises the SpecError the CLI prints (the field named); a job that fails is a
`Result` with `ok` False, never an exception. Faults for testing recovery code (`kill=`,
`preempt=`, `stall=`) reach the tasks as TFO_FAULTS (worker_entry/faults.py).

`profile={"step": 20, "seconds": 2}` captures the job's training tasks once, as `tfo profile`
does, when every one of them has run that many steps (a test of why a job is slow):
`result.profile` is what the capture found (launch/profiling.py's `Profile`: its table by
`profiling.lines`, its `verdict`), taken on a thread beside the supervision loop.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import SpecError
from worker_entry.faults import FAULTS_ENV

if TYPE_CHECKING:
    from orchestrator.launch.pool import WarmPool
    from orchestrator.launch.profiling import Profile
    from orchestrator.loop.job import Job
    from orchestrator.loop.supervise import RunResult
    from orchestrator.planning.plan import Plan
    from orchestrator.planning.spec import ClusterSpec

FAULT_KINDS = ("kill", "preempt", "stall")
FAULT_AT = ("epoch", "step")
STACKS_LEAD_SECONDS = 3.0  # before a timeout: every task's stacks asked for, into its log
LOG_LINES = 20  # of a failed task's log in `explain()`
STACK_FRAMES = 8  # of a task's stack in `explain()`


@dataclass
class TaskResult:
    """One task of a finished job, over all its attempts."""

    name: str  # worker:1
    state: str  # succeeded, failed, stopped...
    exit_code: int | None  # the last attempt's (-9: SIGKILL)
    attempts: int  # 1 + its restarts (0: never started)
    log_path: str
    value: Any = None  # what its entry returned (JSON), from its last attempt
    value_error: str | None = None  # why the value did not come back (too large, not JSON)
    events: list[dict[str, Any]] = field(default_factory=list)  # its lines of events.jsonl
    exit_reason: str = ""
    # Where it was stuck, innermost frame first then the user's own frames (the thread
    # stall.stuck_thread picks), from the last stacks dump in its log (a hang, a timeout).
    stack: list[str] = field(default_factory=list)

    @property
    def log(self) -> str:
        """Everything the task printed (its log file, every attempt)."""
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""


@dataclass
class Result:
    """A job's end: `ok`, why (`outcome`, `reason`), and its tasks in plan order."""

    ok: bool
    outcome: str  # succeeded, failed, interrupted
    reason: str
    exit_code: int  # what `tfo run` would exit with
    run_dir: str
    tasks: dict[str, TaskResult]
    restarts: int = 0
    failed_task: str | None = None
    stalls: list[str] = field(default_factory=list)  # each stall, described
    # How each restart began: `worker:0, worker:1 attempt 1: resumed at epoch 2 (lost 7 steps)`
    resumes: list[str] = field(default_factory=list)
    profile: Profile | None = None  # `run(profile=...)`'s capture, or why there was none
    raw: RunResult | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        """A failed `assert result.ok` shows this (pytest prints the repr): the whole story."""
        head = f"Result(ok={self.ok}, outcome={self.outcome!r}, reason={self.reason!r})"
        return head if self.ok else f"{head}\n{self.explain()}"

    def explain(self, lines: int = LOG_LINES) -> str:
        """What a failed test shows: the outcome, each task's exit, the last lines of the
        failed task's log (every task's, when none is named), and every task's stacks where
        they were taken (a hang)."""
        out = [f"tfo job {self.outcome}: {self.reason}", f"run directory: {self.run_dir}"]
        for t in self.tasks.values():
            out.append(f"  {t.name}: {t.state}, exit {t.exit_code}"
                       f"{f' ({t.exit_reason})' if t.exit_reason else ''}, "
                       f"{t.attempts} attempt(s)")
        out += [f"stall: {s}" for s in self.stalls]
        named = [self.tasks[self.failed_task]] if self.failed_task in self.tasks else []
        for t in named or [t for t in self.tasks.values() if t.state != "succeeded"]:
            tail = _tail(t.log, lines)
            out.append(f"--- last {len(tail)} lines of {t.name}'s log ({t.log_path}):")
            out += [f"  {line}" for line in tail]
        for t in self.tasks.values():
            if t.stack:
                out.append(f"--- {t.name}'s Python stack where it hung, innermost first:")
                out += [f"  {f}" for f in t.stack]
        return "\n".join(out)


def _tail(text: str, n: int) -> list[str]:
    from worker_entry.markers import MARK

    kept = [line for line in text.splitlines()
            if not line.startswith(MARK)]  # markers: tfo's, not the task's
    return kept[-n:]


def spec_from_flags(*, workers: int | None = None, script: str | None = None,
                    module: str | None = None, entry: str | None = None,
                    args: Sequence[str] | Mapping[str, Any] | None = None,
                    strategy: str | None = None, ps: int | None = None, chief: bool = False,
                    evaluator: bool = False, restart: str | None = None,
                    max_restarts: int | None = None, name: str | None = None,
                    independent: bool = False) -> dict[str, Any]:
    """The cluster file's data `tfo run FLAGS -- COMMAND` would make, from keywords."""
    from orchestrator.planning.quick import FlagError, QuickFlags, spec_from_command

    given = [k for k, v in (("script", script), ("module", module), ("entry", entry)) if v]
    if len(given) != 1:
        raise FlagError(f"give exactly one of script=, module=, entry=; got "
                        f"{', '.join(given) or 'none'}")
    mapping = isinstance(args, Mapping)
    if entry is not None:
        if args is not None and not mapping:
            raise FlagError("args: an entry's args are a mapping (ctx.args), like {'epochs': 2}")
        command = [entry]
    else:
        if mapping:
            raise FlagError("args: a script's or module's args are a list of strings")
        rest = [str(a) for a in args or []]
        command = ["python", script, *rest] if script else ["python", "-m", str(module), *rest]
    flags = QuickFlags(workers=workers, chief=chief, ps=ps, evaluator=evaluator,
                       strategy=strategy, name=name, restart=restart, max_restarts=max_restarts,
                       independent=independent)
    spec = spec_from_command(command, flags)
    if entry is not None and args:
        spec["job"]["args"] = dict(args)  # type: ignore[arg-type]
    return spec


def faults_env(kill: Mapping[str, Any] | None = None, preempt: Mapping[str, Any] | None = None,
               stall: Mapping[str, Any] | None = None) -> str | None:
    """TFO_FAULTS for the tasks: {task: {"kill"|"preempt"|"stall": {"epoch"|"step": n}}}.
    Each fault strikes the task's first attempt once it reaches that epoch (0-based, as Keras
    counts) or step; a restarted attempt runs clean."""
    faults: dict[str, dict[str, dict[str, int]]] = {}
    for kind, given in zip(FAULT_KINDS, (kill, preempt, stall), strict=True):
        for task, at in (given or {}).items():
            where = f"{kind}[{task!r}]"
            if not isinstance(at, Mapping) or len(at) != 1 or next(iter(at)) not in FAULT_AT:
                raise SpecError(f"{where}: give {{'epoch': N}} or {{'step': N}}, got {at!r}")
            (unit, n), = at.items()
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise SpecError(f"{where}.{unit}: a whole number >= 0, got {n!r}")
            if task in faults:
                raise SpecError(f"{where}: {task} already has a fault; one per task")
            faults[str(task)] = {kind: {unit: n}}
    return json.dumps(faults, sort_keys=True) if faults else None


def run(source: str | Path | Mapping[str, Any] | None = None, *,
        workers: int | None = None, script: str | None = None, module: str | None = None,
        entry: str | None = None, args: Sequence[str] | Mapping[str, Any] | None = None,
        strategy: str | None = None, ps: int | None = None, chief: bool = False,
        evaluator: bool = False, restart: str | None = None, max_restarts: int | None = None,
        name: str | None = None, env: Mapping[str, str] | None = None,
        timeout: float | None = None, timeouts: Mapping[str, Any] | None = None,
        kill: Mapping[str, Any] | None = None, preempt: Mapping[str, Any] | None = None,
        stall: Mapping[str, Any] | None = None, run_dir: str | Path | None = None,
        echo: bool = False, pool: WarmPool | None = None,
        teardown_grace: float | None = None, independent: bool = False,
        profile: Mapping[str, Any] | None = None) -> Result:
    """Run a job to its end and return its Result. `source` is a cluster file's path or its
    data; without one, the keywords are `tfo run`'s flags (`workers=2, script="train.py",
    args=[...]`, or `entry="pkg.mod:fn", args={...}`). `env` adds to every task's environment,
    `timeout` is the job's deadline in seconds (every task's stacks are taken just before),
    `timeouts` the cluster file's `timeouts:`; `teardown_grace`, how long a task whose code
    and atexit handlers are done may spend in Python's teardown once its peers are there too
    (decide.Timing's, 3 s by default); `independent`, `tfo run --independent` (the tasks may
    train outside one cluster: `expect_cluster: false`); `profile`, a capture of the training
    tasks once each has run `step` steps, for `seconds` (2), of `tasks` (all): the module doc.
    Raises SpecError for a bad spec (nothing started); KeyboardInterrupt on Ctrl-C (the tasks
    stopped)."""
    from orchestrator import pipeline

    flags = dict(workers=workers, script=script, module=module, entry=entry, args=args,
                 strategy=strategy, ps=ps, chief=chief, evaluator=evaluator, restart=restart,
                 max_restarts=max_restarts, name=name, independent=independent)
    if source is None:
        spec: dict[str, Any] = spec_from_flags(**flags)  # type: ignore[arg-type]
    else:
        given = [f"{k}=" for k, v in flags.items() if v not in (None, False)]
        if given:
            raise SpecError(f"{', '.join(given)}: these make a cluster; {source} is one "
                            "already (edit it, or give the keywords without it)")
        spec = _as_dict(source)
    extra_env = {**(env or {})}
    if (faults := faults_env(kill, preempt, stall)) is not None:
        extra_env[FAULTS_ENV] = faults
    if extra_env:
        spec["env"] = {**(spec.get("env") or {}), **extra_env}
    if timeouts or timeout is not None:
        spec["timeouts"] = {**(spec.get("timeouts") or {}), **(timeouts or {})}
        if timeout is not None:
            spec["timeouts"]["deadline_seconds"] = timeout
    say = _stderr if echo else pipeline._quiet
    capture = Capture.asked(profile)
    display = _display(echo, timeout, capture)
    timing = None
    if teardown_grace is not None:
        from orchestrator.loop.decide import Timing

        timing = Timing(teardown_grace=teardown_grace)
    raw = pipeline.run(_source(source, spec), run_dir, say=say, warn=say, display=display,
                       made_by="orchestrator.run", pool=pool, timing=timing)
    result = result_of(raw)
    if capture is not None:
        result.profile = capture.found()
    return result


class Capture:
    """`run(profile=...)`: one `tfo profile` of the job, on a thread of its own, started from
    the loop's watch once every training task has run `step` steps."""

    FIELDS = ("step", "seconds", "tasks")
    JOIN_SECONDS = 120.0  # after the job's end: a capture under way ends with the job's tasks

    def __init__(self, step: int, seconds: float, tasks: list[str] | None) -> None:
        self.step, self.seconds, self.tasks = step, seconds, tasks
        self.thread: threading.Thread | None = None
        self.answer: Profile | None = None

    @classmethod
    def asked(cls, given: Mapping[str, Any] | None) -> Capture | None:
        if given is None:
            return None
        extra = sorted(set(given) - set(cls.FIELDS))
        step, seconds, tasks = (given.get("step"), given.get("seconds", 2.0),
                                given.get("tasks"))
        if extra or not isinstance(step, int) or isinstance(step, bool) or step < 1:
            raise SpecError(f"profile: {dict(given)!r}; give {{'step': N}} (N >= 1: capture "
                            "once every training task has run N steps), optionally 'seconds' "
                            "and 'tasks'")
        if not isinstance(seconds, (int, float)) or not 0 < seconds <= 600:
            raise SpecError(f"profile.seconds: {seconds!r}; give 0 < seconds <= 600")
        if tasks is not None and (isinstance(tasks, str) or not all(
                isinstance(t, str) for t in tasks)):
            raise SpecError(f"profile.tasks: {tasks!r}; give a list of task names")
        return cls(step, float(seconds), list(tasks) if tasks is not None else None)

    def watch(self, job: Job) -> None:
        """Each round of the loop: start the capture once every training task got there."""
        if self.thread is not None:
            return
        from orchestrator.loop.decide import training

        steps = [r.current.work.progress.step if r.current.work.progress else -1
                 for r in job.records.values() if training(r.role, job.rules)]
        if steps and min(steps) >= self.step:
            self.thread = threading.Thread(target=self._take, args=(job.plan.run_dir,),
                                           name="tfo-profile", daemon=True)
            self.thread.start()

    def _take(self, run_dir: str) -> None:
        from orchestrator.launch import profiling
        from orchestrator.runs.rundir import RunDir

        try:
            self.answer = profiling.profile(RunDir(run_dir), self.seconds, self.tasks)
        except profiling.ProfileError as e:
            self.answer = profiling.Profile([], errors=[str(e)])

    def found(self) -> Profile:
        """What the capture found; a Profile with only `errors` where there was none."""
        from orchestrator.launch.profiling import Profile

        if self.thread is None:
            return Profile([], errors=[f"no capture: the job ended before every training "
                                       f"task ran {self.step} steps"])
        self.thread.join(self.JOIN_SECONDS)
        return self.answer or Profile([], errors=["the capture did not end in "
                                                  f"{self.JOIN_SECONDS:.0f} s"])


def _source(given: str | Path | Mapping[str, Any] | None, spec: dict[str, Any]
            ) -> dict[str, Any] | ClusterSpec:
    """What the pipeline runs: a cluster file's data, checked here once under the file's name
    (its errors name it) and run as it is (the user has the file: nothing is written back);
    data made from keywords or given as a dict goes as data, which the run directory keeps
    as cluster.yaml."""
    if not isinstance(given, str | Path):
        return spec
    from orchestrator.planning.spec import parse_spec

    return parse_spec(spec, str(given))


def _as_dict(source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """A cluster file's data (a plan.json stays a path: its ports come with it)."""
    if isinstance(source, Mapping):
        return json.loads(json.dumps(source))  # a copy the caller's dict does not share
    from orchestrator.planning.specfile import SpecFileError, read_data

    try:
        data = read_data(Path(source))
    except SpecFileError as err:
        raise SpecError(str(err)) from None
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping (name:, job:, tasks:, ...)")
    if {"run_id", "spec", "tasks"} <= data.keys():
        raise SpecError(f"{source} is a run's plan.json: run it again with `tfo rerun`")
    return data


def _stderr(line: str) -> None:
    print(f"tfo: {line}", file=sys.stderr, flush=True)


def _display(echo: bool, timeout: float | None, capture: Capture | None = None
             ) -> Callable[[Plan], contextlib.AbstractContextManager[Any]]:
    """The tasks' lines to stdout (echo) or nowhere; with a timeout, every live task's
    stacks asked for STACKS_LEAD_SECONDS before it (into its log, for `TaskResult.stacks`);
    and the capture asked for, started when due."""
    @contextlib.contextmanager
    def display(plan: Plan) -> Iterator[tuple[Any, Any]]:
        t0 = time.monotonic()
        asked = False

        def watch(job: Job) -> None:
            nonlocal asked
            if capture is not None:
                capture.watch(job)
            if asked or timeout is None or time.monotonic() - t0 < timeout - STACKS_LEAD_SECONDS:
                return
            asked = True
            for rec in job.live():
                request = getattr(rec.handle, "request_stacks", None)
                if request is not None:
                    with contextlib.suppress(OSError):
                        request()

        yield (None if echo else _drop), watch
    return display


def _drop(task: str, line: str) -> None:
    """Where a quiet run's lines go: they are in the logs."""


def result_of(raw: RunResult) -> Result:
    """The Result of a RunResult: each task's value and attempts as the supervisor kept them
    (the `done` marker's fields, untrusted, checked by orchestrator.loop.markers), its lines of
    events.jsonl, its stacks from the last faulthandler dump in its log (a timeout's, which
    `_display` asked for: no record holds them)."""
    from orchestrator.loop.resumes import lines
    from orchestrator.loop.stall import stuck_thread, threads, where
    from orchestrator.runs.rundir import RunDir

    records, _ = RunDir(raw.run_dir).read_events()
    tasks: dict[str, TaskResult] = {}
    for t in raw.tasks:
        done = t.done
        result = TaskResult(
            name=t.name, state=t.state.value, exit_code=t.returncode, attempts=t.attempts,
            log_path=t.log_path, value=done.value if done is not None else None,
            value_error=done.value_error if done is not None else None,
            events=[e for e in records if e.get("task") == t.name], exit_reason=t.exit_reason)
        result.stack = where(stuck_thread(threads(result.log.splitlines())), n=STACK_FRAMES)
        tasks[t.name] = result
    return Result(ok=raw.exit_code == 0, outcome=raw.state.value, reason=raw.reason,
                  exit_code=raw.exit_code, run_dir=raw.run_dir, tasks=tasks,
                  restarts=raw.restarts, failed_task=raw.failed_task,
                  stalls=[s.describe() for s in raw.stalls], resumes=lines(raw.resumes),
                  raw=raw)
