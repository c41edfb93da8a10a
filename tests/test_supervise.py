"""The supervisor's state machine with scripted handles on a fake clock (tests/fakes.py): no
processes, no TensorFlow, no waiting (each scenario asserts it).

Each fake task prints its markers at once and exits with a scripted code after a delay
(None: runs until stopped), per attempt."""

from __future__ import annotations

import json
import re
import time

import pytest

from orchestrator.cli.liveview import rows_from_events
from orchestrator.cli.report import print_summary
from orchestrator.launch import wakeup
from orchestrator.loop.decide import PEER_LOST_GRACE_SECONDS
from orchestrator.loop.supervise import (
    JOB_TRANSITIONS,
    TASK_TRANSITIONS,
    IllegalTransition,
    JobState,
    Supervisor,
    TaskState,
    Timing,
    advance,
    tail,
)
from orchestrator.planning.plan import TaskPlan
from tests import golden
from tests.conftest import events as run_events
from tests.fakes import (
    FakeClock,
    FakeHandle,
    FakeWaiter,
    Script,
    planned,
    progress,
    spec,
    steps,
    supervise,
)
from worker_entry.markers import EXIT_PERMANENT, START


@pytest.fixture(autouse=True)
def golden_events(request, tmp_path):
    """Each scenario's events.jsonl, times and pids stripped, stays as recorded in
    tests/data/golden/supervise/ (tests/golden.py): the supervisor's refactor keeps its
    behaviour. Checked after the test's own assertions."""
    yield
    golden.check_runs("supervise", request.node.nodeid, tmp_path)


# A scenario's own work, however loaded the machine: it never sleeps, but 2 cores shared by
# a whole suite under xdist can stall a process for a while.
WALL_SECONDS = 5.0


@pytest.fixture(autouse=True)
def on_the_fake_clock(monkeypatch):
    """Every scenario runs on the fake clock (fakes.FakeClock): the loop's one sleep is
    FakeWaiter's, never the real Waiter's, and no wall time passes waiting. (The real
    Waiter's wake-ups are test_overhead's.)"""
    def waited(self, seconds: float, output: bool = True):
        raise AssertionError(f"the loop slept {seconds:.3f} s on the wall clock: give the "
                             "Supervisor clock=FakeClock() and waiter=FakeWaiter(clock)")

    monkeypatch.setattr(wakeup.Waiter, "wait", waited)
    t0 = time.monotonic()
    yield
    took = time.monotonic() - t0
    assert took < WALL_SECONDS, f"{took:.1f} s of wall time: a scenario never waits for real"


PS = {"chief": ["localhost:1"], "worker": ["localhost:2", "localhost:3"], "ps": ["localhost:4"]}


@pytest.mark.timeout(20)
def test_mwms_success(tmp_path):
    result, started, _ = supervise(tmp_path, spec(), {})
    assert result.state is JobState.SUCCEEDED and result.exit_code == 0
    assert sorted(started) == [("worker:0", 0), ("worker:1", 0)]


@pytest.mark.timeout(20)
def test_started_is_called_once_every_task_was_started(tmp_path):
    """`tfo run` says the run's line and loads rich there: after its tasks' start-up began."""
    plan = planned(tmp_path, spec())
    started, seen = [], []

    clock = FakeClock()

    def start(task: TaskPlan, attempt: int) -> FakeHandle:
        started.append(task.name)
        return FakeHandle(task, attempt, Script(), clock)

    sup = Supervisor(plan, start=start, echo=lambda task, line: None, clock=clock,
                     waiter=FakeWaiter(clock))
    result = sup.run(started=lambda: seen.append(sorted(started)))
    assert result.state is JobState.SUCCEEDED
    assert seen == [["worker:0", "worker:1"]]


class Stubborn(FakeHandle):
    """A task that outlives its SIGTERM (TensorFlow's C++ runtime swallows it)."""

    termed_at: float | None = None
    killed_at: float | None = None

    def terminate(self) -> None:
        self.termed_at = self._clock()

    def kill(self) -> None:
        self.killed_at = self._clock()
        super().kill()


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("code", "output", "grace"), [
    (3, {}, PEER_LOST_GRACE_SECONDS),  # a peer lost: its survivor cannot save
    (42, {0: [(0.1, '@tfo {"event": "sigterm", "grace": 3}')]}, 3.0),  # a preemption
], ids=["peer_lost", "preempted"])
def test_a_task_that_outlives_its_sigterm_is_stopping_until_its_kill_deadline(
        tmp_path, code, output, grace):
    """worker:1 fails (or is preempted) and worker:0 ignores its SIGTERM: worker:0 is
    STOPPING, the loop goes on meanwhile (the live view is drawn) and wakes at the kill
    deadline to SIGKILL it, then the group restarts. The deadline: grace_seconds after the
    SIGTERM for a preemption, the short grace where the group stops for a lost peer."""
    data = spec(max_restarts=1)
    data["timeouts"] = {**data["timeouts"], "grace_seconds": 3.0}
    clock = FakeClock()
    scripts = {"worker:0": Script([(None, 0, True), (0, 0.1, True)]),
               "worker:1": Script([(code, 0.2, True), (0, 0.1, True)], output)}
    handles: list[FakeHandle] = []

    def start(task: TaskPlan, attempt: int) -> FakeHandle:
        kind = Stubborn if (task.name, attempt) == ("worker:0", 0) else FakeHandle
        handles.append(kind(task, attempt, scripts[task.name], clock))
        return handles[-1]

    seen: list[TaskState] = []
    result = Supervisor(planned(tmp_path, data), start=start, echo=lambda task, line: None,
                        watch=lambda job: seen.append(job.records["worker:0"].state),
                        clock=clock, waiter=FakeWaiter(clock)).run()
    assert result.state is JobState.SUCCEEDED
    assert (result.restarts, result.preemptions) == ((1, 0) if code == 3 else (0, 1))
    stubborn = handles[0]
    assert isinstance(stubborn, Stubborn) and stubborn.termed_at and stubborn.killed_at
    assert grace <= stubborn.killed_at - stubborn.termed_at < grace + 0.1
    assert TaskState.STOPPING in seen  # the loop went on while it was stopping
    events = run_events(tmp_path / "run")
    killed = [e for e in events if e["event"] == "task_killed"]
    assert [(e["task"], e["reason"]) for e in killed] == [
        ("worker:0", f"still running {grace:g} s after SIGTERM")]


