"""Every mistake a user can make in a cluster file: exit 2 before anything starts, a
message naming the field and the offending value, and no traceback."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.planning.plan import make_policy
from orchestrator.planning.spec import (
    RestartPolicy,
    Role,
    SpecError,
    Strategy,
    load_spec,
    parse_spec,
)
from tests.conftest import REPO, run_tfo, small_tmpfs, write_spec

GOOD = """\
name: t
job: {entry: "worker_entry.examples.digits:train"}
tasks:
  worker: [localhost:20000, localhost:20001]
"""

# (case, cluster file text, what the message must contain)
BAD = [
    ("bad yaml", "name: t\njob: {entry: [\n", ["not valid YAML", "line"]),
    ("unknown top-level key", GOOD + "colour: blue\n", ["unknown key 'colour'"]),
    ("unknown job key", GOOD.replace("train\"}", "train\", epochs: 3}"),
     ["job", "unknown key 'epochs'"]),
    ("unknown role", GOOD + "  master: [localhost:20002]\n", ["tasks", "unknown role 'master'"]),
    ("two chiefs", GOOD + "  chief: [localhost:20002, localhost:20003]\n",
     ["tasks.chief", "at most one chief", "localhost:20002"]),
    ("two evaluators", GOOD + "  evaluator: [localhost:20002, localhost:20003]\n",
     ["tasks.evaluator", "at most one evaluator"]),
    ("duplicate address", GOOD.replace("localhost:20001", "localhost:20000"),
     ["tasks.worker[1]", "duplicate address localhost:20000", "tasks.worker[0]"]),
    ("port too big", GOOD.replace("20001", "70000"),
     ["tasks.worker[1]", "port 70000 is outside 1-65535"]),
    ("port zero", GOOD.replace("20001", "0"), ["tasks.worker[1]", "port 0"]),
    ("port not a number", GOOD.replace("20001", "http"), ["tasks.worker[1]", "'http'"]),
    ("no training tasks", "name: t\njob: {entry: 'a.b:c'}\ntasks:\n  evaluator: [localhost:1]\n",
     ["tasks", "no training tasks"]),
    ("ps in an MWMS job", GOOD + "  ps: [localhost:20005]\n",
     ["tasks.ps", "parameter_server"]),
    ("entry without function", GOOD.replace("digits:train", "digits"),
     ["job.entry", "module:function", "worker_entry.examples.digits"]),
    ("entry with spaces", GOOD.replace("digits:train", "digits: train"), ["job.entry"]),
    ("unknown strategy", GOOD + "strategy: mirrored\n", ["strategy", "mirrored"]),
    ("unknown host", GOOD.replace("localhost:20001", "gpu7:20001"),
     ["tasks.worker[1]", "'gpu7'", "hosts"]),
    ("missing job", "name: t\ntasks:\n  worker: [localhost:1]\n", ["job", "required"]),
    ("bad restart policy", GOOD + "restart: {policy: sometimes}\n",
     ["restart.policy", "sometimes"]),
    ("negative max_restarts", GOOD + "restart: {max_restarts: -1}\n",
     ["restart.max_restarts", "-1"]),
    ("not a mapping", "- a\n- b\n", ["mapping"]),
    ("localhost beside lab hosts", GOOD.replace("localhost:20000", "lab:20000")
     + "hosts: {lab: {address: 10.0.0.2}}\n", ["tasks.worker[1]", "localhost cannot be reached"]),
    ("unknown host key", GOOD + "hosts: {lab: {address: 10.0.0.2, passwd: x}}\n",
     ["hosts.lab", "unknown key 'passwd'"]),
    ("PS job without ps", GOOD.replace("name: t", "name: t\nstrategy: parameter_server")
     + "  chief: [localhost:20002]\n", ["tasks", "parameter_server", "at least one ps"]),
    ("PS job with two chiefs", GOOD.replace("name: t", "name: t\nstrategy: parameter_server")
     + "  chief: [localhost:20002, localhost:20003]\n  ps: [localhost:20004]\n",
     ["tasks.chief", "at most one chief"]),
    ("PS job without chief", GOOD.replace("name: t", "name: t\nstrategy: parameter_server")
     + "  ps: [localhost:20004]\n", ["tasks", "exactly one chief"]),
    # Issue 10: a user's own script or module.
    ("entry and script", GOOD.replace('train"}', 'train", script: train.py}'),
     ["job: give exactly one of entry", "script", "module", "got entry and script"]),
    ("no job kind", GOOD.replace('{entry: "worker_entry.examples.digits:train"}',
                                 "{args: [--epochs, '3']}"),
     ["job: give exactly one of entry", "got none"]),
    ("script with a mapping of args", GOOD.replace('{entry: "worker_entry.examples.digits:train"}',
                                                   "{script: train.py, args: {epochs: 3}}"),
     ["job.args", "list of command-line arguments"]),
    ("entry with a list of args", GOOD.replace('train"}', 'train", args: [--epochs, "3"]}'),
     ["job.args", "mapping"]),
    ("module that is a path", GOOD.replace('{entry: "worker_entry.examples.digits:train"}',
                                           "{module: pkg/train.py}"),
     ["job.module", "dotted module name", "pkg/train.py"]),
    ("code that does not hold the script", GOOD.replace(
        '{entry: "worker_entry.examples.digits:train"}', "{script: a/train.py, code: b}"),
     ["job.code", "holds job.script"]),
    ("warm spares not a choice", GOOD + "restart: {warm_spares: always}\n",
     ["restart.warm_spares", "expected auto, true or false", "'always'"]),
    ("warm spares a number", GOOD + "restart: {warm_spares: 1}\n",
     ["restart.warm_spares", "expected auto, true or false", "got 1"]),
]
# Issue 8: inputs that gave a traceback, a hang or a silently wrong value.
HOSTILE = [
    ("shell in an env key", GOOD + "env: {'A$(touch /tmp/pwned)': v}\n",
     ["env: bad key 'A$(touch /tmp/pwned)'", "letters, digits and _"]),
    ("shell in a host env key", GOOD.replace("localhost", "lab")
     + "hosts: {lab: {address: 10.0.0.2, env: {'A;id': v}}}\n",
     ["hosts.lab.env: bad key 'A;id'"]),
    ("env key with =", GOOD + "env: {A=B: v}\n", ["env: bad key 'A=B'"]),
    ("NUL in an env value", GOOD + 'env: {A: "x\\0y"}\n', ["env", "A", "NUL"]),
    ("200 KB of args", GOOD.replace("train\"}", "train\", args: {blob: " + "x" * 200_000 + "}}"),
     ["job.args", "200,0", "131,072", "TFO_JOB"]),
    ("unknown model_dir placeholder", GOOD.replace("train\"}", "train\", model_dir: '{model}'}"),
     ["job.model_dir", "{model}", "{run_id}, {run_dir}"]),
    ("unclosed model_dir placeholder",
     GOOD.replace("train\"}", "train\", model_dir: '/m/{run_id'}"),
     ["job.model_dir", "'/m/{run_id'", "{run_id}, {run_dir}"]),
    ("infinite backoff", GOOD + "restart: {backoff_seconds: .inf}\n",
     ["restart.backoff_seconds", "finite"]),
    ("nan startup timeout", GOOD + "timeouts: {startup_seconds: .nan}\n",
     ["timeouts.startup_seconds", "finite"]),
    ("infinite deadline", GOOD + "timeouts: {deadline_seconds: .inf}\n",
     ["timeouts.deadline_seconds", "finite"]),
    ("negative stall timeout", GOOD + "timeouts: {stall_seconds: -1}\n",
     ["timeouts.stall_seconds", "greater than or equal to 0"]),
    ("infinite stall timeout", GOOD + "timeouts: {stall_seconds: .inf}\n",
     ["timeouts.stall_seconds", "finite"]),
    ("stall timeout true", GOOD + "timeouts: {stall_seconds: true}\n",
     ["timeouts.stall_seconds"]),
    ("stall timeout words", GOOD + "timeouts: {stall_seconds: five minutes}\n",
     ["timeouts.stall_seconds", "expected auto, a number of seconds, or null"]),
    ("stall timeout Auto", GOOD + "timeouts: {stall_seconds: Auto}\n",
     ["timeouts.stall_seconds", "expected auto", "'Auto'"]),
    ("stall floor with a fixed limit", GOOD + "timeouts: {stall_seconds: 30, "
     "stall_min_seconds: 5}\n", ["timeouts.stall_min_seconds", "floor of stall_seconds: auto",
                                 "30.0"]),
    ("stall floor 0", GOOD + "timeouts: {stall_min_seconds: 0}\n",
     ["timeouts.stall_min_seconds", "greater than 0"]),
    ("infinite connect timeout", GOOD.replace("localhost", "lab")
     + "hosts: {lab: {address: 10.0.0.2, connect_timeout_seconds: .inf}}\n",
     ["hosts.lab.connect_timeout_seconds", "finite"]),
    ("lifeline shorter than three heartbeats", GOOD.replace("localhost", "lab")
     + "hosts: {lab: {address: 10.0.0.2, lifeline_seconds: 1}}\n",
     ["hosts.lab.lifeline_seconds", "greater than or equal to 3"]),
    ("port true", GOOD.replace("localhost:20001", "{host: localhost, port: true}"),
     ["tasks.worker[1].port", "True"]),
    ("host port true", GOOD.replace("localhost", "lab")
     + "hosts: {lab: {address: 10.0.0.2, port: true}}\n", ["hosts.lab.port", "True"]),
    ("max_restarts true", GOOD + "restart: {max_restarts: true}\n",
     ["restart.max_restarts", "True"]),
    ("duplicate key", GOOD + "name: u\n", ["line 5", "duplicate key 'name'", "first at line 1"]),
    ("YAML alias bomb", GOOD + "x: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
     + "".join(f"x{i}: &a{i} [{', '.join(['*a' if i == 0 else f'*a{i - 1}'] * 9)}]\n"
               for i in range(9)),
     ["line 5", "anchors and aliases (&a)"]),
    ("100,000 nested [ in YAML", GOOD + "x: " + "[" * 100_000 + "]" * 100_000 + "\n",
     ["line 5", "nested more than 64 levels"]),
    # Issue 31: a role's tasks are counted before one address is read.
    ("5,000 workers", GOOD.replace("[localhost:20000, localhost:20001]",
                                   "[" + ", ".join(["localhost"] * 5000) + "]"),
     ["tasks.worker", "5,000 tasks; a role has at most 4096"]),
]
BAD += HOSTILE
# Issue 9: GPUs in the cluster file.
LAB_GPUS = GOOD.replace("localhost", "lab") + "hosts: {lab: {address: 10.0.0.2, gpus: GPUS}}\n"
GPUS = [
    ("negative GPU id", GOOD + "localhost: {gpus: [0, -1]}\n",
     ["localhost.gpus", "GPU ids are integers >= 0, got -1"]),
    ("GPU listed twice", LAB_GPUS.replace("GPUS", "[0, 1, 1]"),
     ["hosts.lab.gpus", "GPU 1 is listed twice"]),
    ("GPU count instead of ids", LAB_GPUS.replace("GPUS", "4"),
     ["hosts.lab.gpus", "'auto'", "for 4 GPUs write [0, 1, 2, 3]"]),
    ("GPUs 'all'", GOOD + "localhost: {gpus: all}\n", ["localhost.gpus", "'all'", "'auto'"]),
    ("GPU id true", GOOD + "localhost: {gpus: [true]}\n", ["localhost.gpus", "True"]),
    ("unknown localhost key", GOOD + "localhost: {cpus: 4}\n", ["localhost", "unknown key 'cpus'"]),
    ("negative gpus_per_task", GOOD.replace("train\"}", "train\", gpus_per_task: -1}"),
     ["job.gpus_per_task", "-1"]),
    ("gpus_per_task of an unknown role", GOOD.replace("train\"}", "train\", gpus_per_task: "
                                                      "{master: 1}}"),
     ["job.gpus_per_task", "unknown role 'master'"]),
    ("unknown collective", GOOD.replace("train\"}", "train\", collective: mpi}"),
     ["job.collective", "mpi"]),
    ("nccl without GPUs", GOOD.replace("train\"}", "train\", collective: nccl}"),
     ["job.collective", "nccl needs GPUs", "job.gpus_per_task"]),
    ("collective in a PS job", GOOD.replace("name: t", "name: t\nstrategy: parameter_server")
     .replace("train\"}", "train\", collective: ring}")
     + "  chief: [localhost:20002]\n  ps: [localhost:20004]\n",
     ["job.collective", "multi_worker_mirrored only"]),
    ("CUDA_VISIBLE_DEVICES in env", GOOD + "env: {CUDA_VISIBLE_DEVICES: '0'}\n",
     ["env.CUDA_VISIBLE_DEVICES", "tfo sets it"]),
    ("CUDA_VISIBLE_DEVICES in a host's env", GOOD.replace("localhost", "lab")
     + "hosts: {lab: {address: 10.0.0.2, env: {CUDA_VISIBLE_DEVICES: ''}}}\n",
     ["hosts.lab.env.CUDA_VISIBLE_DEVICES", "tfo sets it"]),
]
SLURM_GOOD = """\
name: t
job: {entry: "worker_entry.examples.digits:train"}
backend: {slurm: {partition: lab}}
tasks: {worker: 2}
"""
SLURM = [
    ("a count without slurm", GOOD.replace("[localhost:20000, localhost:20001]", "2"),
     ["tasks.worker", "a count (2) is for a Slurm job"]),
    ("addresses under slurm", SLURM_GOOD.replace("{worker: 2}", "{worker: [localhost:1]}"),
     ["tasks.worker", "Slurm picks the hosts", "give a count (worker: 2)"]),
    ("negative count", SLURM_GOOD.replace("worker: 2", "worker: -1"),
     ["tasks.worker", "0 to 4096, got -1"]),
    ("a count of 10,000,000", SLURM_GOOD.replace("worker: 2", "worker: 10000000"),
     ["tasks.worker", "0 to 4096, got 10000000"]),
    ("slurm partition with a space", SLURM_GOOD.replace("partition: lab", "partition: 'a b'"),
     ["backend.slurm.partition", "'a b'"]),
    ("slurm time not a time", SLURM_GOOD.replace("partition: lab", "partition: lab, time: 1h"),
     ["backend.slurm.time", "'1h'"]),
    ("slurm nodes zero", SLURM_GOOD.replace("partition: lab", "partition: lab, nodes: 0"),
     ["backend.slurm.nodes", "greater than or equal to 1"]),
    ("slurm too few nodes", SLURM_GOOD.replace("partition: lab", "partition: lab, nodes: 1"),
     ["backend.slurm.nodes", "hold 1 task(s), the job has 2"]),
    ("slurm unknown key", SLURM_GOOD.replace("partition: lab", "partition: lab, qos: hi"),
     ["backend.slurm", "unknown key 'qos'"]),
    ("slurm extra arg not an option",
     SLURM_GOOD.replace("partition: lab", "partition: lab, extra_args: [debug]"),
     ["backend.slurm.extra_args", "'debug'"]),
    ("job gpus under slurm", SLURM_GOOD.replace("train\"}", "train\", gpus_per_task: 1}"),
     ["job.gpus_per_task", "backend.slurm.gpus_per_task"]),
]
BAD += GPUS + SLURM
# Issue 27: an elastic job's bounds, and what it cannot resize.
THREE = GOOD.replace("localhost:20001]", "localhost:20001, localhost:20002]")
PS_TWO = (GOOD.replace("name: t", "name: t\nstrategy: parameter_server")
          + "  chief: [localhost:20002]\n  ps: [localhost:20004]\n")
ELASTIC = [
    ("elastic min above max", THREE + "elastic: {min_workers: 3, max_workers: 2}\n",
     ["elastic.min_workers", "3 is more than max_workers 2"]),
    ("elastic min above the places", THREE + "elastic: {min_workers: 4}\n",
     ["elastic.min_workers", "4 is more than the 3 place(s) tasks.worker lists"]),
    ("elastic min 0", THREE + "elastic: {min_workers: 0}\n",
     ["elastic.min_workers", "greater than or equal to 1"]),
    ("elastic without min", THREE + "elastic: {max_workers: 3}\n",
     ["elastic.min_workers", "is required"]),
    ("elastic max above the places", THREE + "elastic: {min_workers: 2, max_workers: 4}\n",
     ["elastic.max_workers", "4, but tasks.worker lists 3 place(s)", "host:auto"]),
    # parameter_server: every listed worker starts (the chief's TF_CONFIG names them all).
    ("elastic ps max below the workers",
     PS_TWO + "elastic: {min_workers: 1, max_workers: 1}\n",
     ["elastic.max_workers", "1, but a parameter_server job starts every worker",
      "leave max_workers out"]),
    ("elastic ps min above the workers", PS_TWO + "elastic: {min_workers: 3}\n",
     ["elastic.min_workers", "3 is more than the 2 place(s) tasks.worker lists"]),
    ("elastic with a chief", THREE + "  chief: [localhost:20003]\nelastic: {min_workers: 2}\n",
     ["elastic: an elastic job has no chief task", "first under tasks.worker"]),
    ("elastic probe 0", THREE + "elastic: {min_workers: 2, probe_seconds: 0}\n",
     ["elastic.probe_seconds", "greater than 0"]),
    ("elastic negative max_resizes", THREE + "elastic: {min_workers: 2, max_resizes: -1}\n",
     ["elastic.max_resizes", "-1"]),
    ("elastic failures past the restarts", THREE + "restart: {policy: on-failure}\n"
     "elastic: {min_workers: 2, lost_after_failures: 6}\n",
     ["elastic.lost_after_failures", "max_restarts 3 ends the job after 4"]),
    ("elastic unknown key", THREE + "elastic: {min_workers: 2, min_np: 1}\n",
     ["elastic", "unknown key 'min_np'"]),
    ("elastic min true", THREE + "elastic: {min_workers: true}\n",
     ["elastic.min_workers", "True"]),
]
BAD += ELASTIC

# The tf.data service (issue 43): a dispatcher, its data workers, reachable by the trainers.
DATA_SERVICE = [
    ("data workers without a dispatcher", GOOD + "  data_worker: [localhost:20002]\n",
     ["tasks.data_worker", "none is listed", "tasks.dispatcher"]),
    ("two dispatchers", GOOD + "  dispatcher: [localhost:20002, localhost:20003]\n"
     "  data_worker: [localhost:20004]\n",
     ["tasks.dispatcher", "at most one dispatcher", "localhost:20003"]),
    ("a dispatcher without data workers", GOOD + "  dispatcher: [localhost:20002]\n",
     ["tasks.dispatcher", "no data workers", "tasks.data_worker"]),
    ("data worker on a trainer's port", GOOD + "  dispatcher: [localhost:20002]\n"
     "  data_worker: [localhost:20001]\n",
     ["tasks.worker[1]", "duplicate address localhost:20001", "tasks.data_worker[0]"]),
    ("dispatcher on the dispatcher's port", GOOD + "  dispatcher: [localhost:20002]\n"
     "  data_worker: [localhost:20002]\n",
     ["tasks.data_worker[0]", "duplicate address localhost:20002", "tasks.dispatcher[0]"]),
    ("dispatcher the lab trainers cannot reach",
     GOOD.replace("localhost:20000, localhost:20001", "lab:20000, lab:20001")
     + "  dispatcher: [localhost:20002]\n  data_worker: [lab:20003]\n"
     "hosts: {lab: {address: 10.0.0.2}}\n",
     ["tasks.dispatcher[0]", "localhost cannot be reached from the lab hosts"]),
    ("data worker the lab trainers cannot reach",
     GOOD.replace("localhost:20000, localhost:20001", "lab:20000, lab:20001")
     + "  dispatcher: [lab:20002]\n  data_worker: [localhost:20003]\n"
     "hosts: {lab: {address: 10.0.0.2}}\n",
     ["tasks.data_worker[0]", "localhost cannot be reached from the lab hosts"]),
    ("dispatcher on a loopback host the lab trainers cannot reach",
     GOOD.replace("localhost:20000, localhost:20001", "lab:20000, lab:20001")
     + "  dispatcher: [me:20002]\n  data_worker: [lab:20003]\n"
     "hosts: {lab: {address: 10.0.0.2}, me: {address: 127.0.0.1}}\n",
     ["tasks.dispatcher[0]", "host 'me' has the loopback address 127.0.0.1",
      "tasks.worker[0] on lab could not reach", "give me an address the other hosts reach"]),
    ("data service roles misspelt", GOOD + "  data_workers: [localhost:20002]\n",
     ["tasks", "unknown role 'data_workers'", "data_worker"]),
]
BAD += DATA_SERVICE


@pytest.mark.parametrize(("case", "text", "needles"), BAD, ids=[c for c, _, _ in BAD])
def test_bad_spec_is_rejected_with_the_field_named(case, text, needles, tmp_path):
    with pytest.raises(SpecError) as err:
        load_spec(write_spec(tmp_path / "c.yaml", text))
    for needle in needles:
        assert needle in str(err.value), f"{case}: {needle!r} not in:\n{err.value}"


def test_a_data_service_on_loopback_hosts_with_its_trainers_is_accepted(tmp_path):
    """Loopback reaches loopback: all of a job on hosts at 127.0.0.1 (one machine) is fine."""
    spec = load_spec(write_spec(tmp_path / "c.yaml", GOOD.replace("localhost", "box")
                                + "  dispatcher: [me:20002]\n  data_worker: [box:20003]\n"
                                "hosts: {box: {address: 127.0.0.1}, me: {address: 127.0.0.2}}\n"))
    assert [str(a) for a in spec.tasks.dispatcher] == ["me:20002"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["unknown role", "duplicate address", "entry without function",
                                  "bad yaml", "ps in an MWMS job", "PS job without ps",
                                  "PS job with two chiefs", *[c for c, _, _ in HOSTILE],
                                  "nccl without GPUs", "GPU count instead of ids",
                                  "addresses under slurm", "slurm time not a time",
                                  "warm spares not a choice", "stall timeout words",
                                  "data workers without a dispatcher"])
def test_cli_exits_2_without_traceback(case, tmp_path):
    text, needles = next((t, n) for c, t, n in BAD if c == case)
    spec = write_spec(tmp_path / "c.yaml", text)
    for command in ("plan", "run"):
        res = run_tfo(command, str(spec), "--run-dir", str(tmp_path / "run"), timeout=30)
        assert res.returncode == 2, res.output
        assert "Traceback" not in res.output
        for needle in needles:
            assert needle in res.output
        assert not (tmp_path / "run").exists(), "a bad spec must not start a run"


@pytest.mark.timeout(30)
def test_entry_module_that_does_not_exist(tmp_path):
    spec = write_spec(tmp_path / "c.yaml", GOOD.replace("worker_entry.examples.digits",
                                                        "no_such_pkg.mod"))
    res = run_tfo("plan", str(spec), timeout=20)
    assert res.returncode == 2, res.output
    assert "job.entry: no module named 'no_such_pkg'" in res.stderr
    assert "Traceback" not in res.output


SCRIPT = GOOD.replace('{entry: "worker_entry.examples.digits:train"}', "{%s}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("job", "needles"), [
    ("script: no/such/train.py", ["job.script:", "no/such/train.py does not exist"]),
    ("script: tests", ["job.script:", "is not a file"]),
    ("module: no_such_pkg.train", ["job.module: no module named 'no_such_pkg'"]),
    ("module: worker_entry.nope", ["job.module: module 'worker_entry' has no module 'nope'",
                                   "(modules there: __main__, "]),
    ("module: worker_entry.examples", ["job.module:", "no __main__"]),
])
def test_script_or_module_that_does_not_exist(job, needles, tmp_path):
    spec = write_spec(tmp_path / "c.yaml", SCRIPT % job)
    for command in ("plan", "run"):
        res = run_tfo(command, str(spec), "--run-dir", str(tmp_path / "run"), timeout=30)
        assert res.returncode == 2, res.output
        assert "Traceback" not in res.output
        for needle in needles:
            assert needle in res.stderr, res.stderr
        assert not (tmp_path / "run").exists(), "nothing starts"


@pytest.mark.timeout(30)
def test_missing_file_and_json(tmp_path):
    res = run_tfo("plan", str(tmp_path / "nope.yaml"), timeout=20)
    assert res.returncode == 2 and "no such cluster file" in res.output
    assert "Traceback" not in res.output
    bad = write_spec(tmp_path / "c.json", '{"name": "t", "job": ')
    res = run_tfo("plan", str(bad), timeout=20)
    assert res.returncode == 2 and "not valid JSON" in res.output


@pytest.mark.timeout(60)
def test_paths_and_arguments_are_shown_as_they_are(tmp_path):
    """Square brackets and colons in a path or an argument are not rich markup or emoji codes:
    `[/x]` in a path was a MarkupError traceback, `[bold]d` hid itself and bolded the rest."""
    missing = tmp_path / "[/x].yaml"
    res = run_tfo("plan", str(missing), timeout=20)
    assert res.returncode == 2 and "Traceback" not in res.output, res.output
    assert f"error: {missing}: no such cluster file" in res.stderr
    (tmp_path / "a[").mkdir()
    bad = write_spec(tmp_path / "a[" / "x].yaml", "name: t\nstrategy: nope\n")
    res = run_tfo("plan", str(bad), timeout=20)
    assert res.returncode == 2 and "Traceback" not in res.output, res.output
    assert f"error: {tmp_path}/a[/x].yaml: invalid cluster file\nstrategy:" in res.stderr
    where = tmp_path / "[bold]d"
    where.mkdir()
    good = write_spec(where / "c.yaml", SCRIPT % (
        f"script: {REPO / 'tests/scripts/show_env.py'}, args: ['[b]x[/b]', ':smile:']"))
    run_dir = where / "[red]run:smile:"
    res = run_tfo("plan", str(good), "--run-dir", str(run_dir), timeout=20)
    assert res.returncode == 0, res.output
    assert f"run directory: {run_dir}" in res.stdout
    assert "'[b]x[/b]' :smile:" in res.stdout, res.stdout


def test_good_spec_defaults():
    spec = parse_spec({"name": "t", "job": {"entry": "a.b:c"},
                       "tasks": {"worker": ["localhost:1", "localhost"], "chief": "localhost:3"}})
    assert spec.strategy is Strategy.MULTI_WORKER_MIRRORED
    assert [str(a) for a in spec.tasks.worker] == ["localhost:1", "localhost:auto"]
    assert spec.tasks.chief[0].port == 3
    assert spec.restart.for_role("worker", spec.strategy) is RestartPolicy.NEVER


def test_elastic_defaults_and_a_slurm_pool():
    spec = parse_spec({"name": "t", "job": {"entry": "a.b:c"}, "elastic": {"min_workers": 2},
                       "tasks": {"worker": ["localhost", "localhost", "localhost"]}})
    e = spec.elastic
    assert (e.min_workers, e.max_workers, e.probe_seconds, e.max_resizes,
            e.lost_after_failures) == (2, None, 30.0, 10, 3)
    assert parse_spec({"name": "t", "job": {"entry": "a.b:c"}}
                      | {"tasks": {"worker": ["localhost"]}}).elastic is None
    # Under Slurm the pool is the count of workers (nodes of the allocation).
    slurm = parse_spec({"name": "t", "job": {"entry": "a.b:c"}, "tasks": {"worker": 4},
                        "backend": {"slurm": {}}, "elastic": {"min_workers": 2,
                                                             "max_workers": 3}})
    assert slurm.elastic.max_workers == 3
    # parameter_server: elastic with its chief, max_workers every worker listed.
    ps = parse_spec({"name": "t", "job": {"entry": "a.b:c"}, "strategy": "parameter_server",
                     "tasks": {"chief": ["localhost"], "worker": ["localhost"] * 3,
                               "ps": ["localhost", "localhost"]},
                     "elastic": {"min_workers": 2, "max_workers": 3}})
    assert (ps.elastic.min_workers, ps.elastic.max_workers) == (2, 3)


@pytest.mark.parametrize("timeouts, seconds, floor", [
    ({}, "auto", 60.0),  # the default: adapts to the job's steps, at least a minute
    ({"stall_seconds": "auto", "stall_min_seconds": 5}, "auto", 5.0),
    ({"stall_seconds": 30}, 30.0, 60.0),
    ({"stall_seconds": None}, None, 60.0),
    ({"stall_seconds": 0}, None, 60.0),
])
def test_stall_seconds_default_set_and_off(timeouts, seconds, floor):
    spec = parse_spec({"name": "t", "job": {"entry": "a.b:c"}, "timeouts": timeouts,
                       "tasks": {"worker": ["localhost:1", "localhost:2"]}})
    policy = make_policy(spec)
    assert (policy.stall_seconds, policy.stall_min_seconds) == (seconds, floor)


def test_shipped_cluster_files_load():
    for path in sorted((REPO / "clusters").glob("*.yaml")):
        spec = load_spec(path)
        assert spec.tasks.worker or spec.tasks.chief, path


@pytest.mark.parametrize("text", [
    GOOD, PS_TWO, SLURM_GOOD, LAB_GPUS.replace("GPUS", "[0, 1]"),
    SLURM_GOOD.replace("{worker: 2}", "{worker: 3}") + "elastic: {min_workers: 2}\n",
    SLURM_GOOD.replace("name: t", "name: t\nstrategy: parameter_server").replace(
        "{worker: 2}", "{worker: 2, ps: 1, chief: 1}"),
], ids=["local", "ps", "slurm", "lab", "slurm elastic", "slurm ps"])
def test_a_spec_reads_back_from_its_dump(text):
    """plan.json keeps the spec as dumped; `tfo rerun` reads it back (a Slurm job's was its
    placeholder addresses, which a scheduler's spec refuses)."""
    spec = parse_spec(yaml.safe_load(text))
    assert parse_spec(json.loads(json.dumps(spec.model_dump(mode="json")))) == spec


def test_per_role_restart_policy():
    spec = parse_spec({"name": "t", "job": {"entry": "a.b:c"}, "tasks": {"worker": ["localhost:1"]},
                       "restart": {"policy": {"worker": "exit-code"}}})
    assert spec.restart.for_role("worker", spec.strategy) is RestartPolicy.EXIT_CODE
    assert spec.restart.for_role("evaluator", spec.strategy) is RestartPolicy.ON_FAILURE
    assert spec.restart.for_role("chief", spec.strategy) is RestartPolicy.NEVER


# Issue 31: each role's default is its strategy's, as data (strategy.RULES), whether the
# policy is unset or a map that does not name the role; one policy given covers every role.
_N, _F, _A = RestartPolicy.NEVER, RestartPolicy.ON_FAILURE, RestartPolicy.ALWAYS
DEFAULT_POLICIES = [
    ("mwms, unset", "multi_worker_mirrored", None,
     {"chief": _N, "worker": _N, "evaluator": _F}),
    ("ps, unset: the servers come back", "parameter_server", None,
     {"chief": _N, "worker": _F, "ps": _F, "evaluator": _F}),
    ("ps, a map naming the chief", "parameter_server", {"chief": "always"},
     {"chief": _A, "worker": _F, "ps": _F, "evaluator": _F}),
    ("ps, never for all", "parameter_server", "never",
     {"chief": _N, "worker": _N, "ps": _N, "evaluator": _N}),
]


@pytest.mark.parametrize(("strategy", "policy", "expected"),
                         [c[1:] for c in DEFAULT_POLICIES], ids=[c[0] for c in DEFAULT_POLICIES])
def test_default_restart_policy_per_role_is_the_strategy_s(strategy, policy, expected):
    tasks = {"chief": "localhost:1", "worker": "localhost:2", "evaluator": "localhost:4"}
    if strategy == "parameter_server":
        tasks["ps"] = "localhost:3"
    spec = parse_spec({"name": "t", "strategy": strategy, "job": {"entry": "a.b:c"},
                       "tasks": tasks, **({"restart": {"policy": policy}} if policy else {})})
    assert make_policy(spec).restart == {Role(r): p for r, p in expected.items()}


def test_relative_path_example(tmp_path: Path):
    spec = write_spec(tmp_path / "c.yaml", GOOD)
    assert load_spec(spec).name == "t"


def _not_a_cluster_file(case: str, tmp_path: Path) -> Path:
    if case == "FIFO":
        os.mkfifo(tmp_path / "fifo.yaml")  # reading it would wait for a writer forever
        return tmp_path / "fifo.yaml"
    if case == "/dev/zero":
        return Path("/dev/zero")  # never ends
    if case == "directory":
        return tmp_path
    if case == "latin-1":
        path = tmp_path / "latin1.yaml"
        path.write_bytes(GOOD.encode() + "# caf\u00e9\n".encode("latin-1"))
        return path
    if case == "100,000 nested [ in JSON":
        return write_spec(tmp_path / "deep.json", "[" * 100_000 + "]" * 100_000)
    return write_spec(tmp_path / "huge.yaml", GOOD + "#" * (2 << 20) + "\n")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("case", "needle"), [
    ("FIFO", "not a regular file (a FIFO)"), ("/dev/zero", "(a character device)"),
    ("directory", "not a regular file (a directory)"),
    ("latin-1", "not UTF-8 text: byte 0xe9 at line 5, column 6"),
    ("100,000 nested [ in JSON", "nested more than 64 levels deep"),
    ("2 MiB", "larger than 1,048,576 bytes")])
