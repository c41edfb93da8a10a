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
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any

from orchestrator.spec import LOCALHOST, ClusterSpec, Strategy

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

    @property
    def is_local(self) -> bool:
        return self.host == LOCALHOST

    def to_json(self) -> dict[str, Any]:
        keys = ("name", "host", "port", "tf_config", "command", "env", "role", "index",
                "address", "cwd", "log_path")
        return {k: v for k, v in asdict(self).items() if k in keys}


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
) -> Plan:
    """Work out every task's port, TF_CONFIG, command, env and paths.

    `run_dir` and `workdir` are absolute paths on the coordinator's machine; `ports` fills
    in the tasks whose port is `auto` (the launcher finds free ones). Remote tasks run in
    their host's `workdir` with the run directory mirrored under it.
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
    for role in CLUSTER_ROLES:
        members = sorted((i, f"{a}:{p}") for r, i, _, a, p in resolved if r == role)
        if members:
            cluster[role] = [hp for _, hp in members]

    tasks = []
    for role, index, host, address, port in resolved:
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
        tf_config = {"cluster": cluster, "task": {"type": role, "index": index}}
        tmp_dir = posixpath.join(task_run_dir, "tmp", f"{role}-{index}")
        job = {"entry": spec.job.entry, "args": spec.job.args, "model_dir": model_dir,
               "strategy": spec.strategy.value, "run_id": run_id, "run_dir": task_run_dir,
               "tmp_dir": tmp_dir}
        env = {
            **spec.env,
            **(spec.hosts[host].env if host in spec.hosts else {}),
            "TF_CONFIG": json.dumps(tf_config, sort_keys=True),
            "TFO_TASK": name,
            "TFO_JOB": json.dumps(job, sort_keys=True),
            # Keras 3 in TF 2.21 breaks multi-worker fit and has no PS support.
            "TF_USE_LEGACY_KERAS": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": task_workdir,
            # TensorFlow's autograph files and the like: gone with the task (lifeline.py).
            "TMPDIR": tmp_dir, "TEMP": tmp_dir, "TMP": tmp_dir,
        }
        tasks.append(TaskPlan(
            name=name, role=role, index=index, host=host, address=address, port=port,
            tf_config=tf_config, command=[exe, "-m", "worker_entry"], env=env,
            cwd=task_workdir, log_path=posixpath.join(run_dir, "logs", f"{role}-{index}.log"),
            tmp_dir=tmp_dir,
        ))
    return Plan(name=spec.name, strategy=spec.strategy, run_id=run_id, run_dir=run_dir,
                tasks=tasks)
