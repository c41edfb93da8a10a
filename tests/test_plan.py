"""The plan: a pure function from spec to every task's TF_CONFIG, command and env."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.planning.plan import Placement, Plan, json_text, make_plan
from orchestrator.planning.policy import RestartPolicy
from orchestrator.planning.spec import SpecError, parse_spec
from orchestrator.planning.strategy import RULES
from tests.conftest import REPO, run_tfo
from worker_entry.markers import Role, Strategy

FULL = {
    "name": "full",
    "job": {"entry": "worker_entry.examples.digits:train", "model_dir": "{run_dir}/m"},
    "tasks": {"chief": ["localhost:21000"], "worker": ["localhost:21001", "localhost:21002"],
              "evaluator": ["localhost:21003"]},
}


def plan_of(spec: dict, **kw):
    return make_plan(parse_spec(spec), run_id="r1", run_dir="/runs/r1", workdir="/w", **kw)


def test_tf_config_per_task():
    plan = plan_of(FULL)
    assert [t.name for t in plan.tasks] == ["worker:0", "worker:1", "chief:0", "evaluator:0"]
    cluster = {"chief": ["localhost:21000"], "worker": ["localhost:21001", "localhost:21002"]}
    for t in plan.tasks:
        assert t.tf_config == {"cluster": cluster, "task": {"type": t.role, "index": t.index}}
        assert json.loads(t.env["TF_CONFIG"]) == t.tf_config
        assert t.env["TFO_TASK"] == t.name
        # The task's default (worker_entry/defaults.py), so that the spec or the user's
        # environment can say otherwise.
        assert "TF_USE_LEGACY_KERAS" not in t.env
        assert t.env["TFO_IS_CHIEF"] == ("1" if t.name == "chief:0" else "0")
        job = json.loads(t.env["TFO_JOB"])
        assert t.env["TFO_MODEL_DIR"] == job["model_dir"]
        assert t.env["TFO_BACKUP_DIR"] == job["backup_dir"]
        assert t.env["TFO_RUN_DIR"] == job["run_dir"]
        assert t.command[1:] == ["-m", "worker_entry"]
        assert t.log_path == f"/runs/r1/logs/{t.role}-{t.index}.log"
    job = json.loads(plan.task("chief:0").env["TFO_JOB"])
    assert job["model_dir"] == "/runs/r1/m"
    assert job["entry"] == "worker_entry.examples.digits:train"


def test_evaluator_is_never_in_cluster():
    plan = plan_of(FULL)
    for t in plan.tasks:
        assert "evaluator" not in t.tf_config["cluster"]
        assert "localhost:21003" not in json.dumps(t.tf_config["cluster"])


def test_auto_ports_are_filled_from_the_launcher():
    spec = {**FULL, "tasks": {"worker": ["localhost", "localhost:auto"]}}
    plan = plan_of(spec, ports={"worker:0": 30001, "worker:1": 30002})
    assert plan.tasks[0].tf_config["cluster"]["worker"] == ["localhost:30001", "localhost:30002"]
    with pytest.raises(ValueError, match="worker:0"):
        plan_of(spec)


def test_relative_model_dir_is_under_the_workdir():
    spec = {**FULL, "job": {**FULL["job"], "model_dir": "models/{run_id}"}}
    job = json.loads(plan_of(spec).tasks[0].env["TFO_JOB"])
    assert job["model_dir"] == "/w/models/r1"


@pytest.mark.tf
@pytest.mark.timeout(120)
def test_every_tf_config_parses_in_tensorflow():
    """TFConfigClusterResolver, in a fresh process with each task's env, agrees with the plan."""
    plan = plan_of(FULL)
    script = (
        "import json, os, sys\n"
        "import tensorflow as tf\n"
        "for cfg in json.loads(sys.argv[1]):\n"
        "    os.environ['TF_CONFIG'] = cfg\n"
        "    r = tf.distribute.cluster_resolver.TFConfigClusterResolver()\n"
        "    print(json.dumps({'type': r.task_type, 'id': r.task_id,"
        " 'cluster': r.cluster_spec().as_dict()}))\n"
    )
    configs = json.dumps([t.env["TF_CONFIG"] for t in plan.tasks])
    out = subprocess.run([sys.executable, "-c", script, configs], capture_output=True, text=True,
                         timeout=110, env={**os.environ, "TF_USE_LEGACY_KERAS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    got = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    expected_cluster = {"chief": ["localhost:21000"],
                        "worker": ["localhost:21001", "localhost:21002"]}
    assert [(g["type"], g["id"]) for g in got] == [(t.role, t.index) for t in plan.tasks]
    for g in got:
        assert g["cluster"] == expected_cluster


@pytest.mark.timeout(60)
def test_plan_cli_json_and_no_tensorflow(tmp_path: Path):
    res = run_tfo("plan", "clusters/localhost.yaml", "--json", timeout=30)
    assert res.returncode == 0, res.output
    shown = json.loads(res.stdout)  # the plan as plan.json holds it
    assert shown["cluster"] == {"worker": ["localhost:20000", "localhost:20001"]}
    tasks = shown["tasks"]
    assert [t["name"] for t in tasks] == ["worker:0", "worker:1"]
    assert [t["port"] for t in tasks] == [20000, 20001]
    for t in tasks:
        assert {"name", "host", "port", "tf_config", "command", "env"} <= set(t)
    table = run_tfo("plan", "clusters/localhost.yaml", timeout=30)
    assert "worker:1" in table.stdout and "20001" in table.stdout
    # No made-up run id that the real run would not use; --run-dir is shown as given.
    assert "runs/localhost-mwms-YYYYmmdd-HHMMSS-xxxx (a new id for each run" in table.stdout
    assert "YYYYmmdd-HHMMSS-xxxx" in tasks[0]["env"]["TFO_JOB"]
    chosen = run_tfo("plan", "clusters/localhost.yaml", "--run-dir", str(tmp_path / "r"),
                     timeout=30)
    assert f"run directory: {tmp_path / 'r'}\n" in chosen.stdout
    imp = subprocess.run([sys.executable, "-X", "importtime", "-m", "orchestrator", "plan",
                          "clusters/localhost.yaml"], cwd=REPO, capture_output=True, text=True,
                         timeout=30)
    assert imp.returncode == 0
    imported = [line.rsplit("|", 1)[-1].strip() for line in imp.stderr.splitlines()
                if line.startswith("import time:")]
    assert "orchestrator.planning.plan" in imported  # the check itself can see our modules
    assert not [m for m in imported if m.split(".")[0] in ("tensorflow", "tf_keras", "keras")]


def _many(n: int, host: str = "lab") -> dict:
    return {"name": "big", "job": {"entry": "worker_entry.examples.digits:train",
                                   "args": {"epochs": 1}},
            "hosts": {"lab": {"address": "10.0.0.2"}} if host == "lab" else {},
            "tasks": {"chief": [f"{host}:2999"], "worker": [f"{host}:{30000 + i}"
                                                            for i in range(n)]}}


def test_a_plan_of_1000_tasks_gives_each_task_its_json_as_json_dumps_writes_it():
    """How fast make_plan and plan.json are for 1,000 tasks is bench/run.py's figure
    (plan_json_time: `tfo plan --json`, 1.9 s before, target 1.0 s), not a timed test here."""
    spec = parse_spec(_many(1000))
    plan = make_plan(spec, run_id="r1", run_dir="/runs/r1", workdir="/w")
    names = [t["name"] for t in plan.to_json()["tasks"]]  # what run writes to plan.json
    assert len(names) == 1001 and {"chief:0", "worker:999"} <= set(names)
    for t in plan.tasks[::250]:  # what a task reads is exactly what json.dumps gives
        assert t.env["TF_CONFIG"] == json.dumps(t.tf_config, sort_keys=True)
        job = json.loads(t.env["TFO_JOB"])
        assert t.env["TFO_JOB"] == json.dumps(job, sort_keys=True)
        assert job["args"] == {"epochs": 1}
    assert len(plan.tasks[0].tf_config["cluster"]["worker"]) == 1000


def test_an_env_entry_linux_would_refuse_is_a_spec_error():
    far = {**_many(4000), "hosts": {"lab": {"address": "a-lab-host-of-a-long-name.example.org"}}}
    with pytest.raises(SpecError) as err:  # TF_CONFIG of 4,000 tasks on this host: ~180 KB
        plan_of(far)
    assert "worker:0: its environment variable TF_CONFIG is 1" in str(err.value)
    assert "Linux allows 131,072 (MAX_ARG_STRLEN)" in str(err.value)
    big = {**FULL, "env": {"BLOB": "x" * 140_000}}
    with pytest.raises(SpecError, match="worker:0: its environment variable BLOB is 140,006 bytes"):
        plan_of(big)
    remote = {**_many(1), "hosts": {"lab": {"address": "10.0.0.2", "env": {
        "A": "x" * 70_000, "B": "y" * 70_000}}}}
    with pytest.raises(SpecError, match="worker:0: its environment is .* travels to lab in one "
                                        "SSH command"):
        plan_of(remote)


@pytest.mark.timeout(60)
def test_ten_thousand_local_workers_are_refused_quickly(tmp_path: Path):
    spec = tmp_path / "c.yaml"
    spec.write_text(json.dumps(_many(4000, host="localhost")))  # a role holds up to 4096
    t0 = time.monotonic()
    res = run_tfo("plan", str(spec), timeout=30)
    assert res.returncode == 2, res.output
    assert "tasks: 4,001 tasks on localhost; at most 256 run on one machine" in res.stderr
    assert "Traceback" not in res.output
    assert time.monotonic() - t0 < 10  # 50 s and 2 GB before


PS_SPEC = {"name": "ps", "strategy": "parameter_server",
           "job": {"entry": "worker_entry.examples.digits:train", "args": {"epochs": 2}},
           "hosts": {"lab": {"address": "10.0.0.2", "workdir": "~/w"}},
           "tasks": {"chief": ["lab:1"], "worker": ["lab:2", "lab:auto"], "ps": ["lab:4"],
                     "evaluator": ["lab:5"]},
           "restart": {"policy": {"worker": "always"}, "max_restarts": 5},
           "timeouts": {"deadline_seconds": 600}}


@pytest.mark.parametrize("spec", [FULL, PS_SPEC], ids=["mwms", "ps"])
def test_plan_json_round_trips(spec):
    """plan.json is the plan: reading it back gives the same plan, policy and rules included."""
    plan = plan_of(spec, ports={"worker:1": 30002})
    again = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan
    assert again.tasks[0].placement == plan.tasks[0].placement


def test_the_plan_carries_policy_rules_and_placement():
    plan = plan_of(PS_SPEC, ports={"worker:1": 30002})
    assert plan.rules == RULES[Strategy.PARAMETER_SERVER]
    assert plan.rules.serve_first == (Role.DISPATCHER, Role.DATA_WORKER, Role.PS, Role.WORKER)
    # The roles the map leaves out get the strategy's default: a PS job's servers come back.
    assert plan.policy.restart == {Role.PS: RestartPolicy.ON_FAILURE,
                                   Role.WORKER: RestartPolicy.ALWAYS,
                                   Role.CHIEF: RestartPolicy.NEVER,
                                   Role.EVALUATOR: RestartPolicy.ON_FAILURE}
    assert plan.policy.deadline_seconds == 600 and plan.policy.max_restarts == 5
    assert plan.job == "entry worker_entry.examples.digits:train"
    chief = plan.task("chief:0")
    assert chief.placement == Placement("ssh", "lab", "10.0.0.2")
    job = json.loads(chief.env["TFO_JOB"])
    assert job["backup_dir"] == "~/w/runs/r1/backup/chief-0" and job["serve"] is False
    assert json.loads(plan.task("ps:0").env["TFO_JOB"])["serve"] is True
    local = plan_of(FULL).tasks[0]
    assert local.placement == Placement("local", "localhost", "localhost")


def _plan_json_size(n: int) -> int:
    plan = make_plan(parse_spec(_many(n - 1)), run_id="r1", run_dir="/runs/r1", workdir="/w")
    return len(json_text(plan.to_json()))


def test_plan_json_text_is_the_plan_one_task_a_line():
    data = plan_of(PS_SPEC, ports={"worker:1": 30002}).to_json()
    text = json_text(data)
    assert json.loads(text) == data
    lines = text.splitlines()
    assert [line.strip().startswith('{"name": "' + t["name"]) for line, t in
            zip(lines[lines.index('  "tasks": [') + 1:], data["tasks"], strict=False)] == [True] * 5


def test_plan_json_grows_linearly():
    """Each task used to carry the whole cluster twice (tf_config and TF_CONFIG): 51 MB for
    1,000 tasks. The cluster is now written once, at the top."""
    small, big = _plan_json_size(100), _plan_json_size(1000)
    assert big / small < 11  # 10x the tasks; 75x before
    assert big < 3_000_000


def test_an_old_plan_json_still_loads():
    """tests/data/plan-v1.json was written by tfo before the cluster moved to the top of
    plan.json (commit 2ccbb39): each task carries it. `tfo run`/`tfo rerun` still read it."""
    old = json.loads((REPO / "tests" / "data" / "plan-v1.json").read_text())
    assert "cluster" not in old and "cluster" in old["tasks"][0]["tf_config"]
    plan = Plan.from_json(old)
    again = make_plan(plan.spec, run_id=old["run_id"], run_dir=old["run_dir"],
                      workdir=old["workdir"], ports=plan.ports())
    # The same tasks, ports and TF_CONFIGs as a plan made now (which also carries what tfo
    # added since, e.g. the stall policy and the wrapper's grace in TFO_JOB).
    assert [(t.name, t.host, t.port, t.tf_config) for t in plan.tasks] == \
        [(t.name, t.host, t.port, t.tf_config) for t in again.tasks]
    for task, was in zip(plan.tasks, old["tasks"], strict=True):
        assert task.env == was["env"] and task.tf_config == was["tf_config"]
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan  # and the new format


@pytest.mark.timeout(60)
def test_plan_json_cli_is_the_plan(tmp_path: Path):
    """`tfo plan --json` prints plan.json's format; an old plan.json is a FILE it takes."""
    res = run_tfo("plan", "tests/data/plan-v1.json", "--json", timeout=30)
    assert res.returncode == 0, res.output
    shown = json.loads(res.stdout)
    old = json.loads((REPO / "tests" / "data" / "plan-v1.json").read_text())
    assert shown["cluster"] == old["tasks"][0]["tf_config"]["cluster"]
    assert [t["port"] for t in shown["tasks"]] == [t["port"] for t in old["tasks"]]
    assert all("TF_CONFIG" not in t["env"] and set(t["tf_config"]) == {"task"}
               for t in shown["tasks"])
    again = Plan.from_json(shown)
    assert again.tasks[0].env["TF_CONFIG"] == old["tasks"][0]["env"]["TF_CONFIG"]


@pytest.mark.timeout(120)
def test_a_plan_json_of_1000_tasks_runs_again(tmp_path: Path):
    """Over the 1 MiB a cluster file may have (50 MB before the cluster moved to the top)."""
    spec = tmp_path / "big.json"
    spec.write_text(json.dumps(_many(999)))
    res = run_tfo("plan", str(spec), "--json", timeout=60)
    assert res.returncode == 0, res.stderr
    plan = tmp_path / "plan.json"
    plan.write_text(res.stdout)
    assert 1 << 20 < plan.stat().st_size < 3 << 20
    again = run_tfo("plan", str(plan), "--json", timeout=60)
    assert again.returncode == 0, again.stderr
    shown, before = json.loads(again.stdout), json.loads(res.stdout)
    assert shown["cluster"] == before["cluster"] and len(shown["tasks"]) == 1000


# Issue 31: a hand-edited plan.json gets the cluster file's checks, named by its path there.
def _set(*path, value):
    def edit(plan: dict) -> None:
        *parents, last = path
        for key in parents:
            plan = plan[key]
        plan[last] = value
    return edit


BAD_PLANS = [
    ("port not a number", _set("tasks", 0, "port", value="abc"),
     ["tasks[0].port", "valid integer", "'abc'"]),  # a traceback before
    ("port too big", _set("tasks", 1, "port", value=70000), ["tasks[1].port", "65535", "70000"]),
    ("port true", _set("tasks", 1, "port", value=True),  # TF_CONFIG said localhost:True
     ["tasks[1].port", "valid integer", "True"]),
    ("no tasks", _set("tasks", value=[]), ["tasks:", "at least 1 item"]),  # a traceback
    ("two tasks on one port", lambda p: p["tasks"][1].update(port=p["tasks"][0]["port"]),
     ["tasks[1].port", "on localhost is also worker:0's"]),  # accepted before
    ("a port its spec fixes", _set("tasks", 2, "port", value=21009),
     ["tasks[2].port: 21009, but spec.tasks.chief[0] is localhost:21000"]),
    ("a task its spec does not have", lambda p: p["tasks"].pop(1),
     ["tasks: worker:0, chief:0, evaluator:0 are not its spec's tasks",
      "worker:0, worker:1, chief:0, evaluator:0"]),
    ("name and role differ", _set("tasks", 0, "role", value="chief"),
     ["tasks[0]: name worker:0 but role chief, index 0"]),
    ("the spec's own mistake", _set("spec", "tasks", "chief", value=["localhost:1", "localhost:2"]),
     ["spec.tasks.chief: at most one chief"]),
    ("a spec field of the wrong type", _set("spec", "restart", "max_restarts", value="3"),
     ["spec.restart.max_restarts", "'3'"]),
    ("an unknown strategy", _set("strategy", value="mirrored"), ["strategy", "'mirrored'"]),
    ("policy of the wrong type", _set("policy", "max_restarts", value="x"),
     ["policy.max_restarts", "'x'"]),
    ("command not a list", _set("tasks", 0, "command", value="python -m worker_entry"),
     ["tasks[0].command", "valid list"]),
    ("env value a number", _set("tasks", 0, "env", "A", value=1), ["tasks[0].env.A", "string"]),
    ("not a mapping", lambda p: p.clear(), ["name", "required"]),
]


@pytest.mark.parametrize(("edit", "needles"), [(e, n) for _, e, n in BAD_PLANS],
                         ids=[c for c, _, _ in BAD_PLANS])
def test_a_hand_edited_plan_json_names_the_field(edit, needles):
    data = json.loads(json.dumps(plan_of(FULL).to_json()))
    edit(data)
    with pytest.raises(SpecError) as err:
        Plan.from_json(data, "runs/r1/plan.json")
    message = str(err.value)
    assert message.startswith("runs/r1/plan.json: invalid plan.json\n"), message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message}"