def test_files_that_are_not_cluster_files_exit_2_at_once(case, needle, tmp_path: Path):
    path = _not_a_cluster_file(case, tmp_path)
    t0 = time.monotonic()
    res = run_tfo("plan", str(path), timeout=20)
    assert res.returncode == 2, res.output
    assert f"{path}: " in res.stderr and needle in res.stderr, res.stderr
    assert "Traceback" not in res.output
    assert time.monotonic() - t0 < 15


@pytest.mark.timeout(30)
def test_an_alias_bomb_is_refused_within_a_second(tmp_path: Path):
    text = next(t for c, t, _ in BAD if c == "YAML alias bomb")
    t0 = time.monotonic()
    with pytest.raises(SpecError, match="anchors and aliases"):
        load_spec(write_spec(tmp_path / "c.yaml", text))
    assert time.monotonic() - t0 < 1


AUTO = GOOD.replace("localhost:20000, localhost:20001", "localhost:auto, localhost:auto")


@pytest.mark.timeout(60)
def test_a_run_dir_that_cannot_be_made(tmp_path: Path):
    spec = write_spec(tmp_path / "c.yaml", AUTO)
    a_file = write_spec(tmp_path / "a-file", "x")
    for command, run_dir, needle in [
            ("plan", a_file, f"--run-dir {a_file}: {a_file} is not a directory"),
            ("run", a_file / "sub", f"--run-dir {a_file}/sub: {a_file} is not a directory"),
            ("run", Path("/proc/tfo-x"), "run directory /proc/tfo-x: cannot write /proc/tfo-x")]:
        res = run_tfo(command, str(spec), "--run-dir", str(run_dir), timeout=30)
        assert res.returncode == 2, res.output
        assert needle in res.stderr
        assert "Traceback" not in res.output


