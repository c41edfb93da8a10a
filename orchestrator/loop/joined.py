"""Did a task train in the plan's cluster? Pure: the plan's cluster and what the task said it
joined (its `joined` markers, worker_entry/joined.py) in, a verdict out.

    alone = judge(Planned("worker:1", Strategy.MULTI_WORKER_MIRRORED, cluster), joins)
    alone.lines()    # the console: what it joined instead, the likely cause, the fix
    alone.reason()   # the summary's one line

The loop asks once per attempt, at its first step (orchestrator/loop/intake.py): a task of a job
whose cluster has more than one task that trains without having joined that cluster (no
multi-worker strategy, a cluster of one, another cluster, peers or a task that are not the
plan's, a DTensor mesh of fewer clients) trains alone, and the job fails (`expect_cluster:
false` allows independent tasks). A ParameterServer chief that trains alone leaves the
plan's ps and worker servers unused: its verdict names them.

DTensor's clients are worker_entry.markers.dtensor_env's (the task sets them from TF_CONFIG).

Design: Did it train in the plan's cluster
====================

tfo's progress says a task trained; a script that ignores TF_CONFIG trains too, alone, in
every process, and exits 0. So each task tells which cluster its strategy joined (issue 36):
`worker_entry/joined.py` wraps, before any user code runs, the `__init__` of every subclass
of TensorFlow's `StrategyBase` (not the default strategy's: a script with no strategy tells
nothing), and emits a `joined` marker once the outermost constructor returns: `via` (the
public name: `CollectiveAllReduceStrategy` is `MultiWorkerMirroredStrategy`), `cluster` (its
resolver's cluster spec; `ParameterServerStrategyV2` keeps its resolver without the
property), `member` (the resolver's task), and `in_process`, the addresses of that cluster
served by a `tf.distribute.Server` of this very process (the Server's `__init__` is wrapped
too): the ParameterServer tutorial's `create_in_process_cluster`. DTensor's
`initialize_accelerator_system` (wrapped in its module and in the `tensorflow._api…dtensor`
modules that re-export it) tells `clients`, `client` and `{DTENSOR_JOB_NAME: DTENSOR_JOBS}`.
The marker is checked as any (`markers.Joined`, bounded lists) and kept per attempt
(`Attempt.joins`).

The decision is `orchestrator/joined.judge` (pure, tables in `tests/test_joined.py`): for a
plan whose cluster has more than one task, did any of the attempt's joins name the plan's
peers (MWMS: chief and worker lists; PS: worker and ps, the coordinator's resolver may omit
itself; addresses compared with the loopback's names as one) as the task the plan made, with
neither a one-process strategy, an in-process cluster (peers its own process serves; its own
address is none: a PS chief may serve itself) nor the other kind's strategy? Else `Alone`:
what it joined, the plan's cluster, the likely cause and the fix (no strategy, one-process
strategy, in-process cluster, a cluster of one, another task, other peers, the other kind, a
DTensor mesh of other clients), and for a ParameterServer chief the servers it left unused.
`Intake` asks once an attempt, at its first `first_step` or `progress`, and at an exit 0 of
a task that built a strategy or drives servers (a PS chief that never stepped), for training
tasks that are not servers; a verdict is written at once (`task_alone`, three console lines)
and kept in `Job.alone`, and `Checks.alone` ends the job FAILED with the verdict's reason
before the round starts anything and again right before the success check (so a last step
told in an exit's final lines cannot end in SUCCEEDED). `expect_cluster: false` (the plan's
`Policy.expect_cluster`; `--independent`) skips the verdict; `task_joined` is still
recorded. It cannot see a strategy that is no `tf.distribute.Strategy`, nor judge a task
that neither steps where tfo counts nor builds a strategy.

Tested: `tests/test_joined.py` (the verdict as a table: TF_CONFIG's cluster, 127.0.0.1 for
localhost, no strategy, one-process strategies, a cluster of one, other peers, another task,
the other kind, the PS tutorial's in-process cluster, a PS chief serving itself, DTensor
meshes; when a task is judged; the marker as untrusted input; scripted loops: two workers
stepping without a strategy and exiting 0 fail the job, `expect_cluster: false` succeeds;
`tfo plan`'s lines) and `tests/test_alone.py` (TensorFlow: the PS tutorial under `--strategy
ps --workers 2 --ps 1` fails naming the in-process cluster and `TFConfigClusterResolver()`,
and succeeds with it; `MirroredStrategy` and no strategy on 2 workers fail, and succeed with
`expect_cluster: false`; a DTensor script forms one mesh of 2 clients, where each process
alone is a client of 1). Before the change all of these ended `job succeeded`.

DTensor reads `DTENSOR_JOBS`, `DTENSOR_CLIENT_ID`, `DTENSOR_JOB_NAME` (TF 2.21's
`dtensor/python/config.py`; `DTENSOR_NUM_CLIENTS` is no longer read, set for older code): an
MWMS job's chief and worker tasks, where there are two or more, set (unless their
environment has them) the chief's and the workers' TF_CONFIG addresses in that order, their
index there, and `worker`, as TensorFlow's DTensor-based MultiWorkerMirroredStrategy derives
them (`worker_entry/markers.dtensor_env`, in `runner.main` beside TFO_TASK, before the job's
code; `tfo plan` prints them from the same function). Not in the plan's env: plan.json would
hold the cluster once more per task (the 1,000-task plan's size and speed tests). The same
ports as TF_CONFIG: a DTensor script builds no other strategy, and its client's server
(`initialize_multi_client_cluster`) is the one the wrapper sees listen. Measured: 2 clients,
one mesh (the same loss on both at every step), 28 s under `tfo run --workers 2` on the
loaded 2 cores.

What a restart lost (`orchestrator/loop/resumes.py`): `worker_entry/checkpoints.py` tells
every `tf.train.Checkpoint` written or read back (`checkpoint` markers, `task_checkpoint`
events: the path, the attempt's step count then from `autoprogress.steps_done`, a restore's
own epoch variable). The intake keeps a `Ledger`: the steps each restart unit reached per
attempt (an attempt's markers count from 0, so each attempt has a base: the step of the save
it restored, else 0), and the step of each save by path. At a restarted attempt's first
progress marker, `resumption` (pure) compares the checkpoint it restored (before training)
with the save tfo saw and what the unit had reached: `task_resumed` (`how`, `restored`,
`step`, `epoch`, `lost_steps`, `reached`, `words`), one `[tfo]` line per attempt and words,
`RunResult.resumes` for the summary and the API, `tfo status` from the events. A checkpoint
restored that no task of the run saved (a rerun's) is said as such, its loss unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.loop.markers import Joined
from worker_entry.markers import DTENSOR_ROLES, Role, Strategy, dtensor_jobs

# Strategies that train in one process, whatever TF_CONFIG says.
ONE_PROCESS = ("MirroredStrategy", "OneDeviceStrategy", "CentralStorageStrategy")
MWMS, PS = "MultiWorkerMirroredStrategy", "ParameterServerStrategy"
# What a script of each job builds, as the fix says it.
_RIGHT = {
    Strategy.MULTI_WORKER_MIRRORED: "`tf.distribute.MultiWorkerMirroredStrategy()`",
    Strategy.PARAMETER_SERVER: ("`tf.distribute.experimental.ParameterServerStrategy("
                                "tf.distribute.cluster_resolver.TFConfigClusterResolver())`"),
}
# The other kind's strategy: never the plan's cluster, whatever its peers.
_WRONG = {Strategy.MULTI_WORKER_MIRRORED: PS, Strategy.PARAMETER_SERVER: MWMS}
_LOOPBACK = ("127.0.0.1", "::1", "[::1]", "localhost")


@dataclass(frozen=True)
class Planned:
    """A task as the plan made it: its name, the job's strategy, its TF_CONFIG's cluster."""

    task: str  # "worker:1"
    strategy: Strategy
    cluster: dict[str, list[str]]


@dataclass(frozen=True)
class Alone:
    """A task that trained outside the plan's cluster: what it joined instead, the plan's,
    the likely cause and the fix (a line each), and a ParameterServer job's unused servers."""

    task: str
    joined: str
    planned: str
    cause: str
    fix: str
    unused: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        said = [f"{self.task} trains alone: it joined {self.joined}, not {self.planned}"]
        if self.unused:
            said.append(f"  {', '.join(self.unused)} serve, and no chief uses them")
        return [*said, f"  likely cause: {self.cause}", f"  fix: {self.fix}"]

    def reason(self) -> str:
        return f"{self.task} trained alone ({self.joined}): {self.cause}; fix: {self.fix}"

    def fields(self) -> dict[str, Any]:
        """task_alone's fields."""
        return {"joined": self.joined, "planned": self.planned, "cause": self.cause,
                "fix": self.fix, **({"unused": list(self.unused)} if self.unused else {})}


