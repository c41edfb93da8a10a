"""The task protocol, imported by both sides: roles, strategies, markers, the lifeline.

A marker is a line `@tfo {"event": "ready", ...}` that the task writes on a descriptor of
its own (`use_channel`), not on its stdout: its wrapper reads it and passes it on in a frame
of its own (worker_entry.channel), apart from the task's output, where the same text is
only text. The coordinator checks each against its model in orchestrator.loop.markers and
records it as an event. This side stays free of pydantic (it is all a lab host gets of tfo,
with the job's own code).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from enum import Enum
from typing import Any


class Role(str, Enum):
    """A task's type in TF_CONFIG. What each role does under a strategy is data:
    orchestrator.planning.strategy.RULES."""

    CHIEF = "chief"
    WORKER = "worker"
    PS = "ps"
    EVALUATOR = "evaluator"
    # The tf.data service (orchestrator/planning/strategy.py DATA_SERVICE): tfo's own servers.
    DISPATCHER = "dispatcher"
    DATA_WORKER = "data_worker"

    def __str__(self) -> str:  # f"{role}:{index}" is "worker:1" (StrEnum needs Python 3.11)
        return self.value


def is_chief(role: str, index: int, cluster: dict[str, list[str]]) -> bool:
    """The task that saves the model (TFO_IS_CHIEF): the chief, or worker 0 when there is
    no chief."""
    return role == Role.CHIEF or (role == Role.WORKER and index == 0
                                  and not cluster.get(Role.CHIEF.value))


# The training group's size now (an elastic job's changes between attempts; orchestrator/
# elastic.py sets it); TF_CONFIG's cluster says it too.
NUM_WORKERS_ENV = "TFO_NUM_WORKERS"


def num_workers(environ: dict[str, str] | None = None) -> int:
    """The group's size as a task sees it: TFO_NUM_WORKERS, else TF_CONFIG's chief and
    workers (1 without either: a single process)."""
    env = os.environ if environ is None else environ
    given = env.get(NUM_WORKERS_ENV, "")
    if given.isascii() and given.isdigit() and int(given) > 0:
        return int(given)
    try:
        cluster = json.loads(env.get("TF_CONFIG") or "{}").get("cluster") or {}
    except (ValueError, AttributeError):
        cluster = {}
    return max(1, len(cluster.get("chief") or []) + len(cluster.get("worker") or []))


class Strategy(str, Enum):
    MULTI_WORKER_MIRRORED = "multi_worker_mirrored"
    PARAMETER_SERVER = "parameter_server"


# DTensor's clients (it reads DTENSOR_JOBS, DTENSOR_CLIENT_ID, DTENSOR_JOB_NAME; TF 2.21's
# dtensor/python/config.py): a multi_worker_mirrored job's chief, then its workers, on
# their TF_CONFIG addresses, job name "worker", as TensorFlow's own DTensor-based
# MultiWorkerMirroredStrategy derives them (distribute/experimental/
# multi_worker_mirrored_strategy.py). A DTensor script builds no other strategy, so its
# client's server is the task's only one, on its TF_CONFIG port.
DTENSOR_ROLES = (Role.CHIEF.value, Role.WORKER.value)
DTENSOR_JOB_NAME = "worker"


def dtensor_jobs(cluster: dict[str, list[str]]) -> list[str]:
    return [a for role in DTENSOR_ROLES for a in cluster.get(role) or []]


def dtensor_env(strategy: str, cluster: dict[str, list[str]], role: str,
                index: int) -> dict[str, str]:
    """A task's DTENSOR_* variables, from its TF_CONFIG (the task sets them before the job's
    code runs, as it does TFO_TASK): a chief or worker of a multi_worker_mirrored job of two
    or more of them is a DTensor client; one process alone runs DTensor's local mode."""
    jobs = dtensor_jobs(cluster)
    if strategy != Strategy.MULTI_WORKER_MIRRORED.value or role not in DTENSOR_ROLES \
            or len(jobs) < 2:
        return {}
    return {"DTENSOR_JOBS": ",".join(jobs), "DTENSOR_NUM_CLIENTS": str(len(jobs)),
            "DTENSOR_CLIENT_ID": str(jobs.index(cluster[role][index])),
            "DTENSOR_JOB_NAME": DTENSOR_JOB_NAME}


