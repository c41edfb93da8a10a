"""Did a task train in the plan's cluster (orchestrator/loop/joined.py): the verdict as tables,
the DTensor variables the plan gives, and the `joined` marker as the coordinator reads it.
TensorFlow runs of the same are in tests/test_alone.py."""

from __future__ import annotations

import json
import re

import pytest

from orchestrator.api import spec_from_flags
from orchestrator.loop import decide
from orchestrator.loop.joined import Planned, judge
from orchestrator.loop.markers import BadMarker, Joined, read_marker
from orchestrator.loop.supervise import JobState
from orchestrator.planning.plan import make_plan
from orchestrator.planning.spec import parse_spec
from orchestrator.planning.strategy import RULES
from tests.conftest import run_tfo
from tests.fakes import FakeClock, Script, spec, steps, supervise
from worker_entry import markers as m
from worker_entry.markers import Role, Strategy, dtensor_env

MWMS, PS = Strategy.MULTI_WORKER_MIRRORED, Strategy.PARAMETER_SERVER
TWO = {"worker": ["localhost:1001", "localhost:1002"]}
WITH_CHIEF = {"chief": ["localhost:1000"], "worker": ["localhost:1001", "localhost:1002"]}
PS_PLAN = {"chief": ["localhost:1000"], "ps": ["localhost:1003"],
           "worker": ["localhost:1001", "localhost:1002"]}
IN_PROCESS = {"worker": ["localhost:5001", "localhost:5002", "localhost:5003"],
              "ps": ["localhost:5004", "localhost:5005"]}


def joined(via: str = "MultiWorkerMirroredStrategy", cluster: dict | None = None,
           member: str | None = None, **more: object) -> Joined:
    return Joined(event=m.JOINED, via=via, cluster=cluster or {}, member=member, **more)


# (case, the plan's task and cluster, strategy, its joins) -> None (together) or the words
# the verdict's cause and fix hold.
CASES = [
    ("MWMS on TF_CONFIG", "worker:1", TWO, MWMS, [joined(cluster=TWO, member="worker:1")],
     None),
    ("written 127.0.0.1", "worker:0", TWO, MWMS, [joined(cluster={"worker": [
        "127.0.0.1:1001", "127.0.0.1:1002"]}, member="worker:0")], None),
    ("with a chief", "chief:0", WITH_CHIEF, MWMS, [joined(cluster=WITH_CHIEF,
                                                         member="chief:0")], None),
    ("one process alone: nothing to join", "worker:0", {"worker": ["localhost:1"]}, MWMS, [],
     None),
    ("no strategy", "worker:1", TWO, MWMS, [],
     ("built no distribution strategy", "tf.distribute.MultiWorkerMirroredStrategy()")),
    ("MirroredStrategy", "worker:0", TWO, MWMS, [joined("MirroredStrategy")],
     ("built `MirroredStrategy`", "use `tf.distribute.MultiWorkerMirroredStrategy()`")),
    ("OneDeviceStrategy beside MWMS: joined", "worker:0", TWO, MWMS,
     [joined(cluster=TWO, member="worker:0"), joined("OneDeviceStrategy")], None),
    ("MWMS with no TF_CONFIG", "worker:0", TWO, MWMS, [joined(cluster={})],
     ("found no cluster: TF_CONFIG was missing", "with TF_CONFIG as tfo set it")),
    ("other peers", "worker:0", TWO, MWMS, [joined(cluster={"worker": [
        "host9:1", "host9:2"]}, member="worker:0")],
     ("names other peers", "TFConfigClusterResolver()")),
    ("another task", "worker:1", TWO, MWMS, [joined(cluster=TWO, member="worker:0")],
     ("says it is worker:0, and tfo started it as worker:1", "read the task from TF_CONFIG")),
    ("PS strategy in an MWMS job", "worker:0", TWO, MWMS,
     [joined("ParameterServerStrategy", cluster=TWO)],
     ("built ParameterServerStrategy in a multi_worker_mirrored job", "--strategy ps")),
    ("PS chief on TF_CONFIG", "chief:0", PS_PLAN, PS,
     [joined("ParameterServerStrategy", cluster=PS_PLAN, member="chief:0")], None),
    ("PS chief, SimpleClusterResolver without itself", "chief:0", PS_PLAN, PS,
     [joined("ParameterServerStrategy", cluster={k: v for k, v in PS_PLAN.items()
                                                 if k != "chief"})], None),
    ("PS tutorial: in-process cluster", "chief:0", PS_PLAN, PS,
     [joined("ParameterServerStrategy", cluster=IN_PROCESS,
             in_process=[a for v in IN_PROCESS.values() for a in v])],
     ("the chief built its own in-process cluster (5 servers", "TFConfigClusterResolver()")),
    ("PS chief that serves its own address too", "chief:0", PS_PLAN, PS,
     [joined("ParameterServerStrategy", cluster=PS_PLAN, member="chief:0",
             in_process=["localhost:1000"])], None),
    ("PS chief with no strategy", "chief:0", PS_PLAN, PS, [],
     ("built no distribution strategy", "ParameterServerStrategy(")),
    ("MWMS in a PS job", "chief:0", PS_PLAN, PS, [joined(cluster=PS_PLAN, member="chief:0")],
     ("built MultiWorkerMirroredStrategy in a parameter_server job", "--strategy mwms")),
    ("DTensor, one mesh of 2", "worker:1", TWO, MWMS,
     [joined("DTensor", cluster=TWO, member="worker:1", clients=2, client=1)], None),
    ("DTensor with a chief: client 1 is worker 0", "worker:0", WITH_CHIEF, MWMS,
     [joined("DTensor", cluster={"worker": WITH_CHIEF["chief"] + WITH_CHIEF["worker"]},
             member="worker:1", clients=3, client=1)], None),
    ("DTensor without tfo's variables: 1 client", "worker:1", TWO, MWMS,
     [joined("DTensor", member="localhost:0", clients=1, client=0)],
     ("DTensor saw 1 client(s)", "leave the DTENSOR_* variables")),
    ("DTensor, another client id", "worker:1", TWO, MWMS,
     [joined("DTensor", cluster=TWO, clients=2, client=0)],
     ("DTensor saw 2 client(s) (client 0)", "DTENSOR_*")),
]