@pytest.mark.timeout(120)
def test_tfo_run_and_rerun_of_a_bad_plan_json_exit_2(tmp_path: Path):
    res = run_tfo("plan", "--json", "--workers", "2", "--", "python", "bench/job.py", timeout=30)
    data = json.loads(res.stdout)
    data["tasks"][1]["port"] = True
    rd = tmp_path / "runs" / "edited"
    rd.mkdir(parents=True)
    (rd / "plan.json").write_text(json.dumps(data))
    for args in (["run", str(rd / "plan.json")], ["rerun", str(rd)]):
        res = run_tfo(*args, "--run-dir", str(tmp_path / "new"), timeout=60)
        assert res.returncode == 2, res.output
        assert f"{rd / 'plan.json'}: invalid plan.json\ntasks[1].port: Input should be a valid " \
            "integer (got True)" in res.stderr
        assert "Traceback" not in res.output and not (tmp_path / "new").exists()


def test_the_data_service_is_planned_beside_the_cluster_at_the_address_the_trainers_reach():
    """Every task is given the dispatcher's address; the service's tasks are not in
    TF_CONFIG's cluster, and each is told where it listens (a lab host's address, the plan's
    port) and the dispatcher its journal in the run directory on its host."""
    spec = {"name": "ds", "job": {"script": "train.py"},
            "hosts": {"lab1": {"address": "10.0.0.1"}, "lab3": {"address": "10.0.0.3",
                                                                "workdir": "/scratch/tfo"}},
            "tasks": {"worker": ["lab1:30000", "lab1:30001"], "dispatcher": "lab3:31000",
                      "data_worker": ["lab3:31001", "lab3:auto"]}}
    plan = plan_of(spec, ports={"data_worker:1": 31002})
    assert [t.name for t in plan.tasks] == ["dispatcher:0", "data_worker:0", "data_worker:1",
                                            "worker:0", "worker:1"]
    assert plan.cluster == {"worker": ["10.0.0.1:30000", "10.0.0.1:30001"]}
    assert {t.env["TFO_DATA_SERVICE"] for t in plan.tasks} == {"grpc://10.0.0.3:31000"}
    jobs = {t.name: json.loads(t.env["TFO_JOB"]) for t in plan.tasks}
    assert jobs["data_worker:1"]["listen"] == "10.0.0.3:31002" and jobs["data_worker:1"]["serve"]
    assert jobs["dispatcher:0"]["work_dir"].startswith("/scratch/tfo/")
    assert jobs["dispatcher:0"]["work_dir"].endswith("/dataservice")
    assert "listen" not in jobs["worker:0"] and not jobs["worker:0"]["serve"]
    assert Plan.from_json(json.loads(json_text(plan.to_json()))).tasks == plan.tasks
