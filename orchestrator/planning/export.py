"""A cluster file as a Kubeflow TFJob (kubeflow.org/v1), for a lab that has outgrown SSH boxes.

    job = tfjob(spec, image="registry.lab/train:1")   # raises SpecError naming the field
    job.manifest["spec"]["tfReplicaSpecs"]["Worker"]["replicas"]   # 2
    job.warnings     # what does not carry over and changes behaviour: say it, do not hide it

Pure: no I/O. The TFJob operator does what our coordinator does here: it builds every pod's
TF_CONFIG (we set none), places the pods, and restarts them by `restartPolicy`. Each pod runs
`python -m worker_entry` with the job's settings (TFO_JOB and the rest) in its environment,
as a local or SSH task does (plan.py); the image holds the project, as its working directory.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from orchestrator.planning.plan import JOB_KINDS, job_env
from orchestrator.planning.policy import RestartPolicy
from orchestrator.planning.spec import ClusterSpec, SpecError
from orchestrator.planning.strategy import RULES, START_ORDER, RestartUnit
from orchestrator.runs.rundir import BACKUP, TMP
from worker_entry.markers import Role, Strategy

API_VERSION = "kubeflow.org/v1"
REPLICA_TYPES = {Role.CHIEF: "Chief", Role.WORKER: "Worker", Role.PS: "PS",
                 Role.EVALUATOR: "Evaluator"}
# The same four words; TFJob's ExitCode is ours too (1-127 permanent, 128-255 retried).
RESTART_POLICIES = {RestartPolicy.NEVER: "Never", RestartPolicy.ON_FAILURE: "OnFailure",
                    RestartPolicy.ALWAYS: "Always", RestartPolicy.EXIT_CODE: "ExitCode"}
CONTAINER = "tensorflow"  # the operator finds the TF container (and its port) by this name
GPU_RESOURCE = "nvidia.com/gpu"
PYTHON = "python"  # the image's
# Each pod's run directory, in an emptyDir: it outlives a container restart in the same pod
# (OnFailure, Always), so BackupAndRestore resumes; it goes with the pod.
VOLUME, MOUNT = "tfo-run", "/tfo"
POD_RUN_DIR = f"{MOUNT}/run"
# The operator's webhook wants a DNS-1035 label; its services are `<name>-<type>-<index>`.
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_MAX = 63


@dataclass(frozen=True)
class TFJobExport:
    manifest: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    def text(self, made_by: str) -> str:
        """The manifest as the file `tfo export tfjob` writes: YAML, after a comment that
        says what made it and how to run it."""
        import yaml  # only here: the rest of the export is plain data

        return (f"# made by: {made_by}\n# run it: kubectl apply -f THIS_FILE (the Kubeflow "
                "training operator must be installed)\n"
                + yaml.safe_dump(self.manifest, sort_keys=False, width=100))


def tfjob(spec: ClusterSpec, *, image: str, name: str | None = None) -> TFJobExport:
    """The TFJob that runs `spec`'s tasks as pods of `image`; `name` overrides spec.name."""
    if not image.strip():
        raise SpecError("--image: give the container image that holds the job's code and "
                        "TensorFlow (e.g. registry.lab/train:1)")
    job_name = _job_name(spec, name)
    counts = {role: len(getattr(spec.tasks, role)) for role in _roles(spec)}
    replicas = {REPLICA_TYPES[role]: _replica(spec, role, count, image)
                for role, count in counts.items()}
    run_policy: dict[str, Any] = {"cleanPodPolicy": "All",
                                  "backoffLimit": spec.restart.max_restarts}
    if spec.timeouts.deadline_seconds is not None:
        run_policy["activeDeadlineSeconds"] = math.ceil(spec.timeouts.deadline_seconds)
    job_spec: dict[str, Any] = {"runPolicy": run_policy}
    if spec.strategy is Strategy.MULTI_WORKER_MIRRORED and Role.CHIEF not in counts:
        # Ours: done when every worker is. TFJob's default: when worker 0 is.
        job_spec["successPolicy"] = "AllWorkers"
    job_spec["tfReplicaSpecs"] = replicas
    manifest = {"apiVersion": API_VERSION, "kind": "TFJob",
                "metadata": {"name": job_name, "labels": {"app.kubernetes.io/created-by": "tfo"}},
                "spec": job_spec}
    return TFJobExport(manifest, _warnings(spec))


def _job_name(spec: ClusterSpec, name: str | None) -> str:
    field_name = "--name" if name is not None else "name"
    job_name = name if name is not None else spec.name
    longest = max((f"{job_name}-{role.value}-{len(getattr(spec.tasks, role)) - 1}"
                   for role in _roles(spec)), key=len)
    if not _DNS_LABEL.match(job_name) or len(longest) > _LABEL_MAX:
        hint = re.sub(r"[^a-z0-9-]+", "-", job_name.lower()).strip("-") or "job"
        if not hint[0].isalpha():
            hint = f"job-{hint}"
        raise SpecError(
            f"{field_name}: {job_name!r} cannot name a TFJob: Kubernetes wants lower-case "
            f"letters, digits and '-', starting with a letter, and its pods' names "
            f"(`{longest}`) at most {_LABEL_MAX} characters; give --name {hint[:40]}")
    return job_name