@pytest.mark.parametrize(("task", "cluster", "strategy", "joins", "want"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_verdict(task: str, cluster: dict, strategy: Strategy, joins: list[Joined],
                     want: tuple[str, str] | None):
    alone = judge(Planned(task, strategy, cluster), joins)
    if want is None:
        assert alone is None
        return
    assert alone is not None
    cause, fix = want
    assert cause in alone.cause and fix in alone.fix, (alone.cause, alone.fix)
    lines = alone.lines()
    assert lines[0].startswith(f"{task} trains alone: it joined ")
    assert lines[-2] == f"  likely cause: {alone.cause}" and lines[-1] == f"  fix: {alone.fix}"
    assert alone.reason().startswith(f"{task} trained alone (")
    assert alone.fields()["cause"] == alone.cause


def test_a_ps_chief_alone_names_the_servers_nobody_used():
    alone = judge(Planned("chief:0", PS, PS_PLAN), [])
    assert alone is not None
    assert alone.unused == ("ps:0", "worker:0", "worker:1")
    assert "  ps:0, worker:0, worker:1 serve, and no chief uses them" in alone.lines()
    assert alone.fields()["unused"] == ["ps:0", "worker:0", "worker:1"]
    assert alone.planned == "the plan's cluster of 4 (1 chief, 1 ps, 2 worker)"


@pytest.mark.parametrize(("strategy", "cluster", "role", "index", "want"), [
    (MWMS, TWO, Role.WORKER, 1, {"DTENSOR_JOBS": "localhost:1001,localhost:1002",
                                  "DTENSOR_NUM_CLIENTS": "2", "DTENSOR_CLIENT_ID": "1",
                                  "DTENSOR_JOB_NAME": "worker"}),
    # TensorFlow's own (distribute/experimental/multi_worker_mirrored_strategy.py): the
    # chief first, then the workers, on TF_CONFIG's ports, job name worker.
    (MWMS, WITH_CHIEF, Role.CHIEF, 0, {
        "DTENSOR_JOBS": "localhost:1000,localhost:1001,localhost:1002",
        "DTENSOR_NUM_CLIENTS": "3", "DTENSOR_CLIENT_ID": "0", "DTENSOR_JOB_NAME": "worker"}),
    (MWMS, WITH_CHIEF, Role.WORKER, 1, {
        "DTENSOR_JOBS": "localhost:1000,localhost:1001,localhost:1002",
        "DTENSOR_NUM_CLIENTS": "3", "DTENSOR_CLIENT_ID": "2", "DTENSOR_JOB_NAME": "worker"}),
    (MWMS, {"worker": ["localhost:1"]}, Role.WORKER, 0, {}),  # one process: local mode
    (MWMS, TWO, Role.EVALUATOR, 0, {}),
    (PS, PS_PLAN, Role.CHIEF, 0, {}),
])
def test_dtensor_clients_are_the_chief_and_the_workers(strategy, cluster, role, index, want):
    """The task sets them from its TF_CONFIG (worker_entry/runner.py), so plan.json does not
    carry the cluster once more per task."""
    assert dtensor_env(strategy.value, cluster, role.value, index) == want


def test_the_plan_says_whether_the_job_expects_a_cluster():
    spec = parse_spec({"name": "d", "job": {"script": "train.py"},
                       "tasks": {"worker": ["localhost:1001", "localhost:1002"]}})
    plan = make_plan(spec, run_id="r", run_dir="/tmp/r", workdir="/tmp")
    assert plan.policy.expect_cluster is True
    off = parse_spec({**spec.model_dump(exclude_defaults=True), "expect_cluster": False})
    assert make_plan(off, run_id="r", run_dir="/tmp/r", workdir="/tmp").policy \
        .expect_cluster is False


def test_a_joined_marker_is_checked_as_untrusted_input():
    line = m.line(m.JOINED, via="MultiWorkerMirroredStrategy", cluster=TWO, member="worker:0",
                  in_process=[])
    marker = read_marker(line)
    assert isinstance(marker, Joined) and marker.cluster == TWO
    for bad in ({"via": "x", "cluster": {"worker": "localhost:1"}},  # not a list
                {"via": "", "cluster": {}},
                {"via": "x", "cluster": {}, "clients": -1},
                {"via": "x", "cluster": {}, "task": "worker:0"}):  # the record's own key
        with pytest.raises(BadMarker):
            read_marker(m.MARK + json.dumps({"event": m.JOINED, **bad}))


POLICY = make_plan(parse_spec({"name": "d", "job": {"script": "t.py"}, "tasks": {
    "worker": ["localhost:1"]}}), run_id="r", run_dir="/tmp/r", workdir="/tmp").policy
OFF = POLICY.__class__(**{**POLICY.__dict__, "expect_cluster": False})


@pytest.mark.parametrize(("role", "strategy", "policy", "stepped", "ended_well", "built",
                          "want"), [
    (Role.WORKER, MWMS, POLICY, True, False, False, True),  # its first step
    (Role.WORKER, MWMS, OFF, True, False, False, False),  # expect_cluster: false
    (Role.EVALUATOR, MWMS, POLICY, True, False, False, False),  # a sidecar
    (Role.WORKER, PS, POLICY, True, False, False, False),  # a server takes no steps
    (Role.WORKER, MWMS, POLICY, False, True, True, True),  # ended well, built a strategy
    (Role.WORKER, MWMS, POLICY, False, True, False, False),  # no step, no strategy: no training
    (Role.CHIEF, PS, POLICY, False, True, False, True),  # a PS chief that never stepped
    (Role.CHIEF, PS, POLICY, False, False, False, False),  # failed: the failure says enough
])
def test_when_a_task_is_judged(role, strategy, policy, stepped, ended_well, built, want):
    assert decide.judged_now(role, policy, RULES[strategy], stepped, ended_well,
                             built) is want


# ---- the loop: the verdict's effect (scripted tasks on a fake clock) ---------------------

def alone_job(tmp_path, **more) -> tuple:
    """Two workers that step without having built a strategy (a script that ignores
    TF_CONFIG), each exiting 0 a moment after its steps: their last steps reach the loop
    with their exits, in the same round."""
    scripts = {n: Script([(0, 0.35, False)], {0: steps(0.3)}) for n in ("worker:0", "worker:1")}
    lines: list[str] = []
    result, _, events = supervise(tmp_path, {**spec(policy="on-failure"), **more}, scripts,
                                  echo=lambda task, line: lines.append(f"[{task}] {line}"),
                                  clock=FakeClock())
    return result, events, lines


@pytest.mark.timeout(20)
def test_tasks_that_train_alone_fail_the_job_though_every_one_exits_0(tmp_path):
    result, events, lines = alone_job(tmp_path)
    assert result.state is JobState.FAILED and result.exit_code == 1
    assert result.reason.startswith("worker:0 trained alone (no cluster: no strategy): "), \
        result.reason
    assert result.failed_task == "worker:0"
    told = [e for e in events if e["event"] == "task_alone"]
    assert [e["task"] for e in told][0] == "worker:0"
    assert "[tfo] worker:0 trains alone: it joined no cluster: no strategy, not the plan's " \
        "cluster of 2 (2 worker)" in lines
    assert not [e for e in events if e["event"] == "task_restarted"]  # nothing restarts


@pytest.mark.timeout(20)
def test_expect_cluster_false_lets_them_train_alone(tmp_path):
    result, events, _ = alone_job(tmp_path, expect_cluster=False)
    assert result.state is JobState.SUCCEEDED, result.reason
    assert not [e for e in events if e["event"] == "task_alone"]


@pytest.mark.timeout(60)
def test_tfo_plan_shows_the_dtensor_clients_and_the_cluster_check():
    res = run_tfo("plan", "--workers", "2", "--chief", "--", "python",
                  "tests/scripts/dtensor_mlp.py")
    assert res.returncode == 0, res.stderr
    out = " ".join(res.stdout.split())  # rich wraps long lines
    jobs = re.search(r"DTENSOR_JOBS=(\S+) DTENSOR_NUM_CLIENTS=3 DTENSOR_JOB_NAME=worker; "
                     r"DTENSOR_CLIENT_ID: worker:0 1, worker:1 2, chief:0 0", out)
    cluster = json.loads(re.search(r"^cluster: (.*)$", res.stdout, re.M)[1])
    assert jobs and jobs[1].split(",") == cluster["chief"] + cluster["worker"], out
    assert "cluster check: a training task that trains outside this cluster fails the job" \
        in out
    res = run_tfo("plan", "--workers", "2", "--independent", "--", "python",
                  "tests/scripts/dtensor_mlp.py")
    assert "cluster check: off (expect_cluster: false)" in " ".join(res.stdout.split())
    assert "expect_cluster: false" in res.stdout  # the cluster file it makes
    assert spec_from_flags(workers=2, script="t.py", independent=True)["expect_cluster"] \
        is False