@pytest.mark.timeout(60)
def test_a_full_disk_is_an_error_before_anything_starts(tmp_path: Path):
    with small_tmpfs(tmp_path / "disk", "16k") as disk:
        with pytest.raises(OSError), (disk / "filler").open("wb") as f:
            for _ in range(64):
                f.write(b"x" * 4096)
                f.flush()
        spec = write_spec(tmp_path / "c.yaml", AUTO)
        res = run_tfo("run", str(spec), "--run-dir", str(disk / "run"), timeout=30)
        assert res.returncode == 2, res.output
        assert f"run directory {disk}/run: cannot write" in res.stderr
        assert "No space left on device; nothing was started" in res.stderr
        assert "Traceback" not in res.output


@pytest.mark.timeout(60)
def test_more_local_tasks_than_cpus_is_a_warning_with_the_numbers(tmp_path: Path):
    count = (os.cpu_count() or 1) + 1
    spec = write_spec(tmp_path / "c.yaml", GOOD.replace(
        "[localhost:20000, localhost:20001]", "[" + ", ".join(["localhost"] * count) + "]"))
    res = run_tfo("plan", str(spec), timeout=30)
    assert res.returncode == 0, res.output
    assert f"warning: {count} tasks on localhost but {os.cpu_count()} CPU(s)" in res.stderr


