"""`tfo export tfjob`: a cluster file as a Kubeflow TFJob that the operator's CRD accepts, with
what does not carry over said, and bad input named (exit 2)."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path

import jsonschema
import pytest
import yaml

from orchestrator.planning.export import tfjob
from orchestrator.planning.plan import make_plan
from orchestrator.planning.spec import SpecError, load_spec, parse_spec
from tests.conftest import REPO, run_tfo
from worker_entry.runner import task_env

# The TFJob CRD's OpenAPI v3 schema from kubeflow/training-operator (the file names its commit).
CRD = Path(__file__).parent / "data" / "tfjob_crd_v1.schema.json"
CLUSTERS = sorted((REPO / "clusters").glob("*.yaml"))
IMAGE = "registry.lab/train:1"
MWMS = {"name": "mnist", "job": {"entry": "worker_entry.examples.digits:train"},
        "tasks": {"worker": ["localhost:auto", "localhost:auto"]}}
PS = {"name": "ps-job", "strategy": "parameter_server",
      "job": {"entry": "worker_entry.examples.digits:train", "gpus_per_task": 1},
      "tasks": {"chief": "localhost", "worker": ["localhost", "localhost", "localhost"],
                "ps": ["localhost", "localhost"], "evaluator": "localhost"},
      "restart": {"policy": {"worker": "exit-code", "ps": "always"}, "max_restarts": 7},
      "timeouts": {"deadline_seconds": 3600.5, "grace_seconds": 2.5}}


@cache
def _crd() -> dict:
    return json.loads(CRD.read_text())


def crd_validator() -> jsonschema.Validator:
    """The CRD's schema as the API server applies it."""
    return jsonschema.Draft7Validator(_crd()["openAPIV3Schema"])


def operator_validator() -> jsonschema.Validator:
    """The CRD's schema plus what the operator itself checks: the CRD types restartPolicy and
    the like as any string; the Go API's constants and the webhook (named in the file) say
    which values it knows, that one container is named "tensorflow", and the name's form."""
    schema = copy.deepcopy(_crd()["openAPIV3Schema"])
    enums = _crd()["enums"]
    spec = schema["properties"]["spec"]["properties"]
    spec["runPolicy"]["properties"]["cleanPodPolicy"]["enum"] = enums["cleanPodPolicy"]
    spec["successPolicy"]["enum"] = enums["successPolicy"]
    replicas = spec["tfReplicaSpecs"]
    replicas["propertyNames"] = {"enum": enums["replicaType"]}
    replica = replicas["additionalProperties"]
    replica["properties"]["restartPolicy"]["enum"] = enums["restartPolicy"]
    containers = replica["properties"]["template"]["properties"]["spec"]["properties"]["containers"]
    containers["contains"] = {"properties": {"name": {"const": enums["defaultContainerName"]}},
                              "required": ["image"]}
    schema["properties"]["metadata"]["properties"] = {
        "name": {"type": "string", "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}}
    schema["properties"]["metadata"]["required"] = ["name"]
    return jsonschema.Draft7Validator(schema)


def errors(manifest: dict, validator: jsonschema.Validator | None = None) -> list[str]:
    validator = validator or operator_validator()
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(manifest)]


def container(manifest: dict, replica: str) -> dict:
    return manifest["spec"]["tfReplicaSpecs"][replica]["template"]["spec"]["containers"][0]


def env(manifest: dict, replica: str) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(manifest, replica)["env"]}


def test_the_schema_is_the_crds():
    crd = _crd()
    assert crd["_source"]["repo"] == "kubeflow/training-operator"
    assert len(crd["_source"]["commit"]) == 40
    jsonschema.Draft7Validator.check_schema(crd["openAPIV3Schema"])
    replica = crd["openAPIV3Schema"]["properties"]["spec"]["properties"]["tfReplicaSpecs"]
    assert "template" in replica["additionalProperties"]["properties"]


@pytest.mark.parametrize("path", CLUSTERS, ids=[p.name for p in CLUSTERS])
def test_every_cluster_file_exports_a_valid_tfjob(path):
    spec = load_spec(path)
    manifest = tfjob(spec, image=IMAGE).manifest
    assert errors(manifest, crd_validator()) == []
    assert errors(manifest) == []
    # It survives the trip through YAML, as kubectl reads it.
    assert yaml.safe_load(yaml.safe_dump(manifest)) == manifest
    assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1", "TFJob")
    replicas = manifest["spec"]["tfReplicaSpecs"]
    types = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
    assert {types[r]: len(getattr(spec.tasks, r)) for r in types if getattr(spec.tasks, r)} == \
        {name: r["replicas"] for name, r in replicas.items()}
    run_policy = manifest["spec"]["runPolicy"]
    assert run_policy["cleanPodPolicy"] == "All"  # kubeflow trainer#774: PS pods left running
    assert run_policy["backoffLimit"] == spec.restart.max_restarts
    for name in replicas:
        c = container(manifest, name)
        assert (c["name"], c["image"], c["command"]) == \
            ("tensorflow", IMAGE, ["python", "-m", "worker_entry"])
        assert "TF_CONFIG" not in env(manifest, name)  # the operator's
        assert replicas[name]["restartPolicy"] == "OnFailure"  # every file says on-failure