@pytest.mark.timeout(20)
def test_mwms_loss_restarts_the_whole_group(tmp_path):
    scripts = {"worker:0": Script([(None, 0, True), (0, 0.1, True)]),
               "worker:1": Script([(-9, 0.1, True), (0, 0.1, True)])}
    result, started, events = supervise(tmp_path, spec(), scripts)
    assert result.state is JobState.SUCCEEDED and result.restarts == 1
    assert sorted(started) == [("worker:0", 0), ("worker:0", 1), ("worker:1", 0), ("worker:1", 1)]
    assert {e["task"] for e in events if e["event"] == "task_restarted"} == {"worker:0",
                                                                              "worker:1"}


@pytest.mark.timeout(20)
def test_max_restarts_is_a_limit_over_the_job(tmp_path):
    scripts = {"worker:1": Script([(3, 0.05, True)])}
    result, started, _ = supervise(tmp_path, spec(max_restarts=2), scripts)
    assert result.state is JobState.FAILED and result.exit_code == 1
    assert result.restarts == 2 and result.failed_task == "worker:1"
    assert "no restarts left" in result.reason
    assert started.count(("worker:1", 2)) == 1 and ("worker:1", 3) not in started


@pytest.mark.timeout(20)
def test_exit_code_policy_does_not_retry_a_program_verdict(tmp_path):
    scripts = {"worker:1": Script([(3, 0.05, True)])}
    result, _, _ = supervise(tmp_path, spec(policy="exit-code"), scripts)
    assert result.state is JobState.FAILED and result.restarts == 0
    assert "restart policy exit-code" in result.reason


@pytest.mark.timeout(20)
def test_the_tasks_due_in_a_round_reach_the_backend_as_one_batch(tmp_path):
    """The first start and a group's restart are one batch each (a backend may start a
    host's tasks together); each task is answered in order."""
    batches: list[list[tuple[str, int]]] = []
    clock = FakeClock()
    scripts = {"worker:0": Script([(None, 0, True), (0, 0.2, True)]),
               "worker:1": Script([(-9, 0.1, True), (0, 0.2, True)])}

    def start_batch(items):
        items = list(items)  # a backend that starts them together takes them all first
        batches.append([(t.name, a) for t, a in items])
        for t, a in items:
            yield FakeHandle(t, a, scripts[t.name], clock)

    def start(task, attempt):
        raise AssertionError("started alone")

    result = Supervisor(planned(tmp_path, spec()), start=start, start_batch=start_batch,
                        echo=lambda task, line: None, clock=clock,
                        waiter=FakeWaiter(clock)).run()
    assert result.state is JobState.SUCCEEDED and result.restarts == 1
    assert batches == [[("worker:0", 0), ("worker:1", 0)], [("worker:0", 1), ("worker:1", 1)]]


@pytest.mark.timeout(20)
def test_a_task_whose_batch_stopped_at_a_failed_start_keeps_its_attempt(tmp_path):
    """A backend that takes the whole batch first (as SSH's and Slurm's do): worker:0's
    start fails, so worker:1's answer is never taken, and it is not started: its next
    start is still its attempt 0, as the events say (before: attempt 1, 0 skipped)."""
    batches: list[list[tuple[str, int]]] = []
    clock = FakeClock()
    scripts = {"worker:0": Script([(0, 0.2, True)]), "worker:1": Script([(0, 0.2, True)])}

    def start_batch(items):
        items = list(items)
        batches.append([(t.name, a) for t, a in items])
        for t, a in items:
            if (t.name, a) == ("worker:0", 0):
                yield OSError("host lab2: unreachable")
            else:
                yield FakeHandle(t, a, scripts[t.name], clock)

    result = Supervisor(planned(tmp_path, spec()), start=None, start_batch=start_batch,
                        echo=lambda task, line: None, clock=clock,
                        waiter=FakeWaiter(clock)).run()
    assert result.state is JobState.SUCCEEDED, result.reason
    assert batches == [[("worker:0", 0), ("worker:1", 0)], [("worker:0", 1), ("worker:1", 0)]]
    events = run_events(tmp_path / "run")
    assert [(e["task"], e["attempt"]) for e in events if e["event"] == "task_started"] == \
        [("worker:0", 1), ("worker:1", 0)]
    # Its log says attempt 0 once: the header of the start not taken is not written again.
    log = next((tmp_path / "run").rglob("worker-1*.log"))
    headers = [line for line in log.read_text().splitlines() if line.startswith("===== tfo:")]
    assert headers == ["===== tfo: worker:1 attempt 0 ====="]


@pytest.mark.timeout(20)
def test_ps_worker_restarts_alone_and_chief_decides(tmp_path):
    scripts = {"chief:0": Script([(0, 0.6, True)]),
               "worker:1": Script([(-9, 0.1, True), (None, 0, True)]),
               "worker:0": Script([(None, 0, True)]), "ps:0": Script([(None, 0, True)])}
    result, started, events = supervise(tmp_path, spec("parameter_server", **PS), scripts)
    assert result.state is JobState.SUCCEEDED
    assert [e["task"] for e in events if e["event"] == "task_restarted"] == ["worker:1"]
    assert started.count(("chief:0", 0)) == 1 and ("chief:0", 1) not in started
    # Servers never exit on their own: the supervisor stopped them after the chief.
    assert {t.name: t.state for t in result.tasks}["ps:0"] is TaskState.STOPPED


@pytest.mark.timeout(20)
def test_a_server_that_exits_0_is_failed_in_the_events_and_in_tfo_status(tmp_path):
    """A server never exits on its own: exit 0 is a loss. events.jsonl says the state the
    supervisor decided, and `tfo status` (rows_from_events) reads it, not exit 0's success."""
    scripts = {"chief:0": Script([(None, 0, True)]), "worker:1": Script([(0, 0.1, True)]),
               "worker:0": Script([(None, 0, True)]), "ps:0": Script([(None, 0, True)])}
    result, _, events = supervise(tmp_path, spec("parameter_server", **PS), scripts)
    # on-failure restarts no exit 0: the loss ends the job.
    assert (result.state, result.failed_task) == (JobState.FAILED, "worker:1")
    exited = [e for e in events if e["event"] == "task_exited" and e["task"] == "worker:1"]
    assert [(e["returncode"], e["state"]) for e in exited] == [(0, "failed")]
    assert {r.task: r.state for r in rows_from_events(events)}["worker:1"] == "failed"