def size(cluster: dict[str, list[str]]) -> int:
    return sum(len(tasks) for tasks in cluster.values())


def expects_cluster(cluster: dict[str, list[str]]) -> bool:
    """A job whose tasks must train together: its cluster has more than one task."""
    return size(cluster) > 1


def _address(address: str) -> str:
    host, sep, port = address.strip().lower().rpartition(":")
    return f"localhost:{port}" if sep and host in _LOOPBACK else address.strip().lower()


def _same(got: list[str], want: list[str]) -> bool:
    return [_address(a) for a in got] == [_address(a) for a in want]


def _peers(planned: Planned) -> tuple[str, ...]:
    """The roles whose addresses a task's join must name as the plan does."""
    if planned.strategy is Strategy.PARAMETER_SERVER:
        return (Role.WORKER.value, Role.PS.value)  # a coordinator's resolver may omit itself
    return DTENSOR_ROLES


def _own(planned: Planned) -> str | None:
    """The task's own address in the plan's cluster (the evaluator has none)."""
    role, _, index = planned.task.partition(":")
    tasks = planned.cluster.get(role, [])
    return tasks[int(index)] if index.isdigit() and int(index) < len(tasks) else None


def _in_process(planned: Planned, j: Joined) -> list[str]:
    """The peers of `j`'s cluster the task's own process serves: an in-process cluster. Its
    own address is no peer (a script may start a server for itself, as a PS chief can)."""
    own = _own(planned)
    return [a for a in j.in_process if own is None or _address(a) != _address(own)]


