"""Spec → Plan: everything decided before anything starts. A pure function: no I/O.

    plan = make_plan(spec, run_id="demo-1", run_dir=Path("/abs/runs/demo-1"),
                     workdir=Path("/abs"), ports={"worker:1": 20001})
    plan.tasks[0].tf_config   # {"cluster": {"worker": [...]}, "task": {"type": "worker", ...}}

Printing a plan is a dry run (`tfo plan FILE`); plan.json is the plan as JSON, and
`Plan.from_json` reads it back (`tfo rerun`).

Design: Job kinds
====================

The spec's `job` names exactly one of `entry: module:function` (called with a `TaskContext`,
or with nothing if it takes no argument; `args` a mapping; what it returns goes back in its
`done` marker as `value`, JSON of at most `VALUE_BYTES`, 16 KiB, else a `value_error` saying
why: the task's word, untrusted like any marker), `script: path/to/train.py` or `module:
pkg.train` (`args` a list of strings). `JOB_KINDS` in plan.py turns each into the task's
command and what it reads from `TFO_JOB`. A script or module runs in the task as `python
train.py ARGS` or `python -m pkg.train ARGS` would (in a new `__main__` module left in
`sys.modules`, so at exit its globals are cleared in order as a plain run's are; its
`sys.argv`; a script's directory first on `sys.path`), inside the same wrapper; it builds
its own strategy from TF_CONFIG. Under ParameterServer the servers (ps, worker) are ours and
the script runs on the chief and the evaluator. Every task's environment (plan.py) has
TF_CONFIG, `TFO_TASK`, `TFO_IS_CHIEF`, `TFO_MODEL_DIR`, `TFO_BACKUP_DIR`, `TFO_RUN_DIR`,
`TMPDIR` (and the backend adds `TFO_ATTEMPT`; an MWMS job's chief and workers set DTensor's
`DTENSOR_*` from TF_CONFIG themselves, below); the wrapper's defaults
(worker_entry/defaults.py) are `TF_USE_LEGACY_KERAS=1`, which the spec's `env` or the
environment tfo (or a lab host) runs in can override, and gRPC's first reconnect after 0.1
s, not 1 s, added to any `TF_GRPC_DEFAULT_OPTIONS` that does not set it. Whoever imports
TensorFlow (and tf-keras) in the task first (the job's code, a standby, the wrapper for a
server), the import runs with Python's collector paused and what it made is frozen, unfrozen
at exit (`worker_entry/tfimport.py`): 1.72 s instead of 2.27 s on one core here. The task's
`sys.excepthook` (`runner.user_traceback`) prints an uncaught exception's traceback from the
user's first frame on, as `python train.py` would, without the five frames of runpy and the
runner; a syntax error in the user's file (raised by the runner's compile, or a `-m`
module's loader) as Python shows it, file, line and caret alone; any other traceback with no
frame of the user's is printed whole. A missing script or module is exit 2 before anything
starts (entry.py finds them without importing), exit 78 in the task. Over SSH the job's code
directory (`job.code`, by default a script's directory) is synced into each host's workdir,
where a script's path is relative to it.
- `policy`: restart policy per role, `max_restarts`, backoff, startup/deadline/grace/
  evaluator timeouts (`evaluator_seconds`, `evaluator_idle_seconds`), `evaluator_required`.
- `rules`: the strategy's rules as data (below).
- `spec`, `workdir`: so that plan.json is enough to run the same job again.
- In plan.json the cluster is written once, at the top; each task's `tf_config` there is
  `{task}` and its env has no TF_CONFIG (`Plan.from_json` puts both back, and still reads an
  older plan.json whose tasks carry them), so its size is linear in the tasks.

The supervisor reads only the plan, and decides through `orchestrator/loop/decide.py` (pure
functions of its state that return actions; see The loop): `orchestrator/loop/supervise.py`
imports neither `spec` nor `Strategy`.
"""

from __future__ import annotations

import json
import posixpath
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from orchestrator.planning.devices import task_gpus, visible_devices
from orchestrator.planning.policy import Policy
from orchestrator.planning.spec import (
    LOCALHOST,
    MAX_ARG_STRLEN,
    ClusterSpec,
    Int,
    Port,
    SpecError,
    format_validation_error,
)
from orchestrator.planning.strategy import CLUSTER_ROLES, DATA_SERVICE, RULES, StrategyRules
from orchestrator.runs.rundir import RunDir
from worker_entry.markers import INPUT_WAIT_ENV, Role, Strategy, is_chief

