"""The loop: start order, health, restart policy, success policy, deadline, signals, teardown.

    supervisor = Supervisor(plan, start=backends.start)   # standby=backends.standby: spares
    result = supervisor.run()          # blocks; SIGINT/SIGTERM tear everything down
    sys.exit(result.exit_code)         # 0 ok, 1 failed, 129 SIGHUP, 130 SIGINT, 131 SIGQUIT,
                                       # 143 SIGTERM

One thread, one loop: pump output into logs and console, notice exits and stalls, decide
restarts, start what is due. Between rounds it sleeps until the kernel says something
happened: a task exited (its handle's pidfd) or a signal came, at once; output arrived
(orchestrator.launch.wakeup), at most every OUTPUT_SECONDS (a usage marker wakes nothing: the
next round takes it); at most IDLE_SECONDS (timeouts, backoffs); handles with no exit fd
(SSH) are polled every POLL_SECONDS. Every step is
written to events.jsonl. What to do is the plan's: its policy (restarts, timeouts) and its
strategy's rules (which roles serve first, which are servers, what restarts with what, what
counts as done).

Hangs are failures: a training task whose steps stopped moving for its limit (or that has
been stopped that long, or whose whole group idles that long) fails its attempt like an exit
would (orchestrator.loop.stall: `stall_seconds` fixed, or `auto`, which adapts to the job's
steps); its Python stacks are asked for first, and the summary says where it was stuck.
A task is ready at its ready marker, or at its first step (a one-process script opens no
port); one not ready by `startup_seconds` fails the attempt only while it idles.

Preemption is not a failure: a task that exits EXIT_PREEMPTED (TensorFlow's
PreemptionCheckpointHandler, having saved) after a SIGTERM is restarted without counting
against max_restarts. "After a SIGTERM" means its wrapper reported one (a `sigterm` marker)
this attempt, to it or to a task of its restart unit: the handler saves on every worker and
every worker exits with the code, but only the preempted one got the signal.

TensorFlow's teardown is not waited out: a training task whose code is over (its last atexit
handler said `exiting`) is only tearing down. Once a peer of its restart unit exited 0, or
every peer's code is over too, TEARDOWN_GRACE_SECONDS later it is waiting in the
interpreter's teardown for peers that have nothing more to give (measured here: in about
half of all 2-worker runs, by hand too, the workers exit 10 s after their code ended, or
one 10 s after the other, stack `Garbage-collecting`, `Failed to send RPC to coordination
service`; under gdb, Python's last collection takes 3 s to free TensorFlow's objects, and
freeing a tf.data iterator waits for its autotune thread, Model::OptimizeLoop, to wake
from a sleep that doubles up to 60 s). It is SIGKILLed (`task_teardown_stopped`), and its
exit is the status its code ended with, which the `exiting` marker says: 0 (or not said) a
success, 42 after a SIGTERM a preemption (every worker saved and exits 42, and may then
hang the same way), anything else a failure.

The loop only carries out what orchestrator/loop/decide.py says, through small modules, each one
concept: `starts` (what is due, as one batch; warm spares), `intake` (the tasks' output and
markers), `exits` (an exit, a loss, a restart), `stopping` (STOPPING: SIGTERM, a kill
deadline, then what follows), `stacks` (a stalled task's stacks, asked for), `checks` (the
startup limit, stalls, training done, the sidecars' wait); `job` holds the state they share
and its one write path. A stop or a stacks request under way holds the loop (`Job.hold`):
it wakes for their deadlines and looks at nothing else until they are over; nothing in the
loop sleeps but its one `poll`.

Warm spares (`standby`, orchestrator/launch/spares.py): once an attempt trains (its first
progress, or a while after ready), while a restart is still possible, the loop asks for a
standby of the task's next attempt (`task_standby_started`); a restart that gets it says
`warm: true` in `task_started`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.elastic.backupstore import BackupStore
from orchestrator.elastic.groups import First
from orchestrator.launch import BatchLauncher, Launcher, TaskHandle, one_by_one, wakeup
from orchestrator.loop import decide, resizing
from orchestrator.loop.backupfill import Refill
from orchestrator.loop.checks import Checks
from orchestrator.loop.decide import (
    JOB_TRANSITIONS,
    STANDBY_AFTER_READY_SECONDS,
    START_BACKOFF_MAX,
    TASK_TRANSITIONS,
    TEARDOWN_GRACE_SECONDS,
    IllegalTransition,
    JobState,
    TaskState,
    Timing,
    advance,
)
from orchestrator.loop.exits import Exits
from orchestrator.loop.intake import Intake
from orchestrator.loop.job import Clock, Interrupted, Job
from orchestrator.loop.records import RunResult, TaskOutcome, TaskRecord, tail
from orchestrator.loop.rundirwatch import RunDirWatch
from orchestrator.loop.starts import Standby, Starts
from orchestrator.loop.stopping import stop, teardown_waits
from orchestrator.planning.plan import Plan
from orchestrator.planning.policy import restart_allowed
from orchestrator.runs.rundir import RunDir, coordinator_identity

__all__ = ["JOB_TRANSITIONS", "STANDBY_AFTER_READY_SECONDS", "START_BACKOFF_MAX",
           "TASK_TRANSITIONS", "TEARDOWN_GRACE_SECONDS", "IllegalTransition", "Interrupted",
           "JobState", "RunResult", "Supervisor", "TaskOutcome", "TaskRecord", "TaskState",
           "advance", "restart_allowed", "tail"]

POLL_SECONDS = 0.05  # handles without an exit fd
IDLE_SECONDS = 0.25  # the longest the loop sleeps with nothing happening
# Output wakes the loop at most this often: a round costs O(tasks). The usage markers of 64
# tasks arrive 32 times a second (a round for each cost 0.04 of a core); they wake nothing
# (launch/output.py), each round takes those queued.
OUTPUT_SECONDS = 0.1
WATCH_SECONDS = 1.0  # how often the loop hands itself to a watcher (the live view)
# A closed terminal or a dropped SSH session to the user's machine sends SIGHUP, Ctrl-\ sends
# SIGQUIT: each a teardown like Ctrl-C, not a silent death that leaves the run looking alive.
SIGNAL_EXIT = {signal.SIGHUP: 129, signal.SIGINT: 130, signal.SIGQUIT: 131, signal.SIGTERM: 143}
# Ctrl-Z (SIGTSTP) is refused: a stopped coordinator's tasks would run on unwatched, their
# output pipes filling, their lab hosts' heartbeats missed (lost contact), their peers' stall
# limits running. It is said once, with how to stop the job instead.
NO_SUSPEND = ("tfo cannot be suspended (Ctrl-Z): its tasks would run on unwatched and time "
              "out; it keeps running. To stop the job: Ctrl-C (or kill -TERM {pid})")


class Supervisor:
    def __init__(self, plan: Plan, start: Launcher,
                 echo: Callable[[str, str], None] | None = None,
                 watch: Callable[[Job], None] | None = None,
                 standby: Standby | None = None,
                 start_batch: BatchLauncher | None = None, timing: Timing | None = None,
                 clock: Clock | None = None, waiter: wakeup.Waiter | None = None,
                 probe: resizing.Probe | None = None,
                 backup_store: BackupStore | None = None, elastic: First | None = None
                 ) -> None:
        """`clock` and `waiter` are the loop's time and its one sleep (a test's fake clock
        and a waiter that moves it); `timing` the loop's own limits (decide.Timing). An
        elastic job runs `elastic`, its first group (elastic.groups.first(plan), planned
        once by pipeline.run); `probe` asks whether a lost or spare place answers (default
        resizing.reachable); `backup_store` reads and fills the backups on restarts and
        resizes (default: this machine's only)."""
        if (plan.spec.elastic is None) != (elastic is None):
            raise ValueError("an elastic job, and only one, runs its first group: `elastic`")
        plan = plan if elastic is None else elastic.plan
        self.plan = plan
        # Made, with plan.json, before anything starts (pipeline.make_run_dir): a bad place or
        # a full disk is the user's error there, and plan.json is not serialized twice.
        self.run_dir = RunDir(plan.run_dir)
        self.job = job = Job(plan, self.run_dir.open_events(), echo or _print_line,
                             timing or Timing(), clock)
        self.intake = Intake(job)
        self.dirwatch = RunDirWatch(self.run_dir)  # deleted under us, or its disk full
        self.exits = Exits(job, self.intake)
        # What is due in a round starts as one batch (Backends.start_batch); a caller that
        # gives only `start` has its tasks started one by one.
        self.starts = Starts(job, self.exits, start_batch or functools.partial(one_by_one, start),
                             standby)
        self.checks = Checks(job, self.intake, self.exits)
        # A script's BackupAndRestore keeps the chief's backup alone: copied to every
        # worker's directory before the group starts again (backupfill).
        self.refill = Refill(job, backup_store)
        self.exits.refill = self.refill.restarting
        self.resizing = None if elastic is None else resizing.make(
            job, self.intake, elastic, probe=probe, store=backup_store, refill=self.refill)
        if self.resizing is not None:
            self.exits.resize = self.resizing.lost
            self.exits.replan = self.resizing.replan
        # Called by the loop, on its thread, at most every WATCH_SECONDS: it may read the
        # records, and must return at once (the live view copies rows and returns).
        self.watch = watch
        self._watched_at = -WATCH_SECONDS
        self._t0 = job.clock()
        self._waiter = waiter or wakeup.Waiter()
        self._round_at = 0.0  # time the last round began (OUTPUT_SECONDS)
        # What the loop last waited on: each exit fd's record, and the records with none
        # (polled). None: not waited yet, every live handle is asked.
        self._by_fd: dict[int, TaskRecord] | None = None
        self._unwatched: list[TaskRecord] = []
        self._exited: set[int] = set()  # exit fds readable when the loop last woke

    def run(self, started: Callable[[], None] | None = None) -> RunResult:
        """Blocks until the job ends. `started()` is called once, as soon as the first tasks
        are started: what the caller does there (`tfo run`: its announcement and rich's
        import, 0.05 s) then overlaps the tasks' own start-up instead of delaying it."""
        job = self.job
        old = {s: signal.signal(s, self._on_signal) for s in (*SIGNAL_EXIT, signal.SIGTSTP)}
        job.events.write("run_started", run_id=self.plan.run_id,
                         strategy=self.plan.strategy.value,
                         tasks=[t.name for t in self.plan.tasks], **coordinator_identity())
        job.set(None, JobState.RUNNING)
        try:
            if job.signal is None:
                self.starts.start_due(job.clock())
            if started is not None:
                started()
            while job.ending is None:
                self._tick()
                if self.watch is not None and job.clock() - self._watched_at >= WATCH_SECONDS:
                    self._watched_at = job.clock()
                    self.watch(job)
                if job.ending is None:
                    self._wait()
        except Exception as e:  # a bug of ours: still tear down, and say where to look
            crash_log = Path(self.run_dir.crash_log)
            with contextlib.suppress(OSError):  # a full disk: the reason says where to look
                crash_log.write_text(traceback.format_exc())
            job.end(JobState.FAILED, f"supervisor error {e!r}; traceback in {crash_log}")
        finally:
            self._stop_all()
            self.refill.tick()  # backup copies a group that finished no longer needs
            for s, handler in old.items():
                signal.signal(s, handler)
        return self._result()

    def _result(self) -> RunResult:
        job, end = self.job, self.job.ending
        assert end is not None
        if end.state is JobState.INTERRUPTED and job.signal is not None:
            code = SIGNAL_EXIT[job.signal]
        else:
            code = 0 if end.state is JobState.SUCCEEDED else 1
        self.dirwatch.check(job, float("inf"))  # deleted in the teardown: put back first
        self.dirwatch.close()
        job.events.write("job_finished", state=end.state.value, exit_code=code,
                         reason=end.reason, failed_task=end.failed_task, restarts=job.restarts)
        job.events.close()
        self.run_dir.remove_tmp()  # empty once every task cleaned up
        for rec in job.records.values():
            if rec.log:
                with contextlib.suppress(OSError):  # a full disk: its last line is lost
                    rec.log.close()
        return RunResult(
            state=end.state, exit_code=code, reason=end.reason, run_dir=self.plan.run_dir,
            restarts=job.restarts, failed_task=end.failed_task, evaluation=job.evaluation,
            stalls=job.stalls, preemptions=job.preemptions, notes=self.dirwatch.notes,
            resizes=self.resizing.resized if self.resizing is not None else [],
            resumes=job.resumes.said,
            tasks=[TaskOutcome(r.name, r.state, r.current.returncode, r.restarts, r.task.log_path,
                               r.task.host, r.current.work.progress, r.torn_down_ok,
                               r.current.exit_reason, r.started, r.done)
                   for r in job.records.values()])

    def _stop_all(self) -> None:
        """The end: every task still running is stopped, and waited for as the loop waits
        for any stop (its deadlines), whatever was under way dropped."""
        job = self.job
        job.hold = None
        stop(job, self.intake, list(job.records.values()), "job finished")
        while job.hold is not None:
            self._wait()
            self.intake.pump()
            if job.hold is not None:
                job.hold.step(job.clock())

    def _tick(self) -> None:
        job, checks = self.job, self.checks
        self.intake.pump()
        if job.suspend_asked == 1:  # said once, here: a handler must not write to the console
            job.suspend_asked += 1
            job.events.write("suspend_refused", signal="SIGTSTP")
            job.echo("tfo", NO_SUSPEND.format(pid=os.getpid()))
        self.dirwatch.check(job, job.clock())
        if job.ending is not None:
            return None
        if job.hold is not None:  # a stop or a stacks request under way: only it, until over
            return job.hold.step(job.clock())
        finishing = job.state is JobState.FINISHING
        if job.signal is not None:
            # Once training is done, a signal only cuts the wait for the sidecars short.
            if finishing:
                return job.end(JobState.SUCCEEDED, "all training tasks finished")
            return job.end(JobState.INTERRUPTED, f"interrupted by {job.signal.name}")
        if finishing:
            self._poll_exits()
            return checks.finished()
        now = job.clock()
        if (why := decide.deadline_passed(job.policy, now - self._t0)) is not None:
            return job.end(JobState.FAILED, why)
        checks.alone()  # a task that trained outside the plan's cluster: nothing restarts
        if job.busy:
            return None
        self.starts.start_due(now)
        for check in (self._poll_exits, lambda: teardown_waits(job, job.clock()),
                      lambda: checks.startup(job.clock()), lambda: checks.stalls(job.clock()),
                      lambda: self.starts.standbys(job.clock()), checks.alone, checks.success,
                      self._resizes, lambda: checks.slow.tick(job.clock())):
            if job.busy:
                return None
            check()
        return None

    def _resizes(self) -> None:
        self.refill.tick()
        if self.resizing is not None:
            self.resizing.tick(self.job.clock())

    def _poll_exits(self) -> None:
        """Asks the handles the kernel said exited (their exit fd readable when the loop
        woke) and those without an exit fd: a round with no exit asks none (64 idle tasks:
        64 polls a round saved). One that exits later, or before its fd was first watched,
        wakes the next sleep at once: the fd stays readable."""
        if self._by_fd is None:
            asked = self.job.live()
        else:
            asked = [*(self._by_fd[fd] for fd in self._exited if fd in self._by_fd),
                     *self._unwatched]
        for rec in asked:
            if rec.state.live and rec.handle is not None:
                rc = rec.handle.poll()
                if rc is not None:
                    self.exits.exited(rec, rc)
                    if self.job.busy:
                        return

    def _on_signal(self, signum: int, frame: Any) -> None:
        job = self.job
        if signum == signal.SIGTSTP:  # refused; the loop says so (once)
            job.suspend_asked = max(job.suspend_asked, 1)
            wakeup.notify(urgent=True)
            return
        job.signal_count += 1
        if job.signal is None:
            job.signal = signal.Signals(signum)
        wakeup.notify(urgent=True)
        if job.in_start:
            job.in_start = False
            raise Interrupted

    def _idle_seconds(self) -> float:
        """Until the next task is due to start (a restart's backoff), at most IDLE_SECONDS;
        while something holds the loop, until its deadline."""
        job = self.job
        now, idle = job.clock(), IDLE_SECONDS
        if job.hold is not None:
            return max(0.0, job.hold.wake_in(now))
        for r in job.records.values():
            if r.state is TaskState.PENDING and self.starts.ready(r):
                idle = min(idle, r.start_after - now)
        return max(0.0, idle)

    def _wait(self) -> None:
        """Until a handle exits or a signal comes, or the next deadline; output ends the
        sleep too, but no sooner than OUTPUT_SECONDS after the last round began. While a
        hold is under way, only its handles are watched."""
        job = self.job
        timeout = self._idle_seconds()
        if job.hold is not None:
            handles: list[TaskHandle] = job.hold.handles()
            fds = {fd for h in handles if (fd := getattr(h, "exit_fd", None)) is not None}
            unwatched = len(fds) < len(handles)
            self._by_fd = None  # the hold asks its own handles
        else:
            self._by_fd, self._unwatched = {}, []
            for r in job.records.values():
                if r.handle is None or not r.state.live:
                    continue
                fd = getattr(r.handle, "exit_fd", None)
                if fd is None:
                    self._unwatched.append(r)
                else:
                    self._by_fd[fd] = r
            fds, unwatched = set(self._by_fd), bool(self._unwatched)
        if unwatched:
            timeout = min(timeout, POLL_SECONDS)
        self._waiter.watch(fds)
        until, output = job.clock() + timeout, False
        while True:  # at least one look, even with no time to wait
            self._exited, notified = self._waiter.wait(until - job.clock(), output=not output)
            if self._exited or job.signal is not None:
                break
            if notified:  # output (a signal ended the sleep above)
                output, until = True, min(until, self._round_at + OUTPUT_SECONDS)
            if job.clock() >= until:
                break
        self._round_at = job.clock()


def _print_line(task: str, line: str) -> None:
    sys.stdout.write(f"[{task}] {line}\n")
    sys.stdout.flush()
