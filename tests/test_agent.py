"""The host agent (worker_entry.agent) on its own, over pipes as sshd would give it: frames
in, frames out; a task's output cannot pass for a frame."""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.conftest import REPO, wait_until
from tests.helpers import Agent
from tests.procs import alive
from worker_entry import frames

pytestmark = pytest.mark.timeout(60)


def test_a_task_cannot_forge_frames_for_another_task_or_the_agent():
    agent = Agent()
    try:
        forged = (frames.frame(frames.EXITED, 2, b"0") + frames.frame(frames.OUTPUT, 2, b"pwn")
                  + frames.frame(frames.ALIVE) + frames.SYNC)
        agent.start(1, f"import os; os.write(1, {forged!r}); import time; time.sleep(0.3)")
        agent.start(2, "import time; time.sleep(1.5); print('honest')")
        assert agent.wait(frames.STARTED, 1).isdigit()
        assert agent.wait(frames.EXITED, 1) == b"0"
        assert agent.output(1) == forged  # its bytes, as it printed them, and only its own
        assert agent.wait(frames.EXITED, 2) == b"0"
        assert agent.output(2) == b"honest\n"
        exits = [(k, s) for k, s, _ in agent.got if k == frames.EXITED]
        assert exits == [(frames.EXITED, 1), (frames.EXITED, 2)]
    finally:
        agent.close()


def test_signals_reach_the_task_and_its_exit_says_which():
    agent = Agent()
    try:
        agent.start(7, "import time; print('up', flush=True); time.sleep(60)")
        agent.wait(frames.STARTED, 7)
        until = time.monotonic() + 10
        while b"up" not in agent.output(7) and time.monotonic() < until:
            agent.pump()
        agent.send(frames.SIGNAL, 7, b"KILL")
        assert agent.wait(frames.EXITED, 7) == str(-signal.SIGKILL).encode()
        agent.start(8, "raise SystemExit(3)")
        assert agent.wait(frames.EXITED, 8) == b"3"
        agent.send(frames.START, 9, json.dumps({"command": ["/nonexistent/python"], "env": {},
                                                "cwd": str(REPO)}).encode())
        assert b"/nonexistent/python" in agent.wait(frames.FAILED, 9)
    finally:
        agent.close()


def test_silence_from_the_coordinator_ends_every_task_and_the_agent():
    agent = Agent(lifeline=2)
    try:
        agent.start(1, "import time; time.sleep(60)")
        agent.start(2, "import time; time.sleep(60)")
        pids = [int(agent.wait(frames.STARTED, s)) for s in (1, 2)]
        # No BEAT frames from us: after 2 s the agent takes us for gone.
        assert wait_until(lambda: agent.proc.poll() is not None, 15), "the agent outlived it"
        for pid in pids:
            assert wait_until(lambda p=pid: not alive(p), 5), f"task {pid} outlived it"
    finally:
        agent.close()


def test_what_a_killed_task_left_is_killed_and_its_neighbours_are_not():
    """A task SIGKILLed with its group leaves a child in a session of its own: it comes to
    the agent (a subreaper), which kills it; the host's other task, and its child, run on."""
    spawn = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
             "'import time; time.sleep(60)'], start_new_session={detach}); "
             "print(p.pid, flush=True); time.sleep(60)")
    agent = Agent()
    try:
        agent.start(1, spawn.format(detach=True))
        agent.start(2, spawn.format(detach=False))
        pids = {s: int(agent.wait(frames.STARTED, s)) for s in (1, 2)}
        until = time.monotonic() + 15
        while not all(agent.output(s).strip() for s in (1, 2)) and time.monotonic() < until:
            agent.pump()
        left, neighbour = (int(agent.output(s)) for s in (1, 2))
        agent.send(frames.SIGNAL, 1, b"KILL")
        assert agent.wait(frames.EXITED, 1) == str(-signal.SIGKILL).encode()
        assert wait_until(lambda: not alive(left), 5), "the detached child outlived its task"
        assert alive(pids[2]) and alive(neighbour)
    finally:
        agent.close()


def test_a_host_reader_never_waits_on_one_tasks_lines(tmp_path):
    """An SSH task's output is fed by its host's one reader (no thread of its own): a task
    whose lines the supervisor has not taken must not stop its neighbours' output. Past
    the queue's size the lines are dropped for the supervisor, counted; the log has all."""
    from orchestrator.launch.output import FLOOD_LINES, QUEUE_CHARS, TaskOutput

    log = tmp_path / "t.log"
    out = TaskOutput(str(log), None, "fed")
    line = b"x" * 60_000 + b"\n"  # under the flood's line count, over the queue's size
    count = QUEUE_CHARS // 60_000 + 20
    assert count < FLOOD_LINES
    for _ in range(count):
        out.feed(line)  # returns at once: nothing takes the lines meanwhile
    out.end()
    assert out.done
    got = out.lines()
    assert got[-1].startswith("[tfo] ") and "lines not shown" in got[-1]
    assert len(got) - 1 + int(got[-1].split()[1]) == count
    assert log.read_bytes() == line * count


@pytest.mark.parametrize(("lifeline", "beat"), [(30, 3.0), (5, 1.0), (3, 1.0), (120, 12.0)])
def test_a_host_s_beats_are_a_tenth_of_its_lifeline_and_not_under_a_second(lifeline, beat):
    from worker_entry.markers import beat_seconds

    assert beat_seconds(lifeline) == beat


@pytest.mark.parametrize(("now", "due"), [(0.0, 2.0), (0.5, 2.0), (1.999, 2.0), (2.0, 4.0),
                                          (1001.3, 1002.0)])
def test_a_host_s_wrappers_measure_usage_together(now, due):
    """On the machine's monotonic clock's multiples of USAGE_SECONDS: whenever each started,
    a host's wrappers report at the same moments (its agent sends them in one write)."""
    from worker_entry.markers import next_usage

    assert next_usage(now, 2.0) == due


@pytest.mark.parametrize(("refusals", "slept", "opened"), [
    (0, [], True),
    (2, [0.05, 0.2], True),  # a slot freed a moment after the last session's close
    (4, [0.05, 0.2, 0.5, 1.0], True),
    (5, [0.05, 0.2, 0.5, 1.0], False),  # still full: MaxSessions itself, said so
])
def test_a_refused_session_is_tried_again_briefly_then_named(refusals, slept, opened):
    import paramiko

    from orchestrator.launch.ssh.hostagent import SshError, open_session

    class Transport:
        tries = 0

        def open_session(self, timeout: float) -> str:
            self.tries += 1
            if self.tries <= refusals:
                raise paramiko.ChannelException(2, "Connect failed")
            return "channel"

    waits: list[float] = []
    if opened:
        assert open_session(Transport(), "lab1", "10.0.0.1", 5.0, waits.append) == "channel"
    else:
        with pytest.raises(SshError, match=r"host lab1 \(10.0.0.1\): sshd refused a new "
                                           r"session .*MaxSessions"):
            open_session(Transport(), "lab1", "10.0.0.1", 5.0, waits.append)
    assert waits == slept