LOCAL = "local"  # the placement kind (backend) of tasks on the coordinator's machine
# The tf.data service's address, grpc://dispatcher:port, in every task of a job that has one:
# `dataset.apply(tf.data.experimental.service.distribute(..., service=os.environ[...]))`.
DATA_SERVICE_ENV = "TFO_DATA_SERVICE"


@dataclass(frozen=True)
class Placement:
    """Where a task runs and who starts it."""

    kind: str  # the backend that starts it: a key of orchestrator.launch.BACKENDS
    host: str  # "localhost", a name under `hosts:`, or the node a scheduler gave
    address: str  # how the other tasks reach this one

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "host": self.host, "address": self.address}


def placement(spec: ClusterSpec, host: str, node: str | None = None) -> Placement:
    """`node`: the node a scheduler gave the task (Backend.place); until then a scheduler's
    task has its kind for host and address (enough to pick the backend that allocates)."""
    if host == LOCALHOST:
        return Placement(LOCAL, LOCALHOST, LOCALHOST)
    if host == spec.scheduler:
        return Placement(host, node or host, node or host)
    return Placement(spec.hosts[host].backend, host, spec.hosts[host].address)


@dataclass(frozen=True)
class TaskPlan:
    name: str  # "worker:1"
    role: Role
    index: int
    placement: Placement
    port: int
    tf_config: dict[str, Any]
    command: list[str]
    env: dict[str, str]
    cwd: str  # on the task's host
    log_path: str  # on the coordinator's machine
    tmp_dir: str  # on the task's host; its TMPDIR, removed when it ends
    gpus: list[int] = field(default_factory=list)  # its CUDA_VISIBLE_DEVICES; [] is none
    # Where it serves TensorFlow's profiler (worker_entry/profiler.py; `tfo profile`), on its
    # placement's address; None: no profiler (`profiler: false`, or an evaluator).
    profiler_port: int | None = None

    @property
    def host(self) -> str:
        return self.placement.host

    @property
    def address(self) -> str:
        return self.placement.address

    _KEYS = ("name", "role", "index", "port", "tf_config", "command", "env", "cwd", "log_path",
             "tmp_dir", "gpus", "profiler_port")

    def to_json(self) -> dict[str, Any]:
        """Without the cluster, which the plan's JSON holds once for every task (else its size
        grows with the square of the tasks): `tf_config` is {"task": ...} and `env` has no
        TF_CONFIG; from_json puts both back. No asdict: it would deep-copy the cluster."""
        data = {k: getattr(self, k) for k in self._KEYS}
        data["tf_config"] = {"task": self.tf_config["task"]}
        data["env"] = {k: v for k, v in self.env.items() if k != "TF_CONFIG"}
        return {**data, "host": self.host, "placement": self.placement.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any], cluster: dict[str, list[str]] | None = None,
                  cluster_json: str | None = None) -> TaskPlan:
        """`cluster`: the plan's (`cluster_json`: serialized, once for all tasks); None for a
        plan.json from before the cluster moved to the top, whose tasks carry it themselves."""
        fields = {k: data[k] for k in cls._KEYS if k in data}  # profiler_port: since issue 41
        if cluster is not None:
            task = data["tf_config"]["task"]
            fields["tf_config"] = {"cluster": cluster, "task": task}
            fields["env"] = {**data["env"], "TF_CONFIG": tf_config_env(
                cluster_json or json.dumps(cluster), task)}
        return cls(**{**fields, "role": Role(data["role"])},
                   placement=Placement(**data["placement"]))


