"""GPUs are part of placement: each task's CUDA_VISIBLE_DEVICES, decided in the plan.

Pure allocation and plan envs are unit tests; `tfo plan`/`tfo check` run as a user would,
with a fake `nvidia-smi` on PATH where a host's gpus are `auto`; one real MWMS run checks
that each task gets its own devices and the job's collective."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from orchestrator.launch.gpus import parse
from orchestrator.planning.devices import allocate_gpus
from orchestrator.planning.plan import make_plan
from orchestrator.planning.spec import SpecError, parse_spec
from tests.conftest import run_tfo, write_spec

LAB = {
    "name": "gpus",
    "job": {"entry": "worker_entry.examples.digits:train", "gpus_per_task": 2},
    "hosts": {"lab1": {"address": "10.0.0.1", "gpus": [0, 1, 2, 3]},
              "lab2": {"address": "10.0.0.2", "gpus": [4, 5, 6, 7]}},
    "tasks": {"chief": ["lab1:20000"], "worker": ["lab1:20001", "lab2:20001", "lab2:20002"],
              "evaluator": ["lab2:20003"]},
}


def plan_of(spec: dict, **kw):
    return make_plan(parse_spec(spec), run_id="r1", run_dir="/runs/r1", workdir="/w", **kw)


def visible(plan) -> dict[str, str]:
    return {t.name: t.env["CUDA_VISIBLE_DEVICES"] for t in plan.tasks}


def test_colocated_tasks_get_disjoint_gpus():
    plan = plan_of(LAB)
    assert {t.name: t.gpus for t in plan.tasks} == {
        "worker:0": [0, 1], "worker:1": [4, 5], "worker:2": [6, 7], "chief:0": [2, 3],
        "evaluator:0": []}
    assert visible(plan) == {"worker:0": "0,1", "worker:1": "4,5", "worker:2": "6,7",
                             "chief:0": "2,3", "evaluator:0": ""}
    for host in ("lab1", "lab2"):
        ids = [g for t in plan.tasks if t.host == host for g in t.gpus]
        assert len(ids) == len(set(ids))
    # nvidia-smi's numbering, not CUDA's fastest-first.
    assert {t.env["CUDA_DEVICE_ORDER"] for t in plan.tasks} == {"PCI_BUS_ID"}
    assert [t["gpus"] for t in plan.to_json()["tasks"]] == [t.gpus for t in plan.tasks]


def test_cpu_only_tasks_get_an_empty_cuda_visible_devices():
    """Unset, TensorFlow would give every task every GPU of its host."""
    cpu = {**LAB, "job": {"entry": "a.b:c"}}
    assert set(visible(plan_of(cpu)).values()) == {""}
    local = {"name": "l", "job": {"entry": "a.b:c"}, "tasks": {"worker": ["localhost:1"]}}
    assert visible(plan_of(local)) == {"worker:0": ""}
    ps = {"name": "ps", "strategy": "parameter_server", "localhost": {"gpus": [0, 1, 2]},
          "job": {"entry": "a.b:c", "gpus_per_task": 1},
          "tasks": {"chief": ["localhost:1"], "worker": ["localhost:2", "localhost:3"],
                    "ps": ["localhost:4"]}}
    # An int is for the roles that train: a ps holds variables.
    assert visible(plan_of(ps)) == {"ps:0": "", "worker:0": "0", "worker:1": "1", "chief:0": "2"}


def test_a_host_with_too_few_gpus_is_refused_naming_it():
    spec = {**LAB, "tasks": {"chief": ["lab1:20000"],
                             "worker": ["lab1:20001", "lab1:20002", "lab2:20001"]}}
    with pytest.raises(SpecError) as err:
        plan_of(spec)
    assert str(err.value).startswith(
        "host lab1: 3 tasks × 2 GPUs need 6, it has 4 ([0, 1, 2, 3]); "
        "list more under hosts.lab1.gpus or lower job.gpus_per_task")
    none = {"name": "l", "job": {"entry": "a.b:c", "gpus_per_task": 1},
            "tasks": {"worker": ["localhost:1"]}}
    with pytest.raises(SpecError, match=r"host localhost: 1 task × 1 GPU need 1, it has none; "
                                        r"list more under localhost.gpus"):
        plan_of(none)


def test_gpus_per_role():
    spec = {**LAB, "job": {"entry": "a.b:c", "gpus_per_task": {"worker": 1, "evaluator": 2}}}
    assert visible(plan_of(spec)) == {"worker:0": "0", "worker:1": "4", "worker:2": "5",
                                      "chief:0": "", "evaluator:0": "6,7"}
    spec["job"]["gpus_per_task"] = {"worker": 3, "chief": 1}
    spec["hosts"] = {**LAB["hosts"], "lab1": {"address": "10.0.0.1", "gpus": [0, 1, 2]}}
    with pytest.raises(SpecError, match=r"^host lab1: tasks worker:0 \(3\), chief:0 \(1\) "
                                        r"need 4, it has 3 \(\[0, 1, 2\]\)"):
        plan_of(spec)


def test_allocation_is_pure_and_ordered():
    tasks = [("worker", 0, "a"), ("worker", 1, "b"), ("chief", 0, "a"), ("evaluator", 0, "a")]
    need = {"worker": 1, "chief": 2, "evaluator": 0}.__getitem__
    assert allocate_gpus(tasks, {"a": [7, 3, 5], "b": [2]}, need) == [[7], [2], [3, 5], []]
    # Not known yet (`auto` in a dry run): nvidia-smi's numbering from 0, never refused.
    assert allocate_gpus(tasks, {"a": None, "b": None}, need) == [[0], [0], [1, 2], []]


def test_auto_hosts_take_the_gpus_the_launcher_found():
    spec = {"name": "l", "localhost": {"gpus": "auto"},
            "job": {"entry": "a.b:c", "gpus_per_task": 1},
            "tasks": {"worker": ["localhost:1", "localhost:2"]}}
    assert visible(plan_of(spec, gpus={"localhost": [3, 5]})) == {"worker:0": "3",
                                                                  "worker:1": "5"}
    assert visible(plan_of(spec)) == {"worker:0": "0", "worker:1": "1"}  # not asked yet
    with pytest.raises(SpecError, match="host localhost: 2 tasks × 1 GPU need 2, it has 1"):
        plan_of(spec, gpus={"localhost": [0]})


def test_collective_reaches_the_task():
    spec = {**LAB, "job": {**LAB["job"], "collective": "ring"}}
    assert {json.loads(t.env["TFO_JOB"])["collective"] for t in plan_of(spec).tasks} == {"ring"}
    assert json.loads(plan_of(LAB).tasks[0].env["TFO_JOB"])["collective"] == "auto"


def test_nvidia_smi_output_is_read_carefully():
    out = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n"
           "  MIG 1g.10gb     Device  0: (UUID: MIG-2)\n"
           "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-3)\n"
           "GPU x: not a gpu\nsomething GPU 9: else\n")
    assert parse(0, out, "").ids == [0, 1]
    assert parse(127, "", "sh: nvidia-smi: not found").note == "nvidia-smi not found"
    failed = parse(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                   "driver.\n", "")
    assert failed.ids == [] and "exit 9" in failed.note and "NVIDIA driver" in failed.note
    assert str(parse(0, out, "")) == "2 (0,1)"


# --- the cluster file ----------------------------------------------------------------------

LOCAL = """\
name: gpus
job: {{entry: "{entry}", gpus_per_task: {per_task}{extra}}}
localhost: {{gpus: {gpus}}}
tasks:
  chief: [localhost:auto]
  worker: [localhost:auto, localhost:auto]
