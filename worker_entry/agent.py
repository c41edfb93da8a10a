"""`python -m worker_entry.agent SECONDS`: one per lab host and run, over one SSH session.

sshd's stock `MaxSessions 10` caps the sessions of one connection, and a session per task
(and per standby, per remote kill) ran out at 9 tasks on a host. As Open MPI's daemon does,
this agent forks the host's tasks itself (each `python -m worker_entry`, its wrapper, in a
session of its own: the process group tfo signals) and carries all of them over its one
channel: their output, exits, signals, stacks requests, standbys' GO (worker_entry.frames).
It never imports TensorFlow, and its one thread waits in select.

Per task nothing changes for the wrapper (worker_entry.lifeline): its stdin is a pipe from
here (lifeline "stdin": EOF means gone), its stdout and stderr one pipe to here; PDEATHSIG
ends it when the agent dies. The coordinator's lifeline is the agent's: a BEAT frame at
least every markers.beat_seconds(SECONDS) down the channel, and ours back when we sent
nothing else that long. On EOF, or silence for
SECONDS (a cut network), the agent closes every task's stdin, so each wrapper kills its task
and all it started at once, SIGKILLs what is left after CLEANUP_SECONDS, and exits.

The agent is a child subreaper: what a SIGKILLed wrapper leaves (the task's own children
that detached) comes to it, not to init, and is killed.

It holds the run's ports on the host while it lives (worker_entry/portlocks.py): the
preflight's probe's reservations where it was that probe, else each task's port at its
START; a port another live job holds fails the start, naming that job.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from worker_entry import forkstart, frames, portlocks, proctree
from worker_entry.markers import beat_seconds

CLEANUP_SECONDS = 5.0  # after the lifeline ends: wrappers still running then are SIGKILLed
DRAIN_SECONDS = 2.0  # after a wrapper exits: its output's last bytes (a straggler holds it)
OUT_LIMIT = 4 << 20  # bytes waiting for the channel: task pipes are not read past it
# Task output waits this long for more before it is sent: a host's wrappers report usage
# together (markers.next_usage), and their lines then cross in one write, one SSH packet,
# one wake-up of the coordinator's threads instead of eight. Anything else goes at once.
COALESCE_SECONDS = 0.05
PROBE_GONE_SECONDS = 2.0  # a port held by this run's own probe: it ends within this


@dataclass
class _Task:
    pid: int  # its wrapper's, the leader of its session
    stdin: int | None  # the write end of its stdin pipe, until closed
    out: int | None  # its output pipe, until EOF
    proc: subprocess.Popen | None = None  # an exec'd wrapper's (Popen owns its pipes)
    code: int | None = None  # once reaped
    reaped_at: float = 0.0
    extra: list[int] = field(default_factory=list)
    forked: bool = False


def _close(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def _expand(value: str) -> str:
    return os.path.expanduser(value) if value == "~" or value.startswith("~/") else value


class Agent:
    def __init__(self, lifeline: float, ports: portlocks.Reservations | None = None) -> None:
        self.lifeline = lifeline
        self.ports = ports  # the run's, held until the agent ends
        self.tasks: dict[int, _Task] = {}
        self.out = bytearray(frames.SYNC)
        self.hold_until = 0.0  # `out` holds only task output, sent from then (COALESCE_SECONDS)
        self.beat = beat_seconds(lifeline)
        self.reader = frames.Reader(frames.TO_AGENT)
        self.heard = self.beat_at = time.monotonic()
        self.lost_at: float | None = None  # the lifeline ended
        self.quit = False
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w, 1):
            os.set_blocking(fd, False)

    def send(self, kind: bytes, slot: int = 0, payload: bytes = b"") -> None:
        if kind != frames.OUTPUT:
            self.hold_until = 0.0
        elif not self.out:
            self.hold_until = time.monotonic() + COALESCE_SECONDS
        self.out += frames.frame(kind, slot, payload)

    # ---- requests --------------------------------------------------------------------
    def handle(self, kind: bytes, slot: int, payload: bytes) -> None:
        if kind == frames.START:
            self.start(slot, json.loads(payload))
        elif kind == frames.SIGNAL:
            self.signal(slot, payload.decode())
        elif kind == frames.INPUT:
            task = self.tasks.get(slot)
            if task is not None and task.stdin is not None:
                with contextlib.suppress(OSError):
                    os.write(task.stdin, payload)
        elif kind == frames.CLEAN:
            tmp = _expand(payload.decode())
            shutil.rmtree(tmp, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(tmp))
        elif kind == frames.QUIT:
            self.quit = True
            for slot in self.tasks:
                self.signal(slot, "KILL")

    def start(self, slot: int, spec: dict) -> None:
        """The task's wrapper: forked from here where that is what an exec would make
        (worker_entry.forkstart), else exec'd."""
        env = {**os.environ, **{k: _expand(v) for k, v in spec["env"].items()}}
        cwd = _expand(spec["cwd"])
        if spec.get("port"):
            if self.ports is None:
                self.ports = portlocks.Reservations(spec.get("owner") or "")
            holder = self.ports.reserve(spec["port"])
            until = time.monotonic() + PROBE_GONE_SECONDS
            while holder == self.ports.owner and time.monotonic() < until:
                time.sleep(0.05)  # this run's preflight probe, ending as this agent starts
                holder = self.ports.reserve(spec["port"])
            # Still this run's (an agent before a reconnect, its lifeline not yet out): the
            # port is ours all the same; the next start reserves it again.
            if holder is not None and holder != self.ports.owner:
                self.send(frames.FAILED, slot, f"port {spec['port']} is reserved by "
                          f"{holder}".encode())
                return
        try:
            if run_dir := env.get("TFO_RUN_DIR"):  # its logs and tmp: the user's alone
                os.makedirs(run_dir, mode=0o700, exist_ok=True)
            os.makedirs(cwd, exist_ok=True)
            if forkstart.can_fork(spec["command"], env):
                pid, stdin, out = forkstart.spawn(cwd, env)
                task = _Task(pid, stdin, out, forked=True)
            else:
                proc = subprocess.Popen(spec["command"], cwd=cwd, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        bufsize=0)
                assert proc.stdin is not None and proc.stdout is not None
                # Ours to close: Popen keeps only the pid (and its returncode, set on reaping,
                # so that it never waits for the pid itself).
                stdin, out = os.dup(proc.stdin.fileno()), os.dup(proc.stdout.fileno())
                proc.stdin.close()
                proc.stdout.close()
                task = _Task(proc.pid, stdin, out, proc)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            why = getattr(e, "strerror", None) or str(e)
            self.send(frames.FAILED, slot, f"{why}: {spec['command'][0]}".encode())
            return
        assert task.out is not None
        os.set_blocking(task.out, False)
        self.tasks[slot] = task
        self.send(frames.STARTED, slot, str(task.pid).encode())

    def signal(self, slot: int, name: str) -> None:
        task = self.tasks.get(slot)
        sig = getattr(signal, f"SIG{name}", None)
        if task is not None and task.code is None and isinstance(sig, signal.Signals):
            with contextlib.suppress(OSError):
                os.killpg(task.pid, sig)

    # ---- the loop --------------------------------------------------------------------
    def reap(self) -> None:
        by_pid = {t.pid: t for t in self.tasks.values()}
        orphans = False
        for pid, status in proctree.reaped():
            task = by_pid.get(pid)
            if task is None:
                continue  # an orphan of a wrapper's tree, adopted and now reaped
            task.code, task.reaped_at = os.waitstatus_to_exitcode(status), time.monotonic()
            if task.proc is not None:
                task.proc.returncode = task.code  # Popen must not wait for it again
            orphans |= task.code < 0
        if orphans:
            self.kill_orphans()

    def kill_orphans(self) -> None:
        """A wrapper killed by a signal could not kill what its task started: what of it
        detached came to us (the subreaper). Our only children are wrappers."""
        ours = {t.pid for t in self.tasks.values() if t.code is None}
        for child in proctree.children(os.getpid()):
            if child in ours:  # a live wrapper: its tree is its own to end
                continue
            for pid in [child, *proctree.descendants(child)]:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def read_task(self, slot: int, task: _Task) -> None:
        assert task.out is not None
        try:
            data = os.read(task.out, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.send(frames.OUTPUT, slot, data)
        else:
            self.close_output(task)

    @staticmethod
    def close_output(task: _Task) -> None:
        _close(task.out)
        task.out = None

    @staticmethod
    def close_stdin(task: _Task) -> None:
        """The wrapper's lifeline ends (EOF on its stdin)."""
        _close(task.stdin)
        task.stdin = None

    def report_exits(self, now: float) -> None:
        for slot, task in list(self.tasks.items()):
            if task.code is None or (task.out is not None and now - task.reaped_at
                                     < DRAIN_SECONDS):
                continue
            if task.out is not None:
                self.close_output(task)
            self.close_stdin(task)
            self.send(frames.EXITED, slot, str(task.code).encode())
            del self.tasks[slot]

    def lose(self) -> None:
        """The coordinator is gone (EOF, silence, a signal): every wrapper's lifeline ends."""
        if self.lost_at is not None:
            return
        self.lost_at = time.monotonic()
        for task in self.tasks.values():
            self.close_stdin(task)

    def run(self) -> None:
        while True:
            now = time.monotonic()
            if self.lost_at is None and now - self.heard > self.lifeline:
                self.lose()
            if self.lost_at is not None or self.quit:
                live = [t for t in self.tasks.values() if t.code is None]
                if not live:
                    return
                if self.lost_at is not None and now - self.lost_at > CLEANUP_SECONDS:
                    for t in live:
                        with contextlib.suppress(OSError):
                            os.killpg(t.pid, signal.SIGKILL)
            readers = [self.wake_r] + ([0] if self.lost_at is None else [])
            if len(self.out) < OUT_LIMIT:
                readers += [t.out for t in self.tasks.values() if t.out is not None]
            held = self.out and len(self.out) < OUT_LIMIT // 4 and now < self.hold_until
            writers = [1] if self.out and self.lost_at is None and not held else []
            due = [self.beat_at + self.beat, self.heard + self.lifeline]
            if held:
                due.append(self.hold_until)
            wait = max(0.0, min(min(due) - now, 1.0))
            try:
                ready, can_write, _ = select.select(readers, writers, [], wait)
            except InterruptedError:
                continue
            now = time.monotonic()
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wake_r, 512):
                        pass
                self.reap()
            if 0 in ready:
                self.read_coordinator(now)
            for slot, task in list(self.tasks.items()):
                if task.out is not None and task.out in ready:
                    self.read_task(slot, task)
            self.report_exits(now)
            if now - self.beat_at >= self.beat:  # quiet that long: say we are here
                self.beat_at = now
                self.send(frames.ALIVE)
            if can_write and self.out:
                try:
                    n = os.write(1, self.out)
                except BlockingIOError:
                    n = 0
                except OSError:  # the channel is gone
                    self.out.clear()
                    self.lose()
                    continue
                del self.out[:n]
                if n:  # anything we send tells the coordinator we are alive
                    self.beat_at = now

    def read_coordinator(self, now: float) -> None:
        try:
            data = os.read(0, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.lose()
            return
        self.heard = now
        try:
            requests = self.reader.feed(data)
        except frames.FrameError:
            self.lose()
            return
        for kind, slot, payload in requests:
            self.handle(kind, slot, payload)


def main(argv: list[str], ports: portlocks.Reservations | None = None) -> None:
    """`ports`: the preflight's probe's reservations, where this agent is that probe."""
    lifeline = float(argv[0]) if argv else 30.0
    proctree.parent_death_signal(signal.SIGHUP)
    proctree.become_subreaper()
    forkstart.preload()  # before the first START: each task's wrapper is a fork of this
    agent = Agent(lifeline, ports)
    os.set_blocking(0, False)

    def on_signal(signum: int, frame: object) -> None:
        agent.lose()

    signal.set_wakeup_fd(agent.wake_w)  # SIGCHLD wakes the select
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    agent.run()
    if agent.ports is not None:
        agent.ports.close()  # their files removed: a SIGKILL leaves them, unlocked

if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