@dataclass(frozen=True)
class Plan:
    """Everything a run needs, decided before anything starts; plan.json is this, and
    enough to run the same tasks again (`tfo rerun`)."""

    name: str
    strategy: Strategy
    run_id: str
    run_dir: str
    job: str  # what every task runs, for messages: "entry pkg.mod:train"
    policy: Policy
    rules: StrategyRules
    workdir: str  # where tfo ran: the job's code, and local tasks' cwd
    spec: ClusterSpec  # what the plan was made from; a rerun plans it again, same ports
    tasks: list[TaskPlan] = field(default_factory=list)
    # The GPUs of the hosts whose gpus are `auto`, as they were asked (make_plan's `gpus`):
    # an elastic group's plan (elastic.plan_for) allocates from the same lists.
    host_gpus: dict[str, list[int]] = field(default_factory=dict)

    def task(self, name: str) -> TaskPlan:
        return next(t for t in self.tasks if t.name == name)

    def ports(self) -> dict[str, int]:
        """Every port the plan gave, by task name (its profiler's: `profiler_key(name)`): a
        rerun's plan has them all again."""
        return {t.name: t.port for t in self.tasks} | {
            profiler_key(t.name): t.profiler_port for t in self.tasks
            if t.profiler_port is not None}

    @property
    def cluster(self) -> dict[str, list[str]]:
        """TF_CONFIG's cluster: the same for every task."""
        return self.tasks[0].tf_config["cluster"] if self.tasks else {}

    def to_json(self) -> dict[str, Any]:
        """plan.json, and `tfo plan --json`: the cluster once, then each task without it.
        json_text() writes it."""
        return {"name": self.name, "strategy": self.strategy.value, "run_id": self.run_id,
                "run_dir": self.run_dir, "job": self.job, "policy": self.policy.to_json(),
                "rules": self.rules.to_json(), "workdir": self.workdir,
                "spec": self.spec.model_dump(mode="json"), "cluster": self.cluster,
                "tasks": [t.to_json() for t in self.tasks]} | (
                    {"host_gpus": self.host_gpus} if self.host_gpus else {})

    @classmethod
    def from_json(cls, data: Any, source: str = "plan.json") -> Plan:
        """A plan.json, checked as a cluster file is (a hand-edited one too): a SpecError
        names the field in plan.json (`tasks[1].port`) and the value. Also reads a plan.json
        without the top-level cluster (tfo before issue 13), whose every task carries it."""
        checked, spec = _check_plan_file(data, source)
        cluster = data.get("cluster")
        cluster_json = json.dumps(cluster) if cluster is not None else None
        return cls(name=checked.name, strategy=checked.strategy, run_id=checked.run_id,
                   run_dir=checked.run_dir, job=checked.job, policy=checked.policy,
                   rules=checked.rules, workdir=checked.workdir, spec=spec,
                   tasks=[TaskPlan.from_json(t, cluster, cluster_json) for t in data["tasks"]],
                   host_gpus=checked.host_gpus)


class _PlacementFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    kind: str
    host: str
    address: str


class _TaskFile(BaseModel):
    """One task of plan.json as the cluster file's types check it: strict (`port: true` was
    TF_CONFIG's `localhost:True`), a port in 1-65535."""

    model_config = ConfigDict(extra="ignore")  # `host`: the placement's, for readers
    name: str = Field(strict=True)
    role: Role
    index: Int = Field(ge=0)
    port: Port
    tf_config: dict[str, Any]
    command: list[Annotated[str, Strict()]] = Field(min_length=1)
    env: dict[str, Annotated[str, Strict()]]
    cwd: str = Field(strict=True)
    log_path: str = Field(strict=True)
    tmp_dir: str = Field(strict=True)
    gpus: list[Annotated[Int, Field(ge=0)]]
    placement: _PlacementFile
    profiler_port: Port | None = None


class _PlanFile(BaseModel):
    """plan.json: what `tfo run PLAN.json` and `tfo rerun` read of it."""

    model_config = ConfigDict(extra="ignore")
    name: str = Field(strict=True)
    strategy: Strategy
    run_id: str = Field(strict=True)
    run_dir: str = Field(strict=True)
    job: str = Field(strict=True)
    workdir: str = Field(strict=True)
    policy: Policy
    rules: StrategyRules
    spec: dict[str, Any]  # a ClusterSpec: checked on its own, its errors named spec.…
    cluster: dict[str, list[Annotated[str, Strict()]]] | None = None
    tasks: list[_TaskFile] = Field(min_length=1)
    host_gpus: dict[str, list[Annotated[Int, Field(ge=0)]]] = Field(default_factory=dict)


