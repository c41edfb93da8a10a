"""Spec → Plan: everything decided before anything starts. A pure function: no I/O.

    plan = make_plan(spec, run_id="demo-1", run_dir=Path("/abs/runs/demo-1"),
                     workdir=Path("/abs"), ports={"worker:1": 20001})
    plan.tasks[0].tf_config   # {"cluster": {"worker": [...]}, "task": {"type": "worker", ...}}

Printing a plan is a dry run (`tfo plan FILE`).
"""

from __future__ import annotations

import json
import posixpath
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from orchestrator.devices import task_gpus, visible_devices
from orchestrator.spec import LOCALHOST, MAX_ARG_STRLEN, ClusterSpec, SpecError, Strategy

CLUSTER_ROLES = ("chief", "worker", "ps")  # the evaluator is never part of `cluster`


@dataclass(frozen=True)
class TaskPlan:
    name: str  # "worker:1"
    role: str
    index: int
    host: str  # "localhost" or a name under `hosts:`
    address: str  # how the other tasks reach this one
    port: int
    tf_config: dict[str, Any]
    command: list[str]
    env: dict[str, str]
    cwd: str  # on the task's host
    log_path: str  # on the coordinator's machine
    tmp_dir: str  # on the task's host; its TMPDIR, removed when it ends
    gpus: list[int] = field(default_factory=list)  # its CUDA_VISIBLE_DEVICES; [] is none

    @property
    def is_local(self) -> bool:
        return self.host == LOCALHOST

    def to_json(self) -> dict[str, Any]:
        # No asdict: it deep-copies every task's cluster, quadratic in the number of tasks.
        keys = ("name", "host", "port", "tf_config", "command", "env", "role", "index",
                "address", "cwd", "log_path", "gpus")
        return {k: getattr(self, k) for k in keys}


@dataclass(frozen=True)
class Plan:
    name: str
    strategy: Strategy
    run_id: str
    run_dir: str
    tasks: list[TaskPlan] = field(default_factory=list)

    def task(self, name: str) -> TaskPlan:
        return next(t for t in self.tasks if t.name == name)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "strategy": self.strategy.value, "run_id": self.run_id,
                "run_dir": self.run_dir, "tasks": [t.to_json() for t in self.tasks]}


def task_name(role: str, index: int) -> str:
    return f"{role}:{index}"


