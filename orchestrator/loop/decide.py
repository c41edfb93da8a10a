"""The supervisor's decisions, as pure functions of the job's state (and the time, and an
event, where one matters) that return what to do: the loop in orchestrator/loop/supervise.py
carries it out against the handles, the event log and the console.

One rule, one place:
- the task and job states and their transitions (`TaskState`, `JobState`, `advance`);
- "is this a training task" (`training`: not a sidecar) and "a server" (`serving`);
- an exit's state (`exit_state`: a server's any exit, else an exit not 0 and not a good
  teardown, is a loss);
- an exit's status and words (`teardown_status`: a torn-down task's exit is its `exiting`
  code; `exited_how`, `stopped_how`, `lost_why`): the backends report a code and a lost
  contact, and what a user reads of them is decided here (loop/exitwords.py puts a code's
  own words to them);
- a sign of work (`busy_cpu`: the CPU a usage must say, a sidecar's bar higher);
- the restart budget (`restarts_left`: a sidecar's own restarts, a training task's the job's,
  against max_restarts), which the loss (`on_loss`), the warm spares (`standby_wanted`,
  and launch/spares.spares_wanted) and a preemption (`preempted`) all ask;
- the wait before a restart (`restart_wait`: none for the first, a backoff growing only with
  a crash loop, `crash_streak`, or with failed starts, `start_backoff`);
- what the policy's limits and the strategy's rules say: who waits for the servers
  (`waits_for`), the startup limit (`startup_failed`), the stall rule, the deadline, when
  training is done, and the end of FINISHING (`finishing`, its words and event fields). The
  loop reads no policy or rule itself, and never sleeps (tests/test_decide.py checks the
  source of supervise.py and of each module it acts through).

This module imports nothing of time, signal, orchestrator.launch or the run directory (and
nothing that does): tests/test_decide.py checks it, and decides with no process and no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from orchestrator.loop.stall import IDLE_CPU, StallRule, Watched, startup_over
from orchestrator.planning.policy import Policy, RestartPolicy, restart_allowed
from orchestrator.planning.strategy import (  # the roles and the budget, for decide.*
    RestartUnit,
    StrategyRules,
    restarts_left,
    service,
    serving,
    sidecar,
    training,
)
from worker_entry.markers import EXIT_PERMANENT, EXIT_PREEMPTED, Role

# The longest wait before starting again on a host that could not be reached.
START_BACKOFF_MAX = 60.0
# An attempt that failed this soon after it started is part of a crash loop (issue 39): the
# first failure of a loop restarts at once, each further one waits CRASH_LOOP_BACKOFF
# (backoff_seconds where given), doubled.
# An attempt that ran longer starts the count anew. Kubernetes' CrashLoopBackOff resets
# after 10 minutes of running; a training attempt that trained a minute did useful work.
CRASH_LOOP_SECONDS = 60.0
CRASH_LOOP_BACKOFF = 1.0
# A task that reports no progress (a script without worker_entry.progress) is taken to be
# training this long after its ready marker (its port listens): then its warm spare starts.
STANDBY_AFTER_READY_SECONDS = 5.0
# A task in its teardown (the `exiting` marker) this long after a peer of its restart unit
# exited 0, or after every peer said `exiting` too, is stopped. TensorFlow's own exit took
# 1.0–2.9 s after the code ended here when it did not wait.
TEARDOWN_GRACE_SECONDS = 3.0
# A sidecar whose usage says this much CPU (percent of one core) is evaluating, not idle:
# one waiting for a checkpoint (SidecarEvaluator polls once a second) uses about none.
SIDECAR_BUSY_CPU = 10.0


@dataclass(frozen=True)
class Timing:
    """The loop's own limits that are no setting of the cluster file (a test shortens them;
    none is patched into a module)."""

    teardown_grace: float = TEARDOWN_GRACE_SECONDS
    standby_after_ready: float = STANDBY_AFTER_READY_SECONDS


class TaskState(str, Enum):
    """One task across its attempts. Every transition, one a line (a test reads these):

        PENDING ──start──▶ STARTING
        PENDING ──could not start──▶ FAILED
        STARTING ──ready marker, or its first step──▶ RUNNING
        STARTING/RUNNING ──exit 0──▶ SUCCEEDED
        STARTING/RUNNING ──stopped in its teardown (code over, a peer gone)──▶ SUCCEEDED
        STARTING/RUNNING ──exit ≠ 0, signal, a server's exit──▶ FAILED
        STARTING/RUNNING ──teardown (a stalled task's too): SIGTERM, a kill deadline──▶ STOPPING
        STOPPING ──exited, or killed at the deadline──▶ STOPPED
        PENDING/FAILED/STOPPED/SUCCEEDED ──restart (attempt + 1)──▶ PENDING
    """

    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"

    @property
    def live(self) -> bool:
        return self in _LIVE  # a frozenset: the loop asks for every task each round


_T = TaskState
_LIVE = frozenset({_T.STARTING, _T.RUNNING})
TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    _T.PENDING: frozenset({_T.STARTING, _T.FAILED, _T.PENDING}),
    _T.STARTING: frozenset({_T.RUNNING, _T.SUCCEEDED, _T.FAILED, _T.STOPPING}),
    _T.RUNNING: frozenset({_T.SUCCEEDED, _T.FAILED, _T.STOPPING}),
    _T.STOPPING: frozenset({_T.STOPPED}),
    _T.SUCCEEDED: frozenset({_T.PENDING}),
    _T.FAILED: frozenset({_T.PENDING}),
    _T.STOPPED: frozenset({_T.PENDING}),
}


class JobState(str, Enum):
    """The whole run. Every transition, one a line (a test reads these):

        PENDING ──launch──▶ RUNNING
        RUNNING/RESTARTING ──task lost or stalled, restart allowed and left──▶ RESTARTING
        RUNNING/RESTARTING ──task preempted──▶ RESTARTING
        RESTARTING ──relaunched after the backoff──▶ RUNNING
        RUNNING/RESTARTING ──success policy met: wait for the sidecars──▶ FINISHING
        FINISHING ──sidecars done, their time up, or a signal──▶ SUCCEEDED
        RUNNING/RESTARTING ──lost/stalled, no restart left; startup timeout; deadline──▶ FAILED
        RUNNING/RESTARTING/FINISHING ──supervisor error; run directory unwritable──▶ FAILED
        RUNNING/RESTARTING ──SIGHUP/SIGINT/SIGQUIT/SIGTERM──▶ INTERRUPTED
    """

    PENDING = "pending"
    RUNNING = "running"
    RESTARTING = "restarting"
    FINISHING = "finishing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


_J = JobState
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _J.PENDING: frozenset({_J.RUNNING}),
    _J.RUNNING: frozenset({_J.RESTARTING, _J.FINISHING, _J.FAILED, _J.INTERRUPTED}),
    _J.RESTARTING: frozenset({_J.RESTARTING, _J.RUNNING, _J.FINISHING, _J.FAILED,
                              _J.INTERRUPTED}),
    _J.FINISHING: frozenset({_J.SUCCEEDED, _J.FAILED}),
    _J.SUCCEEDED: frozenset(),
    _J.FAILED: frozenset(),
    _J.INTERRUPTED: frozenset(),
}
TRANSITIONS: dict[type, dict[Any, frozenset[Any]]] = {TaskState: TASK_TRANSITIONS,
                                                      JobState: JOB_TRANSITIONS}


class IllegalTransition(Exception):
    """A bug of ours: a state change the Enum's docstring does not draw."""


def advance(current: TaskState | JobState, new: TaskState | JobState) -> Any:
    """`new`, if the table next to the Enum allows current → new; raises otherwise."""
    if new not in TRANSITIONS[type(current)][current]:
        raise IllegalTransition(f"{type(current).__name__} {current.value} → {new.value} "
                                "is not drawn in its docstring")
    return new


# ---- one rule, one place --------------------------------------------------------------




def exit_state(rc: int, torn_down_ok: bool, role: Role, rules: StrategyRules) -> TaskState:
    """The state an exit leaves a task in: a server's any exit is a loss (servers never exit
    on their own); otherwise exit 0, or stopped in its teardown after its code ended well,
    is a success."""
    lost = (rc != 0 and not torn_down_ok) or serving(role, rules)
    return TaskState.FAILED if lost else TaskState.SUCCEEDED


# The exit code our kill makes (-SIGKILL; decide imports no signal module).
_KILLED = -9


def stopped_in_teardown(rc: int) -> bool:
    """Did our stop of a task in its teardown end it (its exit then is the status its
    `exiting` marker said its code ended with)? Only if the kernel says our SIGKILL ended
    it: a task that exited on its own meanwhile (its code, its own crash) is told by the
    kernel's status, whatever it said before."""
    return rc == _KILLED


def teardown_status(rc: int | None, said: int | None, ours: bool) -> int | None:
    """A torn-down task's exit is its `exiting` code: a task whose code had ended with a
    status (`said`, its `exiting` marker) and that our signal then ended (`ours`, and the
    kernel reports a signal) exited with that status. None: the kernel's status stands (it
    said none, or it ended otherwise). How each event records it: loop/exitwords.py."""
    return said if ours and said is not None and rc is not None and rc < 0 else None


def busy_cpu(role: Role, rules: StrategyRules) -> float:
    """The CPU (percent of one core) a task's usage must say to count as a sign of work: a
    training task's IDLE_CPU (one blocked in a collective reads 0.0), a sidecar's
    SIDECAR_BUSY_CPU (one waiting for a checkpoint polls, and uses about none)."""
    return IDLE_CPU if training(role, rules) else SIDECAR_BUSY_CPU


# ---- how an exit is told ----------------------------------------------------------------
# The backends report facts: an exit code (-N: signal N; its words are exitwords.describe_exit)
# and, where the code says less, a lost contact (`lost contact with lab2: ...`). Which words
# a user reads is decided here, once: task_exited, task_stopped, a loss's reason, the tables.
TORN_DOWN = "stopped in teardown"


def exited_how(code: str, lost: str = "", torn_down: bool = False,
               code_said: str | None = None) -> str:
    """How an exit is told (task_exited's `how`, the tables' exit cell), from its `code` in
    words and a `lost` contact: a task stopped in its teardown is TORN_DOWN, after the status
    its code said (`code_said`) where that was not a success; else a lost contact, else its
    code."""
    if torn_down:
        return f"{code_said} ({TORN_DOWN})" if code_said else TORN_DOWN
    return lost or code


def stopped_how(code: str, lost: str = "", code_said: str | None = None, note: str = "") -> str:
    """How a task we stopped ended (task_stopped's `how`): a lost contact, else its code; one
    whose code had ended with a status of its own (`code_said`, its `exiting` marker) and
    waited in its teardown is told by that status first, with why a 42 was no preemption."""
    how = lost or code
    return f"{code_said}{note}, then stopped in its teardown ({how})" if code_said else how


def lost_why(name: str, code: str, lost: str = "", note: str = "") -> str:
    """A lost task's reason (the restart line, the job's failure)."""
    return f"{name} {lost}" if lost else f"{name} exited with {code}{note}"




def standby_wanted(role: Role, policy: Policy, rules: StrategyRules, task_restarts: int,
                   job_restarts: int) -> bool:
    """A warm spare for the task's next attempt is worth making: a restart may still need
    it (its policy restarts, and the budget has one left)."""
    return policy.restart[role] is not RestartPolicy.NEVER and \
        restarts_left(role, policy, rules, task_restarts, job_restarts)


def start_backoff(backoff_seconds: float, failures: int) -> float:
    """The wait before a restart: the policy's, or after `failures` failed starts in a row
    (a host that could not be reached) 1, 2, 4 ... START_BACKOFF_MAX s."""
    if not failures:
        return backoff_seconds
    return min(max(backoff_seconds, 1.0) * 2 ** (failures - 1), START_BACKOFF_MAX)


def crash_streak(streak: int, ran: float, counted: bool = True) -> int:
    """The failures in a row of a restart unit that each came within CRASH_LOOP_SECONDS of
    its attempt's start, this one included: `streak` before it, `ran` s its attempt ran.
    A restart not `counted` (a preemption) is no crash: the streak stays."""
    if not counted:
        return streak
    return streak + 1 if ran < CRASH_LOOP_SECONDS else 1


def restart_wait(policy: Policy, streak: int, start_failures: int) -> float:
    """The wait from a unit's stop to its restart. After `start_failures` failed starts (a
    host that could not be reached): start_backoff's. Else, with backoff_seconds unset (the
    default), none for the first failure of a crash loop (`streak` ≤ 1: a worker that died
    after training a while is back at once), then CRASH_LOOP_BACKOFF, doubled for each
    further failure in a row, up to START_BACKOFF_MAX; a backoff_seconds given is waited
    before every restart, doubled the same way in a crash loop (up to itself, if longer)."""
    given = policy.backoff_seconds
    if start_failures:
        return start_backoff(given or 0.0, start_failures)
    if given is None:
        if streak <= 1:
            return 0.0
        return min(CRASH_LOOP_BACKOFF * 2 ** (streak - 2), START_BACKOFF_MAX)
    return min(given * 2 ** max(streak - 1, 0), max(given, START_BACKOFF_MAX))


def restarts_alone(role: Role, rules: StrategyRules) -> bool:
    """What goes down with a lost task: the task alone, or (False) every training task."""
    return rules.restart_unit[role] is RestartUnit.ALONE


def preempted(role: Role, rc: int | None, policy: Policy, sigterm_in_unit: bool) -> bool:
    """An exit EXIT_PREEMPTED after a SIGTERM reached the task's restart unit this attempt is
    a preemption (restarted, not counted), unless the role's policy is never."""
    return rc == EXIT_PREEMPTED and sigterm_in_unit \
        and policy.restart[role] is not RestartPolicy.NEVER


def not_preempted_note(rc: int | None, unit: list[str], sigterm_in_unit: bool) -> str:
    """Why an exit 42 was not taken as a preemption, if it was not (else "")."""
    if rc != EXIT_PREEMPTED or sigterm_in_unit:
        return ""
    return (f" (by itself: {EXIT_PREEMPTED} is a preemption only after a SIGTERM, "
            f"and none reached {', '.join(unit)})")


# ---- what a loss leads to ----------------------------------------------------------------
@dataclass(frozen=True)
class EndJob:
    """The job fails: `reason`, the task to blame."""

    reason: str
    task: str


@dataclass(frozen=True)
class Restart:
    """Restart the lost task's unit (`alone`: the task only); `counted`: against the job's
    max_restarts (a sidecar's own restart is counted by the task only)."""

    reason: str
    alone: bool
    counted: bool


@dataclass(frozen=True)
class Say:
    """Nothing to do but say so (a sidecar lost for good: the job goes on)."""

    text: str


LossAction = EndJob | Restart | Say


def on_loss(name: str, role: Role, rc: int | None, why: str, job: str, policy: Policy,
            rules: StrategyRules, task_restarts: int, job_restarts: int) -> LossAction:
    """A task lost (an exit that is a loss, a failed start, the startup limit, a stall):
    end the job, restart, or go on. A task that cannot find its code (EXIT_PERMANENT) is
    never restarted; a sidecar restarts alone and fails the job only if required."""
    restart = policy.restart[role]
    if rc == EXIT_PERMANENT:
        why = f"{name}: {job} cannot be found (exit code {rc}: permanent, not restarted)"
        if training(role, rules):
            return EndJob(why, name)
    if not training(role, rules):
        if restart_allowed(restart, rc) and restarts_left(role, policy, rules, task_restarts,
                                                         job_restarts):
            return Restart(why, alone=True, counted=False)
        if service(role, rules):  # the trainers' input is gone for good
            left = "no restarts left" if restart_allowed(restart, rc) else \
                f"restart policy {restart.value}"
            return EndJob(f"{why} ({left}; the trainers' data service is down)", name)
        if policy.evaluator_required:
            return EndJob(why, name)
        return Say(f"{why}; the evaluator is a sidecar, the job goes on")
    if not restart_allowed(restart, rc):
        return EndJob(f"{why} (restart policy {restart.value})", name)
    if not restarts_left(role, policy, rules, task_restarts, job_restarts):
        return EndJob(f"{why}; no restarts left (max_restarts {policy.max_restarts})", name)
    return Restart(why, alone=restarts_alone(role, rules), counted=True)


def teardown_since(exiting_at: float, peers: list[tuple[bool, bool, float | None, float | None]]
                   ) -> float | None:
    """Since when a task in its teardown (its `exiting` at `exiting_at`) waits for nothing:
    the first exit 0 of a peer, or the time every peer's code was over (its `exiting`, or its
    exit 0 where it said none), whichever came first, and not before its own `exiting`; None
    while neither holds. `peers`: each (finished, live, exiting_at, ended_at).

    A peer that exits while the others wait (its own teardown ended first) does not restart
    the wait: they have waited for each other since the last `exiting`."""
    gone = [(said, ended) for finished, _, said, ended in peers
            if finished and ended is not None]
    over = [said if said is not None else ended for said, ended in gone]
    over += [said for _, live, said, _ in peers if live and said is not None]
    since = [min(ended for _, ended in gone)] if gone else []
    if peers and len(over) == len(peers):
        since.append(max(over))
    return max(exiting_at, min(since)) if since else None


def finishing(now: float, finished_at: float, policy: Policy, quiet_since: list[float]) -> str:
    """FINISHING: what the sidecars still running (each quiet since the later of its last
    line and its last busy usage, in `quiet_since`) leave to do: "done" (none runs), "time"
    (`evaluator_seconds` since training finished at `finished_at`), "idle" (each idle
    `evaluator_idle_seconds` since then), or "wait"."""
    idle = policy.evaluator_idle_seconds
    if not quiet_since:
        return "done"
    if now >= finished_at + policy.evaluator_seconds:
        return "time"
    if idle is not None and all(now - max(finished_at, q) >= idle for q in quiet_since):
        return "idle"
    return "wait"


def finishing_words(verdict: str, policy: Policy, names: str) -> str:
    """What the loop says when training finished with sidecars running ("wait"), and when it
    stops them ("time", "idle")."""
    limit, idle = policy.evaluator_seconds, policy.evaluator_idle_seconds
    if verdict == "time":
        return (f"{names} still running {limit:g} s after training finished "
                "(timeouts.evaluator_seconds): stopping it")
    if verdict == "idle":
        return (f"{names} idle {idle:g} s after training finished, the last checkpoint "
                "evaluated: stopping it (timeouts.evaluator_idle_seconds)")
    return (f"training finished; waiting up to {limit:g} s (timeouts.evaluator_seconds) for "
            f"{names} to evaluate the last checkpoint"
            + (f", or until it has been idle {idle:g} s" if idle else ""))


def finishing_fields(verdict: str, policy: Policy) -> dict[str, float | None]:
    """The limits the loop's event says: job_finishing's ("wait"), job_evaluators_idle's."""
    if verdict == "idle":
        return {"idle_seconds": policy.evaluator_idle_seconds}
    return {"evaluator_seconds": policy.evaluator_seconds,
            "evaluator_idle_seconds": policy.evaluator_idle_seconds}


def judged_now(role: Role, policy: Policy, rules: StrategyRules, stepped: bool,
               ended_well: bool = False, built: bool = False) -> bool:
    """Whether to ask now if a task trained in the plan's cluster (orchestrator/loop/joined.py):
    only where the job expects one (`expect_cluster`), of a training task that is no server;
    at its first step, or at a good end where it built a strategy (an eager loop's steps go
    uncounted) or drives servers (a ParameterServer chief that never stepped used none)."""
    if not policy.expect_cluster or not training(role, rules) or serving(role, rules):
        return False
    drives = any(r not in rules.services for r in rules.servers)  # tf.data's drive nothing
    return stepped or (ended_well and (built or drives))


def training_done(rules: StrategyRules, tasks: Iterable[tuple[Role, bool]]) -> bool:
    """The job's training is done: every task (role, finished) of the roles the strategy
    names (`done_when`) finished."""
    return all(finished for role, finished in tasks if role in rules.done_when)


def waits_for(role: Role, rules: StrategyRules) -> tuple[Role, ...]:
    """The roles every task of which must be up before a task of `role` starts: those that
    serve first (PS: ps and workers), for any other role."""
    first = rules.serve_first
    return () if not first or role in first else first


def deadline_passed(policy: Policy, elapsed: float) -> str | None:
    """Why the job ends at its deadline, once `elapsed` s of the run are past it."""
    deadline = policy.deadline_seconds
    if deadline is not None and elapsed > deadline:
        return f"deadline of {deadline:g} s reached; job stopped"
    return None


def startup_failed(policy: Policy, starting: list[tuple[str, str, Watched]], now: float
                   ) -> str | None:
    """Why the tasks still starting (name, last marker, as the stall rules see it) fail
    their attempt: one not up by `startup_seconds` and idle (stall.startup_over). Every
    one not up is named: one that hangs keeps its peers waiting too."""
    limit = policy.startup_seconds
    if not startup_over([w for _, _, w in starting], now, limit):
        return None
    names = ", ".join(f"{name} (last: {last or 'no output from tfo yet'})"
                      for name, last, _ in starting)
    return f"startup timeout ({limit:g} s): never came up: {names}"


def input_outage(now: float, services: Iterable[tuple[bool, float | None]]) -> float | None:
    """Since when the trainers' stall clocks run, given the data service's tasks (each: up,
    and when its attempt came up): `now` while one is not up (a trainer waiting for its input
    then is not hung: no stall is blamed on it), else the last time one came back; None
    without a data service."""
    latest: float | None = None
    for up, since in services:
        if not up or since is None:
            return now
        latest = since if latest is None else max(latest, since)
    return latest


def excused(w: Watched, outage: float) -> Watched:
    """A trainer as the stall rules see it once the data service is back since `outage`: its
    steps and work count from then (a stop, state T, is its own and still counts)."""
    moved = w.pace.moved_at
    pace = w.pace if moved is None or moved >= outage else replace(w.pace, moved_at=outage)
    return w._replace(pace=pace, busy_at=max(w.busy_at, outage))


def stall_rule(policy: Policy) -> StallRule | None:
    """The hang rule `stall_seconds` sets: a fixed limit, `auto`'s, or none."""
    seconds = policy.stall_seconds
    if seconds is None:
        return None
    if seconds == "auto":
        return StallRule(floor=policy.stall_min_seconds)
    return StallRule(seconds=float(seconds))


# A group stopped because one of its members is gone (it exited with a failure, its start
# failed, its lifeline was cut, it stalled) has survivors that cannot save: a checkpoint's
# collectives (PreemptionCheckpointHandler's agreed step, BackupAndRestore's save) need every
# peer, and a task blocked in a collective with the dead peer never reaches its handler. So
# their grace is this, not grace_seconds. Measured on 2 cores at load 26: a
# PreemptionCheckpointHandler survivor of a SIGKILLed peer was still running 10 s after its
# SIGTERM (its code ended by itself after 8.3 s, then hung in its teardown); a Python SIGTERM
# handler not blocked in an op ran 0-15 ms after the SIGTERM (the process then spent 13-16 s
# in TensorFlow's teardown, which saves nothing). 2 s lets such a handler log and flush with
# a wide margin for load. A preemption, Ctrl-C and the job's end keep grace_seconds.
PEER_LOST_GRACE_SECONDS = 2.0


def grace(policy: Policy, peer_lost: bool = False) -> float:
    """From a task's SIGTERM to its SIGKILL: grace_seconds, or where its group is stopped
    because a peer is gone, at most PEER_LOST_GRACE_SECONDS."""
    if peer_lost:
        return min(policy.grace_seconds, PEER_LOST_GRACE_SECONDS)
    return policy.grace_seconds


__all__ = ["EndJob", "JobState", "Restart", "Say", "TaskState", "advance", "exit_state",
           "on_loss", "restarts_left", "service", "serving", "sidecar", "standby_wanted",
           "training"]

