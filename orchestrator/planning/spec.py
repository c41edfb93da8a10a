"""The cluster file: its schema, loading it, and every check a user can get wrong.

    spec = load_spec("clusters/localhost.yaml")    # raises SpecError on any mistake
    spec.tasks.worker[1]                            # Address(host='localhost', port=20001)
    [(role, i, addr) for role, i, addr in spec.tasks.all()]

A SpecError's message names the field (`tasks.worker[1]`) and the offending value;
the CLI prints it and exits 2 before anything starts.

Three modules: `fields` (the base model, strict scalars, one value's checks), `sections`
(one model per section of the file), and this one (ClusterSpec, the checks across sections,
loading, the JSON Schema). Every name is importable from here.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from pydantic import (
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from orchestrator.errors import SpecError
from orchestrator.planning.fields import (  # noqa: F401 - the spec's names, in one place
    GPU_ROLES,
    LOCALHOST,
    MAX_ARG_STRLEN,
    MAX_TASKS_PER_ROLE,
    MODEL_DIR_PLACEHOLDERS,
    ROLES,
    Address,
    AddressText,
    Collective,
    Env,
    Gpus,
    GpusPerTask,
    Int,
    Port,
    Seconds,
    TaskAddress,
    _field_error,
    _Model,
    format_validation_error,
    parse_address,
)
from orchestrator.planning.policy import RestartPolicy
from orchestrator.planning.schedulers import scheduler_options
from orchestrator.planning.sections import (  # noqa: F401 - the spec's names, in one place
    JOB_KINDS,
    Addresses,
    ElasticSpec,
    HostSpec,
    JobSpec,
    LocalhostSpec,
    MetricsSpec,
    RestartSpec,
    SchedulerOptions,
    SchedulerSpec,
    StallSeconds,
    TasksSpec,
    TimeoutSpec,
    WarmSpares,
    _scheduler_kind,
)
from orchestrator.planning.specfile import SpecFileError, read_data
from orchestrator.planning.strategy import CLUSTER_ROLES, DATA_SERVICE, RULES
from worker_entry.markers import Role, Strategy

__all__ = ["RestartPolicy", "Role", "Strategy", "ClusterSpec", "SchedulerOptions",
           "SpecError",
           "cluster_schema",
           "load_spec", "parse_spec"]


class ClusterSpec(_Model):
    """A cluster file: the job, its tasks, where they run, and how they are watched."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", description=(
        "the job's name: letters, digits, _ . -; the run directories are named for it"))
    strategy: Strategy = Field(default=Strategy.MULTI_WORKER_MIRRORED, description=(
        "multi_worker_mirrored (every chief and worker trains) or parameter_server "
        "(the chief coordinates, ps and worker tasks are TF servers)"))
    job: JobSpec = Field(description="what the training tasks run")
    tasks: TasksSpec = Field(description="the tasks, by role")
    hosts: dict[str, HostSpec] = Field(default_factory=dict, description=(
        "lab machines reached over SSH, by the name tasks use"))
    localhost: LocalhostSpec = Field(default_factory=LocalhostSpec, description=(
        "this machine, for the tasks on localhost"))
    restart: RestartSpec = Field(default_factory=RestartSpec, description=(
        "what happens when a task is lost"))
    timeouts: TimeoutSpec = Field(default_factory=TimeoutSpec, description="limits, in seconds")
    env: Env = Field(default_factory=dict, description=(
        "extra environment for every task (not CUDA_VISIBLE_DEVICES: tfo sets it)"))
    evaluator_required: bool = Field(default=False, description=(
        "true: the evaluator's failure fails the job; false: it restarts alone"))
    expect_cluster: bool = Field(default=True, description=(
        "true: every training task must train in the planned cluster (its strategy, or "
        "DTensor mesh, joins the chief, workers and ps TF_CONFIG names), else the job "
        "fails; false: the tasks may train independently, on purpose"))
    profiler: bool = Field(default=True, description=(
        "true: every training task serves TensorFlow's profiler on a port of the plan "
        "(`tfo profile` captures them all at once), and tfo reads how long each waits for "
        "its input from tf.data's model (the slow worker's `cause: input`); false: neither"))
    backend: SchedulerSpec | None = Field(default=None, description=(
        "a scheduler that places the tasks, by kind: {slurm: {...}}; default: none, "
        "the tasks name their hosts"))
    metrics: MetricsSpec | None = Field(default=None, description=(
        "serve Prometheus metrics while the job runs: {port: 9400}; default: none"))
    elastic: ElasticSpec | None = Field(default=None, description=(
        "train on fewer workers when a host is lost, more when it is back; parameter_server: "
        "a lost worker is dropped as the chief trains on, a lost ps restarts the job with "
        "the ps left (docs/guide/faults.md)"))

    @model_serializer(mode="wrap")
    def _counts_for_a_scheduler(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A scheduler's tasks dumped as they are written (`worker: 2`), so that plan.json's
        spec reads back (`tfo rerun`): its placeholder addresses are no cluster file's."""
        data = handler(self)
        if self.backend is not None and isinstance(data, dict) and "tasks" in data:
            data["tasks"] = {role: len(getattr(self.tasks, role)) for role in ROLES
                             if getattr(self.tasks, role)}
        return data

    @property
    def scheduler(self) -> str | None:
        """The kind of the scheduler that places the tasks (`backend:`); None: the cluster
        file names the hosts. A scheduler's tasks all have the kind as their host until it
        places them (plan.placement)."""
        return self.backend.kind if self.backend is not None else None

    def gpus_for(self, role: str) -> int:
        """How many GPUs each task of the role gets: the scheduler's, else the job's."""
        return self.backend.options.gpus_for(role) if self.backend is not None \
            else self.job.gpus_for(role)

    @model_validator(mode="before")
    @classmethod
    def _a_scheduler_takes_counts(cls, data: Any) -> Any:
        """Before the addresses are read: a scheduler's tasks are counts (`worker: 2`), each
        task's host the scheduler's kind until it places them."""
        if not isinstance(data, dict) or not isinstance(data.get("tasks"), dict):
            return data
        kind = _scheduler_kind(data)
        if kind is None and data.get("backend") is not None:
            return data  # SchedulerSpec says what is wrong with `backend:`
        tasks = dict(data["tasks"])
        for role, value in tasks.items():
            count = isinstance(value, int) and not isinstance(value, bool)
            if kind is not None and not count:
                model = scheduler_options().get(kind)
                raise _field_error(f"tasks.{role}", f"{model.title if model else kind} picks "
                                   f"the hosts of a backend.{kind} job: give a count "
                                   f"({role}: 2), got {value!r}")
            if kind is None and count:
                models = scheduler_options()
                raise _field_error(f"tasks.{role}", (
                    f"a count ({value}) is for a {' or '.join(m.title for m in models.values())} "
                    f"job (backend: {{{next(iter(models), 'KIND')}: {{…}}}}); otherwise list "
                    "addresses ('host:port')"))
            if count:
                if not 0 <= value <= MAX_TASKS_PER_ROLE:
                    raise _field_error(f"tasks.{role}", f"a count of tasks is 0 to "
                                       f"{MAX_TASKS_PER_ROLE}, got {value}")
                tasks[role] = [{"host": kind, "port": None}] * value
        return {**data, "tasks": tasks}

    @model_validator(mode="after")
    def _cluster_rules(self) -> ClusterSpec:
        t = self.tasks
        if len(t.chief) > 1:
            raise _field_error("tasks.chief", f"at most one chief, got {len(t.chief)}: "
                               f"{', '.join(map(str, t.chief))}")
        if len(t.evaluator) > 1:
            raise _field_error("tasks.evaluator", f"at most one evaluator, got "
                               f"{len(t.evaluator)}: {', '.join(map(str, t.evaluator))}")
        if not t.chief and not t.worker:
            raise _field_error("tasks", "no training tasks: list at least one worker or chief")
        _data_service_rules(t)
        rules = RULES[self.strategy]
        for role in Role:
            if getattr(t, role) and role not in rules.roles:
                where = next(s.value for s in Strategy if role in RULES[s].roles)
                raise _field_error(f"tasks.{role}", f"{role} tasks are only for strategy {where}; "
                                   f"remove them or set strategy: {where}")
        missing = [f"{n} {r}" for r, n in rules.required if not getattr(t, r)]
        if missing:
            raise _field_error("tasks", f"a {self.strategy.value} job needs "
                               + ", ".join(missing) + " task")
        if self.backend is not None:
            kind, options = self.backend.kind, self.backend.options
            if self.job.gpus_per_task:  # the scheduler gives the GPUs, or none
                instead = f"set backend.{kind}.gpus_per_task instead" if "gpus_per_task" in \
                    type(options).model_fields else "it takes none; remove it"
                raise _field_error("job.gpus_per_task", (
                    f"a {options.title} job asks {options.title} for GPUs: {instead}"))
            if problem := options.job_problem(kind, sum(1 for _ in t.all())):
                raise _field_error(*problem)
            return self
        for role, index, address in t.all():
            if address.host != LOCALHOST and address.host not in self.hosts:
                raise _field_error(f"tasks.{role}[{index}]", (
                    f"host {address.host!r} is neither 'localhost' nor a name under hosts: "
                    f"({', '.join(self.hosts) or 'none'})"))
        remote = [(f"tasks.{r}[{i}]", a.host) for r, i, a in t.all() if a.host != LOCALHOST]
        if remote:
            # TF_CONFIG names each task by its host's address; "localhost" would point a lab
            # machine at itself.
            for role, index, address in t.all():
                # The trainers reach the data service's tasks too (its address, its workers').
                if address.host == LOCALHOST and role in (*CLUSTER_ROLES, *DATA_SERVICE):
                    raise _field_error(f"tasks.{role}[{index}]", (
                        f"localhost cannot be reached from the lab hosts ({remote[0][0]} runs "
                        f"on {remote[0][1]}); list this machine under hosts: with an address "
                        "the others can reach"))
            _service_reachable(self)
        seen: dict[tuple[str, int], str] = {}
        for role, index, address in t.all():
            field = f"tasks.{role}[{index}]"
            if address.port is None:
                continue
            key = (self._machine(address.host), address.port)
            if key in seen:
                raise _field_error(field, f"duplicate address {address}: also {seen[key]}")
            seen[key] = field
        return self

    @model_validator(mode="after")
    def _device_rules(self) -> ClusterSpec:
        for where, env in [("env", self.env)] + [(f"hosts.{n}.env", h.env)
                                                  for n, h in self.hosts.items()]:
            if "CUDA_VISIBLE_DEVICES" in env:
                raise _field_error(f"{where}.CUDA_VISIBLE_DEVICES", (
                    "tfo sets it for each task from the hosts' gpus and job.gpus_per_task; "
                    "remove it"))
        collective = self.job.collective
        if collective is not Collective.AUTO and self.strategy is not \
                Strategy.MULTI_WORKER_MIRRORED:
            raise _field_error("job.collective", (
                f"{collective.value} is for strategy multi_worker_mirrored only; remove it"))
        if collective is Collective.NCCL and not any(
                self.job.gpus_for(role) for role, _, _ in self.tasks.all()):
            raise _field_error("job.collective", (
                "nccl needs GPUs, and no task of this job gets one: set job.gpus_per_task "
                "(and the hosts' gpus), or use ring or auto"))
        return self

    @model_validator(mode="after")
    def _elastic_rules(self) -> ClusterSpec:
        """What an elastic job needs: a place per worker, and bounds the pool can hold. A
        multi_worker_mirrored job has no chief task (worker 0 is the chief); a
        parameter_server job starts every listed worker (its chief's TF_CONFIG lists them
        all: a lost one is dropped from where it is, and rejoins there)."""
        e = self.elastic
        if e is None:
            return self
        ps = self.strategy is Strategy.PARAMETER_SERVER
        if self.tasks.chief and not ps:
            raise _field_error("elastic", (
                "an elastic job has no chief task: worker 0 is the chief, and the role passes "
                "to the next worker when its host is lost; list the chief's place first under "
                "tasks.worker"))
        places = len(self.tasks.worker)
        if ps and e.max_workers is not None and e.max_workers != places:
            raise _field_error("elastic.max_workers", (
                f"{e.max_workers}, but a parameter_server job starts every worker tasks.worker "
                f"lists ({places}; its chief's TF_CONFIG names them all): leave max_workers "
                "out, or list that many workers"))
        most = e.max_workers if e.max_workers is not None else places
        if e.min_workers > most:
            field = "elastic.min_workers"
            bound = (f"max_workers {e.max_workers}" if e.max_workers is not None
                     else f"the {places} place(s) tasks.worker lists")
            raise _field_error(field, f"{e.min_workers} is more than {bound}")
        if most > places:
            raise _field_error("elastic.max_workers", (
                f"{most}, but tasks.worker lists {places} place(s): list a place per worker "
                "(a host twice, as host:auto, for two workers on it)"))
        policy = self.restart.for_role(Role.WORKER, self.strategy)
        if policy is not RestartPolicy.NEVER and \
                e.lost_after_failures - 1 > self.restart.max_restarts:
            raise _field_error("elastic.lost_after_failures", (
                f"{e.lost_after_failures} failures in a row make a host lost, but "
                f"restart.max_restarts {self.restart.max_restarts} ends the job after "
                f"{self.restart.max_restarts + 1}: lower it, or raise max_restarts"))
        return self

    def _machine(self, host: str) -> str:
        return self.hosts[host].address if host in self.hosts else LOCALHOST


class _OneScheduler(_Model):
    model_config = ConfigDict(json_schema_extra={"minProperties": 1, "maxProperties": 1})


def cluster_schema() -> dict[str, Any]:
    """The cluster file's JSON Schema (`tfo schema`), for editors: what a file may hold, from
    the models themselves. Rules across fields (two chiefs, duplicate addresses) are the
    models' alone."""
    from pydantic import create_model

    # `backend:` as the registry's schedulers make it: one key, a kind, with its options.
    one = create_model("SchedulerSpec", __base__=_OneScheduler, __doc__=SchedulerSpec.__doc__,
                       **{k: (m, None) for k, m in scheduler_options().items()})
    cluster = create_model("ClusterSpec", __base__=ClusterSpec, backend=(one | None, None))
    schema = cluster.model_json_schema(mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "tfo cluster file", **{k: v for k, v in schema.items() if k != "title"}}


def parse_spec(data: Any, source: str = "<spec>") -> ClusterSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(f"{source}: invalid cluster file\n{format_validation_error(err)}") from None


def load_spec(path: str | Path) -> ClusterSpec:
    """Read a YAML or JSON cluster file; any mistake raises SpecError."""
    try:
        data = read_data(Path(path))
    except SpecFileError as err:
        raise SpecError(str(err)) from None
    return parse_spec(data, str(path))


def _loopback(address: str) -> bool:
    try:
        return address == LOCALHOST or ipaddress.ip_address(address).is_loopback
    except ValueError:  # a name: what it resolves to is the network's business
        return False


def _service_reachable(spec: ClusterSpec) -> None:
    """Every task reads the data service at its tasks' addresses: one on a lab host whose
    address is a loopback one (127.0.0.1) is out of reach of a task on another address."""
    for role, index, address in spec.tasks.all():
        machine = spec._machine(address.host)
        if role not in DATA_SERVICE or not _loopback(machine):
            continue
        other = next(((r, i, a.host) for r, i, a in sorted(  # a trainer first
            spec.tasks.all(), key=lambda ria: ria[0] in DATA_SERVICE)
            if not _loopback(spec._machine(a.host))), None)
        if other:
            raise _field_error(f"tasks.{role}[{index}]", (
                f"host {address.host!r} has the loopback address {machine}: "
                f"tasks.{other[0]}[{other[1]}] on {other[2]} could not reach the tf.data "
                f"service there; give {address.host} an address the other hosts reach"))


def _data_service_rules(t: TasksSpec) -> None:
    """The tf.data service: one dispatcher, and data workers for it to hand out work to."""
    if len(t.dispatcher) > 1:
        raise _field_error("tasks.dispatcher", (
            f"at most one dispatcher (the tf.data service has one), got {len(t.dispatcher)}: "
            f"{', '.join(map(str, t.dispatcher))}"))
    if t.data_worker and not t.dispatcher:
        raise _field_error("tasks.data_worker", (
            "data workers register with the tf.data service's dispatcher, and none is "
            "listed: add one under tasks.dispatcher ('host:auto')"))
    if t.dispatcher and not t.data_worker:
        raise _field_error("tasks.dispatcher", (
            "a dispatcher with no data workers serves no data: list at least one under "
            "tasks.data_worker, or remove it"))
