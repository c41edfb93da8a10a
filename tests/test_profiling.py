"""Issue 41: a profiler service in every training task on a port of the plan, `tfo profile`
capturing them all at once, and the task that holds the others back named with its cause.
The verdict's rules on tables; one real job for the rest."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.launch.profiling import Profile, TaskProfile, lines, task_profile, verdict
from orchestrator.planning.plan import Plan, make_plan, profiler_key
from orchestrator.planning.spec import SpecError, parse_spec
from tests.conftest import REPO, events, kill_tree, run_tfo, tfo_cmd, wait_until

SPEC = {"name": "p", "job": {"entry": "worker_entry.examples.digits:train"},
        "tasks": {"chief": ["lab:21500"], "worker": ["lab:21501", "lab2:21502"],
                  "ps": ["lab2:21503"], "evaluator": ["lab:21504"]},
        "strategy": "parameter_server",
        "hosts": {"lab": {"address": "10.0.0.9", "workdir": "/srv/w"},
                  "lab2": {"address": "10.0.0.10", "workdir": "/srv/w"}}}
PORTS = {profiler_key(n): p for n, p in
         [("chief:0", 21510), ("worker:0", 21511), ("worker:1", 21512), ("ps:0", 21513)]}


def plan_of(spec: dict, ports: dict[str, int] | None = None) -> Plan:
    return make_plan(parse_spec(spec), run_id="r1", run_dir="/runs/r1", workdir="/w",
                     ports=PORTS if ports is None else ports)


def test_every_training_task_has_a_profiler_port_in_its_plan():
    plan = plan_of(SPEC)
    got = {t.name: (t.profiler_port, t.env.get("TFO_PROFILER_PORT")) for t in plan.tasks}
    assert got == {"chief:0": (21510, "21510"), "worker:0": (21511, "21511"),
                   "worker:1": (21512, "21512"), "ps:0": (21513, "21513"),
                   "evaluator:0": (None, None)}  # no evaluator trains
    # A rerun plans the same ports again: the profilers' travel with the tasks'.
    assert plan.ports() == {"worker:0": 21501, "worker:1": 21502, "chief:0": 21500,
                            "ps:0": 21503, "evaluator:0": 21504, **PORTS}
    again = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan


def test_profiler_false_starts_none():
    plan = plan_of({**SPEC, "profiler": False})
    assert all(t.profiler_port is None and "TFO_PROFILER_PORT" not in t.env for t in plan.tasks)
    with pytest.raises(SpecError, match="profiler"):
        parse_spec({**SPEC, "profiler": "sometimes"})


def test_a_plan_json_from_before_profilers_still_loads():
    data = json.loads(json.dumps(plan_of(SPEC).to_json()))
    for t in data["tasks"]:
        t.pop("profiler_port")
    assert [t.profiler_port for t in Plan.from_json(data).tasks] == [None] * 5


def test_a_profiler_port_on_another_tasks_port_is_named():
    data = json.loads(json.dumps(plan_of(SPEC).to_json()))
    assert [t["name"] for t in data["tasks"]][1:4] == ["worker:0", "worker:1", "chief:0"]
    data["tasks"][1]["profiler_port"] = 21500  # chief:0's own port, on the same host
    with pytest.raises(SpecError, match=r"tasks\[3\].port: 21500 on 10.0.0.9 is also "
                                        r"worker:0/profiler's"):
        Plan.from_json(data)


def test_allocate_gives_each_training_task_a_profiler_port():
    from orchestrator.launch.backends import Backends

    spec = parse_spec({"name": "a", "job": {"entry": "m:f"},
                       "tasks": {"worker": ["localhost:auto", "localhost:auto"],
                                 "evaluator": ["localhost"]}})
    backends = Backends(spec.hosts)
    try:
        ports = backends.allocate(spec)
    finally:
        backends.close()
    assert set(ports) == {"worker:0", "worker:1", "evaluator:0", "worker:0/profiler",
                          "worker:1/profiler"}
    assert len(set(ports.values())) == len(ports)


def test_a_port_another_process_holds_is_told():
    from worker_entry.profiler import taken

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert taken(port) == "in use by another process"
    assert taken(port) is None


def test_why_a_task_has_no_profiler_comes_from_its_log(tmp_path: Path):
    from orchestrator.launch.profiling import said_in_log

    log = tmp_path / "worker-2.log"
    log.write_text("===== tfo: worker:2 attempt 0 =====\n[tfo] profiler: port 41234 in use by "
                   "another process; this task has no profiler (tfo profile cannot capture it)\n")
    assert said_in_log(str(log)) == "profiler: port 41234 in use by another process"
    log.write_text("[worker] profiler: port 1 looks like ours, but not at a line's start\n")
    assert said_in_log(str(log)) is None
    assert said_in_log(str(tmp_path / "none.log")) is None


def tp(name: str, input: float, comm: float, step: float = 100.0) -> TaskProfile:
    return TaskProfile(name, steps=10, step_ms=step, input=input, communication=comm)


# (what, tasks, expected (task, cause) or None)
VERDICTS = [
    ("input-starved worker waits least in the all-reduce",
     [tp("worker:0", 0.0, 0.95), tp("worker:1", 0.93, 0.02)], ("worker:1", "input")),
    ("a CPU-starved worker: computing while the others wait",  # measured: 0.47 and 1.0
     [tp("worker:0", 0.0, 1.0), tp("worker:1", 0.01, 0.95), tp("worker:2", 0.0, 0.53)],
     ("worker:2", "compute")),
    ("a balanced job on a loaded machine: one 2 s trace's noise",  # measured, bal3 and bj2
     [tp("worker:0", 0.02, 1.0), tp("worker:1", 0.0, 0.65)], None),
    ("… another", [tp("worker:0", 0.0, 0.7), tp("worker:1", 0.0, 0.4)], None),
    ("balanced: every task waits a little", [tp("worker:0", 0.02, 0.1),
                                             tp("worker:1", 0.03, 0.14)], None),
    ("balanced within the spread", [tp("worker:0", 0.0, 0.5), tp("worker:1", 0.0, 0.1)], None),
    ("one task alone: nothing to compare", [tp("worker:0", 0.9, 0.0)], None),
    ("asynchronous steps (a PS job): the slowest worker",
     [tp("worker:0", 0.0, 0.3, step=50), tp("worker:1", 0.0, 0.35, step=120)],
     ("worker:1", "compute")),
    ("everyone waits in communication: said, no verdict", [tp("worker:0", 0.0, 0.8),
                                                             tp("worker:1", 0.0, 0.85)], None),
    ("a task without a trace is left out",
     [tp("worker:0", 0.0, 0.95), TaskProfile("worker:1", error="no trace")], None),
]


@pytest.mark.parametrize(("tasks", "expected"), [(t, e) for _, t, e in VERDICTS],
                         ids=[w for w, _, _ in VERDICTS])
def test_verdict(tasks, expected):
    got = verdict(tasks)
    assert (got and (got.task, got.cause)) == expected or (got is None and expected is None)


def test_the_helpers_figures_are_checked():
    ok = task_profile("worker:1", {"steps": 8, "step_ms": 200.0, "input_ms": 180.0,
                                   "communication_ms": 4.0, "device_collectives_ms": 0.0})
    assert (ok.input, ok.communication, round(ok.compute, 2)) == (0.9, 0.02, 0.08)
    assert task_profile("w", {"steps": 0, "step_ms": 0}).error.startswith("no step")
    assert task_profile("w", "garbage").error == "no answer"
    odd = task_profile("w", {"steps": 3, "step_ms": 10, "input_ms": -5, "communication_ms": 99})
    assert (odd.input, odd.communication) == (0.0, 1.0)


def test_the_table_names_the_slow_task_and_the_silent_one():
    found = Profile([tp("worker:0", 0.0, 0.95), tp("worker:1", 0.93, 0.02),
                     TaskProfile("worker:2", error="no trace: its profiler did not answer")],
                    session="/r/tensorboard/plugins/profile/s", logdir="/r/tensorboard")
    text = "\n".join(lines(found))
    assert "worker:1     10   100.0 ms    93%       5%             2%" in text, text
    assert "worker:2: no trace: its profiler did not answer" in text
    assert "slow: worker:1, cause input: 93% of its 100.0 ms step is waiting for input" in text
    assert "tensorboard --logdir /r/tensorboard" in text
    paced = lines(Profile([tp("worker:0", 0.0, 0.8), tp("worker:1", 0.0, 0.85)]))
    assert paced[-2] == ("slow: none; every task waits 80% or more of its step in "
                         "communication: the collectives (or a ps) set the pace, not one task")


SLOW_JOB = """\
name: slowin
job:
  script: tests/scripts/slow_input.py
  args: ["--slow_task", "worker:1", "--sleep_ms", "5", "--steps", "80"]
