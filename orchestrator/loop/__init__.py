"""The supervision loop: one job's tasks watched, judged and acted on until the job ends.

    Supervisor(plan, launcher, run_dir, clock=…).run() -> records.RunResult

`supervise` is the loop; `job` and `records` its state; `decide` (and the pure modules
beside it: stall, rate, resumes, joined) the decisions, table-tested on a fake clock
(`exitwords`: an exit's status and words, for the events and the tables);
`intake`, `exits`, `starts`, `stopping`, `checks`, `stacks`, `backupfill`, `resizing` and
`rundirwatch` act on them; `markers` reads what a task's side reports.

May import: planning, launch, elastic, runs, errors, worker_entry.markers. Never the CLI.

Design: The loop
====================

Decide, then act (issue 25): what a loss leads to (`decide.on_loss` → end the job, restart
the task or its unit, or say so), an exit's state, the restart budget and warm spares, the
backoff, preemption, who waits for the servers, the startup limit, the stall rule, the
deadline, training done, the teardown wait, a sign of work (`busy_cpu`) and the end of
FINISHING (and what it says) are pure functions in `orchestrator/loop/decide.py`; the loop
gathers the records' state, asks, and carries the answer out. It reads no policy or strategy
rule itself and calls no `sleep` (it hands `policy` and `rules` to `decide`;
`tests/test_decide.py` checks the source of every loop module below).

```
                 ┌──────────── Supervisor.run: one round (supervise.py) ────────────┐
 wakeup.Waiter ─▶│ intake.pump ─▶ hold? ─yes─▶ hold.step(now)  (only it, until over)  │
 (exit fds,      │                  no                                              │
  signals,       │ signal? deadline? ─▶ starts.start_due ─▶ poll exits ─▶ exits      │
  output, the    │ ─▶ stopping.teardown_waits ─▶ checks.startup ─▶ checks.stalls     │
  next deadline) │ ─▶ starts.standbys ─▶ checks.success                              │
                 └──────── each asks decide, then acts; any may set a hold ─────────┘
```

- module: what it carries out
- `supervise.py`: `Supervisor`: the loop (`run`, a round, the exits the kernel reported,
  signals, the one `poll` and its timeout: the next start, or the hold's deadline), the
  result
- `job.py`: `Job`: the state the others share (plan, records, job state, counters, events,
  console, clock) and its one write path, `set` (supervisord's `change_state`), `end`,
  `restart` (the one writer of `task_restarted`: a policy's restart, a preemption's, a
  resize's, a rejoin's); the restart unit; `hold`, what holds the loop
- `records.py`: `TaskRecord` (a task across attempts), `Attempt` and its `Work` (one
  attempt, made fresh at each start), `TaskOutcome`, `RunResult`, `tail`
- `intake.py`: `Intake`: the tasks' lines: markers change the attempt (ready, progress,
  usage, exiting, joined ...) or the job (`backup`: `Job.script_backup`, `backups.told`) and
  become events, other lines go to the console; an exit's last lines (`collect`); at an
  attempt's first step (or its good end) whether it joined the plan's cluster
  (`joined.judge`: `task_alone`, the console, `Job.alone`)
- `exits.py`: `Exits`: an exit's state and its `task_exited` (told by `exitwords`, as
  `task_stopped` is), a preemption, a loss
  (`decide.on_loss`), a restart: the unit stopped, the chief's backup copied where a
  script's BackupAndRestore needs it (`exits.refill`), then `task_restarted` and its backoff
- `backupfill.py`: `Refill`: before an MWMS group starts again (a restart, a resize, a
  rerun's first start) the chief's backup copied into the workers' directories that lack it,
  the copies removed once the group trains, a directory it cannot fill said as training
  begins (Backups across restarts, below); `rerun`/`carry`
- `stopping.py`: `stop`/`Stopping` (STOPPING: SIGTERM, SIGKILL at the kill deadline, the
  exits collected, `task_stopped`, then what was to follow), `teardown_waits`
- `stacks.py`: `ask_stacks`/`StacksRequest`: a stalled task's stacks, until its dump is in
  or STACKS_WAIT_SECONDS (2 s)
- `starts.py`: `Starts`: what is due (serve first, the backoff, a failed host first) as one
  batch, a start's answer, warm spares, a start a signal abandons
- `checks.py`: `Checks`: the startup limit, stalls (their stacks asked, then the loss), a
  task that trained alone (`alone`: the job fails, before anything starts or succeeds),
  training done (the servers stopped, then FINISHING) and the sidecars' wait
- `resizing.py`: `Resizing` (an elastic job only): a loss that shrinks the group (asked by
  `Exits.lost` first), the probes and a grow at an epoch boundary (the last check of a
  round), the group's restart at its new size; a parameter_server job's `PsResizing`, also
  asked by `Exits.restart` before the policy restarts the chief (Elastic jobs, below)

A stop and a stacks request are deadlines, not waits: each is a `Hold` (`Job.hold`) that the
loop steps every round, sleeping until its deadline or an exit of its tasks, and looks at
nothing else until it is over (as the waits inside the loop did, so the events come in the
same order); then what it was for (the restart, FINISHING, the stall's loss) is carried out.
A task being stopped is `STOPPING` (SIGTERM sent, SIGKILL due `grace_seconds` later, at once
on a second signal), then `STOPPED`. Where the stop is a group's restart (or shrink) because
a member is gone (`Exits.lost`'s restart, `Resizing.lost`'s resize: `stop(peer_lost=True)`),
the deadline is `PEER_LOST_GRACE_SECONDS` (2 s) at most: the survivors' checkpoint
collectives need the lost peer, so a longer grace saves nothing (a
PreemptionCheckpointHandler survivor waited on its dead peer until killed: the restart began
2.8 s after the SIGKILL instead of 10.8 s); a preemption and the job's end keep the whole
grace. The loop's clock and its one wait are the Supervisor's `clock` and `waiter`:
`tests/test_supervise.py` runs timed scenarios (the teardown waits, the sidecars' idleness)
on a fake clock that moves only when the loop waits. A task's `TaskRecord` keeps what spans
its attempts (state, handle, attempt number, restarts, backoff, log, failed starts in a row,
its last line); what belongs to one attempt (its pid's markers, exit, teardown times, and
its `Work`: progress, pace, usage, its last sign of work) is its `Attempt`, made fresh when
the attempt starts: nothing is reset by hand.

`Supervisor.run` is one loop: it pumps output (logs are written by each handle's reader; the
loop validates markers and echoes lines), notices exits, applies the policy, and starts what
is due. Between rounds it sleeps in one `poll` (`wakeup.Waiter`, kept for the run; its fds
follow the live handles): a task's exit (its pidfd) or a signal wakes it at once, output at
most every OUTPUT_SECONDS (0.1 s: 64 tasks' usage markers would otherwise make a round over
every task 32 times a second; a usage marker wakes nothing at all, being state, not an
event: the next round takes it, so 64 idle tasks cost 4 rounds a second, not 10), a due
restart or IDLE_SECONDS (0.25 s) otherwise; handles without an exit fd (SSH, Slurm) are
polled every 50 ms. Only handles whose exit fd is readable are asked for their exit code
(the wait keeps each fd's record: a round that woke for no exit asks none and walks no list
of them), a stop asks only its tasks not seen exited yet, once a round, and stalls are
looked for every 0.25 s (a `Watched` per task, a NamedTuple: a third of a frozen dataclass's
cost). What grows with the tasks in a round is kept linear (`tests/test_overhead.py` counts
a 64-task stop's calls against an 8-task one's). Every state change goes through `Job.set`,
which refuses a transition that the Enum's docstring does not draw (`TASK_TRANSITIONS`,
`JOB_TRANSITIONS`; a test checks that the docstrings and the tables agree). The evaluator's
exit takes the same path as every other exit; once the job is done it is waited for in
`FINISHING`: the loop says so (`job_finishing`, a `[tfo]` line naming the sidecars and
`timeouts.evaluator_seconds`, 60 s by default), and ends when they exit, when that time is
up, or, for a script's or module's evaluator (`policy.evaluator_idle_seconds`, from
`timeouts.evaluator_idle_seconds`, 5 s; None for an entry's, which exits after the last
epoch by itself), once each has shown no sign of work (a line or marker, or a `usage` of
`SIDECAR_BUSY_CPU`, 10 % of a core, or more: `decide.busy_cpu`; one notion with the stall
rules' `busy_at`, per attempt) for that long since training finished
(`job_evaluators_idle`): Keras's SidecarEvaluator never exits, and idles, polling for a new
checkpoint, once it has evaluated the last. Every step is written to events.jsonl. SIGHUP,
SIGINT, SIGQUIT (`Ctrl-\\`) and SIGTERM tear down and exit 129, 130, 131 and 143, with the
summary and `job_finished`. Ctrl-Z (SIGTSTP) is refused: a stopped coordinator's tasks would
run on unwatched (pipes filling, a lab's heartbeats missed, stall limits running); the loop
says so once (`suspend_refused`, a `[tfo]` line with how to stop the job) and goes on. They
are answered at once at every moment: a backend's start (an SSH host that does not answer
waits up to its connect timeout) is abandoned by the signal's handler (`Starts.starting`,
`Interrupted`); before the supervisor takes over (`cli._run`: checking the hosts, copying
the code) SIGTERM, SIGHUP and SIGQUIT end tfo as Ctrl-C does, saying what was under way
(`interrupted by SIGTERM while copying the code to the hosts (partial files removed);
nothing was started`), with 128 + the signal.

**Hangs** (`timeouts.stall_seconds`, `orchestrator/loop/stall.py`). A live training task
(not a server, not a sidecar, not `done`) has stalled when its progress step has not moved
for its limit, or its usage has said stopped that long, or every training task of the job
(all RUNNING; PS servers counted, never named) has been idle that long: no line, and its
usage's CPU under `IDLE_CPU` (2 % of a core; a worker blocked in a collective or its input
reads 0.0). `auto`, the default, adapts the limit per task from its `Pace` (its progress
markers folded by `paced`): `MULTIPLE` (10) times the longest wait between two step moves
after its first (the wait for the first, tracing and compilation, is not a step's), never
below `stall_min_seconds` (60 s). Its steps judge it once they are known: `WARMUP_STEPS`
(20) after its first, or its first epoch over; at the end of its first epoch (the marker's
`step_in_epoch == steps`) it waits for the next epoch's first step, which then puts the
validation and checkpoint time into the longest wait. After the last step of its fit's last
epoch (`epochs` known) steps no longer judge it: evaluating or saving follows. Until then,
and for a task that reports no steps, being stopped and the group's idleness count, with the
same limit. A number fixes the limit for all three; `null` or 0: off. A task still STARTING
is the startup timeout's (above): its peers wait for it idle, and that is no stall. A
stopped task is not failed at once: a debugger's look or a brief SIGSTOP should not cost an
attempt, and its step stops at the same moment, so it is caught a limit after it stopped
either way. When one task is over its limit, every task stuck with it (within 2 s of it) is
reported, the cause first: stopped (or its wrapper silent), then one with a thread in its
own code rather than inside a library (its main thread's, or another's: a `tf.py_function`
or a generator of the input pipeline runs in one of TensorFlow's threads, while the main
thread waits in TensorFlow as its blocked peers' do; `stall.stuck_thread`), then the one
quiet longest. The loop writes `task_stalled` per task (`stall_seconds`: the limit it went
over, `60 s` or `auto: 60 s`), asks each one that can answer for its stacks (a deadline the
loop wakes for, up to 2 s: `stacks.py`), writes `task_stacks` with the innermost frame and
the user's own frames of the thread `stuck_thread` picks, and fails the attempt like an exit
with no code: the restart policy applies. `RunResult.stalls` carries them to the summary,
which prints each stall and its frames even when the restart then succeeded.

**Preemption.** A task that exits 42 (`EXIT_PREEMPTED`: TensorFlow's handler's exit code off
Google Cloud, `BorgTerminationConfig`) after a SIGTERM reached it or any task of its restart
unit this attempt (its wrapper's `sigterm` marker) is preempted: `task_preempted`, and its
unit restarts without counting against `max_restarts` (nor the tasks' restarts);
`task_restarted` says `counted: false`. The handler makes every worker save at an agreed
step and exit 42, but only the signalled one got the SIGTERM: hence the unit. Restart policy
`never` still fails the job. A SIGTERM sent to the task process itself, bypassing its
wrapper, is not seen: signal the pid tfo reports, or its process group. An exit 42 without a
SIGTERM before it is a failure, and its reason says so (`by itself: 42 is a preemption only
after a SIGTERM, and none reached worker:0, worker:1`); a task whose code had ended with a
status (its `exiting` marker) and that tfo then stops in its teardown is reported with that
status (`exit code 42 (…), then stopped in its teardown (signal SIGTERM)`), not the signal;
one that exited on its own meanwhile (not by tfo's signal) is told by the kernel's status.
"""