@pytest.mark.timeout(20)
def test_ps_loss_restarts_the_job_and_chief_waits_for_servers(tmp_path):
    scripts = {"chief:0": Script([(None, 0, True), (0, 0.2, True)]),
               "ps:0": Script([(-9, 0.2, True), (None, 0, True)]),
               "worker:0": Script([(None, 0, True)]), "worker:1": Script([(None, 0, True)])}
    result, started, events = supervise(tmp_path, spec("parameter_server", **PS), scripts)
    assert result.state is JobState.SUCCEEDED and result.restarts == 1
    assert {e["task"] for e in events if e["event"] == "task_restarted"} == {
        "chief:0", "worker:0", "worker:1", "ps:0"}
    order = [n for n, a in started if a == 0]
    assert order.index("chief:0") > max(order.index(s) for s in ("ps:0", "worker:0", "worker:1"))


@pytest.mark.timeout(20)
def test_evaluator_failure_never_fails_the_job(tmp_path):
    tasks = {"worker": ["localhost:1"], "evaluator": ["localhost:2"]}
    scripts = {"worker:0": Script([(0, 0.5, True)]), "evaluator:0": Script([(1, 0.05, True)])}
    result, started, _ = supervise(tmp_path, spec(policy={"evaluator": "on-failure"},
                                                  max_restarts=1, **tasks), scripts)
    assert result.state is JobState.SUCCEEDED
    assert ("evaluator:0", 1) in started and result.restarts == 0


@pytest.mark.timeout(20)
def test_a_task_is_up_at_its_first_step(tmp_path):
    """A one-process script (MirroredStrategy, the default strategy) opens no port: its first
    step says it runs, and the startup limit (1 s) is over for it."""
    scripts = {"worker:0": Script([(0, 2.0, False)], {0: steps(1.9, every=0.3)})}
    result, _, events = supervise(tmp_path, spec(worker=["localhost:1"]), scripts)
    assert result.state is JobState.SUCCEEDED, result.reason
    ready = [e for e in events if e["event"] == "task_ready"]
    assert [(e["task"], e["by"]) for e in ready] == [("worker:0", "step")]


@pytest.mark.timeout(20)
def test_a_task_not_up_is_not_failed_by_the_startup_limit_while_it_works(tmp_path):
    """No step and no port: the 1 s limit fails it only once it idles (STARTUP_IDLE_SECONDS)."""
    scripts = {"worker:0": Script([(0, 3.0, False)], {0: working(3.0)})}
    result, _, events = supervise(tmp_path, spec(worker=["localhost:1"]), scripts)
    assert result.state is JobState.SUCCEEDED, result.reason
    assert not [e for e in events if e["event"] in ("task_startup_timeout", "task_ready")]


@pytest.mark.timeout(20)
def test_startup_timeout_names_every_task_not_up(tmp_path):
    scripts = {"worker:1": Script([(None, 0, False)]), "worker:0": Script([(None, 0, True)])}
    result, _, _ = supervise(tmp_path, spec(policy="never"), scripts)
    assert result.state is JobState.FAILED
    assert "startup timeout (1 s): never came up: worker:1" in result.reason
    assert "worker:0" not in result.reason.split("never came up")[1]


@pytest.mark.timeout(20)
def test_an_entry_that_cannot_be_found_is_never_restarted(tmp_path):
    """EXIT_PERMANENT (the task's entry does not exist) ends the job under any policy."""
    scripts = {"worker:1": Script([(EXIT_PERMANENT, 0.05, False), (0, 0.05, True)])}
    result, started, events = supervise(tmp_path, spec(policy="always", max_restarts=5), scripts)
    assert result.state is JobState.FAILED and result.exit_code == 1
    assert result.restarts == 0 and ("worker:1", 1) not in started
    assert result.failed_task == "worker:1"
    assert result.reason == ("worker:1: entry a.b:c cannot be found (exit code 78: permanent, "
                             "not restarted)")
    assert not [e for e in events if e["event"] == "task_restarted"]


@pytest.mark.timeout(20)
def test_an_evaluator_whose_entry_cannot_be_found_is_not_restarted(tmp_path):
    tasks = {"worker": ["localhost:1"], "evaluator": ["localhost:2"]}
    scripts = {"worker:0": Script([(0, 0.5, True)]),
               "evaluator:0": Script([(EXIT_PERMANENT, 0.05, False)])}
    result, started, _ = supervise(tmp_path, spec(policy="always", max_restarts=3, **tasks),
                                   scripts)
    assert result.state is JobState.SUCCEEDED  # a sidecar: the job goes on without it
    assert ("evaluator:0", 1) not in started


@pytest.mark.timeout(20)
def test_a_task_that_could_not_start_is_not_still_running(tmp_path, capsys):
    plan = planned(tmp_path, spec(policy="never"))

    def start(task: TaskPlan, attempt: int) -> FakeHandle:
        if task.name == "worker:1":
            raise OSError("host lab1 dropped off the network")
        return FakeHandle(task, attempt, Script([(None, 0, True)]), clock)

    clock = FakeClock()
    result = Supervisor(plan, start=start, echo=lambda task, line: None, clock=clock,
                        waiter=FakeWaiter(clock)).run()
    assert result.state is JobState.FAILED and result.failed_task == "worker:1"
    assert "worker:1 could not start: host lab1 dropped off the network" in result.reason
    print_summary(result)
    summary = capsys.readouterr().err
    assert "worker:1 failed: could not start" in summary
    assert "still running" not in summary


def _drawn(enum: type) -> set[tuple[str, str]]:
    """The transitions an Enum's docstring draws: `A/B ──why──▶ C`, one a line."""
    edges = set()
    for line in (enum.__doc__ or "").splitlines():
        if "──▶" not in line:
            continue
        left, right = line.split("──▶")
        for source in left.split("──")[0].split("/"):
            edges.add((source.strip(), right.strip().split()[0]))
    return edges


@pytest.mark.parametrize("enum", [TaskState, JobState])
def test_the_transition_tables_are_what_the_docstrings_draw(enum):
    table = {TaskState: TASK_TRANSITIONS, JobState: JOB_TRANSITIONS}[enum]
    assert set(table) == set(enum)
    assert {(a.name, b.name) for a, targets in table.items() for b in targets} == _drawn(enum)
    for a in enum:  # every pair: drawn ones pass, the rest are refused
        for b in enum:
            if b in table[a]:
                assert advance(a, b) is b
            else:
                with pytest.raises(IllegalTransition, match=f"{a.value} → {b.value}"):
                    advance(a, b)


