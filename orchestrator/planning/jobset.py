"""A cluster file as a Kubernetes JobSet (jobset.x-k8s.io/v1alpha2), the API Kubeflow
Trainer v2 is built on, for a lab whose GPUs are in Kubernetes.

    job = jobset(spec, image="registry.lab/train:1")   # raises SpecError naming the field
    job.manifest["spec"]["replicatedJobs"][0]["name"]  # "worker"
    job.warnings                                       # what does not carry over

Pure: no I/O. The shape, and why:
- One replicated job per role (chief, worker, ps, evaluator), each one Indexed Job of
  `count` pods (replicas: 1, parallelism = completions = count): pod i of role r is
  `<set>-<r>-0-<i>.<set>` in the set's DNS (network.enableDNSHostnames).
- TF_CONFIG is tfo's plan's (orchestrator/planning/plan.py, the same cluster and task), with each
  task's address replaced by its pod's stable DNS name and PORT. It is computed in the pod:
  the pod's index comes from the Indexed Job's completion-index annotation (downward API,
  TFO_POD_INDEX) and Kubernetes expands `$(TFO_POD_INDEX)` in TF_CONFIG's value.
- The pod runs tfo's task side, `python -m worker_entry`, with the job's settings (TFO_JOB and
  the rest, as export.py's TFJob): progress markers, stacks and the rest work there as here.
- Restarts: a pod's failure fails its Job (backoffLimit 0, restartPolicy Never), and the
  set's failurePolicy recreates every child Job (Recreate): the whole group restarts
  together, as a MultiWorkerMirrored job needs, up to restart.max_restarts times (policy
  never: 0). What tfo's coordinator does that Kubernetes does not is said as warnings.
- Success: the chief's Job (or, without a chief, every worker's) completing ends the set
  (successPolicy); ps and evaluator, which serve forever, are then deleted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from orchestrator.planning.export import POD_RUN_DIR, _job_name, _replica, _roles, _warnings
from orchestrator.planning.policy import RestartPolicy
from orchestrator.planning.spec import ClusterSpec, SpecError
from worker_entry.markers import Role, Strategy

API_VERSION = "jobset.x-k8s.io/v1alpha2"
PORT = 2222  # every pod has its own address: one port for all (TFJob's default too)
INDEX_ENV = "TFO_POD_INDEX"
INDEX_ANNOTATION = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
_INDEX = f"$({INDEX_ENV})"


@dataclass(frozen=True)
class JobSetExport:
    manifest: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    def text(self, made_by: str) -> str:
        import yaml

        return (f"# made by: {made_by}\n# run it: kubectl apply -f THIS_FILE (JobSet's "
                "controller must be installed: https://jobset.sigs.k8s.io)\n"
                + yaml.safe_dump(self.manifest, sort_keys=False, width=100))


def pod_address(name: str, role: str, index: int) -> str:
    """Pod `index` of role `role`'s stable DNS name in set `name`, with PORT."""
    return f"{name}-{role}-0-{index}.{name}:{PORT}"


def tf_config_template(spec: ClusterSpec, name: str, role: Role) -> str:
    """TF_CONFIG for role's pods as plan.py makes it, addresses as pods' DNS names; its task
    index is `$(TFO_POD_INDEX)`, which Kubernetes expands in each pod."""
    from orchestrator.planning.plan import make_plan

    # The cluster only: GPUs are the device plugin's, not a host's list.
    bare = spec.model_copy(update={"job": spec.job.model_copy(update={"gpus_per_task": 0})})
    names = [f"{r.value}:{i}" for r, i, _ in spec.tasks.all()]  # a scheduler's: no address
    plan = make_plan(bare, run_id=name, run_dir=POD_RUN_DIR, workdir="/tfo",
                     ports={n: PORT + k for k, n in enumerate(names)},
                     nodes={n: "pod" for n in names} if spec.backend is not None else None)
    first = next(t for t in plan.tasks if t.role == role)
    # TF_CONFIG's cluster lists role r's task i at position i: its pod is pod i of r.
    cluster = {r: [pod_address(name, r, i) for i in range(len(addresses))]
               for r, addresses in first.tf_config["cluster"].items()}
    config = {"cluster": cluster, "task": {"type": role.value, "index": 0}}
    text = json.dumps(config, separators=(",", ":"))
    return text.replace('"index":0}', f'"index":{_INDEX}}}')