def joined_plan(planned: Planned, j: Joined) -> bool:
    """`j` is the plan's cluster, with the task as the plan made it."""
    if j.clients is not None:  # DTensor: its clients are the plan's chief and workers
        jobs, own = dtensor_jobs(planned.cluster), _own(planned)
        got = next(iter(j.cluster.values()), [])
        return (planned.strategy is Strategy.MULTI_WORKER_MIRRORED and j.clients == len(jobs)
                and len(j.cluster) == 1 and _same(got, jobs) and own in jobs
                and j.client == jobs.index(own))
    if j.via in ONE_PROCESS or _in_process(planned, j) or j.via == _WRONG[planned.strategy]:
        return False
    if any(not _same(j.cluster.get(r, []), planned.cluster.get(r, [])) for r in _peers(planned)):
        return False
    return j.member is None or j.member == planned.task


def judge(planned: Planned, joins: Sequence[Joined]) -> Alone | None:
    """None where the task joined the plan's cluster (any of its joins this attempt: a
    script may build a one-device strategy for evaluation beside its multi-worker one), or
    where the plan has no cluster to join; else what it joined instead, the last join."""
    if not expects_cluster(planned.cluster) or any(joined_plan(planned, j) for j in joins):
        return None
    cause, fix, joined = _why(planned, joins[-1] if joins else None)
    role = planned.task.split(":")[0]
    unused: tuple[str, ...] = ()
    if planned.strategy is Strategy.PARAMETER_SERVER and role == Role.CHIEF.value:
        unused = tuple(f"{r}:{i}" for r in (Role.PS.value, Role.WORKER.value)
                       for i in range(len(planned.cluster.get(r, []))))
    return Alone(planned.task, joined, _words(planned.cluster, "the plan's cluster of"),
                 cause, fix, unused)