def test_roles_restart_gpus_deadline_and_grace_carry_over():
    manifest = tfjob(parse_spec(PS), image=IMAGE).manifest
    assert errors(manifest) == []
    replicas = manifest["spec"]["tfReplicaSpecs"]
    assert {n: (r["replicas"], r["restartPolicy"]) for n, r in replicas.items()} == {
        "PS": (2, "Always"), "Worker": (3, "ExitCode"), "Chief": (1, "Never"),
        "Evaluator": (1, "OnFailure")}  # a map's roles not named: never; the evaluator alone
    assert manifest["spec"]["runPolicy"] == {
        "cleanPodPolicy": "All", "backoffLimit": 7, "activeDeadlineSeconds": 3601}
    assert "successPolicy" not in manifest["spec"]  # the chief decides, as in ours
    # gpus_per_task: 1 is for the roles that train.
    assert {n: container(manifest, n).get("resources") for n in replicas} == {
        "PS": None, "Evaluator": None, "Worker": {"limits": {"nvidia.com/gpu": 1}},
        "Chief": {"limits": {"nvidia.com/gpu": 1}}}
    pods = {n: r["template"]["spec"] for n, r in replicas.items()}
    assert {p["terminationGracePeriodSeconds"] for p in pods.values()} == {3}
    assert "CUDA_VISIBLE_DEVICES" not in env(manifest, "Worker")  # the device plugin's