@pytest.mark.timeout(20)
def test_an_illegal_transition_in_the_loop_fails_the_run_and_tears_down(tmp_path):
    """A bug of ours (a transition not drawn) ends the run as a supervisor error, with every
    task stopped; it is never silently taken."""
    plan = planned(tmp_path, spec())
    handles: list[FakeHandle] = []

    def start(task: TaskPlan, attempt: int) -> FakeHandle:
        handles.append(FakeHandle(task, attempt, Script([(None, 0, True)]), clock))
        return handles[-1]

    clock = FakeClock()
    sup = Supervisor(plan, start=start, echo=lambda task, line: None, clock=clock,
                     waiter=FakeWaiter(clock))
    sup.checks.success = lambda: sup.job.set(sup.job.records["worker:0"], TaskState.PENDING)
    result = sup.run()
    assert result.state is JobState.FAILED and "→ pending is not drawn" in result.reason
    assert (tmp_path / "run" / "supervisor-error.log").exists()
    assert all(h.poll() == -15 for h in handles)


@pytest.mark.timeout(20)
def test_the_evaluator_exit_while_finishing_takes_the_common_path(tmp_path):
    """Training done: the evaluator's late exit is recorded like any other (task_exited), is
    never restarted, and the job succeeds."""
    tasks = {"worker": ["localhost:1"], "evaluator": ["localhost:2"]}
    scripts = {"worker:0": Script([(0, 0.05, True)]), "evaluator:0": Script([(1, 0.2, True)])}
    result, started, events = supervise(tmp_path, spec(policy="always", max_restarts=3,
                                                       **tasks), scripts)
    assert result.state is JobState.SUCCEEDED
    assert ("evaluator:0", 1) not in started
    exits = [e for e in events if e["event"] == "task_exited" and e["task"] == "evaluator:0"]
    assert [e["returncode"] for e in exits] == [1]
    assert {t.name: t.state for t in result.tasks}["evaluator:0"] is TaskState.FAILED


# ---- stalls and preemption ---------------------------------------------------------------


def usage(stopped: bool, cpu: float = 0) -> str:
    return (f'@tfo {{"event": "usage", "cpu": {cpu}, "rss": 1, "processes": 1, "stopped": '
            f'{"true" if stopped else "false"}}}')


def working(until: float, cpu: float = 50, every: float = 0.2) -> list[tuple[float, str]]:
    """Usage markers of a task at `cpu` % until `until` (its wrapper's, every `every` s)."""
    return [(i * every, usage(False, cpu)) for i in range(1, int(until / every) + 1)]


def stall_spec(stall_seconds: float | None = 0.6, **kw) -> dict:
    s = spec(**kw)
    s["timeouts"] = {**s["timeouts"], "startup_seconds": 5}
    if stall_seconds is not None:
        s["timeouts"]["stall_seconds"] = stall_seconds
    return s


DUMP = ["Thread 0x00007ff3a555c6c0 (most recent call first):",
        '  File "/x/threading.py", line 324 in wait',
        "",
        "Current thread 0x00007ff3a6fbfb80 (most recent call first):",
        '  File "/job/train.py", line 21 in train_step',
        '  File "/job/train.py", line 40 in <module>']


@pytest.mark.timeout(20)
def test_a_stalled_worker_fails_its_attempt_and_the_group_restarts(tmp_path, capsys):
    scripts = {"worker:0": Script([(None, 0, True), (0, 0.3, True)], {0: steps(0.5)}),
               "worker:1": Script([(None, 0, True), (0, 0.3, True)], {0: steps(0.5)}, DUMP)}
    result, started, events = supervise(tmp_path, stall_spec(), scripts)
    assert result.state is JobState.SUCCEEDED and result.restarts == 1
    assert ("worker:0", 1) in started and ("worker:1", 1) in started
    stalled = [e for e in events if e["event"] == "task_stalled"]
    assert {e["task"] for e in stalled} == {"worker:0", "worker:1"}
    assert all(e["attempt"] == 0 and "no progress" in e["reason"] for e in stalled)
    stacks = [e for e in events if e["event"] == "task_stacks"]
    assert [(e["task"], e["where"]) for e in stacks] == [
        ("worker:1", ["train_step (/job/train.py:21)", "<module> (/job/train.py:40)"])]
    # Stalled once the steps stop (0.5 s) plus stall_seconds (0.6 s), not before.
    began = next(e["time"] for e in events if e["event"] == "task_started")
    assert 1.0 <= stalled[0]["time"] - began < 1.5
    print_summary(result)
    summary = capsys.readouterr().err
    assert "stalled: worker:1 no progress for" in summary
    assert "in train_step (/job/train.py:21)" in summary


@pytest.mark.timeout(20)
def test_the_stopped_worker_is_named_not_its_blocked_peer(tmp_path):
    stopped = [(0.3, usage(False)), (0.6, usage(True))]
    scripts = {"worker:0": Script([(None, 0, True)], {0: steps(0.6)}),
               "worker:1": Script([(None, 0, True)], {0: steps(0.6) + stopped}, DUMP)}
    result, _, events = supervise(tmp_path, stall_spec(1.0, policy="on-failure", max_restarts=0),
                                  scripts)
    assert result.state is JobState.FAILED and result.failed_task == "worker:1"
    assert result.reason.startswith("stalled (1 s): worker:1 stopped (state T)")
    assert "worker:0 no progress" in result.reason
    assert [s.task for s in result.stalls] == ["worker:1", "worker:0"]
    assert result.stalls[0].where == []  # a stopped task cannot answer: not asked
    assert next(e for e in events if e["event"] == "task_stalled")["stopped"] is True


@pytest.mark.timeout(20)
@pytest.mark.parametrize("stall", [{"stall_seconds": 0.5},
                                   {"stall_seconds": "auto", "stall_min_seconds": 0.5}])
