"""Markers as the coordinator reads them: untrusted input, validated per kind.

    marker = read_marker(line)   # None: an ordinary line; raises BadMarker for a line that
                                 # starts like a marker but is not a valid one
    marker.event, marker.record()

A task writes markers with worker_entry.markers.emit on a channel of their own, which its
wrapper frames apart from its output (worker_entry.channel): what it prints is never read as
one (kept free of pydantic: lab hosts may lack it). Still, a marker is the task's word, user
code's included, so every one is checked here before the supervisor acts on it or records
it, and what it may decide is checked against what tfo saw itself (an exit code is the
kernel's).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from worker_entry import markers as m

# The keys of the event record a marker becomes; a marker's own fields must not clash.
RESERVED = frozenset({"time", "event", "task", "attempt", "pid"})


class BadMarker(ValueError):
    """A line that starts like a marker but is not a valid one; says what is wrong."""


class _Marker(BaseModel):
    # Fields beyond a kind's own are recorded as they are (a newer worker_entry may add one),
    # unless they would overwrite the record's own keys.
    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="after")
    def _no_reserved_extras(self) -> _Marker:
        clash = sorted(RESERVED & set(self.model_extra or {}))
        if clash:
            raise ValueError(f"field(s) {', '.join(clash)} are tfo's own")
        return self

    def record(self) -> dict[str, Any]:
        """The fields the task sent, to record with the event (`event` itself excluded)."""
        return self.model_dump(exclude={"event"}, exclude_unset=True)


class Up(_Marker):
    event: Literal[m.UP]
    pid: int
    host: str = ""


class Connecting(_Marker):
    event: Literal[m.CONNECTING]


class Ready(_Marker):
    event: Literal[m.READY]
    what: str = ""
    target: str | None = None


# Bounds on what a `joined` marker may carry: a task's word, one line of at most 64 KiB.
_Address = Annotated[str, Field(min_length=1, max_length=300)]


class Joined(_Marker):
    """The cluster a strategy (or a DTensor mesh) the task built joined (worker_entry/
    joined.py): `via` what built it, `cluster` its roles' addresses as the strategy saw them
    ({}: none, one process), `member` who it joined as ("worker:1"), `in_process` the
    addresses of it the task's own process serves; DTensor's `clients` and `client`."""

    event: Literal[m.JOINED]
    via: str = Field(min_length=1, max_length=100)
    cluster: dict[Annotated[str, Field(min_length=1, max_length=100)],
                  Annotated[list[_Address], Field(max_length=10_000)]] = Field(max_length=20)
    member: str | None = Field(default=None, max_length=200)
    in_process: list[_Address] = Field(default_factory=list, max_length=10_000)
    clients: int | None = Field(default=None, ge=0)
    client: int | None = Field(default=None, ge=0)


class FirstStep(_Marker):
    event: Literal[m.FIRST_STEP]
    batch: int | None = None
    approximate: bool = False
    # Where a step inferred by tfo came from (worker_entry/progress/auto.py: "tf.function",
    # "coordinator"); unset when Keras's callback or the script told it.
    source: str | None = None


class Epoch(_Marker):
    event: Literal[m.EPOCH]
    epoch: int


class Progress(_Marker):
    """Training moved (worker_entry.progress, at most once a second). `step` counts the steps
    this attempt has run: a stall is a `step` that stops moving."""

    event: Literal[m.PROGRESS]
    step: int = Field(ge=0)
    epoch: int | None = Field(default=None, ge=0)  # 0-based
    epochs: int | None = Field(default=None, ge=0)
    step_in_epoch: int | None = Field(default=None, ge=0)  # 1-based: steps done this epoch
    steps: int | None = Field(default=None, ge=0)  # steps per epoch, when known
    loss: float | None = None
    source: str | None = None  # as FirstStep's
    # The task's monotonic clock at `step`: the steps/s is taken over it (orchestrator/loop/rate.py)
    at: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class Closures(_Marker):
    """The closures each worker finished, by worker index, as a ParameterServer job's chief
    counted them this attempt (worker_entry/progress/closures.py), at the task's clock `at`."""

    event: Literal[m.CLOSURES]
    by_worker: dict[Annotated[str, Field(pattern=r"^[0-9]{1,6}$")],
                    Annotated[int, Field(strict=True, ge=0)]] = Field(max_length=10_000)
    at: float = Field(ge=0, allow_inf_nan=False)


class Input(_Marker):
    """How long the task's training waited for its input this attempt (`waited`, s), at the
    task's clock `at` (worker_entry/progress/inputwait.py; judged in loop/starved.py)."""

    event: Literal[m.INPUT]
    waited: float = Field(ge=0, allow_inf_nan=False)
    at: float = Field(ge=0, allow_inf_nan=False)