def _check_plan_file(data: Any, source: str) -> tuple[_PlanFile, ClusterSpec]:
    """plan.json's types, then its tasks against its spec: the spec's tasks in its order, a
    port a task's address fixes kept, no two tasks on one port of one machine."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a plan.json mapping, got {type(data).__name__}")
    try:
        checked = _PlanFile.model_validate(data)
    except ValidationError as err:
        raise SpecError(f"{source}: invalid plan.json\n{format_validation_error(err)}") \
            from None
    try:
        spec = ClusterSpec.model_validate(checked.spec)
    except ValidationError as err:
        raise SpecError(f"{source}: invalid plan.json\n{_spec_errors(err)}") from None
    problems = []
    expected = [(task_name(r, i), r, a) for r, i, a in spec.tasks.all()]
    names = [t.name for t in checked.tasks]
    if names != [n for n, _, _ in expected]:
        problems.append(f"tasks: {', '.join(names)} are not its spec's tasks, in its order: "
                        f"{', '.join(n for n, _, _ in expected)}")
    seen: dict[tuple[str, int], str] = {}
    for i, (task, (name, role, address)) in enumerate(zip(checked.tasks, expected, strict=False)):
        if task_name(task.role, task.index) != task.name:
            problems.append(f"tasks[{i}]: name {task.name} but role {task.role.value}, index "
                            f"{task.index}")
        elif address.port is not None and task.port != address.port:
            where = f"spec.tasks.{role.value}[{task.index}]"
            problems.append(f"tasks[{i}].port: {task.port}, but {where} is {address}")
        for field_, port, owner in (("port", task.port, name),
                                    ("profiler_port", task.profiler_port, profiler_key(name))):
            key = (task.placement.address, port)
            if port is None:
                continue
            if key in seen:
                problems.append(f"tasks[{i}].{field_}: {port} on {key[0]} is also "
                                f"{seen[key]}'s")
            seen.setdefault(key, owner)
    if problems:
        raise SpecError(f"{source}: invalid plan.json\n" + "\n".join(problems))
    return checked, spec


def _spec_errors(err: ValidationError) -> str:
    """The spec's errors, as a cluster file's, each named by its path in plan.json."""
    return "\n".join(f"spec: {line.split(': ', 1)[1]}" if line.startswith("(top level)")
                     else f"spec.{line}" for line in format_validation_error(err).splitlines())


def json_text(plan: dict[str, Any]) -> str:
    """A plan's JSON, indented at the top and one line per task: as readable as indent=2,
    and written by json's C encoder (indent runs the pure-Python one: 4x slower)."""
    head = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in plan.items() if k != "tasks"]
    tasks = ",\n".join(f"    {json.dumps(t)}" for t in plan.get("tasks", []))
    return "{\n" + ",\n".join([*head, f'  "tasks": [\n{tasks}\n  ]']) + "\n}\n"


def task_name(role: str, index: int) -> str:
    return f"{role}:{index}"


def profiler_key(name: str) -> str:
    """The key of a task's profiler port among the plan's ports (`ports=`, Plan.ports)."""
    return f"{name}/profiler"


def profiled(spec: ClusterSpec) -> list[str]:
    """The tasks that serve TensorFlow's profiler: every training task (chief, worker, ps),
    unless the spec says `profiler: false`."""
    if not spec.profiler:
        return []
    return [task_name(r, i) for r, i, _ in spec.tasks.all() if r in CLUSTER_ROLES]


def _entry_job(spec: ClusterSpec, python: str, remote: bool) -> tuple[list[str], dict[str, Any]]:
    """`job.entry: module:function`: worker_entry calls the function with a TaskContext."""
    return [python, "-m", "worker_entry"], {"entry": spec.job.entry}


def _script_job(spec: ClusterSpec, python: str, remote: bool) -> tuple[list[str], dict[str, Any]]:
    """`job.script: train.py`: worker_entry runs it as __main__, sys.argv [script, *args]. On
    a lab host its code directory's contents are in the workdir (launch/ssh.py)."""
    script = spec.job.script_on_host() if remote else spec.job.script
    return [python, "-m", "worker_entry"], {"script": script}


def _module_job(spec: ClusterSpec, python: str, remote: bool) -> tuple[list[str], dict[str, Any]]:
    """`job.module: pkg.train`: worker_entry runs it as `python -m pkg.train` would."""
    return [python, "-m", "worker_entry"], {"module": spec.job.module}


# How each kind of job (spec.JOB_KINDS) is run: its command, and what its tasks read from
# TFO_JOB; `remote` is true for a task on a lab host.
JOB_KINDS: dict[str, Callable[[ClusterSpec, str, bool], tuple[list[str], dict[str, Any]]]] = {
    "entry": _entry_job,
    "script": _script_job,
    "module": _module_job,
}


def make_policy(spec: ClusterSpec) -> Policy:
    t = spec.timeouts
    return Policy(
        restart={role: spec.restart.for_role(role, spec.strategy)
                 for role, _, _ in spec.tasks.all()},
        max_restarts=spec.restart.max_restarts, backoff_seconds=spec.restart.backoff_seconds,
        startup_seconds=t.startup_seconds, deadline_seconds=t.deadline_seconds,
        grace_seconds=t.grace_seconds, evaluator_seconds=t.evaluator_seconds,
        evaluator_required=spec.evaluator_required, stall_seconds=t.stall_seconds or None,
        stall_min_seconds=t.stall_min_seconds,
        warm_spares=spec.restart.warm_spares, expect_cluster=spec.expect_cluster,
        evaluator_idle_seconds=t.evaluator_idle_seconds or None if spec.job.kind != "entry"
        else None)