def test_a_task_that_reports_no_progress_is_judged_by_its_work(tmp_path, stall):
    """No step to watch: a group that works (CPU in use) trains; one that idles is hung."""
    busy = {n: Script([(0, 1.5, True)], {0: working(1.5)}) for n in ("worker:0", "worker:1")}
    s = stall_spec(**{"max_restarts": 0})
    s["timeouts"].update(stall)
    result, _, events = supervise(tmp_path / "busy", s, busy)
    assert result.state is JobState.SUCCEEDED and result.restarts == 0
    assert not [e for e in events if e["event"] == "task_stalled"]
    idle = {n: Script([(0, 1.5, True)], {0: working(1.5, cpu=0.5)})
            for n in ("worker:0", "worker:1")}
    result, _, events = supervise(tmp_path / "idle", s, idle)
    assert result.state is JobState.FAILED, result.reason
    assert [s.task for s in result.stalls] == ["worker:0", "worker:1"]
    assert re.search(r"worker:0 idle for \d s \(no step seen\): no output, CPU under 2 %",
                     result.reason), result.reason
    # Starved, not idle: on a crowded host a working task runs under 2 % of a core while its
    # threads wait on a runqueue (make test's test_ready saw one stalled so, at step 2).
    starved = {n: Script([(0, 1.5, True)], {0: [
        (t, line.replace('"cpu": 0.5', '"cpu": 0.5, "wait": 60.0'))
        for t, line in working(1.5, cpu=0.5)]}) for n in ("worker:0", "worker:1")}
    result, _, events = supervise(tmp_path / "starved", s, starved)
    assert result.state is JobState.SUCCEEDED, result.reason
    assert not [e for e in events if e["event"] == "task_stalled"]


@pytest.mark.timeout(20)
def test_a_stopped_task_without_progress_is_a_stall(tmp_path):
    scripts = {"worker:0": Script([(None, 0, True)], {0: working(3)}),
               "worker:1": Script([(None, 0, True)], {0: [(0.2, usage(True))]})}
    result, _, _ = supervise(tmp_path, stall_spec(0.5, max_restarts=0), scripts)
    assert result.state is JobState.FAILED and result.failed_task == "worker:1"
    assert [s.task for s in result.stalls] == ["worker:1"]


@pytest.mark.timeout(20)
def test_a_ps_chief_waiting_for_busy_servers_is_no_stall(tmp_path):
    """PS: the chief idles while the workers (servers) compute; only all of them idle is a
    hang, and then the chief is named, never a server."""
    def job(servers_cpu: float) -> dict[str, Script]:
        servers = {n: Script([(None, 0, True)], {0: working(1.5, cpu=servers_cpu)})
                   for n in ("worker:0", "worker:1", "ps:0")}
        return {"chief:0": Script([(0, 1.5, True)], {0: working(1.5, cpu=0)}), **servers}

    s = stall_spec(None, strategy="parameter_server", max_restarts=0, **PS)
    s["timeouts"].update(stall_seconds="auto", stall_min_seconds=0.5)
    result, _, events = supervise(tmp_path / "busy", s, job(servers_cpu=80))
    assert result.state is JobState.SUCCEEDED, result.reason
    assert not [e for e in events if e["event"] == "task_stalled"]
    result, _, _ = supervise(tmp_path / "idle", s, job(servers_cpu=0))
    assert result.state is JobState.FAILED and [st.task for st in result.stalls] == ["chief:0"]


@pytest.mark.timeout(20)
def test_auto_waits_a_multiple_of_the_longest_step(tmp_path):
    """25 steps 0.1 s apart, then none: auto's limit is 10 x the longest wait between two
    steps (0.1 s, a little more on a busy machine; its floor 0.5 s is lower), counted from
    the last step."""
    scripts = {n: Script([(None, 0, True)], {0: steps(2.5)}) for n in ("worker:0", "worker:1")}
    s = stall_spec(None, max_restarts=0)
    s["timeouts"].update(stall_seconds="auto", stall_min_seconds=0.5)
    clock, asked = FakeClock(), []  # the loop's time, and when (after its start) each was asked

    class Asked(FakeHandle):  # its stacks are asked for at the moment its stall is found
        def request_stacks(self) -> None:
            asked.append(self._clock() - self._t0)
            super().request_stacks()

    result = Supervisor(planned(tmp_path, s), clock=clock, waiter=FakeWaiter(clock),
                        start=lambda task, attempt: Asked(task, attempt, scripts[task.name],
                                                          clock),
                        echo=lambda task, line: None).run()
    events = run_events(tmp_path / "run")
    assert result.state is JobState.FAILED
    stalled = next(e for e in events if e["event"] == "task_stalled")
    limit = float(re.fullmatch(r"auto: ([\d.]+) s", stalled["stall_seconds"])[1])
    assert 1.0 <= limit <= 1.6, stalled  # 10 x 0.1 s, and what the loop's rounds add to a wait
    assert re.match(rf"stalled \(auto: {limit:g} s\): worker:0 no progress for [\d.]+ s "
                    r"\(step 25\)", result.reason), result.reason
    last = 2.5  # its last step, after its start
    assert asked and limit <= asked[0] - last < limit + 0.5


@pytest.mark.timeout(20)
def test_a_task_that_is_done_training_is_not_stalled_while_it_exits(tmp_path):
    """TensorFlow may take seconds to exit once the script returned (its `done`)."""
    done = [*steps(0.3), (0.35, '@tfo {"event": "done"}')]
    scripts = {n: Script([(0, 1.5, True)], {0: done}) for n in ("worker:0", "worker:1")}
    result, _, events = supervise(tmp_path, stall_spec(0.5), scripts)
    assert result.state is JobState.SUCCEEDED and result.restarts == 0
    assert not [e for e in events if e["event"] == "task_stalled"]


@pytest.mark.timeout(20)
def test_stall_seconds_zero_turns_it_off(tmp_path):
    scripts = {n: Script([(0, 1.2, True)], {0: steps(0.2)}) for n in ("worker:0", "worker:1")}
    result, _, events = supervise(tmp_path, stall_spec(0), scripts)
    assert result.state is JobState.SUCCEEDED
    assert not [e for e in events if e["event"] == "task_stalled"]


SIGTERM = '@tfo {"event": "sigterm", "grace": 10}'


