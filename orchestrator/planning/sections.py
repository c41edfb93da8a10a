"""The cluster file's sections, one model each: `job:`, `tasks:`, `restart:`, `timeouts:`,
`hosts:`, `backend:` (a scheduler's request), `elastic:`, `localhost:`; each checks its own
fields. The whole file's cross-section checks are ClusterSpec's (planning/spec.py, which
re-exports these names)."""

from __future__ import annotations

import json
import math
import posixpath
import re
import string
from collections.abc import Iterator
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.planning.fields import (
    _ENTRY,
    _HOSTNAME,
    GPU_ROLES,
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
)
from orchestrator.planning.policy import FLOOR_SECONDS, RestartPolicy
from orchestrator.planning.schedulers import scheduler_options
from orchestrator.planning.strategy import RULES, START_ORDER
from worker_entry.markers import HEARTBEAT_SECONDS, LIFELINE_SECONDS, Role, Strategy

JOB_KINDS = ("entry", "script", "module")  # exactly one of these keys names what tasks run
_MODULE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class JobSpec(_Model):
    """What every training task runs: `entry` is `module:function`, called with a TaskContext;
    `script` (a .py file) or `module` (as `python -m`) runs as `__main__` with `sys.argv`
    [script, *args], as the user would run it by hand."""

    entry: str | None = Field(default=None, description=(
        "module:function, called in every training task with a TaskContext "
        "(worker_entry.examples.digits:train); one of entry, script, module"))
    script: str | None = Field(default=None, description=(
        "a .py file run as __main__ with sys.argv [script, *args], as `python train.py` "
        "would; one of entry, script, module"))
    module: str | None = Field(default=None, description=(
        "a module run as `python -m pkg.train` would; one of entry, script, module"))
    # An entry's kwargs (a mapping); a script's or module's command-line arguments (a list).
    args: dict[str, Any] | list[str] = Field(default_factory=dict, description=(
        "an entry's keyword arguments (a mapping, ctx.args), or a script's or module's "
        "command-line arguments (a list of strings); default {} for an entry, [] otherwise"))
    # The directory synced to lab hosts: by default the script's directory, or the entry's or
    # module's top-level package.
    code: str | None = Field(default=None, description=(
        "the directory copied to lab hosts' workdirs; default: the script's directory, or "
        "the entry's or module's top-level package"))
    # The sync leaves out what .gitignore/.tfoignore name and what looks like a credential
    # (launch/projectfiles.py); these patterns send such files all the same.
    code_include: list[str] = Field(default_factory=list, description=(
        "files in the code directory to copy to lab hosts although .gitignore or .tfoignore "
        "leave them out or they look like credentials (.env, private keys, *.pem, .ssh/): "
        "patterns as .gitignore writes them, relative to the code directory"))
    # {run_id} and {run_dir} are filled in by the plan; relative paths are under the workdir.
    model_dir: str = Field(default="{run_dir}/model", description=(
        "where the chief saves the model (TFO_MODEL_DIR, ctx.model_dir); {run_id} and "
        "{run_dir} are filled in, a relative path is under the workdir"))
    # GPUs per task: an int for every chief and worker, or per role; see devices.py.
    gpus_per_task: GpusPerTask = Field(default=0, description=(
        "GPUs for each task: a number for every chief and worker (ps and evaluator get 0), "
        "or a map of role to number; tasks on a host get disjoint ones from its gpus"))
    collective: Collective = Field(default=Collective.AUTO, description=(
        "MultiWorkerMirrored's all-reduce (CommunicationOptions): auto, ring, or nccl "
        "(needs GPUs)"))

    @model_validator(mode="before")
    @classmethod
    def _one_kind(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        given = [k for k in JOB_KINDS if data.get(k) is not None]
        if len(given) != 1:
            got = f"got {' and '.join(given)}" if given else "got none"
            raise _field_error("job", f"give exactly one of entry (module:function), script "
                               f"(path/to/train.py) or module (pkg.train); {got}")
        if given[0] != "entry" and "args" not in data:
            data = {**data, "args": []}
        return data

    @model_validator(mode="after")
    def _args_match_kind(self) -> JobSpec:
        if self.kind == "entry" and not isinstance(self.args, dict):
            raise _field_error("job.args", "an entry takes a mapping of arguments "
                               f"({{epochs: 5}}), got the list {self.args!r}")
        if self.kind != "entry" and not isinstance(self.args, list):
            raise _field_error("job.args", f"a {self.kind} takes a list of command-line "
                               f"arguments ([--epochs, '3']), got the mapping {self.args!r}")
        return self

    @model_validator(mode="after")
    def _code_holds_script(self) -> JobSpec:
        if self.script is not None and self.code is not None:
            script, code = posixpath.normpath(self.script), posixpath.normpath(self.code)
            if posixpath.isabs(script) != posixpath.isabs(code) or \
                    posixpath.relpath(script, code).startswith(".."):
                raise _field_error("job.code", f"{self.code!r} must be a directory that holds "
                                   f"job.script {self.script!r} (both relative to where tfo "
                                   "runs, or both absolute)")
        return self

    @property
    def kind(self) -> str:
        """Which of JOB_KINDS this job is."""
        return next(k for k in JOB_KINDS if getattr(self, k) is not None)

    def code_dir(self) -> str | None:
        """The directory whose contents are synced into a lab host's workdir: `code`, or a
        script's directory ("." for one in the workdir); None: the package (as for entries)."""
        if self.code is not None:
            return self.code
        if self.script is not None:
            return posixpath.dirname(posixpath.normpath(self.script)) or "."
        return None

    def script_on_host(self) -> str | None:
        """The script's path on a lab host: relative to the host's workdir, where its code
        directory's contents land."""
        if self.script is None:
            return None
        return posixpath.relpath(posixpath.normpath(self.script),
                                 posixpath.normpath(self.code_dir() or "."))

    @property
    def target(self) -> str:
        """What the job runs, as written: the entry, the script's path or the module."""
        return str(getattr(self, self.kind))

    @property
    def package(self) -> str:
        """The entry's or module's top-level package: what a task must be able to import.
        "" for a script."""
        if self.script is not None:
            return ""
        return self.target.split(":")[0].split(".")[0]

    def gpus_for(self, role: str) -> int:
        """How many GPUs each task of the role gets: a map's entry (0 when absent), or the
        int for every chief and worker."""
        if isinstance(self.gpus_per_task, dict):
            return self.gpus_per_task.get(role, 0)
        return self.gpus_per_task if role in GPU_ROLES else 0

    @field_validator("model_dir")
    @classmethod
    def _model_dir_placeholders(cls, model_dir: str) -> str:
        allowed = ", ".join(f"{{{p}}}" for p in MODEL_DIR_PLACEHOLDERS)
        try:
            names = [n for _, n, _, _ in string.Formatter().parse(model_dir) if n is not None]
            unknown = [n for n in names if n not in MODEL_DIR_PLACEHOLDERS]
            if not unknown:
                model_dir.format(**dict.fromkeys(MODEL_DIR_PLACEHOLDERS, "x"))
        except (ValueError, KeyError, IndexError, AttributeError) as e:
            raise ValueError(f"{model_dir!r} is not a valid path template ({e}); placeholders are "
                             f"{allowed}, and {{{{ }}}} stand for literal braces") from None
        if unknown:
            raise ValueError(f"unknown placeholder {{{unknown[0]}}} in {model_dir!r}; placeholders "
                             f"are {allowed}, and {{{{ }}}} stand for literal braces")
        return model_dir

    @field_validator("args")
    @classmethod
    def _args_fit_in_the_environment(cls, args: Any) -> Any:
        size = len(json.dumps(args).encode())
        limit = MAX_ARG_STRLEN - 4096  # the rest of TFO_JOB: entry, paths, run id
        if size > limit:
            raise ValueError(f"{size:,} bytes as JSON, more than the {limit:,} a task can be "
                             f"given: the job travels in the task's environment (TFO_JOB), and "
                             f"Linux allows {MAX_ARG_STRLEN:,} bytes per variable; put large "
                             "data in a file and pass its path")
        return args

    @field_validator("entry")
    @classmethod
    def _entry_shape(cls, entry: str | None) -> str | None:
        if entry is not None and not _ENTRY.match(entry):
            raise ValueError(
                f"entry must be 'module:function' (e.g. worker_entry.examples.digits:train), "
                f"got {entry!r}"
            )
        return entry

    @field_validator("module")
    @classmethod
    def _module_shape(cls, module: str | None) -> str | None:
        if module is not None and not _MODULE.match(module):
            raise ValueError(f"module must be a dotted module name like pkg.train (what "
                             f"`python -m` takes), got {module!r}")
        return module

    @field_validator("script", "code")
    @classmethod
    def _a_path(cls, path: str | None) -> str | None:
        if path is not None and (not path.strip() or "\0" in path):
            raise ValueError(f"expected a path, got {path!r}")
        return path


def _addresses(value: Any) -> Any:
    """A role's tasks: a list of addresses, one address alone, nothing, or a count."""
    if value is None:
        return []
    if isinstance(value, int) and not isinstance(value, bool):
        # A count is a scheduler's (backend: {slurm: …}): ClusterSpec made it addresses.
        raise ValueError(f"a count ({value}) is for a job a scheduler places (backend:)")
    if isinstance(value, str | dict):
        return [value]
    if not isinstance(value, list):
        raise ValueError(f"expected a list of 'host:port', got {value!r}")
    if len(value) > MAX_TASKS_PER_ROLE:
        raise ValueError(f"{len(value):,} tasks; a role has at most {MAX_TASKS_PER_ROLE}")
    return value


Addresses = Annotated[list[TaskAddress], BeforeValidator(
    _addresses,
    json_schema_input_type=list[AddressText | Address] | AddressText | int | None)]


class TasksSpec(_Model):
    """Each role's tasks: a list of addresses ('host:port', 'host:auto', 'host'), or under
    backend.slurm a count."""

    chief: Addresses = Field(default_factory=list, description=(
        "at most one: the chief (under parameter_server, exactly one: the coordinator)"))
    worker: Addresses = Field(default_factory=list, description=(
        "the workers: they train (under parameter_server, TF servers the chief drives)"))
    ps: Addresses = Field(default_factory=list, description=(
        "parameter servers, holding the variables: parameter_server only, at least one"))
    evaluator: Addresses = Field(default_factory=list, description=(
        "at most one: a sidecar that evaluates the chief's checkpoints"))

    @model_validator(mode="before")
    @classmethod
    def _known_roles(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError(f"expected a mapping of role to addresses, got {data!r}")
        for role in data:
            if role not in ROLES:
                raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
        return data

    def all(self) -> Iterator[tuple[Role, int, Address]]:
        """Every task as (role, index, address), in start order: ps, worker, chief, evaluator."""
        for role in START_ORDER:
            for index, address in enumerate(getattr(self, role)):
                yield role, index, address


def _check_warm_spares(value: Any) -> Any:
    if isinstance(value, bool) or value == "auto":
        return value
    raise ValueError(f"expected auto, true or false, got {value!r}")


# Warm spares (orchestrator/launch/spares.py): tasks' next attempts started ahead on their
# hosts, with TensorFlow imported. `auto`: on each host with the memory for them.
WarmSpares = Annotated[Literal["auto"] | bool, BeforeValidator(_check_warm_spares)]


class RestartSpec(_Model):
    """How the job reacts to a lost task; the strategy decides what is restarted with it."""

    # One policy for every role, or a map by role. A role it does not name (all of them when
    # unset) gets its strategy's default (strategy.RULES: a parameter_server job's ps and
    # workers and any evaluator on-failure, the rest never).
    policy: RestartPolicy | dict[str, RestartPolicy] | None = Field(default=None, description=(
        "never, on-failure, always or exit-code (1-127 permanent, 128-255 and signals "
        "retried), or a map of role to policy; a role not named gets its strategy's default "
        "(on-failure for a parameter_server job's ps and workers and for the evaluator, never "
        "for the rest)"))
    max_restarts: Int = Field(default=3, ge=0, description=(
        "restarts over the whole job; preemptions (exit 42 after SIGTERM) do not count"))
    backoff_seconds: Seconds | None = Field(default=None, ge=0, description=(
        "the wait before a restart; unset: none, but in a crash loop (attempts failing "
        "within 60 s of their start, one after another) 1 s before the second such "
        "restart; a crash loop doubles the wait at each further failure (at most 60 s, "
        "or this if more)"))
    warm_spares: WarmSpares = Field(default="auto", description=(
        "standbys with TensorFlow imported (about 650 MiB each), started ahead for each "
        "task's next attempt: true, false, or auto (on where the host's free memory holds "
        "twice its training tasks' standbys)"))

    @field_validator("policy")
    @classmethod
    def _policy_roles(cls, policy: Any) -> Any:
        if isinstance(policy, dict):
            for role in policy:
                if role not in ROLES:
                    raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
        return policy

    def for_role(self, role: Role, strategy: Strategy) -> RestartPolicy:
        """The role's policy: the one given for it, else its strategy's default."""
        if isinstance(self.policy, RestartPolicy):
            return self.policy
        if isinstance(self.policy, dict) and role in self.policy:
            return self.policy[role]
        return RULES[strategy].restart_default[role]


def _check_stall_seconds(value: Any) -> Any:
    """One message for what a union of three would say three times."""
    if value == "auto" or value is None:
        return value
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"expected auto, a number of seconds, or null (off), got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"Input should be a finite number (got {value!r})")
    if value < 0:
        raise ValueError(f"Input should be greater than or equal to 0 (got {value!r})")
    return float(value)


# A training task whose steps stopped moving (or that has been stopped, state T, or whose
# whole group idles) this long fails its attempt (orchestrator.loop.stall). `auto`: the limit
# adapts to the job's steps, never below stall_min_seconds. null or 0: off.
StallSeconds = Annotated[Annotated[float, Strict(), Field(ge=0)] | Literal["auto"] | None,
                         BeforeValidator(_check_stall_seconds)]


class TimeoutSpec(_Model):
    """Limits, in seconds."""

    startup_seconds: Seconds = Field(default=300.0, gt=0, description=(
        "an attempt whose tasks are not training or serving by then, and idle, fails"))
    deadline_seconds: Seconds | None = Field(default=None, gt=0, description=(
        "the whole job: stopped, and failed, after this long; null: no limit"))
    grace_seconds: Seconds = Field(default=10.0, ge=0, description=(
        "between SIGTERM and SIGKILL when a task is stopped: a task that handles SIGTERM "
        "may save then"))
    evaluator_seconds: Seconds = Field(default=60.0, ge=0, description=(
        "Once the training tasks are done, how long an evaluator still running is waited "
        "for (its last evaluation) before it is stopped; default 60"))
    evaluator_idle_seconds: Seconds | None = Field(default=5.0, ge=0, description=(
        "A script's or module's evaluator (one that may never exit, like Keras's "
        "SidecarEvaluator) is stopped once it has printed nothing and used no CPU this long "
        "after the training tasks are done: it has evaluated the last checkpoint and waits "
        "for another; default 5, null or 0: wait evaluator_seconds"))
    stall_seconds: StallSeconds = Field(default="auto", description=(
        "a training task whose steps stopped (or that is stopped, or whose whole group "
        "idles) this long has hung and fails its attempt; auto: 10 times the longest wait "
        "between steps seen, at least stall_min_seconds; null or 0: off"))
    stall_min_seconds: Seconds = Field(default=FLOOR_SECONDS, gt=0, description=(
        "auto's floor: stall_seconds: auto is never less"))

    @model_validator(mode="after")
    def _min_for_auto(self) -> TimeoutSpec:
        if "stall_min_seconds" in self.model_fields_set and self.stall_seconds != "auto":
            raise _field_error("timeouts.stall_min_seconds", (
                f"is the floor of stall_seconds: auto, and stall_seconds is "
                f"{self.stall_seconds!r}; remove one of them"))
        return self


class HostSpec(_Model):
    """A lab machine reached over SSH."""

    address: str = Field(description="host name or IP address to SSH to")
    # What starts its tasks: a key of orchestrator.launch.BACKENDS.
    backend: str = Field(default="ssh", pattern=r"^[a-z][a-z0-9_]*$", description=(
        "what starts its tasks there: ssh (a host backend's kind)"))
    port: Port = Field(default=22, description="SSH port")
    user: str | None = Field(default=None, description=(
        "SSH user; default: ~/.ssh/config's User, else your login name"))
    key: str | None = Field(default=None, description=(
        "private key file (~/.ssh/id_ed25519); default: your SSH agent's keys and ~/.ssh/id_*"))
    python: str = Field(default="python3", description=(
        "the interpreter with TensorFlow on that host (/opt/venvs/tf/bin/python)"))
    workdir: str = Field(default="~/tfo", description=(
        "where the job's code is copied and its tasks run on that host"))
    env: Env = Field(default_factory=dict, description="extra environment for its tasks")
    check_host_key: bool = Field(default=True, description=(
        "check the host's key against known_hosts; false trusts any key"))
    known_hosts: str | None = Field(default=None, description=(
        "the known_hosts file; default ~/.ssh/known_hosts"))
    connect_timeout_seconds: Seconds = Field(default=10.0, gt=0, description=(
        "the bound on every call to the host, not only the connect"))
    # Silence (no heartbeat either way) that means the host or the network is gone: its
    # tasks stop themselves, and tfo reports them lost. A lossy link needs more than a cut.
    lifeline_seconds: Seconds = Field(default=LIFELINE_SECONDS, ge=3 * HEARTBEAT_SECONDS,
                                      description=(
        "silence (no heartbeat either way) after which the host's tasks stop themselves and "
        "tfo reports them lost: raise it for a lossy link, lower it to notice a dead host "
        "sooner"))
    gpus: Gpus = Field(default_factory=list, description=(
        "GPU ids its tasks may use, as nvidia-smi numbers them ([0, 1]), or auto "
        "(what nvidia-smi -L reports there); default: none"))

    @field_validator("address")
    @classmethod
    def _address(cls, address: str) -> str:
        if not _HOSTNAME.match(address):
            raise ValueError(f"bad address {address!r}")
        return address


class SchedulerOptions(_Model):
    """The options of `backend: {KIND: {…}}`, a scheduler's request for the whole job. Each
    scheduler's backend (orchestrator/launch/) names its model as its `options`; the spec
    finds it by the kind, in the registry (launch.backends.BACKENDS)."""

    title: ClassVar[str] = "scheduler"  # its name in messages: "Slurm"

    def gpus_for(self, role: str) -> int:
        """The GPUs the scheduler gives each task of the role (0: none asked)."""
        return 0

    def job_problem(self, kind: str, tasks: int) -> tuple[str, str] | None:
        """Why the request cannot hold the job's `tasks`: (field, message), or None."""
        return None


def _scheduler_kind(data: Any) -> str | None:
    """The kind a raw `backend:` names, if it names exactly one."""
    backend = data.get("backend") if isinstance(data, dict) else None
    if isinstance(backend, dict) and len(backend) == 1:
        return str(next(iter(backend)))
    return None


class SchedulerSpec(_Model):
    """`backend: {KIND: {…}}`: a scheduler places the tasks, not the cluster file. Read
    and written as that one-key mapping; `kind` and `options` (the kind's own model, from
    the registry) name its parts, and `backend.slurm` is the options too."""

    # The one key is the kind, its value the kind's options: an extra field of this model.
    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _one_kind(cls, data: Any) -> Any:
        if isinstance(data, SchedulerSpec):
            return data
        models = scheduler_options()
        kinds = ", ".join(sorted(models)) or "none"
        if not (isinstance(data, dict) and len(data) == 1):
            raise ValueError(f"names one scheduler by its kind, its request below it "
                             f"(backend: {{slurm: {{partition: …}}}}); kinds: {kinds}; got "
                             f"{data!r}")
        kind, raw = next(iter(data.items()))
        if kind not in models:
            raise ValueError(f"unknown kind {kind!r}; the schedulers' kinds are "
                             f"{kinds} (a host's backend goes under hosts: NAME: backend:)")
        try:
            return {kind: models[kind].model_validate(raw)}
        except ValidationError as err:
            raise ValueError(format_validation_error(err, f"backend.{kind}")) from None

    @property
    def kind(self) -> str:
        assert self.__pydantic_extra__ is not None
        return next(iter(self.__pydantic_extra__))

    @property
    def options(self) -> SchedulerOptions:
        assert self.__pydantic_extra__ is not None
        return self.__pydantic_extra__[self.kind]


class ElasticSpec(_Model):
    """An elastic job (orchestrator/elastic/groups.py): `tasks.worker` lists the pool of worker
    places; the group trains on max_workers of them, goes on with fewer (contiguous indices,
    worker 0 the chief) when a host is lost, never below min_workers, and grows back at an
    epoch boundary when a lost host or a spare place answers again. A parameter_server job
    drops a lost worker while its chief trains on, takes it back when its host answers, and
    restarts with the ps left when a ps host is lost."""

    min_workers: Int = Field(ge=1, description="never fewer workers than this")
    max_workers: Int | None = Field(default=None, ge=1, description=(
        "never more workers than this; default: every place listed"))
    # How often lost hosts, and listed places not in use, are asked whether they answer.
    probe_seconds: Seconds = Field(default=30.0, gt=0)
    # A host lost and back is two resizes; 10 is five such outages in one run. A host that
    # flaps more costs a restart (and the work since the last backup) each time: past this
    # bound the group stops resizing (a loss then follows the restart policy, a host back
    # waits).
    max_resizes: Int = Field(default=10, ge=0)
    # A host whose tasks failed this many times in a row (each a restart under the restart
    # policy) counts as lost: 3, so one bad start or a crash in the job's code is not
    # blamed on the host, and the default max_restarts (3) still has a restart left then.
    lost_after_failures: Int = Field(default=3, ge=1)


class LocalhostSpec(_Model):
    """This machine, for the tasks on `localhost`."""

    gpus: Gpus = Field(default_factory=list, description=(
        "GPU ids its tasks may use, as nvidia-smi numbers them ([0, 1]), or auto; "
        "default: none"))