def make_plan(
    spec: ClusterSpec,
    *,
    run_id: str,
    run_dir: PurePosixPath | str,
    workdir: PurePosixPath | str,
    ports: Mapping[str, int] | None = None,
    python: str = sys.executable,
    gpus: Mapping[str, list[int]] | None = None,
    nodes: Mapping[str, str] | None = None,
) -> Plan:
    """Work out every task's placement, port, TF_CONFIG, command, env and paths, and the
    job's policy and rules.

    `run_dir` and `workdir` are absolute paths on the coordinator's machine; `ports` fills
    in the tasks whose port is `auto` (the backends find free ones). Remote tasks run in
    their host's `workdir` with the run directory mirrored under it. `gpus` gives the GPUs
    of hosts whose gpus are `auto` (launch/gpus.py asks them); devices.py has the rest.
    `nodes` gives each task of a scheduler's job its node (task name → node, Backend.place:
    Slurm's allocation); those tasks run as local ones do, in `workdir` with this python: a
    scheduler's nodes share the coordinator's file system (a Slurm cluster's do).
    """
    ports = dict(ports or {})
    run_dir, workdir = str(run_dir), str(workdir)
    rules = RULES[spec.strategy]
    resolved: list[tuple[Role, int, Placement, int]] = []
    for role, index, addr in spec.tasks.all():
        name = task_name(role, index)
        port = addr.port if addr.port is not None else ports.get(name)
        if port is None:
            raise ValueError(f"{name}: port is 'auto' and no port was assigned")
        node = (nodes or {}).get(name)
        if addr.host == spec.scheduler and node is None:
            raise ValueError(f"{name}: a {spec.scheduler} task and no node was assigned")
        resolved.append((role, index, placement(spec, addr.host, node), port))

    cluster: dict[str, list[str]] = {}
    for role, _, where, port in resolved:  # spec.tasks.all() gives each role in order
        if role in CLUSTER_ROLES:
            cluster.setdefault(role.value, []).append(f"{where.address}:{port}")
    cluster = {role: cluster[role] for role in sorted(cluster)}
    # The tf.data service's address, for every task (TFO_DATA_SERVICE): its dispatcher's.
    dispatcher = next((f"{where.address}:{port}" for role, _, where, port in resolved
                       if role is Role.DISPATCHER), None)
    # Serialized once and shared: every task's TF_CONFIG holds the whole cluster.
    cluster_json = json.dumps(cluster)
    args_json = json.dumps(spec.job.args, sort_keys=True)
    kind = spec.job.kind
    local_run = RunDir(run_dir)
    devices = task_gpus(spec, gpus or {})  # in spec.tasks.all() order, as `resolved`
    with_profiler = set(profiled(spec))

    tasks = []
    for (role, index, where, port), task_devices in zip(resolved, devices, strict=True):
        name = task_name(role, index)
        lab_host = where.host in spec.hosts  # reached over SSH: its own paths
        if not lab_host:
            task_workdir, task_run, exe = workdir, local_run, python
        else:
            h = spec.hosts[where.host]
            task_workdir, task_run, exe = h.workdir, RunDir.on_host(h.workdir, run_id), h.python
        model_dir = spec.job.model_dir.format(run_id=run_id, run_dir=task_run.path)
        if not posixpath.isabs(model_dir) and not model_dir.startswith("~"):
            model_dir = posixpath.join(task_workdir, model_dir)
        task = {"type": role.value, "index": index}
        tmp_dir = task_run.tmp_dir(role, index)
        command, job_fields = JOB_KINDS[kind](spec, exe, lab_host)
        backup_dir = task_run.backup_dir(role, index)
        if role in DATA_SERVICE:  # tfo's own server: what it listens on, where it keeps state
            job_fields = {**job_fields, "listen": f"{where.address}:{port}",
                          "work_dir": posixpath.join(task_run.path, "dataservice")}
        tfo_job = job_env(spec, role, job_fields, args_json, model_dir=model_dir, run_id=run_id,
                          run_dir=task_run.path, tmp_dir=tmp_dir, backup_dir=backup_dir)
        env = {
            # What a task's own code can rely on (docs/guide/scripts.md's table); TFO_ATTEMPT
            # comes from the backend. TF_USE_LEGACY_KERAS=1 is the task's default unless the
            # spec or the environment tfo (or a lab host) runs in sets it
            # (worker_entry/defaults.py).
            "TFO_IS_CHIEF": "1" if is_chief(role, index, cluster) else "0",
            "TFO_MODEL_DIR": model_dir,
            "TFO_BACKUP_DIR": backup_dir,
            "TFO_RUN_DIR": task_run.path,
            **spec.env,
            **(spec.hosts[where.host].env if where.host in spec.hosts else {}),
            **({DATA_SERVICE_ENV: f"grpc://{dispatcher}"} if dispatcher else {}),
            "TF_CONFIG": tf_config_env(cluster_json, task),
            "TFO_TASK": name,
            "TFO_JOB": tfo_job,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": task_workdir,
            # TensorFlow's autograph files and the like: gone with the task (worker_entry.lifeline).
            "TMPDIR": tmp_dir, "TEMP": tmp_dir, "TMP": tmp_dir,
            # Its own GPUs only ("" for none: unset, TensorFlow takes every GPU), numbered
            # as nvidia-smi numbers them (CUDA's default order is fastest first).
            "CUDA_VISIBLE_DEVICES": visible_devices(task_devices),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        }
        # None where the caller allocated none (a test's plan; an elastic resize's).
        profiler_port = ports.get(profiler_key(name)) if name in with_profiler else None
        if profiler_port is not None:
            env["TFO_PROFILER_PORT"] = str(profiler_port)
        if not spec.profiler:  # nor tf.data's model read (worker_entry/progress/inputwait.py)
            env[INPUT_WAIT_ENV] = "0"
        _check_env_fits(name, where.host if lab_host else LOCALHOST, env)
        tasks.append(TaskPlan(
            name=name, role=role, index=index, placement=where, port=port,
            tf_config={"cluster": cluster, "task": task}, command=command, env=env,
            cwd=task_workdir, log_path=local_run.log_path(role, index), tmp_dir=tmp_dir,
            gpus=task_devices, profiler_port=profiler_port,
        ))
    return Plan(name=spec.name, strategy=spec.strategy, run_id=run_id, run_dir=run_dir,
                job=f"{kind} {spec.job.target}", policy=make_policy(spec), rules=rules,
                workdir=workdir, spec=spec, tasks=tasks,
                host_gpus={h: list(ids) for h, ids in (gpus or {}).items()})


