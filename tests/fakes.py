"""Fakes shared by the test modules: scripted task handles on a fake clock for the
supervisor's loop (no processes, no TensorFlow), and a fake elastic lab's plan and backups.

    result, started, events = supervise(tmp_path, spec(), {"worker:1": Script([(3, 0.1, True)])})

A Script says what a task does on each attempt; FakeHandle plays it on the clock given;
FakeClock moves only when the loop waits (FakeWaiter), by what the loop asked to wait;
supervise() runs the loop, the tasks and the events' times on one (a new one unless given).
Test modules import from here (and from tests/helpers.py for real runs), never from each
other."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

from orchestrator.elastic.groups import pool
from orchestrator.loop.supervise import Supervisor, Timing
from orchestrator.planning.plan import Plan, TaskPlan, make_plan
from orchestrator.planning.spec import parse_spec
from orchestrator.runs import rundir
from orchestrator.runs.rundir import RunDir
from tests.conftest import events as run_events
from worker_entry.markers import PREFIX, START

# ---- scripted tasks for the supervisor's loop --------------------------------------------

READY = '@tfo {"event": "ready", "what": "training"}'


VIA = {"multi_worker_mirrored": "MultiWorkerMirroredStrategy",
       "parameter_server": "ParameterServerStrategy"}


def joined(task: TaskPlan) -> list[str]:
    """What an entry's task tells once the runner built its strategy (worker_entry/joined.py):
    the cluster of its TF_CONFIG, as itself. A server and the evaluator build none."""
    job = json.loads(task.env["TFO_JOB"])
    if job["serve"] or task.role.value == "evaluator":
        return []
    return ["@tfo " + json.dumps({"event": "joined", "via": VIA[job["strategy"]],
                                  "cluster": task.tf_config["cluster"], "member": task.name,
                                  "in_process": []})]


@dataclass
class Script:
    """What a task does on each attempt: (exit code or None, after seconds, ready?); what it
    prints when (attempt: [(after seconds, line)]); what it prints when asked for stacks."""

    attempts: list[tuple[int | None, float, bool]] = field(default_factory=list)
    output: dict[int, list[tuple[float, str]]] = field(default_factory=dict)
    stacks: list[str] = field(default_factory=list)

    def for_attempt(self, n: int) -> tuple[int | None, float, bool]:
        return self.attempts[min(n, len(self.attempts) - 1)] if self.attempts else (0, 0, True)


class FakeClock:
    """The loop's time in a scripted run: it moves only when the loop waits (FakeWaiter),
    by exactly what the loop asked to wait, so what a test asserts of durations is what
    the loop decided, however loaded the machine (honcho's tests' fake clock)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        """time.time() on this clock: what events.jsonl's times say in a scripted run."""
        return WALL_AT_START + self.now - 1000.0


WALL_AT_START = 1_800_000_000.0  # a fake clock's run began then, as unix time


@contextlib.contextmanager
def events_on(clock: FakeClock) -> Iterator[None]:
    """Events written meanwhile (rundir's time.time) are timed by the fake clock."""
    with mock.patch.object(rundir, "time", SimpleNamespace(time=clock.wall)):
        yield


