"""The cluster file: its schema, loading it, and every check a user can get wrong.

    spec = load_spec("clusters/localhost.yaml")    # raises SpecError on any mistake
    spec.tasks.worker[1]                            # Address(host='localhost', port=20001)
    [(role, i, addr) for role, i, addr in spec.tasks.all()]

A SpecError's message names the field (`tasks.worker[1]`) and the offending value;
the CLI prints it and exits 2 before anything starts.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
import string
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    Strict,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from orchestrator.errors import SpecError
from orchestrator.policy import RestartPolicy
from orchestrator.specfile import SpecFileError, read_data
from orchestrator.stall import FLOOR_SECONDS
from orchestrator.strategy import CLUSTER_ROLES, DATA_SERVICE, RULES, START_ORDER
from worker_entry.markers import HEARTBEAT_SECONDS, LIFELINE_SECONDS, Role, Strategy

__all__ = ["RestartPolicy", "Role", "Strategy", "ClusterSpec", "SchedulerOptions",
           "SpecError",
           "cluster_schema",
           "load_spec", "parse_spec"]
ROLES = tuple(Role)
LOCALHOST = "localhost"
_ENTRY = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
_HOSTNAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MODEL_DIR_PLACEHOLDERS = ("run_id", "run_dir")
# Linux's MAX_ARG_STRLEN: the most one argv or environment string may hold, its NUL included.
# A task's job (TFO_JOB) and TF_CONFIG travel in its environment.
MAX_ARG_STRLEN = 32 * 4096
# The most tasks one role may have. Checked before a single address is built: a count or a
# flag of 10,000,000 took 27 s and 6.4 GB to be refused. Far above any sane job (a localhost
# job stops at 256 tasks; a TF_CONFIG of more than about 6,000 addresses no longer fits in a
# task's environment).
MAX_TASKS_PER_ROLE = 4096


class Collective(str, Enum):
    """MWMS's all-reduce: TensorFlow's CommunicationImplementation, by its lower-case name."""

    AUTO = "auto"
    RING = "ring"
    NCCL = "nccl"


class _Model(BaseModel):
    # No inf/nan in any float: an infinite backoff or timeout idles forever.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# Strict: YAML's `true` would otherwise become 1 (a port, a count).
Int = Annotated[int, Strict()]
Port = Annotated[int, Strict(), Field(ge=1, le=65535)]
# Strict floats still take ints but refuse booleans.
Seconds = Annotated[float, Strict()]


def _check_env(env: dict[str, str]) -> dict[str, str]:
    """Names a shell and `env` take as names (an SSH task's env reaches a remote shell)."""
    for key, value in env.items():
        if not _ENV_KEY.match(key):
            raise ValueError(f"bad key {key!r}: environment variable names are letters, digits "
                             "and _, not starting with a digit")
        if "\0" in value:
            raise ValueError(f"the value of {key} contains a NUL character, which no "
                             "environment variable can hold")
    return env


Env = Annotated[dict[str, str], AfterValidator(_check_env)]


def _parse_gpus(value: Any) -> Any:
    """A host's GPUs: ids as `nvidia-smi -L` numbers them, or 'auto' (ask nvidia-smi)."""
    if value is None:
        return []
    if value == "auto":
        return value
    hint = "a list of GPU ids like [0, 1] or 'auto' (what nvidia-smi -L reports)"
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        hint += f"; for {value} GPUs write {list(range(value))}"
    if not isinstance(value, list):
        raise ValueError(f"expected {hint}, got {value!r}")
    for gpu in value:
        if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
            raise ValueError(f"GPU ids are integers >= 0, got {gpu!r} in {value!r}")
    if len(set(value)) < len(value):
        dup = next(g for g in value if value.count(g) > 1)
        raise ValueError(f"GPU {dup} is listed twice in {value!r}")
    return value


# `auto` is resolved by the launcher before the plan (orchestrator/launch/gpus.py).
Gpus = Annotated[list[int] | Literal["auto"],
                 BeforeValidator(_parse_gpus, json_schema_input_type=list[int] | Literal["auto"]
                                 | None)]


def _check_gpus_per_task(value: Any) -> Any:
    if isinstance(value, dict):
        for role, count in value.items():
            if role not in ROLES:
                raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ValueError(f"{role}: expected a number of GPUs >= 0, got {count!r}")
    elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"expected a number of GPUs >= 0 (every chief and worker) or a map "
                         f"of role to number ({{worker: 1, ps: 0}}), got {value!r}")
    return value


GpusPerTask = Annotated[int | dict[str, int], BeforeValidator(
    _check_gpus_per_task, json_schema_input_type=Annotated[int, Field(ge=0)]
    | dict[Literal[ROLES], Annotated[int, Field(ge=0)]])]
# An int gives GPUs to the roles that train; a ps holds variables, an evaluator only reads.
GPU_ROLES = (Role.CHIEF, Role.WORKER)