def make_plan(
    spec: ClusterSpec,
    *,
    run_id: str,
    run_dir: PurePosixPath | str,
    workdir: PurePosixPath | str,
    ports: Mapping[str, int] | None = None,
    python: str = sys.executable,
    gpus: Mapping[str, list[int]] | None = None,
) -> Plan:
    """Work out every task's port, TF_CONFIG, command, env and paths.

    `run_dir` and `workdir` are absolute paths on the coordinator's machine; `ports` fills
    in the tasks whose port is `auto` (the launcher finds free ones). Remote tasks run in
    their host's `workdir` with the run directory mirrored under it. `gpus` gives the GPUs
    of hosts whose gpus are `auto` (launch/gpus.py asks them); devices.py has the rest.
    """
    ports = dict(ports or {})
    run_dir, workdir = str(run_dir), str(workdir)
    resolved: list[tuple[str, int, str, str, int]] = []  # role, index, host, address, port
    for role, index, addr in spec.tasks.all():
        name = task_name(role, index)
        port = addr.port if addr.port is not None else ports.get(name)
        if port is None:
            raise ValueError(f"{name}: port is 'auto' and no port was assigned")
        address = spec.hosts[addr.host].address if addr.host in spec.hosts else LOCALHOST
        resolved.append((role, index, addr.host, address, port))

    cluster: dict[str, list[str]] = {}
    for role, _, _, address, port in resolved:  # spec.tasks.all() gives each role in order
        if role in CLUSTER_ROLES:
            cluster.setdefault(role, []).append(f"{address}:{port}")
    cluster = {role: cluster[role] for role in sorted(cluster)}
    # Serialized once and shared: every task's TF_CONFIG holds the whole cluster.
    cluster_json = json.dumps(cluster)
    args_json = json.dumps(spec.job.args, sort_keys=True)
    devices = task_gpus(spec, gpus or {})  # in spec.tasks.all() order, as `resolved`

    tasks = []
    for (role, index, host, address, port), task_devices in zip(resolved, devices, strict=True):
        name = task_name(role, index)
        if host == LOCALHOST:
            task_workdir, task_run_dir, exe = workdir, run_dir, python
        else:
            h = spec.hosts[host]
            task_workdir = h.workdir
            task_run_dir = posixpath.join(h.workdir, "runs", run_id)
            exe = h.python
        model_dir = spec.job.model_dir.format(run_id=run_id, run_dir=task_run_dir)
        if not posixpath.isabs(model_dir) and not model_dir.startswith("~"):
            model_dir = posixpath.join(task_workdir, model_dir)
        task = {"type": role, "index": index}
        task_json = json.dumps(task, sort_keys=True)
        tmp_dir = posixpath.join(task_run_dir, "tmp", f"{role}-{index}")
        job = {"entry": spec.job.entry, "model_dir": model_dir,
               "strategy": spec.strategy.value, "run_id": run_id, "run_dir": task_run_dir,
               "tmp_dir": tmp_dir, "collective": spec.job.collective.value}
        env = {
            **spec.env,
            **(spec.hosts[host].env if host in spec.hosts else {}),
            # What json.dumps(..., sort_keys=True) gives, without re-serializing the cluster.
            "TF_CONFIG": f'{{"cluster": {cluster_json}, "task": {task_json}}}',
            "TFO_TASK": name,
            "TFO_JOB": f'{{"args": {args_json}, {json.dumps(job, sort_keys=True)[1:]}',
            # Keras 3 in TF 2.21 breaks multi-worker fit and has no PS support.
            "TF_USE_LEGACY_KERAS": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": task_workdir,
            # TensorFlow's autograph files and the like: gone with the task (lifeline.py).
            "TMPDIR": tmp_dir, "TEMP": tmp_dir, "TMP": tmp_dir,
            # Its own GPUs only ("" for none: unset, TensorFlow takes every GPU), numbered
            # as nvidia-smi numbers them (CUDA's default order is fastest first).
            "CUDA_VISIBLE_DEVICES": visible_devices(task_devices),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        }
        _check_env_fits(name, host, env)
        tasks.append(TaskPlan(
            name=name, role=role, index=index, host=host, address=address, port=port,
            tf_config={"cluster": cluster, "task": task}, command=[exe, "-m", "worker_entry"],
            env=env, cwd=task_workdir,
            log_path=posixpath.join(run_dir, "logs", f"{role}-{index}.log"), tmp_dir=tmp_dir,
            gpus=task_devices,
        ))
    return Plan(name=spec.name, strategy=spec.strategy, run_id=run_id, run_dir=run_dir,
                tasks=tasks)


def _check_env_fits(name: str, host: str, env: Mapping[str, str]) -> None:
    """Linux refuses to start a process (E2BIG) with any environment string over
    MAX_ARG_STRLEN; an SSH task's whole environment is one shell command, under the same cap."""
    sizes = {k: len(k.encode()) + len(v.encode()) + 2 for k, v in env.items()}  # K=V and NUL
    biggest = max(sizes, key=sizes.__getitem__)
    if sizes[biggest] > MAX_ARG_STRLEN:
        what = ("the cluster is too large for one TF_CONFIG" if biggest == "TF_CONFIG"
                else "make it smaller")
        raise SpecError(f"{name}: its environment variable {biggest} is {sizes[biggest]:,} "
                        f"bytes; Linux allows {MAX_ARG_STRLEN:,} (MAX_ARG_STRLEN): {what}")
    total = sum(sizes.values()) + 4096  # room for the command around it
    if host != LOCALHOST and total > MAX_ARG_STRLEN:
        raise SpecError(f"{name}: its environment is {total:,} bytes and travels to {host} in "
                        f"one SSH command, which Linux caps at {MAX_ARG_STRLEN:,} bytes "
                        "(MAX_ARG_STRLEN); make env, job.args or the cluster smaller")