# The lifeline (worker_entry.lifeline): the task's stdin, whose write end the coordinator
# (or a lab host's agent) holds. TFO_LIFELINE is "stdin" (EOF means the coordinator is gone);
# unset, nobody holds it (a Kubernetes pod, `python -m worker_entry` by hand).
LIFELINE_ENV = "TFO_LIFELINE"
LIFELINE_STDIN = "stdin"
# A lab host's agent and the coordinator beat to each other at least this often (beat_seconds).
HEARTBEAT_SECONDS = 1.0
# How often the task's wrapper measures its task's processes on their host (any backend).
USAGE_SECONDS = 2.0
# The default silence that means gone (a lab host's `lifeline_seconds`). TCP rides out loss
# by retransmitting, and each retransmission of the same segment waits twice as long (0.2,
# 0.4, 0.8, ... s from Linux's 200 ms minimum): 5 losses in a row hold a beat up 6.2 s, at
# 30 % loss once in 400 segments, every few minutes with beats both ways; 5 s tripped. 30 s
# takes 8 in a row (25.4 s after 7): 0.3^8, once in 15,000 segments, about an hour and a
# half; and a cut network is still noticed well within a task's start-up timeout.
LIFELINE_SECONDS = 30.0


def beat_seconds(lifeline_seconds: float) -> float:
    """How often a host agent and the coordinator beat to each other: a tenth of the silence
    that means gone (3 s for the default 30), not under HEARTBEAT_SECONDS. Each beat wakes a
    thread on both ends of every host's connection: with 16 hosts, beats every second were
    most of an idle coordinator's CPU."""
    return max(HEARTBEAT_SECONDS, lifeline_seconds / 10)


