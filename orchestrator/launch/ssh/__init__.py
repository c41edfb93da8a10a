"""Lab hosts over SSH: the backend, the host agent each host runs, the remote channel,
and the project's code synced there (what is sent: projectfiles).

May import: orchestrator.launch, planning, runs, errors, worker_entry.

Design: SSH: one agent per host
====================

A lab host runs sshd as its distribution ships it: `MaxSessions 10` sessions on one
connection, `MaxStartups 10:30:100` connections being authenticated at once. One session per
task (and per warm standby, per remote kill) ran out at the 10th; so tfo holds at most 2
sessions on a host at once (`ssh.SESSIONS`, in `tfo check`'s `sessions` column), whatever
its tasks, standbys, restarts, stacks requests and stops: in order, the preflight's probe
(one command, `preflight._PROBE` in the host's python: versions, ports, workdir, cores,
memory, `nvidia-smi -L`, and, told the job's files by `SshBackend.expect_code`, which of
them are in the workdir already, with their sizes, mtimes and modes, and its free space,
whose answer the sync then reuses; it was four commands), the copy (one sftp session, closed
before the agent starts, and only where a file changed; a partial file's removal is the
second), then the host's agent, started as soon as its host is synced, for the rest of the
run. Where the probe found every file there as it is here (a run after the first), the
probe's own python, still waiting on its channel, becomes the agent (told `agent SECONDS`;
it was started with the agent's variables): one interpreter start and one session less per
host; where a file is copied, the probe is ended first and the agent started anew on the new
code. As Open MPI starts one daemon per node that forks the node's ranks, tfo starts `python
-m worker_entry.agent LIFELINE` (`worker_entry/agent.py`, standard library only, synced with
worker_entry) over one exec session in the host's workdir; the agent forks each task's
wrapper (in a session of its own: the process group tfo signals) and multiplexes them over
its stdin and stdout as frames (`worker_entry/frames.py`: kind, slot, length, payload).
Chosen over OpenSSH's ControlMaster (its sessions count against the same `MaxSessions`) and
over a connection per task (`MaxStartups`, and 16 authentications per machine). A task's
output is untrusted: it only ever travels as the payload of an OUTPUT frame whose header the
agent writes after reading the task's own pipe, so no byte a task prints can end a frame,
start one, or speak for another task or the agent; a malformed header loses the host. What
the agent reads from that pipe is the wrapper's own stream of frames (its task's output and
markers apart, below), which the coordinator reads as it reads a local task's. Per task
nothing changes: its own log, its exit (the agent reaps the wrapper: `signal SIGKILL` as
locally), TERM/KILL to its process group, its stacks request and a standby's GO down its
wrapper's stdin, its temp dir removed at `close`.

The agent does not exec a python per task: 128 interpreters starting and importing
worker_entry were most of a lab's start on its machines. It imports worker_entry once
(`forkstart.preload`) and forks each wrapper from itself (`forkstart.spawn`), which is what
an exec of `python -m worker_entry` makes where nothing an interpreter reads at its start
differs: the same python, and the same `PYTHON*`, `LD_*`, locale and `HOME` variables
(`forkstart.can_fork`; the agent is started with those its tasks share, `ssh.agent_env`, so
the usual task forks; one whose own environment sets another `LD_LIBRARY_PATH`, say, is
exec'd). The child resets what an exec would (session, stdin and output pipes, every other
descriptor closed, signal handlers, directory, environment, argv, sys.path[0]), runs
worker_entry's `__main__`, and exits as Python does (threads joined, atexit handlers,
streams flushed). One difference shows: a forked task's /proc/PID/environ (ps e, psutil) is
the agent's exec-time environment, which holds the run's `TFO_RUN_DIR`, not the task's own.

The lifeline is the agent's: BEAT frames both ways every tenth of the host's
`lifeline_seconds` (`markers.beat_seconds`: 3 s for the default 30, at least 1 s; the agent
beats only when it sent nothing else that long); EOF or silence for the host's
`lifeline_seconds` and the agent closes every wrapper's stdin (each kills its task and all
it started at once) and SIGKILLs what is left after 5 s; the coordinator counts every task
of a host lost after the same silence, and its wrappers die with the agent (PDEATHSIG). A
SIGKILLed wrapper's leftovers come to the agent (a child subreaper), which kills them. On
the coordinator a host costs two threads (paramiko's transport, made to wake every 1 s
rather than 0.1 s, and the agent's reader, which feeds each task's `TaskOutput`, sends our
beats and notices the host's silence), not two per task; each task has an exit fd (an
eventfd the reader writes), so the loop sleeps on SSH tasks as on local ones. Each packet
wakes both threads of its host: a host's wrappers measure usage on the same ticks of the
machine's monotonic clock (`markers.next_usage`), and the agent holds task output for 50 ms
(`agent.COALESCE_SECONDS`; anything else goes at once), so a host's eight usage lines cross
as one packet every 2 s instead of four a second. Per-host work (preflight, code sync, a
round's starts, close) runs for all hosts at once, `remote.FAN_OUT` (64) at a time, so 500
hosts do not open 500 connections in one instant. `bench/lab.py` (`bench/run.py --only lab`:
16 network-namespace hosts on 10.202.0.0/24, stock sshd, × 8 light tasks, beside one `ssh`
per host started all at once) measured on this 2-core machine: run → all ready 49.6 s (the
issue, busy) → 8.65 s (one agent per host, quiet: 3.1× the fan-out's 2.79 s) → 2.89 s
(forked wrappers, one probe that becomes the agent: 0.99× the fan-out's 2.90 s), Ctrl-C →
all stopped 24.6 → 0.44 s, idle coordinator CPU 0.065 → 0.022 → 0.0075 cores, threads 274 →
34.

A port free to the kernel may be a live job's between two attempts of its task, and two jobs
started together both found theirs free. So a job reserves its ports on each host for its
lifetime (`worker_entry/portlocks.py`): one `flock`ed file per port and network namespace
under the user's `/tmp/tfo-<uid>`, naming the run; the kernel lets go when the holder ends,
SIGKILL too, so nothing goes stale (a holder that lets go removes its file, and a reserver
checks that the file it locked is still the one at the path). Locally `LocalBackend` holds
them (an `auto` port from `allocate` on, a fixed one from `check`) until `close`; on a lab
host the preflight's probe reserves them before its bind check (portlocks' source is the
probe's first part) and keeps them as the agent it becomes; where the code changed and a new
agent starts, that agent reserves each task's port at its START (waiting up to 2 s for its
own run's probe to end; one still held by its own run, an agent before a reconnect whose
lifeline is not out yet, is used all the same), a small window between the two. Ports are
reserved in ascending order, stopping at the first held, so of two jobs started together one
gets all of its ports and the other's preflight says `port 20100 is reserved by run …` (exit
2). Reservations are per user (a shared directory would be another user's trap); another
user's job is caught by the bind check alone.
"""