class Address(_Model):
    """Where one task listens. `port=None` means: take a free port at launch (`port: auto`)."""

    host: str = Field(description="'localhost', or a name under hosts:")
    port: Int | None = Field(default=None, description=(
        "the task's port, 1-65535; null (written 'host:auto' or just 'host'): a free port "
        "taken at launch"))

    def __str__(self) -> str:
        return f"{self.host}:{self.port if self.port is not None else 'auto'}"

    @field_validator("port")
    @classmethod
    def _port_range(cls, port: int | None) -> int | None:
        if port is not None and not 1 <= port <= 65535:
            raise ValueError(f"port {port} is outside 1-65535")
        return port


def parse_address(value: Any) -> Any:
    """'host:port', 'host:auto' or 'host' → {host, port}; the model checks the range."""
    if isinstance(value, Address | dict):
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected 'host:port', 'host:auto' or 'host', got {value!r}")
    host, sep, port_text = value.strip().rpartition(":")
    if not sep:
        host, port_text = value.strip(), "auto"
    if not host or not _HOSTNAME.match(host):
        raise ValueError(f"bad host {host!r} in {value!r}")
    if port_text == "auto":
        return {"host": host, "port": None}
    if not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"port must be a number or 'auto', got {port_text!r} in {value!r}")
    return {"host": host, "port": int(port_text)}


# The schema (`tfo schema`) shows what a file may hold: 'host:port', 'host:auto', 'host'.
AddressText = Annotated[str, Field(pattern=r"^\s*[A-Za-z0-9_.\-]+(:(\d+|auto))?\s*$")]
TaskAddress = Annotated[Address, BeforeValidator(
    parse_address, json_schema_input_type=AddressText | Address)]


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
    dispatcher: Addresses = Field(default_factory=list, description=(
        "at most one: the tf.data service's dispatcher, with data_worker tasks (the "
        "trainers get its address as TFO_DATA_SERVICE)"))
    data_worker: Addresses = Field(default_factory=list, description=(
        "the tf.data service's workers: they run the trainers' input pipelines; need a "
        "dispatcher"))

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
        """Every task as (role, index, address), in start order: dispatcher, data_worker, ps,
        worker, chief, evaluator."""
        for role in START_ORDER:
            for index, address in enumerate(getattr(self, role)):
                yield role, index, address


def _check_warm_spares(value: Any) -> Any:
    if isinstance(value, bool) or value == "auto":
        return value
    raise ValueError(f"expected auto, true or false, got {value!r}")


# Warm spares (orchestrator/launch/spares.py): tasks' next attempts started ahead on their
# hosts, with TensorFlow imported. `auto`: on each host with the cores and memory for them.
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
    backoff_seconds: Seconds = Field(default=1.0, ge=0, description=(
        "the wait before a restart"))
    warm_spares: WarmSpares = Field(default="auto", description=(
        "standbys with TensorFlow imported, started ahead for each task's next attempt: "
        "true, false, or auto (on where the host has the cores and memory to spare)"))

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
# whole group idles) this long fails its attempt (orchestrator.stall). `auto`: the limit
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


def scheduler_options() -> dict[str, type[SchedulerOptions]]:
    """Every scheduler's options model by kind (the registry's; imported only for a job
    that names one, so a cluster file without `backend:` loads no backend)."""
    from orchestrator.launch.backends import schedulers

    return {k: cls.options for k, cls in schedulers().items()}


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
    """An elastic job (orchestrator/elastic.py): `tasks.worker` lists the pool of worker
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
    backend: SchedulerSpec | None = Field(default=None, description=(
        "a scheduler that places the tasks, by kind: {slurm: {...}}; default: none, "
        "the tasks name their hosts"))
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
            # The trainers reach the data service's tasks too (its address, its workers').
            for role, index, address in t.all():
                if address.host == LOCALHOST and role in (*CLUSTER_ROLES, *DATA_SERVICE):
                    raise _field_error(f"tasks.{role}[{index}]", (
                        f"localhost cannot be reached from the lab hosts ({remote[0][0]} runs "
                        f"on {remote[0][1]}); list this machine under hosts: with an address "
                        "the others can reach"))
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


class _FieldError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _field_error(field: str, message: str) -> _FieldError:
    return _FieldError(field, message)


def _loc(loc: tuple[int | str, ...], prefix: str = "") -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith(("function-", "model-")) or "[" in part or part in ("str", "dict"):
            continue  # pydantic's names for union members and validators
        else:
            out += f".{part}" if out else part
    return out or "(top level)"


# The fields our model-level checks name at the start of their message.
_MODEL_FIELDS = ("tasks", "job", "env.", "hosts.", "backend.", "timeouts.", "elastic")


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """One line per field, each naming it; `prefix`: where the model validated sits in the
    cluster file (`backend.slurm`)."""
    lines: dict[str, str] = {}
    for e in err.errors():
        loc, msg = _loc(e["loc"], prefix), e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = f"unknown key {e['loc'][-1]!r}"
            loc = _loc(e["loc"][:-1], prefix)
        elif e["type"] == "missing":
            msg = "is required"
        elif ": " in msg and msg.split(": ", 1)[0].startswith(_MODEL_FIELDS):
            loc, msg = msg.split(": ", 1)  # our model-level checks carry their own field
        elif e["type"] not in ("value_error", "assertion_error"):
            msg = f"{msg} (got {e.get('input')!r})"
        lines.setdefault(loc, f"{loc}: {msg}")  # a union's first member says enough
    return "\n".join(lines.values())


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