@pytest.mark.timeout(20)
def test_a_preempted_group_restarts_without_counting(tmp_path, capsys):
    scripts = {"worker:0": Script([(42, 0.4, True), (0, 0.2, True)]),
               "worker:1": Script([(42, 0.3, True), (0, 0.2, True)], {0: [(0.1, SIGTERM)]})}
    result, started, events = supervise(tmp_path, spec(policy="exit-code", max_restarts=0),
                                        scripts)
    assert result.state is JobState.SUCCEEDED and result.exit_code == 0
    assert result.restarts == 0 and result.preemptions == 1
    assert ("worker:0", 1) in started and ("worker:1", 1) in started
    preempted = [e for e in events if e["event"] == "task_preempted"]
    assert [(e["task"], e["sigterm"]) for e in preempted] == [("worker:1", ["worker:1"])]
    assert all(e["counted"] is False for e in events if e["event"] == "task_restarted")
    assert all(o.restarts == 0 for o in result.tasks)
    print_summary(result)
    assert "(restarts: 0, preemptions: 1)" in capsys.readouterr().err


@pytest.mark.timeout(20)
def test_a_peer_of_the_preempted_task_exiting_first_is_preempted_too(tmp_path):
    scripts = {"worker:0": Script([(42, 0.3, True), (0, 0.2, True)]),
               "worker:1": Script([(None, 0, True), (0, 0.2, True)], {0: [(0.1, SIGTERM)]})}
    result, _, events = supervise(tmp_path, spec(max_restarts=0), scripts)
    assert result.state is JobState.SUCCEEDED and result.restarts == 0
    assert [e["sigterm"] for e in events if e["event"] == "task_preempted"] == [["worker:1"]]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("policy, state, restarts", [("exit-code", JobState.FAILED, 0),
                                                     ("on-failure", JobState.SUCCEEDED, 1)])
def test_exit_42_without_a_sigterm_is_an_ordinary_exit(tmp_path, policy, state, restarts):
    scripts = {"worker:1": Script([(42, 0.2, True), (0, 0.2, True)])}
    result, _, events = supervise(tmp_path, spec(policy=policy, max_restarts=1), scripts)
    assert result.state is state and result.restarts == restarts
    assert not [e for e in events if e["event"] == "task_preempted"]


@pytest.mark.timeout(20)
def test_a_preemption_under_policy_never_fails_the_job(tmp_path):
    scripts = {"worker:1": Script([(42, 0.3, True)], {0: [(0.1, SIGTERM)]})}
    result, _, _ = supervise(tmp_path, spec(policy="never"), scripts)
    assert result.state is JobState.FAILED and "exit code 42" in result.reason


def test_the_summary_tail_skips_markers(tmp_path):
    log = tmp_path / "worker-1.log"
    log.write_text("".join(f"line {i}\n{START}{usage(False)}\n{START}{progress(i)}\n"
                           for i in range(30))
                   + f'{START}@tfo {{"event": "usage", "cpu": "lots"}}\n'
                   + '@tfo {"event": "done"}\n')  # the task's text: no START
    assert tail(str(log), 3) == ["line 29", f'{START}@tfo {{"event": "usage", "cpu": "lots"}}',
                                 '@tfo {"event": "done"}']


# ---- warm spares -------------------------------------------------------------------------

@pytest.mark.timeout(20)
def test_a_warm_spare_is_asked_for_at_first_progress_and_serves_the_restart(tmp_path):
    scripts = {"worker:0": Script([(None, 0, True), (0, 0.3, True)], {0: steps(0.3)}),
               "worker:1": Script([(-9, 0.6, True), (0, 0.3, True)], {0: steps(0.3)})}
    spares: list[tuple[str, int]] = []
    result, _, events = supervise(tmp_path, spec(max_restarts=1), scripts, spares)
    assert result.state is JobState.SUCCEEDED and result.restarts == 1
    # One spare per task for attempt 1; none for attempt 2: no restart was left.
    assert sorted(spares) == [("worker:0", 1), ("worker:1", 1)]
    made = [(e["task"], e["attempt"], e["pid"]) for e in events
            if e["event"] == "task_standby_started"]
    assert sorted(made) == [("worker:0", 1, 2001), ("worker:1", 1, 2001)]
    warm = {(e["task"], e["attempt"]): e["warm"] for e in events if e["event"] == "task_started"}
    assert warm == {("worker:0", 0): False, ("worker:1", 0): False,
                    ("worker:0", 1): True, ("worker:1", 1): True}


@pytest.mark.timeout(20)
def test_a_task_without_progress_gets_its_spare_a_while_after_ready(tmp_path):
    scripts = {"worker:0": Script([(0, 0.6, True)]), "worker:1": Script([(0, 0.1, True)])}
    spares: list[tuple[str, int]] = []
    result, _, _ = supervise(tmp_path, spec(), scripts, spares,
                             timing=Timing(standby_after_ready=0.3))
    assert result.state is JobState.SUCCEEDED
    assert spares == [("worker:0", 1)]  # worker:1 was done before its while was up


@pytest.mark.timeout(20)
@pytest.mark.parametrize("policy, max_restarts", [("never", 2), ("on-failure", 0)])
def test_no_spare_without_a_restart_to_serve(tmp_path, policy, max_restarts):
    scripts = {"worker:0": Script([(0, 0.4, True)], {0: steps(0.3)}),
               "worker:1": Script([(0, 0.4, True)], {0: steps(0.3)})}
    spares: list[tuple[str, int]] = []
    result, _, _ = supervise(tmp_path, spec(policy=policy, max_restarts=max_restarts), scripts,
                             spares)
    assert result.state is JobState.SUCCEEDED and spares == []


# ---- TensorFlow's teardown ---------------------------------------------------------------

DONE, EXITING = '@tfo {"event": "done"}', '@tfo {"event": "exiting"}'


@pytest.mark.timeout(20)
def test_a_task_left_in_its_teardown_by_a_gone_peer_is_stopped_and_succeeds(tmp_path):
    """worker:1's code and atexit handlers are over (`exiting`), but TensorFlow's teardown
    waits for worker:0, which has exited: stopped TEARDOWN_GRACE_SECONDS later, a success."""
    said = {0: [(0.1, DONE), (0.2, EXITING)]}
    scripts = {"worker:0": Script([(0, 0.4, True)], said),
               "worker:1": Script([(None, 0, True)], said)}
    clock = FakeClock()
    t0 = clock()
    result, _, events = supervise(tmp_path, spec(), scripts, timing=Timing(teardown_grace=0.5),
                                  clock=clock)
    assert result.state is JobState.SUCCEEDED and result.restarts == 0
    assert clock() - t0 < 5
    assert {t.name: t.state for t in result.tasks} == {"worker:0": TaskState.SUCCEEDED,
                                                      "worker:1": TaskState.SUCCEEDED}
    stopped = [e for e in events if e["event"] == "task_teardown_stopped"]
    assert [e["task"] for e in stopped] == ["worker:1"] and stopped[0]["waited"] >= 0.5