def jobset(spec: ClusterSpec, *, image: str, name: str | None = None) -> JobSetExport:
    """The JobSet that runs `spec`'s tasks as pods of `image`; `name` overrides spec.name."""
    if not image.strip():
        raise SpecError("--image: give the container image that holds the job's code and "
                        "TensorFlow (e.g. registry.lab/train:1)")
    set_name = _job_name(spec, name)
    roles = _roles(spec)
    longest = max((f"{set_name}-{r.value}-0-{len(getattr(spec.tasks, r)) - 1}" for r in roles),
                  key=len)
    if len(longest) > 63:  # a pod's hostname is a DNS label
        raise SpecError(f"{'--name' if name is not None else 'name'}: {set_name!r} is too long "
                        f"for its pods' names (`{longest}`, at most 63 characters): give a "
                        "shorter --name")
    replicated = [_replicated_job(spec, set_name, role, len(getattr(spec.tasks, role)), image)
                  for role in roles]
    policy = spec.restart.for_role(Role.WORKER if Role.WORKER in roles else roles[0],
                                   spec.strategy)
    restarts = 0 if policy is RestartPolicy.NEVER else spec.restart.max_restarts
    target = Role.CHIEF if Role.CHIEF in roles else Role.WORKER
    job_spec: dict[str, Any] = {
        "network": {"enableDNSHostnames": True, "subdomain": set_name,
                    "publishNotReadyAddresses": True},
        "failurePolicy": {"maxRestarts": restarts, "restartStrategy": "Recreate"},
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [target.value]},
        "replicatedJobs": replicated,
    }
    manifest = {"apiVersion": API_VERSION, "kind": "JobSet",
                "metadata": {"name": set_name, "labels": {"app.kubernetes.io/created-by": "tfo"}},
                "spec": job_spec}
    return JobSetExport(manifest, _jobset_warnings(spec))


def _replicated_job(spec: ClusterSpec, set_name: str, role: Role, count: int,
                    image: str) -> dict[str, Any]:
    pod = _replica(spec, role, count, image)["template"]["spec"]  # the TFJob's pod, as is
    container = pod["containers"][0]
    container["env"] = [
        {"name": INDEX_ENV, "valueFrom": {"fieldRef": {"fieldPath": INDEX_ANNOTATION}}},
        {"name": "TF_CONFIG", "value": tf_config_template(spec, set_name, role)},
        *container["env"]]
    container["ports"] = [{"name": "tfjob-port", "containerPort": PORT}]
    pod["restartPolicy"] = "Never"  # a failure fails the Job; the set restarts the group
    job: dict[str, Any] = {"parallelism": count, "completions": count,
                           "completionMode": "Indexed", "backoffLimit": 0,
                           "template": {"spec": pod}}
    if spec.timeouts.deadline_seconds is not None:
        job["activeDeadlineSeconds"] = math.ceil(spec.timeouts.deadline_seconds)
    return {"name": role.value, "replicas": 1, "template": {"spec": job}}


def _jobset_warnings(spec: ClusterSpec) -> list[str]:
    """export.py's, but the TFJob restart one (the set restarts the group), and JobSet's own."""
    out = [w for w in _warnings(spec) if not w.startswith(("restart.policy: TFJob",
                                                             "evaluator_required"))]
    policy = spec.restart.for_role(Role.WORKER, spec.strategy)
    out = [w.replace("cleanPodPolicy: All", "the set's Jobs go with it") for w in out]
    if spec.strategy is Strategy.PARAMETER_SERVER:
        out.append("restart.policy: a lost worker restarts the whole set (JobSet restarts "
                   "every child Job), where tfo restarts a parameter_server worker alone")
    if spec.restart.policy is not None and not isinstance(spec.restart.policy, RestartPolicy):
        out.append("restart.policy: per-role policies are not carried over: the set has one "
                   "failure policy (the workers')")
    if spec.tasks.evaluator and not spec.evaluator_required:
        out.append("evaluator_required: false is not carried over: the evaluator's failure "
                   "restarts the whole set, as a worker's does; it is deleted once the "
                   "success policy's Jobs complete (timeouts.evaluator_seconds does not apply)")
    if policy in (RestartPolicy.ALWAYS, RestartPolicy.EXIT_CODE):
        out.append(f"restart.policy: {policy.value} is not carried over: the set restarts on "
                   "every failure (up to max_restarts), and never after a success")
    if spec.restart.backoff_seconds:
        out.append("restart.backoff_seconds: not carried over: JobSet recreates the Jobs at "
                   "once")
    return out
