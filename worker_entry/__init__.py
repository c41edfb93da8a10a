"""What runs inside every task: `python -m worker_entry`, configured by the environment.

The coordinator sets TF_CONFIG, TFO_TASK and TFO_JOB; this package reads them, builds the
strategy for the task's role, and calls the job's `module:function` with a TaskContext.
Importing this package does not import TensorFlow (the coordinator reads `markers`).

Design: Inside a task: the wrapper
====================

```
tfo ──stdin (lifeline), stdout/stderr pipe──▶ wrapper (pid in task_started; never imports TF;
    ◀── frames (worker_entry.channel) ──         Linux child subreaper; owns TMPDIR)
                                        stdout+stderr pipe, marker pipe ▲
                                                 └─▶ task (imports TF, runs the entry;
                                                      PDEATHSIG: dies with the wrapper)
                                                      └─▶ anything it starts, however it detaches
```

A task is RUNNING once it reports READY, or once it runs its first step. Entries and our
servers print READY; a user's script prints none, so for script and module jobs the wrapper
watches the task's own port (its TF_CONFIG address, every 0.2 s, `worker_entry/listen.py`:
the kernel's listening sockets over sock_diag netlink, 0.07 ms a check; `/proc/net/tcp{,6}`
cost 8.8 ms here, 0.3 CPU-s per task's start-up) and prints READY once it listens, i.e. once
the script's strategy started its gRPC server (the evaluator, which has no port, is ready at
start). A one-process script (MirroredStrategy over one machine's devices, the default
strategy) opens no port: the supervisor takes its first `first_step` or `progress` marker
(the progress callback tfo adds to Keras's fit, or a counted `tf.function`) as ready
(`task_ready` with `by: step`). The startup timeout fails a task not RUNNING by
`startup_seconds` only while it idles (`stall.startup_over`: no line and its usage's CPU
under 2 % for 5 s): one loading its data before its first step is working, one waiting for
peers that never come (its port never opened, or its strategy never built) is idle.

Markers travel on a channel of their own (issue 37): a task's output is untrusted, and a
script that printed `@tfo {"event": "exiting", "code": 0}` and then exited 7 was reported
succeeded (so was one that printed an old run's log: its `progress`, `saved`, `done` were
recorded as tfo's). The task's stdout and stderr are one pipe to its wrapper, and its
markers another (`markers.use_channel`, set before any user code runs, not inherited across
exec: a script that closes or redirects its stdout and stderr keeps its markers, and `emit`
never raises, so it cannot fail on our DONE). The wrapper reads both and writes each read on
its own stdout as a frame (`worker_entry/channel.py`: MAGIC `\\x1f`, kind, length, payload):
the task's bytes as OUTPUT, with MAGIC in them written out as the text `\\x1f`, so MAGIC only
ever starts a frame however the stream is cut; each marker line from the task's pipe as
MARKER (drained after the output pipe, so a line printed before a marker comes first; a
`usage` or `sigterm` from the task is dropped: those are the wrapper's word); its own
markers as OWN, its own words as SAY, its heartbeat as BEAT. Nothing else writes there (the
wrapper's stderr is /dev/null; bytes outside a frame, e.g. a python that failed before the
wrapper began, or srun's own words, are text). The one stream reaches the coordinator the
same way from every backend: a local or forked task's pipe, srun's stdout (srun forwards
only stdout and stderr: the wrapper is the one process that writes frames there), or the
payload of a host agent's OUTPUT frames; `TaskOutput` reads it, and in the task's log and
lines a marker starts with `markers.START`, the task's text never (so `tfo logs`, the
summary's tail and `Result.explain` skip only real markers). A task printing marker-shaped
text has it shown and logged as text, and no event. The wrapper never blocks on its stdout
(its frames wait in a queue and leave by `writev`; past 1 MiB it stops reading the task's
pipes, which then wait as the coordinator's pipe did). The task's output pipe is 256 KiB and
read as such, and after a small read the next waits 1 ms (`_COALESCE_SECONDS`), so a task
printing a line at a time does not wake the wrapper per line. Measured on the 2 shared cores
at load 25-28: 2,000,000 lines in 7.7 KB writes (154 MB, tests/scripts/flood.py) through
`python -m worker_entry` into a reader that only reads, wrapper and task 0.31-0.37 s of CPU
against 0.20-0.23 s before, wall 1.4-2.5 against 1.6-2.3 s; 200,000 lines printed one at a
time with flush, 0.68-0.74 against 0.98-1.37 s of CPU, 1.4-3.2 against 3.2-7.2 s wall (the
bigger pipe); the coordinator's CPU for test_output's 2,000,000-line flood 1.10-1.18 s
against 0.91-0.93 s (reading frames).

Frames are for a coordinator: every backend starts a wrapper with a lifeline (TFO_LIFELINE).
Without one (a Kubernetes pod of `tfo export`, `python -m worker_entry` by hand) nobody
reads frames, so the wrapper writes none: the task shares its stdout and stderr, and the
markers are text lines on it, as `kubectl logs` shows them.

A marker is still the task's word: each is validated (orchestrator/loop/markers.py), and
what it may decide is checked against what tfo saw. An exit code is the kernel's: a task's
`exiting` code stands for its exit only when tfo stopped it in its teardown and the kernel
says tfo's SIGKILL ended it (`decide.stopped_in_teardown`); one that exited on its own
meanwhile is told by its own status, whatever it said. The task's own code can still write
on its channel, and any process of the user's can reach its wrapper's descriptors through
/proc: the channel keeps printed text from speaking for tfo, it is no sandbox.

The wrapper exits with the task's status (a signal is re-raised, so the coordinator sees
-N). When the task ends, however it ends, the wrapper kills and reaps everything below it
and removes the task's temp dir. SIGHUP, stdin EOF, or (over SSH) heartbeat silence make it
kill the task at once; after silence (`lost contact with the coordinator: no heartbeat for
30 s` in the log) it exits `EXIT_LIFELINE` (79), which the coordinator reports as lost
contact rather than the task's SIGKILL. Over SSH the heartbeat is the host agent's (its
wrappers' lifeline is their stdin from it, EOF only): the agent hears the coordinator's BEAT
frames and closes every wrapper's stdin when they stop. The silence allowed is the host's
`lifeline_seconds` (default `LIFELINE_SECONDS`, 30 s: TCP retransmits a lost segment after
0.2, 0.4, 0.8 ... s, so at 30 % loss five losses in a row hold a beat up 6.2 s once in 400
segments, and 5 s tripped; 30 s takes eight in a row, once in 15,000, about an hour and a
half of beats). Over SSH a task's exit is what its host's agent reaped: its status, or the
signal that ended the wrapper (`signal SIGKILL`, as locally); or the host is lost, a closed
connection or its silence (`lost contact with lab2: the connection dropped`, `… no heartbeat
for 30 s`; code 255). SIGTERM (teardown signals the task's process group; a preemption
notice may come from outside) is reported with a `sigterm` marker and depends on the task:
one with a Python SIGTERM handler gets the signal and `grace_seconds` (from TFO_JOB) before
SIGKILL, the time TensorFlow's PreemptionCheckpointHandler or BackupAndRestore's
`save_before_preemption` (or the user's own handler) has to save; one without is SIGKILLed
at once, because TensorFlow's C++ runtime swallows SIGTERM and waiting would only hold up
every restart. The task tells its wrapper over a pipe whenever a SIGTERM handler is set
(`signal.signal` is wrapped in the task before user code runs). The same wrapper runs on lab
hosts.

The wrapper also measures its task: every `USAGE_SECONDS` (2 s) a `usage` marker with the
whole tree's CPU (percent of one core), RSS, process count, and whether any process is
stopped (state `T`), read from `/proc` on the task's host, local or SSH alike. And it
answers a stacks request: the task registers `faulthandler` on SIGUSR2 before any user code
runs; a `?` byte down the lifeline (heartbeats are `.`) makes the wrapper send that signal,
and every Python thread's stack lands in the task's log.
"""
