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
- The lifeline: the task's stdin, whose write end the coordinator holds. EOF means the
  coordinator or the SSH connection is gone; with "stdin:SECONDS" the coordinator also
  writes a heartbeat, and silence that long means a cut network. Either way: kill all.
  The wrapper answers with a BEAT byte on stdout every second, so the coordinator sees a
  cut network from its end too.
- PR_SET_PDEATHSIG: the wrapper gets SIGHUP (kill at once: no grace) when its parent (the
  coordinator, or the SSH session) dies, a second path to the same cleanup; the task gets
  SIGKILL when the wrapper dies, so a SIGKILLed wrapper never leaves a task holding its
  port. What the task started then goes to the next subreaper up, the coordinator, which
  kills it (orchestrator/launch/orphans.py).
- Readiness of a user's script (job.script, job.module), which prints no markers: the
  wrapper watches the task's port (its TF_CONFIG address) and reports READY once it
  listens, i.e. once the script's strategy started its gRPC server. Entries and servers
  report their own. A one-process script opens no port: the coordinator takes its first
  step as ready (orchestrator/loop/supervise.py).
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
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import fcntl
import itertools
import json
import os
import resource
import select
import shutil
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Iterator
from typing import Any

from worker_entry import channel, markers, standby, title, usage
from worker_entry.listen import listening

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_CLEANUP_SECONDS = 5.0  # at most this long killing descendants (a fork bomb): then give up
_GRACE_SECONDS = 10.0  # from SIGTERM to SIGKILL when the plan does not say (spec's default)
# Bytes waiting to go out on our stdout: the task's pipes are not read past it (the task
# then waits on a full pipe, as it would on the coordinator's).
_OUT_LIMIT = 1 << 20
# The task's output pipe's size, and what one read takes (its MAGIC escaped, a frame's payload
# stays under channel.MAX_PAYLOAD): fewer, bigger hops through us than the default 64 KiB.
_READ_BYTES = 256 * 1024
_COALESCE_SECONDS = 0.001
_DRAIN_SECONDS = 2.0  # after the task's end: its pipes' last bytes (a straggler holds them)
_FLUSH_SECONDS = 30.0  # then, at most this long writing them out to a reader that is slow


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)