class FakeWaiter:
    """wakeup.Waiter for scripted handles (no exit fds): each wait moves the clock on."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def watch(self, fds: set[int]) -> None:
        assert not fds, "a fake clock's run has no exit fds to poll"

    def wait(self, seconds: float, output: bool = True) -> tuple[set[int], bool]:
        self.clock.now += max(0.0, seconds)
        return set(), False


class FakeHandle:
    def __init__(self, task: TaskPlan, attempt: int, script: Script,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.task, self.attempt = task, attempt
        self.code, self.after, ready = script.for_attempt(attempt)
        self._clock = clock
        self._t0 = clock()
        # A task that does not come up has not built its strategy either (MWMS's
        # construction is what waits for the peers).
        self._lines = [*joined(task), READY] if ready else ["booting"]
        self._timed = sorted(script.output.get(attempt, []))
        self._stacks = script.stacks
        self._rc: int | None = None
        self.pid = 1000 + attempt

    def poll(self) -> int | None:
        if self._rc is None and self.code is not None and \
                self._clock() - self._t0 >= self.after:
            self._rc = self.code
        return self._rc

    def terminate(self) -> None:
        self._rc = -15

    def kill(self) -> None:
        self._rc = -9

    def request_stacks(self) -> None:
        self._lines += self._stacks

    def lines(self) -> list[str]:
        now = self._clock() - self._t0
        while self._timed and self._timed[0][0] <= now and self._rc is None:
            self._lines.append(self._timed.pop(0)[1])
        out, self._lines = self._lines, []
        # The scripts' "@tfo ..." lines are markers, as the output reader hands on what the
        # wrapper framed as one (markers.MARK).
        return [START + line if line.startswith(PREFIX) else line for line in out]

    def close(self, timeout: float = 1.0) -> list[str]:
        return self.lines()


def planned(tmp_path: Path, spec: dict) -> Plan:
    """The plan, and its run directory made as `tfo run` makes it before supervising."""
    plan = make_plan(parse_spec(spec), run_id="t", run_dir=tmp_path / "run", workdir=tmp_path)
    RunDir(plan.run_dir).create(plan.to_json())
    return plan


def supervise(tmp_path: Path, spec: dict, scripts: dict[str, Script],
              spares: list[tuple[str, int]] | None = None, echo=None,
              timing: Timing | None = None, clock: FakeClock | None = None):
    """Run the scripted tasks on a fake clock (`clock`, or a new one): the loop, the tasks
    and the events' times. `spares`: warm spares are on, and each one asked for is appended
    there; a start that finds its (task, attempt) among them is `warm`. `echo`: what tfo
    prints, (task, line)."""
    clock = clock or FakeClock()
    plan = planned(tmp_path, spec)
    started: list[tuple[str, int]] = []

    def start(task: TaskPlan, attempt: int) -> FakeHandle:
        started.append((task.name, attempt))
        handle = FakeHandle(task, attempt, scripts.get(task.name, Script()), clock)
        handle.warm = spares is not None and (task.name, attempt) in spares
        return handle

    def standby(task: TaskPlan, attempt: int) -> int:
        assert spares is not None
        spares.append((task.name, attempt))
        return 2000 + attempt

    with events_on(clock):
        sup = Supervisor(plan, start=start, echo=echo or (lambda task, line: None),
                         standby=standby if spares is not None else None, timing=timing,
                         clock=clock, waiter=FakeWaiter(clock))
        result = sup.run()
    events = run_events(tmp_path / "run")
    return result, started, events


def spec(strategy="multi_worker_mirrored", policy="on-failure", max_restarts=2, **tasks):
    tasks = tasks or {"worker": ["localhost:1", "localhost:2"]}
    return {"name": "t", "strategy": strategy, "job": {"entry": "a.b:c"}, "tasks": tasks,
            "restart": {"policy": policy, "max_restarts": max_restarts, "backoff_seconds": 0},
            "timeouts": {"startup_seconds": 1, "grace_seconds": 0.2, "evaluator_seconds": 0.5}}


def progress(step: int) -> str:
    return f'@tfo {{"event": "progress", "step": {step}}}'


def steps(until: float, every: float = 0.1) -> list[tuple[float, str]]:
    """Progress markers, a step every `every` seconds until `until`, then nothing more."""
    n = int(until / every)
    return [(i * every, progress(i)) for i in range(1, n + 1)]


# ---- a fake elastic lab: four hosts, their plan, a backup as tf-keras writes it ----------

HOSTS = {f"lab{i}": {"address": f"10.0.0.{i}", "workdir": f"/w{i}"} for i in range(1, 5)}


def elastic_spec(elastic: dict, places: list[str] | None = None) -> dict:
    return {"name": "e", "job": {"entry": "a.b:c"}, "hosts": HOSTS, "elastic": elastic,
            "tasks": {"worker": places or ["lab1:auto", "lab2:auto", "lab3:auto", "lab4:auto"],
                      "evaluator": ["lab1:auto"]}}


ELASTIC = parse_spec(elastic_spec({"min_workers": 2, "max_workers": 3, "max_resizes": 4}))


PORTS = {"worker:0": 2000, "worker:1": 2001, "worker:2": 2002, "worker:3": 2003,
         "evaluator:0": 2009}


PLACES = pool(ELASTIC, PORTS)  # lab1..lab4, slots 0..3


def plan0():
    return make_plan(ELASTIC, run_id="r1", run_dir="/runs/r1", workdir="/w", ports=PORTS)


def write_backup(directory: Path, saves: list[int], absolute: bool = False) -> None:
    """A backup directory as tf-keras writes it (the `checkpoint` file last)."""
    chief = directory / "chief"
    chief.mkdir(parents=True)
    for n in saves:
        (chief / f"ckpt-{n}.index").write_text(f"index {n}")
        (chief / f"ckpt-{n}.data-00000-of-00001").write_text(f"weights {n}")
    name = (lambda n: str(chief / f"ckpt-{n}")) if absolute else (lambda n: f"ckpt-{n}")
    (chief / "checkpoint").write_text(f'model_checkpoint_path: "{name(saves[-1])}"\n' + "".join(
        f'all_model_checkpoint_paths: "{name(n)}"\n' for n in saves))
