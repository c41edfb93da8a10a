"""The cluster file's values: the base model, strict scalars, and the checks of one value
(an environment, GPUs, an address `host:port`) that the sections' models share.

Part of the spec (planning/spec.py, which re-exports these names)."""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
)

from worker_entry.markers import Role

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
