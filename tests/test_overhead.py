"""Supervising idle tasks costs the coordinator next to nothing, and a task's death is
learnt from the kernel at once. Light tasks: bench/job.py --fake (listens on its port and
sleeps), no TensorFlow; and the supervisor's loop with scripted handles."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from bench.run import cpu_seconds
from orchestrator.launch import wakeup
from orchestrator.loop.supervise import IDLE_SECONDS, OUTPUT_SECONDS, JobState, Supervisor
from orchestrator.planning.plan import TaskPlan
from tests import golden
from tests.conftest import REPO, events, kill_tree, tfo_cmd, wait_until, write_spec
from tests.conftest import events as run_events
from tests.fakes import FakeClock, FakeHandle, FakeWaiter, Script, planned, spec

TASKS = 32


@pytest.mark.timeout(240)
def test_idle_tasks_cost_the_coordinator_almost_nothing(run_dir: Path, tmp_path: Path):
    spec = write_spec(tmp_path / "light.json", json.dumps({
        "name": "light", "job": {"script": "bench/job.py", "args": [
            "--fake", "--epochs", "1", "--steps_per_epoch", "1", "--step_seconds", "600"]},
        "tasks": {"worker": ["localhost:auto"] * TASKS}, "restart": {"policy": "never"}}))
    proc = subprocess.Popen(tfo_cmd("run", str(spec), "--run-dir", str(run_dir)), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        ready = wait_until(lambda: sum(e["event"] == "task_ready"
                                       for e in events(run_dir)) == TASKS, 180, 0.2)
        assert ready, "the light tasks did not all come up"
        time.sleep(0.5)
        coord = psutil.Process(proc.pid)
        c0, t0 = cpu_seconds(coord), time.monotonic()
        time.sleep(3)
        per_second = (cpu_seconds(coord) - c0) / (time.monotonic() - t0)
        # Sampling each task's process tree every second cost 0.10 of a core at 32 tasks. The
        # figure itself is the bench's (make bench); this catches that kind of regression with
        # room for a CI machine whose other test worker is training.
        assert per_second < 0.05, f"the coordinator used {per_second:.3f} of a core"

        victim = next(e["pid"] for e in events(run_dir) if e["event"] == "task_started"
                      and e["task"] == "worker:1")
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        assert proc.wait(60) == 1
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
    ev = events(run_dir)
    exited = next(e["time"] for e in ev if e["event"] == "task_exited")
    assert exited - killed < 0.5, f"the SIGKILL was noticed {exited - killed:.3f} s later"
    assert sum(e["event"] == "task_stopped" for e in ev) == TASKS - 1


@pytest.fixture
def golden_supervise(request, tmp_path):
    """The events of a scripted run on the real Waiter stay as recorded, as test_supervise's
    scenarios do (tests/data/golden/supervise/)."""
    yield
    golden.check_runs("supervise", request.node.nodeid, tmp_path)


class FdHandle(FakeHandle):
    """A FakeHandle with an exit fd, as a pidfd: a pipe that turns readable when it exits
    (its scripted exit, terminate or kill). Counts the supervisor's rounds (each takes its
    lines) and its polls."""

    def __init__(self, task: TaskPlan, attempt: int, script: Script) -> None:
        super().__init__(task, attempt, script)
        self._r, self._w = os.pipe()
        self.rounds = self.polls = 0
        self.exited_at = 0.0
        if self.code is not None:
            threading.Timer(self.after, self._exit, [self.code]).start()

    @property
    def exit_fd(self) -> int:
        return self._r

    def _exit(self, rc: int) -> None:
        if self._rc is None:
            self._rc, self.exited_at = rc, time.time()
            os.write(self._w, b"x")

    def poll(self) -> int | None:
        self.polls += 1
        return self._rc

    def terminate(self) -> None:
        self._exit(-15)

    def kill(self) -> None:
        self._exit(-9)

    def lines(self) -> list[str]:
        self.rounds += 1
        return super().lines()

    def close(self, timeout: float = 1.0) -> list[str]:
        rest = super().close(timeout)
        os.close(self._r)
        os.close(self._w)
        return rest


def supervise_fds(tmp_path: Path, spec: dict, scripts: dict[str, Script]):
    handles: list[FdHandle] = []

    def start(task: TaskPlan, attempt: int) -> FdHandle:
        handles.append(FdHandle(task, attempt, scripts.get(task.name, Script())))
        return handles[-1]

    result = Supervisor(planned(tmp_path, spec), start=start, echo=lambda task, line: None).run()
    events = run_events(tmp_path / "run")
    return result, handles, events


@pytest.mark.timeout(20)
@pytest.mark.usefixtures("golden_supervise")
def test_output_wakes_the_loop_at_most_every_output_seconds_and_exits_at_once(tmp_path):
    """64 tasks' usage markers alone came 32 times a second, each a round over every task:
    output waits for the next round, OUTPUT_SECONDS at most; an exit does not."""
    scripts = {f"worker:{i}": Script([(0, 1.0, True)]) for i in range(2)}
    flooding = threading.Event()

    def flood() -> None:  # what output readers do as their lines arrive
        while not flooding.wait(0.002):
            wakeup.notify()

    threading.Thread(target=flood, daemon=True).start()
    try:
        result, handles, events = supervise_fds(tmp_path, spec(), scripts)
    finally:
        flooding.set()
    assert result.state is JobState.SUCCEEDED
    for h in handles:
        # 1 s: about 1 / OUTPUT_SECONDS rounds; a round per notification was ~500.
        assert h.rounds <= 1.0 / OUTPUT_SECONDS + 5, f"{h.task.name}: {h.rounds} rounds"
        assert h.polls <= 3, f"{h.task.name} polled {h.polls} times: only its exit fd tells"
        exited = next(e["time"] for e in events if e["event"] == "task_exited"
                      and e["task"] == h.task.name)
        assert exited - h.exited_at < 0.05, "the exit was noticed late"


@pytest.mark.timeout(20)
@pytest.mark.usefixtures("golden_supervise")
def test_the_exit_fds_watched_follow_the_handles_across_a_restart(tmp_path):
    """The loop keeps one poll object: a closed exit fd left in it would wake every sleep
    at once (POLLNVAL), a new one left out would be noticed only by the idle timeout."""
    scripts = {"worker:0": Script([(None, 0, True), (0, 0.6, True)]),
               "worker:1": Script([(3, 0.2, True), (0, 0.6, True)])}
    result, handles, events = supervise_fds(tmp_path, spec(), scripts)
    assert result.state is JobState.SUCCEEDED and result.restarts == 1
    again = [h for h in handles if h.attempt == 1]
    assert len(again) == 2
    for h in again:
        assert h.rounds <= 0.6 / IDLE_SECONDS + 6, f"{h.task.name}: {h.rounds} rounds"
        exited = next(e["time"] for e in events if e["event"] == "task_exited"
                      and e["task"] == h.task.name and e["attempt"] == 1)
        assert exited - h.exited_at < 0.05, "the exit was noticed late"


@pytest.mark.timeout(20)
def test_the_loop_sleeps_until_the_kernel_says_a_task_exited(tmp_path: Path):
    handles: list[FdHandle] = []

    def start(task: TaskPlan, attempt: int) -> FdHandle:
        handles.append(FdHandle(task, attempt, Script([(0, 1.0, True)])))
        return handles[-1]

    plan = planned(tmp_path, spec())
    result = Supervisor(plan, start=start, echo=lambda task, line: None).run()
    assert result.state is JobState.SUCCEEDED
    ev = run_events(tmp_path / "run")
    for h in handles:
        # A 50 ms poll asked 20 times a second; sleeping on the fd, a few times at most.
        assert h.polls <= 10, f"{h.task.name} polled {h.polls} times in 1 s"
        exited = next(e["time"] for e in ev if e["event"] == "task_exited"
                      and e["task"] == h.task.name)
        # Woken by the fd, not by IDLE_SECONDS (0.25 s); room for a loaded machine.
        assert exited - h.exited_at < 0.1, "the exit was noticed late"


@pytest.mark.timeout(60)
def test_a_wrapper_waiting_for_its_script_s_port_costs_next_to_nothing(tmp_path: Path):
    """The wrapper polls a script task's port five times a second until it listens. Read
    from /proc/net/tcp that took 0.04 of a core here (a read walks every TCP hash bucket),
    taken from the task's TensorFlow import; over sock_diag it is next to nothing."""
    from orchestrator.launch.local import LocalHandle
    from orchestrator.launch.ports import free_ports
    from orchestrator.planning.plan import make_plan
    from orchestrator.planning.spec import parse_spec
    from orchestrator.runs.rundir import RunDir

    (tmp_path / "slow.py").write_text("import time\ntime.sleep(60)\n")  # never listens
    port = free_ports(1)[0]
    plan = make_plan(parse_spec({"name": "w", "job": {"script": "slow.py"},
                                 "tasks": {"worker": [f"localhost:{port}"]}}),
                     run_id="w", run_dir=tmp_path / "run", workdir=tmp_path)
    RunDir(plan.run_dir).create(plan.to_json())
    handle = LocalHandle(plan.tasks[0], 0)
    try:
        wrapper = psutil.Process(handle.pid)
        assert wait_until(lambda: wrapper.children(), 10), "the task never started"
        time.sleep(1.0)  # the wrapper's own start is over
        c0, t0 = cpu_seconds(wrapper), time.monotonic()
        time.sleep(3)
        per_second = (cpu_seconds(wrapper) - c0) / (time.monotonic() - t0)
        print(f"a waiting wrapper: {per_second:.4f} of a core")
        assert per_second < 0.02, f"the waiting wrapper used {per_second:.3f} of a core"
    finally:
        handle.kill()
        wait_until(lambda: handle.poll() is not None, 10)
        handle.close()