def _replica(spec: ClusterSpec, role: Role, count: int, image: str) -> dict[str, Any]:
    command, job_fields = JOB_KINDS[spec.job.kind](spec, PYTHON, False)
    tmp_dir = posixpath.join(POD_RUN_DIR, TMP)
    backup_dir = posixpath.join(POD_RUN_DIR, BACKUP)
    model_dir = spec.job.model_dir.format(run_id=spec.name, run_dir=POD_RUN_DIR)
    args_json = json.dumps(spec.job.args, sort_keys=True)
    env = {
        # TF_CONFIG is the operator's; TFO_TASK and TFO_IS_CHIEF differ per pod of a replica
        # type, so worker_entry takes them from TF_CONFIG. No CUDA_VISIBLE_DEVICES: the
        # device plugin gives each pod its own GPUs.
        "TFO_MODEL_DIR": model_dir,
        "TFO_BACKUP_DIR": backup_dir,
        "TFO_RUN_DIR": POD_RUN_DIR,
        **spec.env,
        "TFO_JOB": job_env(spec, role, job_fields, args_json, model_dir=model_dir,
                           run_id=spec.name, run_dir=POD_RUN_DIR, tmp_dir=tmp_dir,
                           backup_dir=backup_dir),
        "PYTHONUNBUFFERED": "1",
        "TMPDIR": tmp_dir, "TEMP": tmp_dir, "TMP": tmp_dir,
    }
    container: dict[str, Any] = {
        "name": CONTAINER, "image": image, "command": command,
        # Kubernetes expands $(VAR) in env values; $$ is a literal $.
        "env": [{"name": k, "value": v.replace("$", "$$")} for k, v in env.items()],
        "volumeMounts": [{"name": VOLUME, "mountPath": MOUNT}],
    }
    gpus = spec.gpus_for(role)  # the job's, or what a scheduler was asked for
    if gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: gpus}}
    pod = {"terminationGracePeriodSeconds": math.ceil(spec.timeouts.grace_seconds),
           "containers": [container], "volumes": [{"name": VOLUME, "emptyDir": {}}]}
    policy = spec.restart.for_role(role, spec.strategy)
    return {"replicas": count, "restartPolicy": RESTART_POLICIES[policy],
            "template": {"spec": pod}}


def _warnings(spec: ClusterSpec) -> list[str]:
    """What the TFJob does differently from `tfo run`, by the field that asks for it."""
    out = []
    if spec.hosts:
        out.append(f"hosts: not carried over ({', '.join(spec.hosts)}): Kubernetes places the "
                   "pods; the image replaces each host's python, workdir and synced code, and "
                   "the device plugin its gpus")
        with_env = [n for n, h in spec.hosts.items() if h.env]
        if with_env:
            out.append(f"hosts.{with_env[0]}.env: not carried over (a pod has no host); move "
                       "what every task needs into the top-level env:")
    if spec.backend is not None:
        options = spec.backend.options
        request = sorted(f for f in options.model_fields_set if f != "gpus_per_task")
        gpus = ", and gpus_per_task becomes each pod's nvidia.com/gpu limit" \
            if "gpus_per_task" in type(options).model_fields else ""
        out.append(f"backend.{spec.backend.kind}: not carried over"
                   f"{' (' + ', '.join(request) + ')' if request else ''}: Kubernetes schedules "
                   f"the pods; each role's count is kept{gpus}")
    unit = RULES[spec.strategy].restart_unit
    restarted = [r for r in _roles(spec) if unit[r] is RestartUnit.GROUP
                 and spec.restart.for_role(r, spec.strategy) is not RestartPolicy.NEVER]
    if restarted:
        out.append(f"restart.policy: TFJob restarts a lost {restarted[0].value} pod alone, "
                   f"where tfo restarts every training task of a {spec.strategy.value} job with "
                   "it; the tasks that depend on it fail and restart one by one, each restart "
                   "counted against backoffLimit")
    if spec.tasks.evaluator and not spec.evaluator_required:
        out.append("evaluator_required: false is not carried over: TFJob fails the job when the "
                   "evaluator fails for good, and deletes it as soon as the job is done "
                   "(timeouts.evaluator_seconds does not apply)")
    model_dir = spec.job.model_dir.format(run_id=spec.name, run_dir=POD_RUN_DIR)
    if "://" not in model_dir and (not posixpath.isabs(model_dir)
                                   or model_dir.startswith(POD_RUN_DIR + "/")):
        out.append(f"job.model_dir: {spec.job.model_dir!r} is inside the chief's pod, deleted "
                   "with it when the job ends (cleanPodPolicy: All); give an absolute path on "
                   "a volume every pod mounts, or a gs:// or s3:// URL")
    return out


def _roles(spec: ClusterSpec) -> list[Role]:
    return [role for role in START_ORDER if getattr(spec.tasks, role)]
