"""`tfo export jobset`: the manifest validates against JobSet's own CRD schema (v0.12.0,
vendored in tests/data with its source), and the TF_CONFIG each pod computes (Kubernetes'
downward API and $(VAR) expansion, done here as the kubelet does) is `tfo plan`'s, with each
address its pod's stable DNS name."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from orchestrator.pipeline import load_source
from orchestrator.planning.jobset import INDEX_ANNOTATION, PORT, jobset, pod_address
from orchestrator.planning.plan import make_plan
from orchestrator.planning.spec import SpecError, parse_spec
from tests.conftest import REPO, run_tfo

CRD = Path(__file__).parent / "data" / "jobset_crd_v1alpha2.schema.json"

GPU = """\
name: gpu-mwms
job:
  entry: worker_entry.examples.digits:train
  gpus_per_task: 1
tasks:
  chief: [localhost:20000]
  worker: [localhost:20001, localhost:20002]
restart: {policy: on-failure, max_restarts: 5}
timeouts: {grace_seconds: 30, deadline_seconds: 3600}
"""
EVALUATOR = """\
name: eval-mwms
job: {entry: worker_entry.examples.digits:train}
tasks:
  worker: [localhost:20000, localhost:20001]
  evaluator: [localhost:20002]
restart: {policy: never}
"""
EXAMPLES = {
    "localhost": (REPO / "clusters" / "localhost.yaml").read_text(),
    "ps": (REPO / "clusters" / "localhost-ps.yaml").read_text(),
    "evaluator": EVALUATOR,
    "gpu": GPU,
}


def strict(schema: object) -> object:
    """The CRD's schema as the API server applies it, where it would silently prune: a field
    it does not know is an error here (the apiserver drops it: the pod would lose it)."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


VALIDATOR = jsonschema.Draft7Validator(strict(json.loads(CRD.read_text())["openAPIV3Schema"]))


def errors(manifest: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in VALIDATOR.iter_errors(manifest)]


def spec_of(text: str):  # noqa: ANN201
    return parse_spec(yaml.safe_load(text))