def test_a_slurm_job_exports_with_its_counts_and_gpus_and_a_warning():
    spec = parse_spec({"name": "on-slurm", "strategy": "parameter_server",
                       "job": {"entry": "worker_entry.examples.digits:train"},
                       "backend": {"slurm": {"partition": "gpu", "gpus_per_task": 2}},
                       "tasks": {"chief": 1, "worker": 2, "ps": 1}})
    export = tfjob(spec, image=IMAGE)
    assert errors(export.manifest) == []
    replicas = export.manifest["spec"]["tfReplicaSpecs"]
    assert {n: r["replicas"] for n, r in replicas.items()} == {"PS": 1, "Worker": 2, "Chief": 1}
    assert container(export.manifest, "Worker")["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    assert "resources" not in container(export.manifest, "PS")
    assert any(w.startswith("backend.slurm: not carried over") for w in export.warnings)


def test_mwms_without_a_chief_succeeds_when_all_workers_do():
    assert tfjob(parse_spec(MWMS), image=IMAGE).manifest["spec"]["successPolicy"] == "AllWorkers"
    with_chief = {**MWMS, "tasks": {**MWMS["tasks"], "chief": "localhost"}}
    assert "successPolicy" not in tfjob(parse_spec(with_chief), image=IMAGE).manifest["spec"]


def test_the_pods_get_the_settings_a_local_task_gets():
    spec = parse_spec({**PS, "env": {"NCCL_DEBUG": "WARN"}, "localhost": {"gpus": [0, 1, 2, 3]}})
    manifest = tfjob(spec, image=IMAGE).manifest
    plan = make_plan(spec, run_id="r", run_dir="/runs/r", workdir="/w",
                     ports={f"{r}:{i}": 20000 + n for n, (r, i, _) in enumerate(spec.tasks.all())})
    for role, replica in (("ps", "PS"), ("worker", "Worker"), ("chief", "Chief")):
        local = plan.task(f"{role}:0")
        pod = env(manifest, replica)
        assert set(json.loads(pod["TFO_JOB"])) == set(json.loads(local.env["TFO_JOB"]))
        for key in ("entry", "strategy", "serve", "collective", "args"):
            assert json.loads(pod["TFO_JOB"])[key] == json.loads(local.env["TFO_JOB"])[key]
        # What differs per pod of a replica type comes from the operator's TF_CONFIG.
        assert set(local.env) - set(pod) == {"TF_CONFIG", "TFO_TASK", "TFO_IS_CHIEF",
                                             "PYTHONPATH", "CUDA_VISIBLE_DEVICES",
                                             "CUDA_DEVICE_ORDER"}
        assert pod["NCCL_DEBUG"] == "WARN"
        assert json.loads(pod["TFO_JOB"])["model_dir"] == pod["TFO_MODEL_DIR"] == "/tfo/run/model"


def test_worker_entry_takes_the_task_and_chief_from_tf_config():
    cluster = {"worker": ["a:1", "b:1"]}
    assert task_env("worker", 0, cluster) == {"TFO_TASK": "worker:0", "TFO_IS_CHIEF": "1"}
    assert task_env("worker", 1, cluster)["TFO_IS_CHIEF"] == "0"
    cluster = {"chief": ["c:1"], "worker": ["a:1"], "evaluator": ["e:1"]}  # as the operator
    assert [task_env(r, 0, cluster)["TFO_IS_CHIEF"] for r in ("chief", "worker", "evaluator")] \
        == ["1", "0", "0"]


def test_dollar_signs_stay_literal():
    """Kubernetes expands $(VAR) in env values; a user's `$(HOME)` must reach the task as is."""
    spec = parse_spec({**MWMS, "env": {"GREETING": "costs $(HOME) $5"},
                       "job": {"entry": MWMS["job"]["entry"], "args": {"x": "$(PWD)"}}})
    pod = env(tfjob(spec, image=IMAGE).manifest, "Worker")
    assert pod["GREETING"] == "costs $$(HOME) $$5"
    assert '"x": "$$(PWD)"' in pod["TFO_JOB"]


def test_a_bad_export_fails_validation():
    """The validators catch what the operator would refuse."""
    good = tfjob(parse_spec(MWMS), image=IMAGE).manifest
    cases = {
        "our restart word, not TFJob's": (
            ["spec", "tfReplicaSpecs", "Worker", "restartPolicy"], "on-failure", "restartPolicy"),
        "replicas as text": (["spec", "tfReplicaSpecs", "Worker", "replicas"], "2", "replicas"),
        "an unknown replica type": (["spec", "tfReplicaSpecs", "worker"], None, "worker"),
        "a GPU count that is no quantity": (
            ["spec", "tfReplicaSpecs", "Worker", "template", "spec", "containers", 0, "resources"],
            {"limits": {"nvidia.com/gpu": "one"}}, "nvidia.com/gpu"),
        "a name Kubernetes refuses": (["metadata", "name"], "My_Job", "name"),
    }
    for case, (path, value, needle) in cases.items():
        bad = copy.deepcopy(good)
        node = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value if value is not None else node["Worker"]
        found = errors(bad)
        assert any(needle in e for e in found), f"{case}: {found}"
    assert errors(good) == []
    # The CRD alone refuses a wrongly typed count or a container without a name.
    bad = copy.deepcopy(good)
    del bad["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"]
    bad["spec"]["runPolicy"]["backoffLimit"] = "3"
    assert len(errors(bad, crd_validator())) == 2


# (case, spec, --name, what the message must contain)
BAD = [
    ("name Kubernetes refuses", {**MWMS, "name": "MNIST_v2"}, None,
     ["name: 'MNIST_v2' cannot name a TFJob", "--name mnist-v2"]),
    ("name too long for its pods", {**MWMS, "name": "a" * 60}, None,
     ["name:", "at most 63"]),
    ("bad --name", MWMS, "9lives", ["--name: '9lives'", "--name job-9lives"]),
]


@pytest.mark.parametrize(("case", "data", "name", "needles"), BAD, ids=[c for c, *_ in BAD])
def test_bad_input_names_the_field(case, data, name, needles):
    with pytest.raises(SpecError) as err:
        tfjob(parse_spec(data), image=IMAGE, name=name)
    for needle in needles:
        assert needle in str(err.value), f"{case}: {needle!r} not in {err.value}"


def test_empty_image_is_refused():
    with pytest.raises(SpecError, match="--image"):
        tfjob(parse_spec(MWMS), image=" ")


def test_what_does_not_carry_over_is_a_warning_naming_the_field():
    lab = tfjob(load_spec(REPO / "clusters" / "lab.yaml"), image=IMAGE).warnings
    assert [w.split(":")[0] for w in lab] == ["hosts", "restart.policy", "job.model_dir"]
    ps = tfjob(load_spec(REPO / "clusters" / "localhost-ps.yaml"), image=IMAGE).warnings
    assert [w.split(":")[0] for w in ps] == ["restart.policy", "evaluator_required",
                                             "job.model_dir"]
    quiet = {**MWMS, "job": {**MWMS["job"], "model_dir": "gs://lab/models/{run_id}"}}
    assert tfjob(parse_spec(quiet), image=IMAGE).warnings == []  # restart: never; shared storage


def test_cli_writes_the_tfjob(tmp_path):
    out = tmp_path / "job.yaml"
    res = run_tfo("export", "tfjob", "clusters/localhost.yaml", "--image", IMAGE, "-o", str(out),
                  timeout=60)
    assert res.returncode == 0, res.output
    assert "warning: job.model_dir" in res.stderr
    manifest = yaml.safe_load(out.read_text())
    assert errors(manifest) == []
    assert out.read_text().startswith("# made by: tfo export tfjob clusters/localhost.yaml")
    res = run_tfo("export", "tfjob", "clusters/localhost.yaml", "--image", IMAGE, timeout=60)
    assert res.returncode == 0 and yaml.safe_load(res.stdout) == manifest


@pytest.mark.parametrize("args", [
    ["--image", IMAGE, "--name", "Bad_Name"],
    [],  # no --image
    ["--image", IMAGE, "-o", "/nonexistent/dir/job.yaml"],
], ids=["bad name", "no image", "unwritable output"])
def test_cli_bad_input_is_exit_2(args):
    res = run_tfo("export", "tfjob", "clusters/localhost.yaml", *args, timeout=60)
    assert res.returncode == 2, res.output
    assert "Traceback" not in res.output
    assert ("--name" if "--name" in args else "--image" if not args else "--output") in res.stderr
