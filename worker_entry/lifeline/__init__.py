"""Nothing a task starts outlives it, and nothing outlives the coordinator.

`python -m worker_entry` is two processes. The one the coordinator starts (the pid in
`task_started`, its process group's leader) is a small wrapper that never imports
TensorFlow; it forks the task proper, which does. The task's main thread can sit inside a
TensorFlow op holding the GIL for minutes (building MultiWorkerMirroredStrategy while peers
are missing, a collective that waits), so every duty that must not wait is the wrapper's,
whose main thread only ever waits in select:

- It is a child subreaper (PR_SET_CHILD_SUBREAPER): whatever the task starts stays the
  wrapper's descendant however it detaches (a session of its own, a double-forked daemon),
  because the kernel re-parents orphans to it, not to init. When the task ends, however it
  ends, the wrapper SIGKILLs and reaps every descendant left, removes the task's temp dir,
  and exits with the task's status (killed by signal N: it kills itself with N, so the
  coordinator sees the same -N).
- SIGTERM (teardown, or a preemption notice from outside), reported with a `sigterm`
  marker: if the task has a Python SIGTERM handler, the wrapper passes the SIGTERM on and
  SIGKILLs the task `grace_seconds` later if it still runs. That grace lets TensorFlow's
  PreemptionCheckpointHandler (which takes SIGTERM as its preemption notice; Keras's
  BackupAndRestore(save_before_preemption) uses it) or the user's own handler save, and exit
  with EXIT_PREEMPTED. Without one it SIGKILLs the task at once: TensorFlow's C++ runtime
  swallows SIGTERM, so waiting would only hold up every restart by the grace. The task
  tells the wrapper over a pipe whenever a SIGTERM handler is set (signal.signal is wrapped
  in the task before any user code runs), and that none can help once its code is over
  (its `exiting` marker: a teardown hung after a peer's death gets no grace). SIGHUP (the
  SSH session is gone): SIGKILL at once.
- Usage: every USAGE_SECONDS it measures the task's whole process tree from /proc (CPU,
  RSS, processes, any of them stopped: worker_entry.usage) and writes a `usage` marker. The
  wrapper is the one to do it: it runs on the task's host, local or SSH alike, and it keeps
  running while the task is stopped or wedged.
- Stacks: a STACKS byte down the lifeline makes it send the task STACKS_SIGNAL, on which
  the task's faulthandler (registered before any user code runs) writes every Python
  thread's stack to the task's log: where a stalled task is stuck.
- The lifeline: the task's stdin, whose write end the coordinator (or a lab host's agent)
  holds. EOF means it is gone: kill all.
- PR_SET_PDEATHSIG: the wrapper gets SIGHUP (kill at once: no grace) when its parent (the
  coordinator, or the SSH session) dies, a second path to the same cleanup; the task gets
  SIGKILL when the wrapper dies, so a SIGKILLed wrapper never leaves a task holding its
  port. What the task started then goes to the next subreaper up, the coordinator, which
  kills it (orchestrator/launch/orphans.py).
- Readiness of a user's script (job.script, job.module), which prints no markers: the
  wrapper watches the task's port (its TF_CONFIG address) and reports READY once it
  listens, i.e. once the script's strategy started its gRPC server. Entries and servers
  report their own. A one-process script opens no port: the coordinator takes its first
  step as ready (orchestrator/supervise.py).
- TMPDIR, TEMP and TMP point into the task's temp dir (plan.py), which the wrapper makes
  before the task starts: TensorFlow's autograph files and anything else written through
  `tempfile` go with the task, even a SIGKILLed one.
- A standby (STANDBY_ENV=1: a warm spare, orchestrator/launch/spares.py) is started while
  the attempt before its own still runs. Its task imports TensorFlow and waits
  (worker_entry.standby); the wrapper passes GO from the lifeline on to it over a pipe. Until
  then the wrapper writes nothing (nobody reads its stdout yet: a full pipe would block it),
  neither measures nor watches the port (the running attempt's), and leaves the temp dir
  alone (the running attempt's too); the lifeline, the parent's death and SIGTERM end it as
  they end any task. At GO it makes the temp dir, and is a task's wrapper like any other.

The modules here, one side each:

- `start`: `wrap()`, the fork: the pipes between the two processes, each side's beginning.
- `wrapper`: the wrapper's loop (`Wrapper`), its cleanup and its exit like the task's.
- `relay`: the wrapper's stdout, the task's output and markers and its own, as frames.
- `prologue`: the task's side, from the fork to the job's first line, and its `exiting`.
- `job`: what the wrapper reads of the task's plan (temp dir, grace, port).

The /proc process tree and the prctl's are worker_entry.proctree's (the host agent uses
them too). Nothing is imported here: `python -m worker_entry` imports `start` itself.
"""