class Usage(_Marker):
    """From the task's wrapper, measured on the task's host every USAGE_SECONDS: the task's
    whole process tree."""

    event: Literal[m.USAGE]
    cpu: float = Field(ge=0)  # percent of one core over the last interval
    # Its threads' time runnable but waiting for a CPU, as `cpu` (worker_entry/usage.py);
    # None from a kernel without schedstat, or a wrapper before it was measured.
    wait: float | None = Field(default=None, ge=0)
    cpus: int | None = Field(default=None, ge=1)  # the CPUs its host lets it use
    rss: int = Field(ge=0)  # bytes
    processes: int = Field(default=1, ge=0)
    stopped: bool = False  # a process of the task is stopped (state T: SIGSTOP, Ctrl-Z)
    # The smoothed TCP round-trip time of its connections to other hosts, ms: the fastest
    # host's median (worker_entry/netrtt.py; judged in loop/netslow.py); None: no such
    # connection sent data lately, or a wrapper before it was measured.
    rtt: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    rtt_hosts: int | None = Field(default=None, ge=1)

    @property
    def wanted(self) -> float:
        """The CPU the task wanted: what it ran and what its threads waited on a runqueue for.
        A sign of work: on a crowded host a working task can run under 2 % of a core for
        seconds while it waits for one (a stall check with a short floor took such a task,
        at step 2 of a custom loop, for idle)."""
        return self.cpu + (self.wait or 0.0)


class SigTerm(_Marker):
    """From the task's wrapper: it got SIGTERM and passed it on; SIGKILL in `grace` s."""

    event: Literal[m.SIGTERM]
    grace: float = Field(default=0, ge=0)


class Evaluated(_Marker):
    event: Literal[m.EVALUATED]
    epoch: int
    checkpoint: str = ""
    metrics: dict[str, float]


class Saved(_Marker):
    event: Literal[m.SAVED]
    path: str
    chief: bool = False


class Backup(_Marker):
    """A script's BackupAndRestore directory (worker_entry/progress/auto.py tells it)."""

    event: Literal[m.BACKUP]
    dir: str = Field(min_length=1, max_length=4096)


class Checkpointed(_Marker):
    """A tf.train.Checkpoint the task wrote or read back (worker_entry/checkpoints.py)."""

    event: Literal[m.CHECKPOINT]
    op: Literal["saved", "restored"]
    path: str = Field(min_length=1, max_length=4096)
    step: int = Field(ge=0)  # steps this attempt had done then
    epoch: int | None = Field(default=None, ge=0)  # a restore's: the checkpoint's own


class Done(_Marker):
    event: Literal[m.DONE]
    # What an entry returned (worker_entry.runner.returned): the task's word, untrusted.
    value: Any = None
    value_error: str | None = Field(default=None, max_length=1000)


class Exiting(_Marker):
    """The task's Python is tearing down: its code and its atexit handlers are done. `code`:
    the exit status its code ended with (None: not known)."""

    event: Literal[m.EXITING]
    code: int | None = Field(default=None, ge=0, le=255)


Marker = Annotated[Up | Connecting | Ready | Joined | FirstStep | Epoch | Progress | Closures
                   | Input | Usage | SigTerm | Evaluated | Saved | Backup | Checkpointed | Done
                   | Exiting,
                   Field(discriminator="event")]
_MARKER: TypeAdapter[Marker] = TypeAdapter(Marker)


def read_marker(line: str) -> Marker | None:
    """The marker in one line of a task's lines or log, or None for an ordinary line. A
    marker line starts with markers.MARK: START, which the output reader puts before each
    marker its task's wrapper framed and never lets the task's own text begin with
    (orchestrator/launch/output.py), then "@tfo ". Text that only looks like one is text."""
    if not line.startswith(m.MARK):
        return None
    try:
        data = json.loads(line[len(m.MARK):])
    except (ValueError, RecursionError) as e:  # 64 KiB of `[` is too deep for json
        raise BadMarker(f"not JSON: {str(e)[:200]}") from None
    try:
        return _MARKER.validate_python(data)
    except ValidationError as e:
        raise BadMarker("; ".join(
            f"{'.'.join(map(str, err['loc'])) or 'marker'}: {err['msg']}"
            for err in e.errors()[:3])) from None


def is_marker(line: str) -> bool:
    """A valid marker: a line tfo reads, not one to show (a bad one is shown)."""
    try:
        return read_marker(line) is not None
    except BadMarker:
        return False
