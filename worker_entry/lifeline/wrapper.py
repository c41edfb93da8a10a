"""The wrapper's loop (`Wrapper`): from the fork until the task ends, every duty that must
not wait on the task (see worker_entry.lifeline), in one select on the lifeline, the task's
pipes, its SIGTERM handler reports and SIGCHLD; then the cleanup, and an exit like the
task's. Its stdout is the Relay's (lifeline.relay).
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import shutil
import signal
import sys
import time
import traceback

from worker_entry import markers, netrtt, proctree, standby, title, usage
from worker_entry.lifeline import job
from worker_entry.lifeline.relay import Relay
from worker_entry.listen import listening

_CLEANUP_SECONDS = 5.0  # at most this long killing descendants (a fork bomb): then give up
_READY_POLL_SECONDS = 0.2  # worker_entry.listen: a check costs 0.07 ms of CPU


class Wrapper:
    def __init__(self, task_pid: int, tmp_dir: str | None, lifeline: str | None,
                 grace: float, handler_fd: int, pipes: tuple[int, int] | None,
                 go_fd: int | None = None) -> None:
        self.task_pid, self.tmp_dir, self.grace = task_pid, tmp_dir, grace
        self.relay = Relay(pipes)  # our stdout
        self.go_fd = go_fd  # a standby's, until GO: the task waits for a byte on it
        self.handler_fd: int | None = handler_fd  # the task: b"1" handler set, b"0" unset
        self.handles_sigterm = False
        # A SIGTERM whose handler ran while the loop was reading the task's report (between
        # its read and its verdict, which the handler's own read would miss): answered then.
        self._reading = self._sigterm_deferred = False
        self._closing: list[int] = []  # the handler's pipe, once at EOF
        self.ready_port = job.script_port()  # None once reported
        self.watch_stdin = bool(lifeline)
        self.status: int | None = None  # the task's wait status, once reaped
        self.kill_at: float | None = None  # after a SIGTERM: when the task gets SIGKILL
        self.meter = usage.Meter()
        self.rtt = netrtt.RttMeter()  # its connections' to other hosts (netrtt.py)
        self.usage_at = markers.next_usage(time.monotonic())
        self.ready_at = 0.0  # the port's next look

    def _kill_task(self, signum: int = 0, frame: object = None) -> None:
        self._signal_task(signal.SIGKILL)

    def _signal_task(self, sig: signal.Signals) -> None:
        if self.status is None:
            with contextlib.suppress(OSError):
                os.kill(self.task_pid, sig)

    def _on_sigterm(self, signum: int, frame: object) -> None:
        """A task with a SIGTERM handler gets it, and SIGKILL after the grace (the loop's
        deadline, counted from the first); one without, SIGKILL now."""
        if self._reading:
            self._sigterm_deferred = True
            return
        self._read_handler_state()
        if not self.handles_sigterm or self.standby:
            if self.status is None and not self.standby:
                self.relay.own(markers.SIGTERM, grace=0)
            self._kill_task()
            return
        # The marker first: the coordinator must know of the SIGTERM before the task's exit
        # 42 can reach it (and before anything the task prints about saving).
        if self.kill_at is None and self.status is None:
            self.kill_at = time.monotonic() + self.grace
            self.relay.own(markers.SIGTERM, grace=self.grace)
        self._signal_task(signal.SIGTERM)

    def _read_handler_state(self) -> None:
        if self.handler_fd is None:
            return
        self._reading = True
        try:
            try:
                data = os.read(self.handler_fd, 4096)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if data:
                self.handles_sigterm = data.endswith(b"1")
            else:  # the task (and all that shares the pipe) is gone
                # Closed by the loop, after its select: this may run in the SIGTERM
                # handler, while the select (retried after it) still holds the fd.
                self._closing.append(self.handler_fd)
                self.handler_fd = None
        finally:
            self._reading = False
            if self._sigterm_deferred:
                self._sigterm_deferred = False
                self._on_sigterm(signal.SIGTERM, None)

    @property
    def standby(self) -> bool:
        """A warm spare that has not had GO yet: it writes nothing and owns nothing."""
        return self.go_fd is not None

    def _go(self) -> None:
        """A standby's turn: its task runs from now on, as one started now would."""
        assert self.go_fd is not None
        if standby.adopt_pool_env():  # a pool standby learns its task only now
            self.tmp_dir, self.grace, self.ready_port = job.tmp_dir(), job.grace(), \
                job.script_port()
            title.set_title(title.describe(os.environ, "wrapper", title.room()))
        if self.tmp_dir and not job.make_tmp_dir(self.tmp_dir, self.relay.say):
            self._kill_task()
        else:
            with contextlib.suppress(OSError):
                os.write(self.go_fd, markers.GO)
        os.close(self.go_fd)
        self.go_fd = None
        self.usage_at = markers.next_usage(time.monotonic())

    def _reap(self) -> None:
        for pid, status in proctree.reaped():
            if pid == self.task_pid:
                self.status = status

    def run(self) -> None:
        """Watch until the task ends; then clean up and exit like it. Never returns."""
        try:
            self._watch()
        except BaseException:  # a bug of ours: say where, and still clean up
            self.relay.say(traceback.format_exc())
        self._end_descendants()  # the task too, if a bug left it running
        if not self.standby:
            self.relay.drain()
        if self.tmp_dir and not self.standby:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
        self.relay.flush(wait=True)
        _exit_like(self.status if self.status is not None else 70 << 8)

    def _timeout(self, now: float) -> float | None:
        """How long select may wait: until the next duty falls due (None: no duty, a standby)."""
        due = [] if self.standby else [self.usage_at]
        if self.ready_port and not self.standby:
            due.append(self.ready_at)
        if self.kill_at is not None:
            due.append(self.kill_at)
        if (output_at := self.relay.due(now)) is not None:
            due.append(output_at)
        return max(0.0, min(due) - now) if due else None

    def _watch(self) -> None:
        wake_r, wake_w = os.pipe()
        for fd in (wake_r, wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_w)  # SIGCHLD (the task ended) wakes the select below
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGHUP, self._kill_task)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the coordinator stops us with SIGTERM
        self._reap()  # it may have ended before the handler was in place
        stdin = sys.stdin.fileno()
        watched = [stdin] if self.watch_stdin else []  # until EOF
        assert self.handler_fd is not None
        os.set_blocking(self.handler_fd, False)
        relay = self.relay
        while self.status is None:
            # Made anew each round: the handler's pipe leaves it at EOF. The task's pipes are
            # read once it runs (a standby's wait in them until GO) and while `out` has room.
            fds = [wake_r, *watched] + ([self.handler_fd] if self.handler_fd is not None
                                        else [])
            now = time.monotonic()
            if not self.standby:
                fds += relay.readable(now)
            ready, writable, _ = select.select(fds, [1] if relay.pending else [], [],
                                               self._timeout(now))
            while self._closing:
                os.close(self._closing.pop())
            now = time.monotonic()
            relay.on_ready(ready, now)
            if self.ready_port and not self.standby and now >= self.ready_at:
                self.ready_at = now + _READY_POLL_SECONDS
                if listening(self.ready_port):
                    self.ready_port = None
                    relay.own(markers.READY, what="training", by="port")
            if self.handler_fd is not None and self.handler_fd in ready:
                self._read_handler_state()
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                self._reap()
            if self.kill_at is not None and now >= self.kill_at:
                self.kill_at = None
                relay.say(f"[tfo] task pid {self.task_pid} still running {self.grace:g} s "
                          "after SIGTERM: killing it")
                self._kill_task()
            if now >= self.usage_at and not self.standby:
                self.usage_at = markers.next_usage(now)
                pids = proctree.descendants(os.getpid())
                relay.own(markers.USAGE, **self.meter.measure(pids), **self.rtt.measure(pids))
            if writable or relay.sent:
                relay.flush()
            if stdin in ready:
                self._read_lifeline(stdin, watched)

    def _read_lifeline(self, stdin: int, watched: list[int]) -> None:
        """GO (a standby's), a stacks request, or EOF: the coordinator is gone."""
        try:
            data = os.read(stdin, 4096)
        except OSError:
            data = b""
        if self.standby and markers.GO in data:
            self._go()
        elif markers.STACKS in data and not self.standby:
            self._signal_task(getattr(signal, markers.STACKS_SIGNAL))
        if not data:
            watched.clear()
            self.relay.say(f"[tfo] lifeline to the coordinator closed: killing task pid "
                           f"{self.task_pid} and everything it started")
            self._kill_task()

    def _end_descendants(self) -> None:
        """SIGKILL and reap all below us. A dying parent's children come to us, so repeat
        until none is left."""
        until = time.monotonic() + _CLEANUP_SECONDS
        while proctree.has_children() and (left := proctree.descendants(os.getpid())) \
                and time.monotonic() < until:
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)
            self._reap()


def _exit_like(status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the task's crash, not ours
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, signal.SIG_DFL)  # SIGKILL has no handler to reset
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal whose default is not to terminate
    os._exit(os.waitstatus_to_exitcode(status))