def tf_config_env(cluster_json: str, task: dict[str, Any]) -> str:
    """TF_CONFIG as json.dumps({"cluster": ..., "task": task}, sort_keys=True) gives it, from
    the cluster serialized once for all tasks (`cluster_json`, its roles in sorted order)."""
    return f'{{"cluster": {cluster_json}, "task": {json.dumps(task, sort_keys=True)}}}'


def job_env(spec: ClusterSpec, role: Role, job_fields: dict[str, Any], args_json: str, *,
            model_dir: str, run_id: str, run_dir: str, tmp_dir: str, backup_dir: str) -> str:
    """TFO_JOB, what worker_entry reads: what to run, where, and how. `args_json` is
    json.dumps(spec.job.args, sort_keys=True), serialized once for all tasks."""
    job = {**job_fields, "model_dir": model_dir, "strategy": spec.strategy.value,
           "run_id": run_id, "run_dir": run_dir, "tmp_dir": tmp_dir, "backup_dir": backup_dir,
           "serve": role in RULES[spec.strategy].servers, "collective": spec.job.collective.value,
           "grace_seconds": spec.timeouts.grace_seconds}  # the wrapper's SIGTERM → SIGKILL
    # What json.dumps(..., sort_keys=True) gives, without re-serializing the args.
    return f'{{"args": {args_json}, {json.dumps(job, sort_keys=True)[1:]}'


def _bytes(text: str) -> int:
    """UTF-8 length; for ASCII (isascii is O(1) in CPython) without encoding every task's
    TF_CONFIG, which holds the whole cluster."""
    return len(text) if text.isascii() else len(text.encode())


def _check_env_fits(name: str, host: str, env: Mapping[str, str]) -> None:
    """Linux refuses to start a process (E2BIG) with any environment string over
    MAX_ARG_STRLEN; an SSH task's whole environment is one shell command, under the same cap."""
    sizes = {k: _bytes(k) + _bytes(v) + 2 for k, v in env.items()}  # K=V and NUL
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