tasks:
  worker: [localhost:auto, localhost:auto, localhost:auto]
restart: {policy: on-failure, max_restarts: 3}
"""


def _training(run_dir: Path, task: str) -> bool:
    """The task reported progress since its latest start."""
    latest = [e["event"] for e in events(run_dir) if e.get("task") == task
              and e["event"] in ("task_started", "task_progress")]
    return "task_started" in latest and latest[-1] == "task_progress"


def _read_plan(run_dir: Path) -> dict | None:
    """plan.json once written whole (tfo writes it as the run starts)."""
    try:
        return json.loads((run_dir / "plan.json").read_text())
    except (OSError, ValueError):
        return None


@pytest.mark.tf
@pytest.mark.timeout(400)
def test_tfo_profile_names_the_input_starved_worker(tmp_path: Path, run_dir: Path):
    """A real 3-worker job whose worker:1 decodes slowly and whose worker:2 finds its profiler
    port taken: `tfo profile` writes a trace per answering task under the run's TensorBoard
    folder, prints the table, names worker:1 (input) and worker:2 (no profiler); every task
    trains on to its last step, and a finished run is refused."""
    spec = tmp_path / "slow.yaml"
    spec.write_text(SLOW_JOB)
    job = subprocess.Popen(tfo_cmd("run", str(spec), "--run-dir", str(run_dir), "--no-logs"),
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    squatter = socket.socket()
    try:
        plan = wait_until(lambda: _read_plan(run_dir), 120, interval=0.01)
        assert plan, "no plan.json"
        port = plan["tasks"][2]["profiler_port"]
        squatter.bind(("127.0.0.1", port))  # before worker:2 imports TensorFlow
        squatter.listen()
        # TensorFlow 2.21's profiler crashes a traced non-leader worker in about 1 capture in
        # 5 (a use-after-free inside it: docs/guide/slow.md); tfo says so, the job restarts it,
        # and the user captures again: so does this test, up to 3 times, each capture once
        # worker:1 trains again. Only that crash, said, excuses a capture that names nobody.
        said = []
        for _ in range(3):
            assert wait_until(lambda: _training(run_dir, "worker:1"), 240, interval=0.5), \
                "no training"
            # 5 s: at load 40 a step took 1.6 s, and a 2 s trace caught one step of one task
            got = run_tfo("profile", str(run_dir), "--seconds", "5", timeout=150)
            said.append(got.stdout)
            if "slow: worker:1, cause input" in got.stdout:
                assert got.returncode == 0, got.output
                break
            assert "worker:1: exited while traced (signal" in got.stdout, got.output
            # exit 1 when the crash took every trace with it (none could be read)
            assert got.returncode == (0 if "traces: " in got.stdout else 1), got.output
        assert "slow: worker:1, cause input" in got.stdout, "\n".join(said)
        assert (f"worker:2: no trace: its profiler did not answer (profiler: port {port} in "
                "use by another process)") in got.stdout, got.output
        row = next(line for line in got.stdout.splitlines() if line.startswith("worker:1 "))
        assert int(row.split()[-3].rstrip("%")) >= 50, row  # its input share
        where = next(line for line in got.stdout.splitlines() if line.startswith("traces: "))
        traces = sorted(p.name for p in Path(where.split()[1]).glob("*.xplane.pb"))
        assert traces == ["worker_0.xplane.pb", "worker_1.xplane.pb"]
        # TensorFlow's profiler can crash a traced worker (profiling.py's doc): said, as tfo
        # saw it, and the job restarts it by its policy.
        assert got.stdout.splitlines()[-1].startswith("note: TensorFlow's profiler can crash")
        assert "restart policy worker: on-failure" in got.stdout
        crashed = {e["task"] for e in events(run_dir) if e["event"] == "task_exited"
                   and str(e.get("how", "")).startswith("signal")}
        for name in crashed:
            assert f"{name}: exited while traced (signal" in got.stdout, got.output
        assert "profiler: port" in (run_dir / "logs/worker-2.log").read_text()
        print(got.stdout)  # the closing note's table
        out, _ = job.communicate(timeout=300)
        # Training went on through the capture to its last step in every task. (Not the exit
        # code alone: once a worker:2 that had finished its 80 steps hung in TensorFlow's end
        # until the stall check stopped it, as MWMS tasks sometimes do at load 40.)
        last = {}
        for e in events(run_dir):
            if e["event"] == "task_progress":
                last[e["task"]] = max(last.get(e["task"], 0), e.get("step") or 0)
        assert last == {"worker:0": 80, "worker:1": 80, "worker:2": 80}, out[-3000:]
    finally:
        squatter.close()
        if job.poll() is None:
            kill_tree(job.pid)
            job.wait()
    started = time.monotonic()
    over = run_tfo("profile", str(run_dir), timeout=60)
    assert over.returncode == 2 and "the run is over" in over.stderr, over.output
    assert time.monotonic() - started < 30


def test_one_capture_at_a_time_per_run(tmp_path: Path):
    from orchestrator.launch.profiling import ProfileError, capture_lock

    held = pytest.raises(ProfileError, match=r"another tfo profile \(pid \d+\) is capturing")
    with capture_lock(str(tmp_path)), held, capture_lock(str(tmp_path)):
        pass
    with capture_lock(str(tmp_path)):  # free again once the first ended
        pass


# (what, events, expected); the capture ran from t=100 to t=110, of worker:0 and worker:1
LOST = [
    ("a traced task that crashed while traced",
     [{"event": "task_exited", "task": "worker:1", "time": 108.0, "how": "signal SIGSEGV"}],
     {"worker:1": "signal SIGSEGV"}),
    ("reaped by the loop a little after the trace ended",
     [{"event": "task_exited", "task": "worker:1", "time": 113.0, "how": "signal SIGABRT"}],
     {"worker:1": "signal SIGABRT"}),
    ("an exit before the capture, one long after, an untraced task's: none",
     [{"event": "task_exited", "task": "worker:1", "time": 99.0, "how": "signal SIGSEGV"},
      {"event": "task_exited", "task": "worker:0", "time": 130.0, "how": "exit 0"},
      {"event": "task_exited", "task": "worker:2", "time": 105.0, "how": "signal SIGSEGV"}],
     {}),
    ("progress is no exit", [{"event": "task_progress", "task": "worker:0", "time": 105.0}], {}),
    ("an exit code without its words", [{"event": "task_exited", "task": "worker:0",
                                         "time": 101.0, "returncode": 1}],
     {"worker:0": "exit 1"}),
]


@pytest.mark.parametrize(("events", "expected"), [(e, x) for _, e, x in LOST],
                         ids=[w for w, _, _ in LOST])
def test_a_task_lost_while_traced_is_named(events, expected):
    from orchestrator.launch.profiling import lost_while_traced

    assert lost_while_traced(events, ["worker:0", "worker:1"], 100.0, 110.0) == expected


def test_the_table_says_the_profiler_can_crash_a_task():
    found = Profile([tp("worker:0", 0.0, 0.3), tp("worker:1", 0.0, 0.3)],
                    lost={"worker:1": "signal SIGSEGV"}, restart="worker: never")
    text = "\n".join(lines(found))
    assert "worker:1: exited while traced (signal SIGSEGV)" in text
    assert lines(found)[-1].startswith("note: TensorFlow's profiler can crash a traced task")
    assert lines(found)[-1].endswith("; restart policy worker: never")


def test_tfo_profile_fails_when_no_task_was_traced(tmp_path: Path, monkeypatch):
    """The bench's capture whose traced worker:1 crashed: no trace written, every task "no
    answer"; the table is printed and the command exits 1 (it said 0: a capture that
    produced nothing looked like one that worked). One task traced is a capture: exit 0."""
    from typer.testing import CliRunner

    from orchestrator.cli import commands
    from orchestrator.launch import profiling

    crashed = Profile([TaskProfile("worker:0", error="no answer"),
                       TaskProfile("worker:1", error="no answer")],
                      errors=["capture failed: UNAVAILABLE: No trace event was collected"],
                      lost={"worker:1": "signal SIGSEGV"})
    half = Profile([tp("worker:0", 0.0, 0.3), TaskProfile("worker:1", error="no answer")],
                   session="/r/tensorboard/plugins/profile/x", logdir="/r/tensorboard")
    assert not crashed.traced and half.traced
    (tmp_path / "events.jsonl").write_text("")
    for found, code in ((crashed, 1), (half, 0)):
        monkeypatch.setattr(profiling, "profile", lambda *a, found=found: found)
        got = CliRunner().invoke(commands.app, ["profile", str(tmp_path)])
        assert got.exit_code == code, got.output
        assert "worker:1" in got.output


@pytest.mark.tf
@pytest.mark.timeout(400)
def test_tfo_profile_captures_a_parameter_server_job(tmp_path: Path, run_dir: Path):
    """A ParameterServer job (TensorFlow's tutorial, Model.fit): its chief, workers and ps
    each serve a profiler; one `tfo profile` writes a trace per task, prints a row for each,
    and the chief trains on after it."""
    job = subprocess.Popen(
        tfo_cmd("run", "--run-dir", str(run_dir), "--strategy", "ps", "--workers", "2",
                "--ps", "1", "--no-logs", "--", "python", "tests/scripts/ps_tutorial.py",
                "--cluster", "tf_config", "--epochs", "1000", "--steps_per_epoch", "10"),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        def steps() -> int:  # a ParameterServer fit tells its epochs (progress.fit)
            return max([e.get("epoch") or 0 for e in events(run_dir)
                        if e["event"] == "task_epoch" and e["task"] == "chief:0"] + [0])
        assert wait_until(lambda: steps() >= 2, 240, interval=0.5), "no training"
        got = run_tfo("profile", str(run_dir), "--seconds", "3", timeout=200)
        assert got.returncode == 0, got.output
        rows = {line.split()[0] for line in got.stdout.splitlines()
                if line.split() and line.split()[0] in ("chief:0", "worker:0", "worker:1",
                                                        "ps:0")}
        assert rows == {"chief:0", "worker:0", "worker:1", "ps:0"}, got.output
        where = next(line for line in got.stdout.splitlines() if line.startswith("traces: "))
        traces = sorted(p.name for p in Path(where.split()[1]).glob("*.xplane.pb"))
        assert traces == ["chief_0.xplane.pb", "ps_0.xplane.pb", "worker_0.xplane.pb",
                          "worker_1.xplane.pb"], got.output
        print(got.stdout)
        assert "chief:0: " not in got.stdout, got.output  # the chief's steps are analysed
        for server in ("worker:0", "worker:1", "ps:0"):
            assert f"{server}: no step of its own (it serves the chief's closures)" in \
                got.stdout, got.output
        crashed = {e["task"] for e in events(run_dir) if e["event"] == "task_exited"}
        for name in crashed:
            assert f"{name}: exited while traced" in got.stdout, got.output
        after = steps()
        assert wait_until(lambda: steps() > after, 120, interval=0.5), "no epoch after"
    finally:
        if job.poll() is None:
            kill_tree(job.pid)
            job.wait()