def _words(cluster: dict[str, list[str]], what: str) -> str:
    """`what` N (1 chief, 2 worker): the addresses are in task_joined and plan.json."""
    roles = ", ".join(f"{len(addresses)} {role}" for role, addresses in sorted(cluster.items()))
    return f"{what} {size(cluster)} ({roles})"


def _why(planned: Planned, j: Joined | None) -> tuple[str, str, str]:
    """(likely cause, fix, what it joined) for a task that trained outside the plan."""
    role = planned.task.split(":")[0]
    right = _RIGHT[planned.strategy]
    kind = "multi_worker_mirrored" if planned.strategy is Strategy.MULTI_WORKER_MIRRORED \
        else "parameter_server"
    if j is None:
        return ("the script built no distribution strategy (TensorFlow's default trains in "
                "this one process), or one tfo cannot see (a custom one, another library)",
                f"build {right} before the model", "no cluster: no strategy")
    if j.clients is not None:
        if planned.strategy is not Strategy.MULTI_WORKER_MIRRORED:
            return (f"the script runs DTensor in a {kind} job",
                    "run it as multi_worker_mirrored (--strategy mwms)",
                    f"a DTensor mesh of {j.clients} client(s)")
        return (f"DTensor saw {j.clients} client(s) (client {j.client}): DTENSOR_JOBS or "
                "DTENSOR_CLIENT_ID was not the one tfo set when "
                "dtensor.initialize_accelerator_system() ran",
                "leave the DTENSOR_* variables tfo sets as they are",
                f"a DTensor mesh of {j.clients} client(s)")
    if served := _in_process(planned, j):
        return (f"the {role} built its own in-process cluster ({len(served)} servers in "
                "its own process, as create_in_process_cluster does)",
                "use `tf.distribute.cluster_resolver.TFConfigClusterResolver()`: it reads "
                "the cluster tfo started from TF_CONFIG",
                _words(j.cluster, f"an in-process cluster ({j.via}) of"))
    if j.via in ONE_PROCESS:
        return (f"the script built `{j.via}`, which trains in one process",
                f"use {right}", f"no cluster: {j.via} in this one process")
    if j.via == _WRONG[planned.strategy]:
        other = "ps" if j.via == PS else "mwms"
        return (f"the script built {j.via} in a {kind} job",
                f"run it with --strategy {other} (the cluster file's strategy:)",
                _words(j.cluster, f"a {j.via} cluster of") if j.cluster
                else f"{j.via} without a cluster")
    if size(j.cluster) <= 1:
        return (f"its {j.via} found no cluster: TF_CONFIG was missing or changed when the "
                "script built it", f"build {right} with TF_CONFIG as tfo set it",
                f"a cluster of 1 ({j.via}, this process alone)")
    if all(_same(j.cluster.get(r, []), planned.cluster.get(r, [])) for r in _peers(planned)):
        return (f"its cluster resolver says it is {j.member}, and tfo started it as "
                f"{planned.task}", "let `TFConfigClusterResolver()` read the task from "
                "TF_CONFIG", f"the plan's cluster as {j.member} ({j.via})")
    return ("its cluster resolver names other peers than TF_CONFIG's",
            "use `tf.distribute.cluster_resolver.TFConfigClusterResolver()` (the default): "
            "it reads the cluster tfo started from TF_CONFIG",
            _words(j.cluster, f"another cluster ({j.via}) of"))