class SlowToStop(FakeHandle):
    """Exits `delay` s (of the fake clock) after its SIGTERM; counts how often it is asked
    from then on."""

    def __init__(self, task: TaskPlan, attempt: int, script: Script, clock: FakeClock,
                 delay: float) -> None:
        super().__init__(task, attempt, script, clock)
        self.delay, self.termed_at, self.asked = delay, None, 0

    def terminate(self) -> None:
        self.termed_at = self._clock()

    def poll(self) -> int | None:
        if self.termed_at is not None:
            self.asked += 1
            if self._rc is None and self._clock() - self.termed_at >= self.delay - 1e-9:
                self._rc = -15
        return super().poll()


def stop_many(tmp_path: Path, n: int) -> tuple[list[SlowToStop], int, int]:
    """`n` scripted workers on a fake clock; worker:1 fails after 1 s (restart never): the
    others are stopped and exit 0.05-0.5 s after their SIGTERM. The handles, the loop's
    waits after worker:1's exit, and the Python calls (sys.setprofile) from then on."""
    clock = FakeClock()
    data = spec(policy="never", worker=[f"localhost:{i + 1}" for i in range(n)])
    data["timeouts"]["grace_seconds"] = 5.0
    handles: list[SlowToStop] = []
    counted = {"calls": 0, "waits": 0}

    def start(task: TaskPlan, attempt: int) -> SlowToStop:
        script = Script([(1, 1.0, True)] if task.name == "worker:1" else [(None, 0, True)])
        handles.append(SlowToStop(task, attempt, script, clock,
                                  delay=0.05 * (1 + task.index % 10)))
        return handles[-1]

    def failed() -> bool:
        return len(handles) > 1 and handles[1]._rc is not None

    class Waiter(FakeWaiter):
        def wait(self, seconds: float, output: bool = True) -> tuple[set[int], bool]:
            counted["waits"] += failed()
            return super().wait(seconds, output)

    def count(frame, event, arg) -> None:  # noqa: ANN001 (sys.setprofile's)
        if event in ("call", "c_call") and failed():
            counted["calls"] += 1

    sup = Supervisor(planned(tmp_path / str(n), data), start=start,
                     echo=lambda task, line: None, clock=clock, waiter=Waiter(clock))
    sys.setprofile(count)
    try:
        result = sup.run()
    finally:
        sys.setprofile(None)
    assert result.state is JobState.FAILED and result.failed_task == "worker:1"
    return handles, counted["waits"], counted["calls"]


@pytest.mark.timeout(60)
def test_a_stop_asks_each_task_once_a_round_and_costs_the_loop_in_proportion(tmp_path: Path):
    """Stopping 63 tasks: each round asks only the tasks not seen exited yet, once each (it
    asked each twice: for the loop's wait and for the stop's step), and the loop's work
    grows with the number of tasks, not with its square (each task's restart unit was
    worked out before the first SIGTERM: 64² for 64 tasks)."""
    _, _, few_calls = stop_many(tmp_path, 8)
    many, waits, many_calls = stop_many(tmp_path, 64)
    for h in many[:1] + many[2:]:
        rounds = round(h.delay / 0.05)  # no exit fds here: the loop waits POLL_SECONDS
        assert h.asked <= rounds + 2, f"{h.task.name} asked {h.asked} times in {rounds} rounds"
    assert waits <= 12, f"{waits} waits for a stop whose last task exits in 0.5 s"
    assert many_calls / few_calls < 64 / 8 * 1.5, (few_calls, many_calls)
