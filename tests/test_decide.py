"""The supervisor's decisions (orchestrator/loop/decide.py) as tables: no process, no clock, no
sleep. And the decision module stays pure: it imports nothing of time, signal,
orchestrator.launch or the run directory."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from orchestrator.loop import decide
from orchestrator.loop.decide import EndJob, Restart, Say, TaskState
from orchestrator.loop.stall import Pace, StallRule, Watched, find_stalls
from orchestrator.planning.policy import Policy, RestartPolicy
from orchestrator.planning.strategy import RULES
from tests.conftest import REPO
from worker_entry.markers import EXIT_PERMANENT, EXIT_PREEMPTED, Role, Strategy

MWMS, PS_RULES = RULES[Strategy.MULTI_WORKER_MIRRORED], RULES[Strategy.PARAMETER_SERVER]
C, W, P, E = Role.CHIEF, Role.WORKER, Role.PS, Role.EVALUATOR
D, DW = Role.DISPATCHER, Role.DATA_WORKER  # the tf.data service
ON, NEVER, CODE = RestartPolicy.ON_FAILURE, RestartPolicy.NEVER, RestartPolicy.EXIT_CODE


def policy(restart: RestartPolicy = ON, max_restarts: int = 2, required: bool = False,
           **by_role: RestartPolicy) -> Policy:
    roles = {r: by_role.get(r.value, restart) for r in (C, W, P, E, D, DW)}
    return Policy(restart=roles, max_restarts=max_restarts, backoff_seconds=0.5,
                  startup_seconds=1, deadline_seconds=None, grace_seconds=1,
                  evaluator_seconds=5, evaluator_required=required)


def test_the_decision_module_imports_nothing_of_time_signals_backends_or_run_directories():
    """Read from its source (what it names), and from a fresh interpreter (what importing it
    loads, its dependencies' imports included)."""
    tree = ast.parse((REPO / "orchestrator" / "loop" / "decide.py").read_text())
    named = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    named |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    banned = ("time", "signal", "orchestrator.launch", "orchestrator.runs.rundir",
              "orchestrator.loop.supervise", "orchestrator.launch.wakeup")
    assert sorted(m for m in named if m.startswith(banned)) == []
    code = ("import json, sys; import orchestrator.loop.decide; "
            "print(json.dumps(sorted(sys.modules)))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    loaded = json.loads(res.stdout)
    assert "orchestrator.planning.policy" in loaded  # the check sees our modules
    assert sorted(m for m in loaded if m.startswith(banned[2:])) == []


@pytest.mark.parametrize("rules, role, training, serving", [
    (MWMS, W, True, False), (MWMS, C, True, False), (MWMS, E, False, False),
    (PS_RULES, C, True, False), (PS_RULES, W, True, True), (PS_RULES, P, True, True),
    (PS_RULES, E, False, False), (MWMS, D, False, True), (MWMS, DW, False, True),
    (PS_RULES, D, False, True), (PS_RULES, DW, False, True)])
def test_training_and_serving(rules, role, training, serving):
    assert decide.training(role, rules) is training
    assert decide.serving(role, rules) is serving


@pytest.mark.parametrize("rules, role, rc, torn_down_ok, state", [
    (MWMS, W, 0, False, TaskState.SUCCEEDED),
    (MWMS, W, 1, False, TaskState.FAILED),
    (MWMS, W, -9, True, TaskState.SUCCEEDED),  # stopped in its teardown, its code ended well
    (MWMS, W, -9, False, TaskState.FAILED),
    (MWMS, E, 0, False, TaskState.SUCCEEDED),
    (PS_RULES, W, 0, False, TaskState.FAILED),  # a server never exits on its own
    (PS_RULES, P, 0, False, TaskState.FAILED),
    (PS_RULES, C, 0, False, TaskState.SUCCEEDED)])
def test_exit_state(rules, role, rc, torn_down_ok, state):
    assert decide.exit_state(rc, torn_down_ok, role, rules) is state


LOST = "lost contact with lab2: the connection dropped"


@pytest.mark.parametrize("code, lost, torn_down, code_said, how", [
    ("exit code 0", "", False, None, "exit code 0"),
    ("signal SIGKILL", "", False, None, "signal SIGKILL"),
    ("exit code 255", LOST, False, None, LOST),  # the lost contact says more than 255
    ("signal SIGKILL", "", True, None, "stopped in teardown"),  # its code ended well
    ("exit code 42", "", True, "exit code 42", "exit code 42 (stopped in teardown)"),
    ("exit code 3", LOST, True, "exit code 3", "exit code 3 (stopped in teardown)")])
def test_how_an_exit_is_told(code, lost, torn_down, code_said, how):
    assert decide.exited_how(code, lost, torn_down, code_said) == how


@pytest.mark.parametrize("code, lost, code_said, note, how", [
    ("signal SIGTERM", "", None, "", "signal SIGTERM"),
    ("exit code 255", LOST, None, "", LOST),
    ("signal SIGKILL", "", "exit code 0", "", "exit code 0, then stopped in its teardown "
     "(signal SIGKILL)"),
    ("signal SIGTERM", "", "exit code 42", " (by itself)", "exit code 42 (by itself), then "
     "stopped in its teardown (signal SIGTERM)")])
def test_how_a_stopped_task_is_told(code, lost, code_said, note, how):
    assert decide.stopped_how(code, lost, code_said, note) == how


@pytest.mark.parametrize("rc, said, ours, status", [
    (-9, 42, True, 42),  # our signal ended it in its teardown: the status its code said
    (-9, 0, True, 0),
    (-15, 3, True, 3),
    (-9, None, True, None),  # it said none: the kernel's
    (-9, 42, False, None),  # not ours (it ended on its own meanwhile)
    (1, 42, True, None),  # it exited by itself after all: the kernel's status
    (None, 42, True, None)])
def test_a_torn_down_task_s_exit_is_its_exiting_code(rc, said, ours, status):
    assert decide.teardown_status(rc, said, ours) == status


@pytest.mark.parametrize("rc, said, torn_down, told", [
    (0, None, False, (0, "exit code 0")),
    (-9, 0, True, (-9, "stopped in teardown")),  # a success: the kill's status, teardown
    (-9, None, True, (-9, "stopped in teardown")),
    (-9, 42, True, (42, "exit code 42 (stopped in teardown)")),
    (3, 42, False, (3, "exit code 3"))])
def test_task_exited_tells_the_teardown_rule(rc, said, torn_down, told):
    from orchestrator.loop import exitwords

    assert tuple(vars(exitwords.exited(rc, "", torn_down, said)).values()) == told


@pytest.mark.parametrize("rc, said, told", [
    (-15, None, (-15, "signal SIGTERM")),
    (-15, 0, (0, "exit code 0, then stopped in its teardown (signal SIGTERM)")),
    (-9, 42, (42, "exit code 42, then stopped in its teardown (signal SIGKILL)")),
    (0, 3, (0, "exit code 0"))])  # it exited by itself meanwhile: the kernel's
def test_task_stopped_tells_the_teardown_rule(rc, said, told):
    from orchestrator.loop import exitwords

    assert tuple(vars(exitwords.stopped(rc, "", said)).values()) == told


@pytest.mark.parametrize("code, lost, note, why", [
    ("signal SIGKILL", "", "", "worker:1 exited with signal SIGKILL"),
    ("exit code 42", "", " (by itself)", "worker:1 exited with exit code 42 (by itself)"),
    ("exit code 255", LOST, "", f"worker:1 {LOST}")])
def test_a_loss_s_reason(code, lost, note, why):
    assert decide.lost_why("worker:1", code, lost, note) == why


@pytest.mark.parametrize("rules, role, cpu, busy", [
    (MWMS, W, 2.0, True), (MWMS, W, 1.9, False),  # a worker blocked in a collective: 0.0
    (MWMS, E, 5.0, False), (MWMS, E, 10.0, True),  # a SidecarEvaluator polling: about none
    (PS_RULES, P, 2.0, True), (PS_RULES, E, 9.9, False)])
def test_a_sign_of_work_is_one_rule_with_a_sidecar_s_bar_higher(rules, role, cpu, busy):
    """One notion of a sign of work (the stalls, the startup limit, a sidecar's idleness once
    training is done): the CPU a usage must say, per role."""
    assert (cpu >= decide.busy_cpu(role, rules)) is busy


@pytest.mark.parametrize("role, task_restarts, job_restarts, left", [
    (W, 0, 0, True), (W, 0, 1, True), (W, 5, 2, False),  # the job's budget, not the task's
    (E, 0, 2, True), (E, 1, 9, True), (E, 2, 0, False)])  # a sidecar's own
def test_restarts_left(role, task_restarts, job_restarts, left):
    assert decide.restarts_left(role, policy(), MWMS, task_restarts, job_restarts) is left


@pytest.mark.parametrize("pol, role, task_restarts, job_restarts, wanted", [
    (policy(), W, 0, 0, True), (policy(), W, 0, 2, False),
    (policy(NEVER), W, 0, 0, False), (policy(max_restarts=0), W, 0, 0, False),
    (policy(worker=NEVER), E, 0, 0, True), (policy(), E, 2, 0, False)])
def test_standby_wanted(pol, role, task_restarts, job_restarts, wanted):
    assert decide.standby_wanted(role, pol, MWMS, task_restarts, job_restarts) is wanted


@pytest.mark.parametrize("backoff, failures, wait", [
    (0.5, 0, 0.5), (0.0, 0, 0.0), (0.0, 1, 1.0), (0.5, 2, 2.0), (3.0, 2, 6.0),
    (0.0, 7, 60.0), (0.0, 30, 60.0)])
def test_start_backoff(backoff, failures, wait):
    assert decide.start_backoff(backoff, failures) == wait


# Issue 39: a unit's failures, in order, as (seconds its attempt ran, counted, failed starts
# before it), and the wait before each restart. backoff_seconds unset (the default): none
# for the first failure of a crash loop, then 1 s, doubled per quick failure in a row, up to
# 60 s; an attempt that ran CRASH_LOOP_SECONDS or more starts the count anew. A
# backoff_seconds given: waited before every restart, doubled the same way in a loop.
LOOP = decide.CRASH_LOOP_SECONDS


@pytest.mark.parametrize("backoff, failures, waits", [
    (None, [(5.0, True, 0)], [0.0]),  # a worker SIGKILLed in training: back at once
    (None, [(0.5, True, 0)], [0.0]),  # even one that failed at once: a loop needs a second
    (None, [(2, True, 0), (2, True, 0), (2, True, 0), (2, True, 0)], [0.0, 1.0, 2.0, 4.0]),
    (None, [(2, True, 0)] * 9, [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]),
    (None, [(2, True, 0), (2, True, 0), (LOOP, True, 0), (2, True, 0)], [0.0, 1.0, 0.0, 1.0]),
    (None, [(600, True, 0), (600, True, 0), (600, True, 0)], [0.0, 0.0, 0.0]),
    # A preemption is no crash: no wait, and the loop's count stays.
    (None, [(2, True, 0), (2, False, 0), (2, True, 0)], [0.0, 0.0, 1.0]),
    (None, [(2, False, 0), (2, False, 0)], [0.0, 0.0]),
    # backoff_seconds given: before every restart, doubled in a loop.
    (0.0, [(2, True, 0)] * 4, [0.0] * 4),
    (0.5, [(2, True, 0), (2, True, 0), (2, True, 0)], [0.5, 1.0, 2.0]),
    (0.5, [(600, True, 0), (600, True, 0)], [0.5, 0.5]),
    (4.0, [(5.0, True, 0)], [4.0]),  # a test's time between the attempts
    (90.0, [(2, True, 0), (2, True, 0)], [90.0, 90.0]),  # longer than 60 s: itself
    # A host that could not be reached: start_backoff's 1, 2, 4 ... s, whatever the loop.
    (None, [(0, True, 1), (0, True, 2), (0, True, 3)], [1.0, 2.0, 4.0]),
    (3.0, [(600, True, 2)], [6.0]),
])
def test_restart_wait_grows_only_with_a_crash_loop(backoff, failures, waits):
    streak, got = 0, []
    for ran, counted, start_failures in failures:
        streak = decide.crash_streak(streak, ran, counted)
        got.append(decide.restart_wait(replace(policy(), backoff_seconds=backoff), streak,
                                       start_failures))
    assert got == waits


@pytest.mark.parametrize("role, rc, pol, termed, preempted", [
    (W, EXIT_PREEMPTED, policy(), True, True),
    (W, EXIT_PREEMPTED, policy(), False, False),  # by itself: no SIGTERM came
    (W, EXIT_PREEMPTED, policy(NEVER), True, False),
    (W, 1, policy(), True, False)])
def test_preempted(role, rc, pol, termed, preempted):
    assert decide.preempted(role, rc, pol, termed) is preempted


def test_not_preempted_note():
    assert decide.not_preempted_note(EXIT_PREEMPTED, ["worker:0", "worker:1"], False) == (
        " (by itself: 42 is a preemption only after a SIGTERM, and none reached worker:0, "
        "worker:1)")
    assert decide.not_preempted_note(EXIT_PREEMPTED, ["worker:0"], True) == ""
    assert decide.not_preempted_note(1, ["worker:0"], False) == ""


WHY = "worker:1 exited with exit code 3"
LOSSES = [
    # (rules, role, rc, policy, task restarts, job restarts, action)
    (MWMS, W, 3, policy(), 0, 0, Restart(WHY, alone=False, counted=True)),
    (MWMS, W, 3, policy(), 0, 1, Restart(WHY, alone=False, counted=True)),
    (MWMS, W, 3, policy(), 0, 2,
     EndJob(f"{WHY}; no restarts left (max_restarts 2)", "worker:1")),
    (MWMS, W, 3, policy(NEVER), 0, 0, EndJob(f"{WHY} (restart policy never)", "worker:1")),
    (MWMS, W, 3, policy(CODE), 0, 0, EndJob(f"{WHY} (restart policy exit-code)", "worker:1")),
    (MWMS, W, -9, policy(CODE), 0, 0, Restart(WHY, alone=False, counted=True)),
    (MWMS, W, None, policy(), 0, 0, Restart(WHY, alone=False, counted=True)),  # a stall
    (MWMS, W, EXIT_PERMANENT, policy(), 0, 0,
     EndJob("worker:1: a.b:c cannot be found (exit code 78: permanent, not restarted)",
            "worker:1")),
    (PS_RULES, W, 1, policy(), 0, 0, Restart(WHY, alone=True, counted=True)),
    (PS_RULES, P, 1, policy(), 0, 0, Restart(WHY, alone=False, counted=True)),
    (MWMS, E, 1, policy(), 0, 2, Restart(WHY, alone=True, counted=False)),  # its own budget
    (MWMS, E, 1, policy(), 2, 0, Say(f"{WHY}; the evaluator is a sidecar, the job goes on")),
    (MWMS, E, 1, policy(required=True), 2, 0, EndJob(WHY, "worker:1")),
    (MWMS, E, EXIT_PERMANENT, policy(), 0, 0,
     Say("worker:1: a.b:c cannot be found (exit code 78: permanent, not restarted); the "
         "evaluator is a sidecar, the job goes on")),
    # The tf.data service: alone, on its own budget (the job's restarts are the trainers').
    (MWMS, DW, -9, policy(), 0, 2, Restart(WHY, alone=True, counted=False)),
    (PS_RULES, DW, -9, policy(), 1, 0, Restart(WHY, alone=True, counted=False)),
    (MWMS, D, -9, policy(), 0, 0, Restart(WHY, alone=True, counted=False)),
    (MWMS, DW, -9, policy(), 2, 0, EndJob(
        f"{WHY} (no restarts left; the trainers' data service is down)", "worker:1")),
    (MWMS, D, 1, policy(NEVER), 0, 0, EndJob(
        f"{WHY} (restart policy never; the trainers' data service is down)", "worker:1")),
]


@pytest.mark.parametrize("rules, role, rc, pol, task_restarts, job_restarts, action", LOSSES)
def test_on_loss(rules, role, rc, pol, task_restarts, job_restarts, action):
    assert decide.on_loss("worker:1", role, rc, WHY, "a.b:c", pol, rules, task_restarts,
                          job_restarts) == action


@pytest.mark.parametrize("exiting_at, peers, since", [
    (5.0, [], None),  # alone: nothing to wait for, and no peer to wait with
    (5.0, [(False, True, None, None)], None),  # the peer still in its code
    (5.0, [(True, False, None, 3.0)], 5.0),  # the peer exited 0 before: from its own exiting
    (5.0, [(True, False, 6.0, 7.0)], 6.0),  # exited 0 after: its code was over at 6
    (5.0, [(True, False, None, 7.0)], 7.0),  # exited 0 at 7, its exiting not said
    (5.0, [(False, True, 8.0, None)], 8.0),  # both in their teardown: since the last exiting
    (5.0, [(True, False, 6.0, 9.0), (False, True, 7.0, None)], 7.0),  # all over at 7, gone 9
    (5.0, [(False, False, None, 4.0)], None)])  # a peer that failed: not waited on with
def test_teardown_since(exiting_at, peers, since):
    assert decide.teardown_since(exiting_at, peers) == since


@pytest.mark.parametrize("now, quiet, idle, verdict", [
    (11.0, [], None, "done"),
    (20.0, [10.0], None, "time"),  # evaluator_seconds (10) after training finished at 10
    (12.0, [10.0], None, "wait"),  # an entry's evaluator: waited for
    (16.0, [10.0], 5.0, "idle"),
    (16.0, [10.0, 12.0], 5.0, "wait"),  # one of them printed at 12
    (14.0, [0.0], 5.0, "wait")])  # quiet since before training finished (10): from 10
def test_finishing(now, quiet, idle, verdict):
    pol = replace(policy(), evaluator_seconds=10.0, evaluator_idle_seconds=idle)
    assert decide.finishing(now, finished_at=10.0, policy=pol, quiet_since=quiet) == verdict


@pytest.mark.parametrize("verdict, idle, words", [
    ("wait", None, "training finished; waiting up to 5 s (timeouts.evaluator_seconds) for "
     "evaluator:0 to evaluate the last checkpoint"),
    ("wait", 2.0, "training finished; waiting up to 5 s (timeouts.evaluator_seconds) for "
     "evaluator:0 to evaluate the last checkpoint, or until it has been idle 2 s"),
    ("time", None, "evaluator:0 still running 5 s after training finished "
     "(timeouts.evaluator_seconds): stopping it"),
    ("idle", 2.0, "evaluator:0 idle 2 s after training finished, the last checkpoint "
     "evaluated: stopping it (timeouts.evaluator_idle_seconds)")])
def test_finishing_words(verdict, idle, words):
    pol = replace(policy(), evaluator_idle_seconds=idle)
    assert decide.finishing_words(verdict, pol, "evaluator:0") == words


@pytest.mark.parametrize("rules, tasks, done", [
    (MWMS, [(W, True), (W, True), (E, False)], True),  # the evaluator is not waited for here
    (MWMS, [(W, True), (W, False)], False),
    (PS_RULES, [(C, True), (W, False), (P, False)], True),  # the chief decides
    (PS_RULES, [(C, False), (W, True)], False),
    (MWMS, [(W, True), (D, False), (DW, False)], True)])  # the data service serves, never done
def test_training_done(rules, tasks, done):
    assert decide.training_done(rules, tasks) is done


@pytest.mark.parametrize("rules, role, first", [
    (MWMS, W, (D, DW)), (MWMS, C, (D, DW)), (MWMS, E, (D, DW)), (MWMS, D, ()), (MWMS, DW, ()),
    (PS_RULES, P, ()), (PS_RULES, W, ()), (PS_RULES, D, ()),
    (PS_RULES, C, (D, DW, P, W)), (PS_RULES, E, (D, DW, P, W))])
def test_waits_for(rules, role, first):
    assert decide.waits_for(role, rules) == first


@pytest.mark.parametrize("deadline, elapsed, why", [
    (None, 1e9, None), (10.0, 10.0, None),
    (10.0, 10.5, "deadline of 10 s reached; job stopped")])
def test_deadline_passed(deadline, elapsed, why):
    assert decide.deadline_passed(replace(policy(), deadline_seconds=deadline), elapsed) == why


def watched(name: str, busy_at: float) -> Watched:
    return Watched(name, Pace(0.0), busy_at, None, None, None, up=False, server=False)


@pytest.mark.parametrize("now, busy, why", [
    (0.5, [0.0, 0.0], None),  # within startup_seconds (1)
    (6.0, [3.0, 2.0], None),  # over the limit, but working (a sign within 5 s): given time
    (6.0, [0.0, 0.0], "startup timeout (1 s): never came up: worker:0 (last: up), "
     "worker:1 (last: no output from tfo yet)")])
def test_startup_failed(now, busy, why):
    starting = [("worker:0", "up", watched("worker:0", busy[0])),
                ("worker:1", "", watched("worker:1", busy[1]))]
    assert decide.startup_failed(policy(), starting, now) == why


@pytest.mark.parametrize("seconds, rule", [
    (None, None), ("auto", StallRule(floor=60.0)), (30, StallRule(seconds=30.0))])
def test_stall_rule(seconds, rule):
    assert decide.stall_rule(replace(policy(), stall_seconds=seconds,
                                     stall_min_seconds=60.0)) == rule


@pytest.mark.parametrize("services, outage", [
    ([], None),  # no data service: the stall clocks are the trainers' own
    ([(True, 5.0), (True, 8.0)], 8.0),  # all up: from the last one back (a restarted one)
    ([(True, 5.0), (False, None)], 100.0),  # one down: from now on (nobody is blamed)
    ([(True, 5.0), (True, None)], 100.0)])  # running, its attempt's readiness not yet seen
def test_input_outage(services, outage):
    assert decide.input_outage(100.0, services) == outage


def test_a_trainer_waiting_for_its_input_is_not_stalled_until_the_service_is_back_that_long():
    """A trainer whose steps stopped at 10 while a data worker was down (back at 80): with
    the fixed 60 s limit it would be stalled at 100; from 80 it is not, until 140."""
    rule = StallRule(seconds=60.0)
    pace = Pace(started_at=0.0, step=30, moved_at=10.0, first=1)
    w = Watched("worker:0", pace, busy_at=10.0, cpu=0.0)
    assert find_stalls([w], 100.0, rule)  # unexcused: blamed
    assert find_stalls([decide.excused(w, 80.0)], 100.0, rule) == []
    assert find_stalls([decide.excused(w, 80.0)], 141.0, rule)  # back 61 s: its own now
    assert decide.excused(w, 5.0) == w  # moved after the outage: as it was
    stopped = w._replace(stopped_since=10.0)  # a stop (state T) is its own
    assert decide.excused(stopped, 80.0).stopped_since == 10.0


@pytest.mark.parametrize("rules, ended_well, built, judged", [
    (MWMS, True, False, False),  # an MWMS task that built nothing: no tf.data server drives
    (PS_RULES, True, False, True),  # a PS chief drives its servers
    (MWMS, True, True, True)])
def test_judged_now_ignores_the_data_service(rules, ended_well, built, judged):
    assert decide.judged_now(C, policy(), rules, stepped=False, ended_well=ended_well,
                             built=built) is judged


# The loop: supervise.py and the modules it carries decide's answers out through: every
# module of orchestrator/loop/ but the pure ones (decide and the rules beside it).
PURE = {"__init__", "decide", "stall", "rate", "resumes", "joined", "markers"}
LOOP = tuple(sorted(p.stem for p in (REPO / "orchestrator" / "loop").glob("*.py")
                    if p.stem not in PURE))


def test_the_guard_sees_every_act_module():
    assert {"supervise", "resizing", "backupfill", "rundirwatch", "records"} <= set(LOOP)


@pytest.mark.parametrize("module", LOOP)
def test_the_loop_reads_no_policy_or_strategy_rule_and_never_sleeps(module):
    """The loop hands `policy` and `rules` to decide.py, and reads neither itself: no
    `.policy.x`, `.rules.x` or `policy[role]` there. And every timed wait is a deadline it
    wakes for: no `sleep` is called anywhere in it."""
    tree = ast.parse((REPO / "orchestrator" / "loop" / f"{module}.py").read_text())
    reads = [f"line {n.lineno}: {ast.unparse(n)}" for n in ast.walk(tree)
             if isinstance(n, ast.Attribute | ast.Subscript)
             and isinstance(n.value, ast.Attribute) and n.value.attr in ("policy", "rules")]
    assert reads == []
    sleeps = [f"line {n.lineno}: {ast.unparse(n)}" for n in ast.walk(tree)
              if isinstance(n, ast.Call) and ast.unparse(n.func).split(".")[-1] == "sleep"]
    assert sleeps == []


def test_spares_follow_the_restart_budget():
    """launch/spares asks the same budget: none where no restart is left to serve."""
    from orchestrator.launch.spares import spares_wanted
    from orchestrator.planning.plan import make_plan
    from orchestrator.planning.spec import parse_spec

    spec = {"name": "t", "job": {"entry": "a.b:c"}, "tasks": {"worker": ["localhost:1"]},
            "restart": {"policy": "on-failure", "max_restarts": 1, "warm_spares": True}}
    plan = make_plan(parse_spec(spec), run_id="t", run_dir="/nonexistent", workdir=REPO)
    assert spares_wanted(plan, []) == {"worker:0"}
    none_left = replace(plan, policy=replace(plan.policy, max_restarts=0))
    assert spares_wanted(none_left, []) == frozenset()