def _follow_parent(sig: signal.Signals) -> None:
    """Get `sig` when the parent dies; if it died before prctl took effect, exit now."""
    parent = os.getppid()
    _prctl(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:
        os._exit(128 + sig)


def children(root: int) -> list[int]:
    """The processes whose parent is `root`, from /proc."""
    return _children_map().get(root, [])


def descendants(root: int) -> list[int]:
    """Every process below `root`, from /proc (Linux; elsewhere none are found)."""
    children = _children_map()
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _children_map() -> dict[int, list[int]]:
    """Each live process's children, by parent pid."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # The command name may hold spaces and ')': the fields after the last ')' are
        # state, ppid, ...
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    return children


_READY_POLL_SECONDS = 0.2  # worker_entry.listen: a check costs 0.07 ms of CPU


def _script_port() -> int | None:
    """The port to watch for readiness: a script task's own, from TF_CONFIG. None for an
    entry or a server (they report READY themselves) and for a role without a port."""
    try:
        job = json.loads(os.environ.get("TFO_JOB") or "{}")
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
        if "entry" in job or job.get("serve"):
            return None
        task = config["task"]
        address = config["cluster"][task["type"]][int(task["index"])]
        return int(str(address).rsplit(":", 1)[1])
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None  # the evaluator (no port), or no plan: the runner names the problem


class _Wrapper:
    def __init__(self, task_pid: int, tmp_dir: str | None, lifeline: str | None,
                 grace: float, handler_fd: int, pipes: tuple[int, int] | None,
                 go_fd: int | None = None) -> None:
        self.task_pid, self.tmp_dir, self.grace = task_pid, tmp_dir, grace
        # The task's output and its markers (worker_entry.channel), until EOF: read by us
        # alone, and written on our stdout as frames from `out` (non-blocking: the loop
        # never waits on a reader). None: no coordinator reads us (see wrap): our markers
        # and words are text on our stdout, which the task shares.
        self.framed = pipes is not None
        self.output_fd, self.marker_fd = pipes or (None, None)
        self.marker_part = b""  # a marker line not whole yet
        self.out: deque[bytes | memoryview] = deque()  # frames' pieces, written by writev
        self.out_bytes = 0
        self.sent: list[bytes] = []  # frames from a signal handler, moved to `out` by the loop
        self.go_fd = go_fd  # a standby's, until GO: the task waits for a byte on it
        self.handler_fd: int | None = handler_fd  # the task: b"1" handler set, b"0" unset
        self.handles_sigterm = False
        # A SIGTERM whose handler ran while the loop was reading the task's report (between
        # its read and its verdict, which the handler's own read would miss): answered then.
        self._reading = self._sigterm_deferred = False
        self._closing: list[int] = []  # the handler's pipe, once at EOF
        self.ready_port = _script_port()  # None once reported
        self.watch_stdin, self.quiet_limit = markers.parse_lifeline(lifeline)
        self.status: int | None = None  # the task's wait status, once reaped
        self.lost_contact = False  # killed for the lifeline's silence: EXIT_LIFELINE
        self.kill_at: float | None = None  # after a SIGTERM: when the task gets SIGKILL
        self.meter = usage.Meter()
        self.usage_at = markers.next_usage(time.monotonic())
        self.ready_at = 0.0  # the port's next look
        self.output_at = 0.0  # the task's output pipe is read again from then
        self.last_read = 0  # bytes of the last read of it

    # ---- our stdout: frames ------------------------------------------------------------
    def _own(self, event: str, **fields: Any) -> None:
        """A marker of ours. list.append only: it may run in a signal handler."""
        text = markers.line(event, **fields).encode()
        self.sent.append(channel.frame(channel.OWN, text[1:-1]) if self.framed else text)

    def _say(self, message: str) -> None:
        """Our words, to the task's log (after what the task printed so far)."""
        text = message.encode(errors="replace")
        self.sent.append(channel.frame(channel.SAY, text) if self.framed else text + b"\n")

    def _take_sent(self) -> None:
        """Our frames first: a `sigterm` goes before what the task prints after it."""
        while self.sent:
            self._queue(self.sent.pop(0))

    def _queue(self, *pieces: bytes) -> None:
        self.out.extend(pieces)
        self.out_bytes += sum(map(len, pieces))

    def _read_output(self) -> bool:
        """The task's next bytes, as one frame: False once there are none for now."""
        assert self.output_fd is not None
        self._take_sent()
        try:
            data = os.read(self.output_fd, _READ_BYTES)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            os.close(self.output_fd)
            self.output_fd = None
            return False
        self.last_read = len(data)
        payload = channel.escape(data)
        self._queue(channel.header(channel.OUTPUT, len(payload)), payload)
        if self.out_bytes == len(payload) + channel.HEADER.size:
            self._flush()  # most often: straight on
        return True

    def _read_markers(self) -> None:
        """The task's markers, each checked to be one, after every byte the task printed
        before it (they are in its output pipe by now: emit flushes stdout first)."""
        assert self.marker_fd is not None
        self._take_sent()
        while self.output_fd is not None and self.out_bytes < _OUT_LIMIT and self._read_output():
            pass
        try:
            data = os.read(self.marker_fd, _READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            os.close(self.marker_fd)
            self.marker_fd = None
            return
        *whole, self.marker_part = (self.marker_part + data).split(b"\n")
        self.marker_part = self.marker_part[:_READ_BYTES]  # no line without end held for good
        for line in whole:
            if _is_task_marker(line):
                self._queue(channel.frame(channel.MARKER, line[1:]))

    def _flush(self, wait: bool = False) -> None:
        """`out` to our stdout, as much as it takes now (`wait`: all of it, the end, for at
        most _FLUSH_SECONDS: the task's status matters more than its last bytes)."""
        self._take_sent()
        until = time.monotonic() + _FLUSH_SECONDS
        while self.out:
            try:
                n = os.writev(1, list(itertools.islice(self.out, 64)))
            except BlockingIOError:
                if not wait or time.monotonic() > until:
                    return
                select.select([], [1], [], 1.0)
                continue
            except OSError:  # nobody reads any more (the coordinator is gone)
                self.out.clear()
                self.out_bytes = 0
                return
            self.out_bytes -= n
            while n:  # what went out: whole pieces, then the start of the next
                if len(self.out[0]) <= n:
                    n -= len(self.out.popleft())
                else:
                    self.out[0], n = memoryview(self.out[0])[n:], 0

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
                self._own(markers.SIGTERM, grace=0)
            self._kill_task()
            return
        # The marker first: the coordinator must know of the SIGTERM before the task's exit
        # 42 can reach it (and before anything the task prints about saving).
        if self.kill_at is None and self.status is None:
            self.kill_at = time.monotonic() + self.grace
            self._own(markers.SIGTERM, grace=self.grace)
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
            self.tmp_dir, self.grace, self.ready_port = _task_tmp_dir(), _grace(), _script_port()
            title.set_title(title.describe(os.environ, "wrapper", title.room()))
        if self.tmp_dir and not _make_tmp_dir(self.tmp_dir, self._say):
            self._kill_task()
        else:
            with contextlib.suppress(OSError):
                os.write(self.go_fd, markers.GO)
        os.close(self.go_fd)
        self.go_fd = None
        self.usage_at = markers.next_usage(time.monotonic())

    def _reap(self) -> None:
        for pid, status in reaped():
            if pid == self.task_pid:
                self.status = status

    def run(self) -> None:
        """Watch until the task ends; then clean up and exit like it. Never returns."""
        try:
            self._watch()
        except BaseException:  # a bug of ours: say where, and still clean up
            self._say(traceback.format_exc())
        self._end_descendants()  # the task too, if a bug left it running
        if not self.standby:
            self._drain()
        if self.tmp_dir and not self.standby:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
        if self.lost_contact:  # the task's SIGKILL was ours: say why instead
            self.status = markers.EXIT_LIFELINE << 8
        self._flush(wait=True)
        _exit_like(self.status if self.status is not None else 70 << 8)

    def _drain(self) -> None:
        """The task's last bytes and markers, up to EOF (everything that held its pipes is
        gone by now), or _DRAIN_SECONDS."""
        until = time.monotonic() + _DRAIN_SECONDS
        while (open_fds := [fd for fd in (self.output_fd, self.marker_fd) if fd is not None]) \
                and (left := until - time.monotonic()) > 0:
            full = self.out_bytes >= _OUT_LIMIT  # then only write, until there is room
            ready, writable, _ = select.select([] if full else open_fds,
                                               [1] if self.out else [], [], left)
            if writable:
                self._flush()
            if self.marker_fd in ready:
                self._read_markers()
            elif self.output_fd in ready:
                self._read_output()

    def _timeout(self, now: float) -> float | None:
        """How long select may wait: until the next duty falls due (None: no duty, a standby)."""
        due = [] if self.standby else [self.usage_at]
        if self.ready_port and not self.standby:
            due.append(self.ready_at)
        if self.quiet_limit:
            due.append(now + 0.5)
        if self.kill_at is not None:
            due.append(self.kill_at)
        if self.output_at > now:
            due.append(self.output_at)
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
        watched = [stdin] if self.watch_stdin else []  # until EOF or silence
        assert self.handler_fd is not None
        os.set_blocking(self.handler_fd, False)
        heard = beat = time.monotonic()
        while self.status is None:
            # Made anew each round: the handler's pipe leaves it at EOF. The task's pipes are
            # read once it runs (a standby's wait in them until GO) and while `out` has room.
            fds = [wake_r, *watched] + ([self.handler_fd] if self.handler_fd is not None
                                        else [])
            now = time.monotonic()
            if not self.standby and self.out_bytes < _OUT_LIMIT:
                fds += [fd for fd in (self.marker_fd,) + (
                    (self.output_fd,) if now >= self.output_at else ()) if fd is not None]
            ready, writable, _ = select.select(fds, [1] if self.out or self.sent else [], [],
                                               self._timeout(now))
            while self._closing:
                os.close(self._closing.pop())
            now = time.monotonic()
            if self.marker_fd is not None and self.marker_fd in ready:
                self._read_markers()  # the output before it first
            elif self.output_fd is not None and self.output_fd in ready \
                    and self._read_output() and self.last_read < _READ_BYTES // 4:
                # A task printing in small pieces (a line at a time, flushed) would wake us
                # for each: after a small read, the next waits _COALESCE_SECONDS.
                self.output_at = now + _COALESCE_SECONDS
            if self.ready_port and not self.standby and now >= self.ready_at:
                self.ready_at = now + _READY_POLL_SECONDS
                if listening(self.ready_port):
                    self.ready_port = None
                    self._own(markers.READY, what="training", by="port")
            if self.handler_fd is not None and self.handler_fd in ready:
                self._read_handler_state()
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                self._reap()
            if self.kill_at is not None and now >= self.kill_at:
                self.kill_at = None
                self._say(f"[tfo] task pid {self.task_pid} still running {self.grace:g} s "
                          "after SIGTERM: killing it")
                self._kill_task()
            if now >= self.usage_at and not self.standby:
                self.usage_at = markers.next_usage(now)
                self._own(markers.USAGE, **self.meter.measure(descendants(os.getpid())))
            if self.quiet_limit and now - beat >= markers.HEARTBEAT_SECONDS \
                    and not self.standby:
                beat = now
                self.sent.append(channel.frame(channel.BEAT))  # we are alive (framed: SSH)
            if writable or self.sent:
                self._flush()
            if not watched:
                continue
            lost = self.quiet_limit is not None and now - heard > self.quiet_limit
            data = b"-"  # not EOF
            if stdin in ready:
                try:
                    data = os.read(stdin, 4096)
                except OSError:
                    data = b""
                heard, lost = now, not data
                if self.standby and markers.GO in data:
                    self._go()
                elif markers.STACKS in data and not self.standby:
                    self._signal_task(getattr(signal, markers.STACKS_SIGNAL))
            if lost:
                watched.clear()
                if data:  # silence, not EOF: the network, most likely
                    self._say(f"[tfo] lost contact with the coordinator: no heartbeat for "
                              f"{self.quiet_limit:g} s; killing task pid {self.task_pid} and "
                              "everything it started")
                    self.lost_contact = True
                else:
                    self._say(f"[tfo] lifeline to the coordinator closed: killing task pid "
                              f"{self.task_pid} and everything it started")
                self._kill_task()

    def _end_descendants(self) -> None:
        """SIGKILL and reap all below us. A dying parent's children come to us, so repeat
        until none is left."""
        until = time.monotonic() + _CLEANUP_SECONDS
        while _has_children() and (left := descendants(os.getpid())) \
                and time.monotonic() < until:
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)
            self._reap()


def reaped() -> Iterator[tuple[int, int]]:
    """Every child that has ended, reaped now: (pid, wait status); never blocks."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def _has_children() -> bool:
    """Any child, exited or not (none reaped here)? A subreaper without children has no
    descendants at all (an orphan below would have come to it): then no /proc scan, which
    costs each of 64 wrappers stopping at once milliseconds of a shared core."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


_exit_code: int | None = None  # the task's own, once its main code is over (exiting_with)


def exiting_with(code: object) -> None:
    """In the task, as its main code ends: the exit status its SystemExit code makes (None:
    0; an int: its low byte; anything else: 1), said in the `exiting` marker."""
    global _exit_code
    _exit_code = 0 if code is None else code & 0xFF if isinstance(code, int) else 1


def _say_exiting() -> None:
    with contextlib.suppress(Exception):  # stdout may be closed: nothing to tell then
        if _exit_code is None:  # e.g. a KeyboardInterrupt, or code that never got there
            markers.emit(markers.EXITING)
        else:
            markers.emit(markers.EXITING, code=_exit_code)
    # The task's code is over: a SIGTERM handler can save nothing any more. What is left is
    # the interpreter's and TensorFlow's teardown, which can hang for good after a collective
    # failed (a peer's death); the wrapper then SIGKILLs at once rather than wait the grace.
    if _handler_fd is not None:
        with contextlib.suppress(OSError):
            os.write(_handler_fd, b"0")


def _is_task_marker(line: bytes) -> bool:
    """A line from the task's channel that is a marker the task may send (START, "@tfo ",
    a JSON object with an event that is not one of its wrapper's)."""
    if not line.startswith(_MARK):
        return False
    try:
        data = json.loads(line[len(_MARK):])
    except (ValueError, RecursionError):
        return True  # the coordinator says what is wrong with it (task_bad_marker)
    return not (isinstance(data, dict) and data.get("event") in channel.WRAPPER_EVENTS)


_MARK = markers.MARK.encode()


def _say(message: str) -> None:
    """To stderr, before the wrapper's frames begin (the task not forked yet)."""
    with contextlib.suppress(OSError, ValueError):
        print(message, file=sys.stderr, flush=True)


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


_handler_fd: int | None = None  # the task's end of the pipe _report_sigterm_handlers writes


def _report_sigterm_handlers(fd: int) -> None:
    """In the task: tell the wrapper (b"1"/b"0" on `fd`) whenever a Python SIGTERM handler
    is set or unset, so that it knows whether a SIGTERM can do any good (see the top)."""
    global _handler_fd
    _handler_fd = fd
    os.set_blocking(fd, False)  # a full pipe drops a report rather than block the task
    original = signal.signal

    def reporting(signalnum: int, handler: Any) -> Any:
        previous = original(signalnum, handler)
        if signalnum == signal.SIGTERM:
            with contextlib.suppress(OSError):
                os.write(fd, b"1" if callable(handler) else b"0")
        return previous

    signal.signal = reporting


def _job() -> dict:
    try:
        job = json.loads(os.environ.get("TFO_JOB") or "{}")
    except ValueError:
        return {}  # the runner names the problem
    return job if isinstance(job, dict) else {}


def _make_tmp_dir(tmp_dir: str, say: Any = None) -> bool:
    try:
        os.makedirs(tmp_dir, exist_ok=True)
    except OSError as e:
        (say or _say)(f"[tfo] cannot create the task's temp dir {tmp_dir}: {e.strerror or e}")
        return False
    return True


def _task_tmp_dir() -> str | None:
    tmp_dir = _job().get("tmp_dir")
    return os.path.expanduser(tmp_dir) if isinstance(tmp_dir, str) and tmp_dir else None


def _grace() -> float:
    grace = _job().get("grace_seconds")
    return float(grace) if isinstance(grace, int | float) and grace >= 0 else _GRACE_SECONDS


def wrap() -> None:
    """Call first thing in `python -m worker_entry`, before TensorFlow is imported.

    Returns in the task (a forked child); in the wrapper it never returns. TFO_LIFELINE:
    unset (no coordinator to follow), "stdin" (EOF means gone) or "stdin:SECONDS" (the
    coordinator also sends heartbeats; silence that long means gone).
    """
    _follow_parent(signal.SIGHUP)  # the coordinator is gone: no grace to wait out
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    waits = os.environ.get(markers.STANDBY_ENV) == "1"  # a standby: see the top
    tmp_dir = _task_tmp_dir()
    if tmp_dir:
        for var in ("TMPDIR", "TEMP", "TMP"):  # a lab host's workdir may be ~/something
            if var in os.environ:
                os.environ[var] = os.path.expanduser(os.environ[var])
        if not waits and not _make_tmp_dir(tmp_dir):
            os._exit(1)
    lifeline = os.environ.get(markers.LIFELINE_ENV)
    # A coordinator reads our stdout (every backend sets a lifeline): frames. Without one (a
    # Kubernetes pod, `python -m worker_entry` by hand) our stdout is the task's, as text.
    framed = bool(lifeline)
    sys.stdout.flush()
    sys.stderr.flush()
    handler_r, handler_w = os.pipe()  # not inherited across exec: only the task writes it
    go_r, go_w = os.pipe() if waits else (None, None)
    # The task's stdout and stderr, and its markers: pipes to us (worker_entry.channel).
    output_r, output_w = os.pipe() if framed else (-1, -1)
    if framed:
        with contextlib.suppress(OSError, AttributeError):  # Linux: fewer hops through us
            fcntl.fcntl(output_r, fcntl.F_SETPIPE_SZ, _READ_BYTES)
    # Not inherited: what the task starts cannot write it. Unframed: a copy of stdout.
    marker_r, marker_w = os.pipe() if framed else (-1, os.dup(sys.stdout.fileno()))
    # Before the fork, so setproctitle loads once (2.3-2.9 ms here); the task renames itself.
    title.set_title(title.describe(os.environ, "wrapper", title.room()))
    task_pid = os.fork()
    if task_pid == 0:
        _follow_parent(signal.SIGKILL)
        title.set_title(title.describe(os.environ, room=title.room()))  # `tfo worker:1 train.py`
        # First registered, so it runs last: after the user's and TensorFlow's handlers.
        atexit.register(_say_exiting)
        os.close(handler_r)
        _report_sigterm_handlers(handler_w)
        # Where a stalled task is stuck, on request (the wrapper signals): to its log.
        with contextlib.suppress(ValueError, OSError, RuntimeError, AttributeError):
            faulthandler.register(getattr(signal, markers.STACKS_SIGNAL), all_threads=True)
        # Its output to us, and its markers on a pipe of their own, which nothing it
        # prints can reach: a line that looks like a marker is text.
        if framed:
            os.dup2(output_w, 1)
            os.dup2(output_w, 2)
            for fd in (output_r, output_w, marker_r):
                os.close(fd)
        markers.use_channel(marker_w)
        if lifeline:  # the heartbeat is the wrapper's to read
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, sys.stdin.fileno())
            os.close(devnull)
        if go_r is not None and go_w is not None:
            os.close(go_w)  # the wrapper's end: its exit is our EOF
            standby.serve(go_r)
        return
    os.close(handler_w)
    if go_r is not None:
        os.close(go_r)
    os.close(marker_w)
    if framed:
        os.close(output_w)
        for fd in (output_r, marker_r, 1):
            os.set_blocking(fd, False)
        # Our stdout carries frames only: nothing else of ours may write into it (our words
        # go in SAY frames).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    _Wrapper(task_pid, tmp_dir, lifeline, _grace(), handler_r,
             (output_r, marker_r) if framed else None, go_w).run()