@pytest.mark.timeout(20)
def test_a_task_still_in_its_code_is_waited_for(tmp_path):
    """Done but not `exiting` (its atexit handlers may still run), or not done at all: the
    job waits for its own exit, however long after its peers."""
    scripts = {"worker:0": Script([(0, 0.1, True)], {0: [(0.05, DONE), (0.06, EXITING)]}),
               "worker:1": Script([(0, 1.2, True)], {0: [(0.05, DONE)]})}
    clock = FakeClock()
    t0 = clock()
    result, _, events = supervise(tmp_path, spec(), scripts, timing=Timing(teardown_grace=0.2),
                                  clock=clock)
    assert result.state is JobState.SUCCEEDED and clock() - t0 >= 1.2
    assert not [e for e in events if e["event"] == "task_teardown_stopped"]


@pytest.mark.timeout(20)
def test_tasks_that_all_wait_in_their_teardown_are_all_stopped(tmp_path):
    """Every worker's code is over and each waits for the others in TensorFlow's teardown
    (measured: 10 s): all are stopped TEARDOWN_GRACE_SECONDS after the last got there."""
    scripts = {"worker:0": Script([(None, 0, True)], {0: [(0.1, DONE), (0.2, EXITING)]}),
               "worker:1": Script([(None, 0, True)], {0: [(0.1, DONE), (0.4, EXITING)]})}
    clock = FakeClock()
    t0 = clock()
    result, _, events = supervise(tmp_path, spec(), scripts, timing=Timing(teardown_grace=0.5),
                                  clock=clock)
    assert result.state is JobState.SUCCEEDED and clock() - t0 < 5
    stopped = {e["task"]: e["waited"] for e in events if e["event"] == "task_teardown_stopped"}
    assert set(stopped) == {"worker:0", "worker:1"} and min(stopped.values()) >= 0.5


@pytest.mark.timeout(20)
def test_a_peer_that_exits_while_both_wait_does_not_restart_the_wait(tmp_path):
    """Both workers' code is over at 0.2 s; worker:0's teardown ends at 0.6 s, worker:1's
    never: worker:1 is stopped TEARDOWN_GRACE_SECONDS after both were over, not after
    worker:0's exit (measured in the bench: run over 6.1 s after the code, not 3.0 s)."""
    said = {0: [(0.1, DONE), (0.2, EXITING)]}
    scripts = {"worker:0": Script([(0, 0.6, True)], said),
               "worker:1": Script([(None, 0, True)], said)}
    result, _, events = supervise(tmp_path, spec(), scripts, timing=Timing(teardown_grace=0.5))
    assert result.state is JobState.SUCCEEDED
    at = {(e["event"], e["task"]): e["time"] for e in events if e.get("task") == "worker:1"}
    waited = at[("task_teardown_stopped", "worker:1")] - at[("task_exiting", "worker:1")]
    assert 0.5 <= waited < 0.75  # not 0.9: 0.4 s of worker:0's teardown, then 0.5 again


def exiting(code: int) -> str:
    return '@tfo ' + json.dumps({"event": "exiting", "code": code})


@pytest.mark.timeout(20)
def test_a_preempted_group_left_in_its_teardown_is_still_a_preemption(tmp_path):
    """Every worker saved and its code exited 42, then TensorFlow's teardown hung: stopped,
    they exited 42 (their `exiting` said so), and the group restarts uncounted. It was a
    success before: the job ended mid-training."""
    said = [(0.2, exiting(42))]
    scripts = {"worker:0": Script([(None, 0, True), (0, 0.2, True)], {0: said}),
               "worker:1": Script([(None, 0, True), (0, 0.2, True)],
                                  {0: [(0.1, SIGTERM), *said]})}
    result, started, events = supervise(tmp_path, spec(policy="exit-code", max_restarts=0),
                                        scripts, timing=Timing(teardown_grace=0.3))
    assert result.state is JobState.SUCCEEDED and result.preemptions == 1
    assert ("worker:0", 1) in started and ("worker:1", 1) in started
    exits = [e for e in events if e["event"] == "task_exited" and e["attempt"] == 0]
    assert {e["returncode"] for e in exits} == {42}
    # `teardown: true` is a success by teardown (liveview, test_mwms read it so): not these.
    assert all("teardown" not in e and e["how"] == "exit code 42 (stopped in teardown)"
               for e in exits)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("code, state", [(0, JobState.SUCCEEDED), (3, JobState.FAILED)])
def test_a_task_stopped_in_its_teardown_exits_as_its_code_said(tmp_path, code, state):
    scripts = {"worker:0": Script([(0, 0.3, True)], {0: [(0.1, DONE), (0.2, EXITING)]}),
               "worker:1": Script([(None, 0, True)], {0: [(0.2, exiting(code))]})}
    result, _, events = supervise(tmp_path, spec(policy="never"), scripts,
                                  timing=Timing(teardown_grace=0.3))
    assert result.state is state
    exited = [e for e in events if e["event"] == "task_exited" and e["task"] == "worker:1"]
    assert [e["returncode"] for e in exited] == [code if code else -9]
    assert [e.get("teardown") for e in exited] == [None if code else True]
    assert [t.torn_down for t in result.tasks if t.name == "worker:1"] == [not code]


# ---- a script's evaluator once training is done (issue 31) ---------------------------------
def _busy(until: float, cpu: float = 90.0) -> list[tuple[float, str]]:
    """Usage markers every 0.2 s saying `cpu` until `until` seconds after the start."""
    return [(t / 10, f'@tfo {{"event": "usage", "cpu": {cpu}, "rss": 1}}')
            for t in range(1, int(until * 10) + 1, 2)]


EVALUATOR_CASES = [
    # (case, job, evaluator's output, at least, at most: seconds from start to the job's end)
    ("a script's idle evaluator is stopped", {"script": "train.py"}, [], 0.5, 5),
    ("not while it prints", {"script": "train.py"},
     [(t / 10, f"eval {t}") for t in range(2, 21, 2)], 2.5, 6),
    ("not while it uses CPU", {"script": "train.py"}, _busy(2.0), 2.3, 6),  # last at 1.9 s
    ("idle CPU is idle", {"script": "train.py"}, _busy(2.0, cpu=1.0), 0.5, 2.4),
    ("an entry's evaluator is waited for", {"entry": "a.b:c"}, [], 3.0, 8),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("job", "output", "least", "most"), [c[1:] for c in EVALUATOR_CASES],
                         ids=[c[0] for c in EVALUATOR_CASES])