"""


def fake_nvidia_smi(bin_dir: Path, text: str, code: int = 0) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}EOF\nexit {code}\n")
    script.chmod(0o755)
    return bin_dir


TWO_GPUS = "GPU 0: Fake A100 (UUID: GPU-a)\nGPU 1: Fake A100 (UUID: GPU-b)\n"


@pytest.mark.timeout(60)
def test_tfo_plan_shows_each_tasks_gpus(tmp_path):
    spec = write_spec(tmp_path / "c.yaml", LOCAL.format(
        entry="worker_entry.examples.digits:train", per_task="{worker: 1}", extra="",
        gpus="[0, 1]"))
    res = run_tfo("plan", str(spec), timeout=30)
    assert res.returncode == 0, res.output
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in res.stdout.splitlines() if line.startswith("│")}
    header = next(line for line in res.stdout.splitlines() if "TF_CONFIG task" in line)
    assert [c.strip() for c in header.split("┃")[1:-1]][:5] == [
        "task", "host", "port", "profiler", "gpus"]
    assert {name: cols[3] for name, cols in rows.items()} == {
        "worker:0": "0", "worker:1": "1", "chief:0": "-"}
    res = run_tfo("plan", str(spec), "--json", timeout=30)
    tasks = {t["name"]: t for t in json.loads(res.stdout)["tasks"]}
    assert {n: (t["gpus"], t["env"]["CUDA_VISIBLE_DEVICES"]) for n, t in tasks.items()} == {
        "worker:0": ([0], "0"), "worker:1": ([1], "1"), "chief:0": ([], "")}


@pytest.mark.timeout(90)
def test_auto_on_localhost_asks_nvidia_smi(tmp_path, monkeypatch):
    spec = write_spec(tmp_path / "c.yaml", LOCAL.format(
        entry="worker_entry.examples.digits:train", per_task=1, extra="", gpus="auto"))
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'bin', TWO_GPUS)}:/usr/bin:/bin")
    res = run_tfo("plan", str(spec), "--json", timeout=30)
    assert res.returncode == 2, res.output  # 3 tasks × 1 GPU on a machine with 2
    assert "host localhost: 3 tasks × 1 GPU need 3, it has 2 ([0, 1])" in res.stderr
    spec.write_text(spec.read_text().replace("per_task: 1", "per_task: {worker: 1}"))
    res = run_tfo("plan", str(spec), timeout=30)
    assert res.returncode == 0, res.output
    assert "localhost: gpus auto: nvidia-smi -L reports 2 (0,1)" in res.stdout
    assert re.search(r"│ worker:1 +│ localhost +│ \d+ +│ \d+ +│ 1 ", res.stdout), res.stdout

    # No nvidia-smi, or one that fails: no GPUs, and the reason.
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    res = run_tfo("plan", str(spec), timeout=30)
    assert res.returncode == 2, res.output
    assert "localhost: gpus auto: none (nvidia-smi not found)" in res.stderr
    assert "host localhost: 2 tasks × 1 GPU need 2, it has none" in res.stderr
    broken = fake_nvidia_smi(tmp_path / "broken", "NVIDIA-SMI has failed because it couldn't "
                             "communicate with the NVIDIA driver.\n", code=9)
    monkeypatch.setenv("PATH", f"{broken}:/usr/bin:/bin")
    res = run_tfo("plan", str(spec), timeout=30)
    assert res.returncode == 2 and "exit 9: NVIDIA-SMI has failed" in res.stderr, res.output
    assert "Traceback" not in res.output


@pytest.mark.timeout(60)
def test_tfo_check_reports_the_gpus_of_each_host(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'bin', TWO_GPUS)}:/usr/bin:/bin")
    spec = write_spec(tmp_path / "c.yaml", LOCAL.format(
        entry="worker_entry.examples.digits:train", per_task="{worker: 1}", extra="",
        gpus="[0, 1]"))
    res = run_tfo("check", str(spec), timeout=45)
    assert res.returncode == 0, res.output
    header = next(line for line in res.stdout.splitlines() if "tensorflow" in line)
    row = next(line for line in res.stdout.splitlines() if line.startswith("│ localhost"))
    cols = dict(zip([c.strip() for c in header.split("┃")[1:-1]],
                    [c.strip() for c in row.split("│")[1:-1]], strict=True))
    assert cols["gpus"] == "2 (0,1)"
    # A listed GPU the host does not have is a problem, not a silent CPU run.
    spec.write_text(spec.read_text().replace("[0, 1]", "[0, 7]"))
    res = run_tfo("check", str(spec), timeout=45)
    assert res.returncode == 1, res.output
    assert "host localhost: localhost.gpus lists GPU 7, which nvidia-smi -L there does not " \
           "report (it reports 2 (0,1))" in res.stderr


@pytest.mark.timeout(60)
def test_too_few_gpus_stops_run_before_anything_starts(tmp_path):
    spec = write_spec(tmp_path / "c.yaml", LOCAL.format(
        entry="worker_entry.examples.digits:train", per_task=2, extra="", gpus="[0, 1, 2, 3]"))
    for command in ("plan", "run"):
        res = run_tfo(command, str(spec), "--run-dir", str(tmp_path / "run"), timeout=30)
        assert res.returncode == 2, res.output
        assert "host localhost: 3 tasks × 2 GPUs need 6, it has 4 ([0, 1, 2, 3])" in res.stderr
        assert "Traceback" not in res.output
        assert not (tmp_path / "run").exists()


@pytest.mark.tf
@pytest.mark.timeout(240)
def test_each_task_gets_its_own_gpus_and_the_collective(tmp_path, run_dir):
    """A real MWMS run: the env reaches each task, and `collective: ring` the strategy. There
    is no GPU here, so TensorFlow sees none; a GPU machine would show 1 per worker."""
    spec = write_spec(tmp_path / "c.yaml", LOCAL.format(
        entry="tests.jobs.devices:report", per_task="{worker: 1}", extra=", collective: ring",
        gpus="[0, 1]"))
    res = run_tfo("run", str(spec), "--run-dir", str(run_dir), timeout=200)
    assert res.returncode == 0, res.output[-4000:]
    seen = {}
    for name in ("worker:0", "worker:1", "chief:0"):
        log = (run_dir / "logs" / f"{name.replace(':', '-')}.log").read_text()
        seen[name] = re.search(rf"\[devices\] {name} CUDA_VISIBLE_DEVICES='([^']*)' "
                               r"gpus_seen=(\d+) collective=(\w+) all_reduce=(\S+)", log).groups()
    assert {n: s[0] for n, s in seen.items()} == {"worker:0": "0", "worker:1": "1",
                                                  "chief:0": ""}
    assert {s[2] for s in seen.values()} == {"RING"}
    assert {s[3] for s in seen.values()} == {"3.0"}  # one all-reduce over the three tasks
    if sys.platform == "linux" and not Path("/dev/nvidia0").exists():
        assert {s[1] for s in seen.values()} == {"0"}


@pytest.mark.ssh
@pytest.mark.timeout(90)
def test_auto_on_a_lab_host_asks_over_ssh(tmp_path):
    """`tfo check` asks the host's nvidia-smi over the preflight's connection (a private sshd
    on loopback whose sessions find a fake nvidia-smi first on PATH), and refuses a job
    that needs more than it reports."""
    from tests import sshlab
    from tests.helpers import host_yaml

    fake = fake_nvidia_smi(tmp_path / "bin", TWO_GPUS)
    with sshlab.start_sshd(tmp_path / "sshd", extra_config=[
            f"SetEnv PATH={fake}:/usr/local/bin:/usr/bin:/bin"]) as h:
        text = (f"name: labgpus\njob: {{entry: \"worker_entry.examples.digits:train\", "
                f"gpus_per_task: 1}}\nhosts:\n{host_yaml('lab', h, tmp_path / 'w', gpus='auto')}"
                "tasks:\n  worker: [lab:auto, lab:auto]\n")
        spec = write_spec(tmp_path / "c.yaml", text)
        res = run_tfo("plan", str(spec), timeout=30)  # no SSH in a dry run: says when it asks
        assert res.returncode == 0, res.output
        assert "lab: gpus auto: nvidia-smi -L on lab tells when the job runs" in res.stdout
        res = run_tfo("check", str(spec), timeout=60)
        assert res.returncode == 0, res.output
        row = next(line for line in res.stdout.splitlines() if line.startswith("│ lab"))
        assert "│ 2 (0,1) │" in row, res.stdout
        spec.write_text(text.replace("gpus_per_task: 1", "gpus_per_task: 2"))
        res = run_tfo("check", str(spec), timeout=60)
        assert res.returncode == 2, res.output
        assert "host lab: 2 tasks × 2 GPUs need 4, it has 2 ([0, 1])" in res.stderr
        assert "Traceback" not in res.output