def next_usage(now: float, period: float = USAGE_SECONDS) -> float:
    """When a wrapper next measures its task: on the next multiple of `period` of the
    monotonic clock (one clock for the whole machine), so that a host's wrappers report
    together and its agent sends their lines in one write."""
    return (now // period + 1) * period


PREFIX = "@tfo "
# Every marker is START + "@tfo {json}\n", in one write on the task's channel. In a task's
# log and in the lines the coordinator's reader hands on, a marker line starts with START
# (`MARK`); the task's own bytes never do (worker_entry.channel escapes it), so a line that
# merely looks like a marker is text.
START = "\x1f"  # not \x1c-\x1e: str.splitlines would split a line there
MARK = START + PREFIX
# Down the lifeline, the coordinator's request for the task's Python stacks (a stall): the
# wrapper sends the task STACKS_SIGNAL, on which the task's faulthandler writes every
# thread's stack to its stderr, the task's log.
STACKS = b"?"
STACKS_SIGNAL = "SIGUSR2"  # by name: this module stays free of platform imports
# A warm spare (orchestrator/launch/spares.py) is a task started ahead of its attempt with
# STANDBY_ENV=1: it imports TensorFlow and waits (worker_entry.standby) until GO comes down
# its lifeline; from then on it runs as a task started at that moment would.
STANDBY_ENV = "TFO_STANDBY"
GO = b"!"

# Events a task reports, in the order it reaches them.
UP = "up"  # the process runs; TensorFlow not imported yet
CONNECTING = "connecting"  # building the strategy: waiting for every peer to connect
READY = "ready"  # training: the strategy is built (all peers connected); serving: server up
# The cluster a strategy (or a DTensor mesh) the task built joined (worker_entry/joined.py):
# `via` (what built it), `cluster` (role -> addresses), `member`, `in_process` (addresses of it
# served by the task's own process), and DTensor's `clients`/`client`.
JOINED = "joined"
FIRST_STEP = "first_step"  # the first training step finished
EPOCH = "epoch"  # an epoch began (`epoch`, 0-based)
PROGRESS = "progress"  # training moved: `step` (steps this attempt) and where (at most 1/s)
# The chief of a ParameterServer job: the closures each worker finished this attempt
# (`by_worker`: {"0": n, ...}, by worker index; `at`: the task's clock), at most every 2 s
# (worker_entry/progress/closures.py).
CLOSURES = "closures"
# How long the task's training waited for its input pipeline (`waited`: s this attempt;
# `at`: the task's clock), every 2 s while it takes input (worker_entry/progress/inputwait.py).
INPUT = "input"
INPUT_WAIT_ENV = "TFO_INPUT_WAIT"  # "0": the task sends no `input` (the spec's profiler: false)
USAGE = "usage"  # the wrapper, every USAGE_SECONDS: its task tree's CPU, CPU wait, RSS, stopped?
SIGTERM = "sigterm"  # the task wrapper got SIGTERM and passed it on (`grace`: s to SIGKILL)
EVALUATED = "evaluated"  # the evaluator evaluated a checkpoint (`epoch`, `metrics`)
SAVED = "saved"  # the model was written (`path`, `chief`)
# A script's own BackupAndRestore: the directory it keeps its backups in (`dir`, absolute on
# the task's host), which an elastic resize reads and fills (orchestrator/loop/resizing.py).
BACKUP = "backup"
# A tf.train.Checkpoint written or read back (`op`, `path`, `step`: steps this attempt had
# done; a restore's `epoch`: the checkpoint's own), told by worker_entry/checkpoints.py.
CHECKPOINT = "checkpoint"
DONE = "done"  # the entry returned (`value`: what it returned, as JSON; or `value_error`)
# The most JSON an entry's return value may take in its `done` marker (a marker is one line,
# and the coordinator reads lines of at most 64 KiB).
VALUE_BYTES = 16 * 1024
# The task's last atexit handler (registered before any other): its code and every atexit
# handler are done, and only the interpreter's teardown is left, in which TensorFlow may
# wait for peers that are gone (the supervisor stops such a task: TEARDOWN_GRACE_SECONDS).
# `code`: the exit status its code ended with, which stands as its exit if it is stopped.
EXITING = "exiting"

# A task's exit code for "retrying cannot help": its entry's module or function does not
# exist. The supervisor never restarts it, whatever the restart policy. 78 is EX_CONFIG
# (sysexits.h); user code exiting 78 on its own is taken the same way.
EXIT_PERMANENT = 78

# The exit code of "I was preempted, my state is saved: restart me": what TensorFlow's
# PreemptionCheckpointHandler exits with after saving off Google Cloud (its default
# TerminationConfig, BorgTerminationConfig: `sys.exit(42)`; on GCE it is 143). After a SIGTERM
# the supervisor restarts such a task without counting it against max_restarts.
EXIT_PREEMPTED = 42


def line(event: str, **fields: Any) -> str:
    return START + PREFIX + json.dumps({"event": event, **fields}, default=str) + "\n"


# The task's own descriptor for markers (`use_channel`): a pipe to its wrapper, set before
# the user's code runs and not inherited by what it starts, so nothing it prints reaches it,
# and a script that closes its stdout and stderr (or points them elsewhere) cannot take the
# markers with them, nor fail on our DONE.
_channel: int | None = None
# Told of each marker after it is written (worker_entry/faults.py): (event, fields).
_watchers: list[Any] = []


def on_emit(watch: Any) -> None:
    _watchers.append(watch)


def use_channel(fd: int | None) -> None:
    global _channel
    _channel = fd


def emit(event: str, **fields: Any) -> None:
    """One marker, after whatever the task's stdout holds (so its lines come first); never
    raises: what the task did to its own streams is not the marker's to fail on. Without a
    channel (outside tfo) it is printed, and tfo would take it for text."""
    text = line(event, **fields)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    if _channel is not None:
        data = text.encode()
        with contextlib.suppress(OSError):  # the task closed it (a daemon's closerange)
            while data:
                data = data[os.write(_channel, data):]
    else:
        _print(text)
    for watch in _watchers:
        watch(event, fields)


def _print(text: str) -> None:
    with contextlib.suppress(Exception):
        print(text, end="", flush=True)