def test_an_evaluator_that_never_exits_is_stopped_once_idle(tmp_path, job, output, least,
                                                            most):
    """The tutorial's SidecarEvaluator never exits: after training tfo waited the whole
    evaluator_seconds (60 s), silently. Now it says what it waits for, and a script's
    evaluator is stopped once it has been idle evaluator_idle_seconds (no lines, no CPU)."""
    data = {**spec(policy="never", worker=["localhost:1"], evaluator=["localhost:2"]),
            "job": job}
    data["timeouts"] = {**data["timeouts"], "evaluator_seconds": 3.0,
                        "evaluator_idle_seconds": 0.5}
    scripts = {"worker:0": Script([(0, 0.3, True)]),
               "evaluator:0": Script([(None, 0, True)], output={0: output})}
    said: list[str] = []
    clock = FakeClock()
    t0 = clock()
    result, _, ev = supervise(tmp_path, data, scripts, clock=clock,
                              echo=lambda task, line: said.append(line) if task == "tfo" else None)
    took = clock() - t0
    assert result.state is JobState.SUCCEEDED and least <= took <= most, took
    assert said[0] == "worker:0 finished"
    finishing = next(e for e in ev if e["event"] == "job_finishing")
    assert finishing["waiting"] == ["evaluator:0"] and finishing["evaluator_seconds"] == 3.0
    assert said[1].startswith("training finished; waiting up to 3 s "
                              "(timeouts.evaluator_seconds) for evaluator:0")
    idle = [e for e in ev if e["event"] == "job_evaluators_idle"]
    if "entry" in job:
        assert not idle and "still running 3 s after training finished" in said[-1]
    else:
        assert len(idle) == 1 and "idle 0.5 s after training finished" in said[-1]
    assert next(e for e in ev if e["event"] == "task_stopping"
                and e["task"] == "evaluator:0")["reason"] == "job finished"


# ---- lab hosts that go away (issue 31) ----------------------------------------------------

@pytest.mark.timeout(20)
def test_a_finished_worker_is_not_restarted_when_its_peer_is_lost_afterwards(tmp_path):
    """worker:0 finished (exit 0); worker:1 is lost later: only worker:1 comes back."""
    scripts = {"worker:0": Script([(0, 0.2, True)]),
               "worker:1": Script([(1, 0.6, True), (0, 0.2, True)])}
    result, started, events = supervise(tmp_path, spec(), scripts)
    assert result.state is JobState.SUCCEEDED, result.reason
    assert started == [("worker:0", 0), ("worker:1", 0), ("worker:1", 1)]
    restarted = [e["task"] for e in events if e["event"] == "task_restarted"]
    assert restarted == ["worker:1"]


@pytest.mark.timeout(30)
def test_a_host_that_cannot_be_reached_is_backed_off_and_its_peer_left_alone(tmp_path):
    """worker:1's host refuses connections: its restarts wait 1, 2, 4 s, its start is tried
    first, so the healthy worker:0 is not started and stopped again each time; the reason
    names the host."""
    plan = planned(tmp_path, spec(max_restarts=3))
    started: list[tuple[str, float]] = []

    def start(task: TaskPlan, attempt: int) -> FakeHandle:
        started.append((task.name, clock()))
        if task.name == "worker:1" and attempt >= 1:
            raise OSError("host lab2 (10.200.0.12:22): unreachable: Connection refused")
        script = Script([(1, 0.3, True)]) if task.name == "worker:1" else Script([(None, 0, True)])
        return FakeHandle(task, attempt, script, clock)

    clock = FakeClock()
    result = Supervisor(plan, start=start, echo=lambda task, line: None, clock=clock,
                        waiter=FakeWaiter(clock)).run()
    assert result.state is JobState.FAILED
    assert "lab2" in result.reason and "Connection refused" in result.reason
    # worker:0: its first start, and the restart after worker:1's loss; not once for each
    # of worker:1's failed starts, which are tried first.
    assert [n for n, _ in started].count("worker:0") == 2, started
    tries = [t for n, t in started if n == "worker:1"][1:]
    gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
    assert len(tries) == 3 and gaps[0] >= 0.9 and gaps[1] >= 1.9, gaps


@pytest.mark.timeout(20)
def test_a_restart_starts_at_once_and_only_a_crash_loop_waits(tmp_path):
    """Issue 39, on the fake clock: worker:1 dies after 100 s of training, then twice 2 s
    into its attempt (a crash loop), then succeeds. With the default backoff_seconds (1 s),
    the first restart starts the moment the group is stopped, the next after 1 s, then 2 s:
    the times the loop started each attempt say so."""
    data = spec(max_restarts=3)
    del data["restart"]["backoff_seconds"]  # the default
    clock = FakeClock()
    scripts = {"worker:0": Script([(None, 0, True), (None, 0, True), (None, 0, True),
                                   (0, 0.1, True)]),
               "worker:1": Script([(-9, 100, True), (3, 2, True), (3, 2, True),
                                   (0, 0.1, True)])}
    started_at: dict[tuple[str, int], float] = {}

    def start(task: TaskPlan, attempt: int) -> FakeHandle:
        started_at[task.name, attempt] = clock()
        return FakeHandle(task, attempt, scripts[task.name], clock)

    result = Supervisor(planned(tmp_path, data), start=start, echo=lambda task, line: None,
                        clock=clock, waiter=FakeWaiter(clock)).run()
    assert result.state is JobState.SUCCEEDED and result.restarts == 3
    restarted = [e["backoff"] for e in run_events(tmp_path / "run")
                 if e["event"] == "task_restarted" and e["task"] == "worker:1"]
    assert restarted == [0.0, 1.0, 2.0]
    # worker:1's exit → its attempt's start: the stop of worker:0 (its SIGTERM answered at
    # once here) and the wait, nothing else.
    ends = [started_at["worker:1", 0] + 100, started_at["worker:1", 1] + 2,
            started_at["worker:1", 2] + 2]
    gaps = [started_at["worker:1", n + 1] - end for n, end in enumerate(ends)]
    assert gaps[0] < 0.2 and 1.0 <= gaps[1] < 1.2 and 2.0 <= gaps[2] < 2.2, gaps