def test_a_duplicate_key_in_json(tmp_path: Path):
    path = write_spec(tmp_path / "c.json", '{"name": "t", "name": "u"}')
    with pytest.raises(SpecError, match="duplicate key 'name' in one object"):
        load_spec(path)


SCHEMA_BAD = ["unknown top-level key", "unknown job key", "unknown role", "port not a number",
              "warm spares not a choice", "stall timeout words"]


@pytest.mark.timeout(60)
def test_schema_accepts_every_shipped_cluster_file_and_rejects_bad_ones():
    """`tfo schema` is what an editor validates against: the files we ship pass, a file the
    models refuse for a reason the schema can say is refused too."""
    import json

    import jsonschema
    import yaml

    res = run_tfo("schema", timeout=30)
    assert res.returncode == 0, res.output[-2000:]
    schema = json.loads(res.stdout)
    validator = jsonschema.Draft202012Validator(schema)
    files = sorted((REPO / "clusters").glob("*.yaml"))
    assert files
    for path in files:
        assert not list(validator.iter_errors(yaml.safe_load(path.read_text()))), path
    # The shorter forms a file may use: one address alone, a role left empty, gpus: auto.
    short = yaml.safe_load(GOOD + "  chief: localhost:20002\n  evaluator:\n"
                           "localhost: {gpus: auto}\n")
    parse_spec(short)
    assert not list(validator.iter_errors(short))
    cases = {case: text for case, text, _ in BAD}
    for case in SCHEMA_BAD:
        data = yaml.safe_load(cases[case])
        with pytest.raises(SpecError):
            parse_spec(data)
        assert list(validator.iter_errors(data)), case