def pod_env(container: dict, index: int) -> dict[str, str]:
    """A container's environment in pod `index`, as the kubelet makes it: the downward API's
    completion index, then $(VAR) expanded from the variables before it ($$ is a $)."""
    env: dict[str, str] = {}
    for e in container["env"]:
        if "valueFrom" in e:
            assert e["valueFrom"]["fieldRef"]["fieldPath"] == INDEX_ANNOTATION
            env[e["name"]] = str(index)
            continue
        env[e["name"]] = re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                lambda m: "$" if m.group(0) == "$$" else
                                env.get(m.group(1), m.group(0)), e["value"])
    return env


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_every_example_exports_a_valid_jobset(example):
    manifest = jobset(spec_of(EXAMPLES[example]), image="registry.lab/train:1").manifest
    assert errors(manifest) == []
    assert manifest["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and manifest["kind"] == "JobSet"


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_each_pods_tf_config_is_the_plans(example):
    spec = spec_of(EXAMPLES[example])
    manifest = jobset(spec, image="registry.lab/train:1").manifest
    name = manifest["metadata"]["name"]
    # `tfo plan`'s TF_CONFIGs: GPUs change none of them (this machine has no GPUs to plan).
    bare = spec.model_copy(update={"job": spec.job.model_copy(update={"gpus_per_task": 0})})
    plan = make_plan(bare, run_id="r", run_dir="/tmp/r", workdir="/tmp")
    by_address = {f"{t.host}:{t.port}": pod_address(name, t.role.value, t.index)
                  for t in plan.tasks}
    seen = []
    for rj in manifest["spec"]["replicatedJobs"]:
        job = rj["template"]["spec"]
        assert rj["replicas"] == 1 and job["completionMode"] == "Indexed"
        assert job["parallelism"] == job["completions"]
        for i in range(job["completions"]):
            got = json.loads(pod_env(job["template"]["spec"]["containers"][0], i)["TF_CONFIG"])
            want = next(t for t in plan.tasks if t.name == f"{rj['name']}:{i}").tf_config
            want = {"cluster": {r: [by_address[a] for a in addresses]
                                for r, addresses in want["cluster"].items()},
                    "task": want["task"]}
            assert got == want
            seen.append(f"{rj['name']}:{i}")
    assert sorted(seen) == sorted(t.name for t in plan.tasks)


def test_the_pod_dns_names_are_jobsets():
    """JobSet names pod i of replicated job r `<set>-<r>-<job index>-<i>` in the subdomain
    `<set>` (network.enableDNSHostnames), and the container listens on PORT."""
    manifest = jobset(spec_of(GPU), image="i").manifest
    assert manifest["spec"]["network"] == {"enableDNSHostnames": True, "subdomain": "gpu-mwms",
                                           "publishNotReadyAddresses": True}
    assert pod_address("gpu-mwms", "worker", 1) == f"gpu-mwms-worker-0-1.gpu-mwms:{PORT}"
    for rj in manifest["spec"]["replicatedJobs"]:
        ports = rj["template"]["spec"]["template"]["spec"]["containers"][0]["ports"]
        assert ports[0]["containerPort"] == PORT


def test_restart_success_grace_gpus_and_deadline_carry_over():
    manifest = jobset(spec_of(GPU), image="i").manifest
    s = manifest["spec"]
    # A failed pod fails its Job at once; the set then recreates every Job: the group.
    assert s["failurePolicy"] == {"maxRestarts": 5, "restartStrategy": "Recreate"}
    assert s["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    for rj in s["replicatedJobs"]:
        job = rj["template"]["spec"]
        pod = job["template"]["spec"]
        assert job["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
        assert job["activeDeadlineSeconds"] == 3600
        assert pod["terminationGracePeriodSeconds"] == 30
        assert pod["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
        assert pod["containers"][0]["command"] == ["python", "-m", "worker_entry"]
    never = jobset(spec_of(EVALUATOR), image="i")
    assert never.manifest["spec"]["failurePolicy"]["maxRestarts"] == 0
    assert never.manifest["spec"]["successPolicy"]["targetReplicatedJobs"] == ["worker"]
    assert not any("TFJob" in w for w in never.warnings), never.warnings


def test_a_bad_manifest_fails_validation():
    """The validator does reject: a field JobSet does not know, a value it does not take."""
    manifest = jobset(spec_of(GPU), image="i").manifest
    bad = copy.deepcopy(manifest)
    bad["spec"]["failurePolicy"]["restartStrategy"] = "RestartOne"
    bad["spec"]["replicatedJobs"][0]["replica"] = 2
    found = errors(bad)
    assert any("restartStrategy" in e for e in found), found
    assert any("'replica' was unexpected" in e for e in found), found


def test_a_name_too_long_for_its_pods_is_named():
    with pytest.raises(SpecError, match="--name"):
        jobset(spec_of(GPU), image="i", name="x" * 60)


def test_cli_writes_the_jobset_and_tfjob_points_to_it(tmp_path):
    out = tmp_path / "js.yaml"
    res = run_tfo("export", "jobset", str(REPO / "clusters" / "localhost.yaml"), "--image",
                  "registry.lab/train:1", "-o", str(out), timeout=60)
    assert res.returncode == 0, res.output
    assert errors(yaml.safe_load(out.read_text())) == []
    assert f"wrote {out}" in res.stderr
    helped = run_tfo("export", "tfjob", "--help", timeout=60)
    assert "prefer `tfo export jobset`" in " ".join(helped.stdout.split())


def test_load_source_and_jobset_agree_on_the_examples_files():
    spec, _ = load_source(REPO / "clusters" / "localhost-ps.yaml")
    roles = [rj["name"] for rj in jobset(spec, image="i").manifest["spec"]["replicatedJobs"]]
    assert roles == ["ps", "worker", "chief", "evaluator"]
