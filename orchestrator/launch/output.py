"""A task's output as it arrives, for local and SSH tasks alike.

    output = TaskOutput(task.log_path, read=lambda: os.read(fd, 65536), name="out-worker:1")
    output.lines()          # the lines that arrived since the last call
    output.close(timeout)   # after the task exited: the rest, once its output ends

A reader thread writes every byte the task prints to the task's log as it arrives, in
order, whatever the supervisor is doing: the log is always complete. The supervisor gets
the lines, for markers and the console, each held to LINE_CAP in memory: a longer line is
cut there, with a note of how many bytes more the log has. They wait in a queue bounded in
size; a task that prints faster than the supervisor takes its lines waits, as it would on
a full pipe.

What arrives is the task's wrapper's stream of frames (worker_entry.channel): the task's
bytes, its markers and its wrapper's, each in a frame of its own, so nothing the task
prints is ever read as a marker. A marker can arrive while the task is in the middle of a
line (the wrapper measures it whenever it is due): it becomes a line of its own at once,
and in the log it goes after the line it interrupted. In the log and in the lines a marker
starts with markers.START (`markers.MARK`), which the task's own bytes never do (the
wrapper escapes it). Bytes outside any frame (a python that failed before the wrapper
began, srun's own words) are text like the task's.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import BinaryIO

from orchestrator.launch import wakeup
from orchestrator.launch.printable import overstrike
from orchestrator.runs.logtimes import TimeIndex
from orchestrator.runs.rundir import write_back
from worker_entry import channel, markers

_START = markers.START.encode()
# How a usage marker's frame begins (the wrapper's own, from markers.line).
_USAGE = markers.line(markers.USAGE)[1:].rstrip("}\n").encode()

LINE_CAP = 64 * 1024  # characters of one line held in memory
QUEUE_CHARS = 4 * 1024 * 1024  # lines waiting for the supervisor, in characters


# A task that prints more lines than this a second (per task) floods: the rest of the
# second's lines go to the log only, counted, and one line says how many. Splitting,
# queueing, checking and echoing each line cost the coordinator a full core for a task
# printing 250,000 lines a second; nobody reads that many on a console.
FLOOD_LINES = 1000
FLOOD_SECONDS = 1.0


def cut_note(more: int) -> str:
    return f" [… {more} bytes more in the log]"


def flood_note(hidden: int) -> str:
    return f"[tfo] {hidden} lines not shown (more than {FLOOD_LINES} a second): the log has them"


def dropped_note(count: int) -> str:
    return f"[tfo] {count} lines not shown (tfo fell behind reading them): the log has them"


def _redraws(line: bytearray, part: bytes) -> bool:
    return any(c in part or c in line for c in (b"\r", b"\b"))


class _LineQueue:
    """Lines from the reader thread to the supervisor; `put` waits while the queue is full,
    and drops the line once the supervisor stopped reading (the log has it)."""

    def __init__(self, limit: int, block: bool = True) -> None:
        self._limit = limit
        self._block = block  # False: a full queue drops the line (counted) instead
        self._dropped = 0
        self._lines: deque[str] = deque()
        self._size = 0
        self._open = True
        self._cond = threading.Condition()
        self.full = False  # the reader waits for the supervisor
        self._woken = False  # the loop was woken for the lines queued since its last take

    def put(self, line: str, wake: bool = True) -> None:
        """`wake` False: a line the loop may take at its next round, whenever that is (a
        usage marker); the loop is woken for the first line since its last take that is
        not one."""
        with self._cond:
            if not self._block and self._lines and self._size + len(line) > self._limit:
                self._dropped += 1
                return
            while self._open and self._lines and self._size + len(line) > self._limit:
                self.full = True
                self._cond.wait()
            self.full = False
            if self._open:
                self._lines.append(line)
                self._size += len(line)
                if wake and not self._woken:  # `take` looks without the lock
                    self._woken = True
                    wakeup.notify()  # the supervisor sleeps until there is something to take

    def take(self) -> list[str]:
        if not self._lines:  # most rounds, for most tasks: no lock to take
            return []
        with self._cond:
            lines = list(self._lines)
            self._lines.clear()
            self._size = 0
            self._woken = False
            if self._dropped:
                lines.append(dropped_note(self._dropped))
                self._dropped = 0
            self._cond.notify_all()
            return lines

    def shut(self) -> list[str]:
        with self._cond:
            self._open = False
        return self.take()


class _Lines:
    """The task's bytes as lines for the supervisor: each held to LINE_CAP (a line redrawn
    with \r/\b held as last drawn), a flood beyond FLOOD_LINES a second counted, not passed
    on (flood_note). `put` passes a line on."""

    def __init__(self, put: Callable[[str], None]) -> None:
        self._put = put
        self._line = bytearray()  # the current line, up to LINE_CAP bytes
        self._more = 0  # bytes of the current line beyond LINE_CAP: in the log only
        self._window_at = time.monotonic()  # the flood budget's window: since when
        self._window_lines = 0  # lines the task printed in it
        self._hidden = 0  # lines of a flood not passed on, to be told (flood_note)

    @property
    def partial(self) -> bool:
        """A line has begun and not ended."""
        return bool(self._line or self._more)

    def split(self, data: bytes) -> None:
        if self._over_budget(data):
            # Over the budget: the lines are counted, not split one by one (the log has them).
            last = data.rfind(b"\n")
            if last >= 0:
                self._hidden += data.count(b"\n")
                self._line.clear()
                self._more = 0
                self._piece(data[last + 1:])
            else:
                self._piece(data)
            return
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            self._piece(data[start:end])
            self.end_line()
            start = end + 1
        self._piece(data[start:])

    def _piece(self, part: bytes) -> None:
        room = LINE_CAP - len(self._line)
        if len(part) > room and not self._more and _redraws(self._line, part):
            # A progress bar redrawn with \r and \b all epoch long: what the line shows at
            # the end is its last drawing, not the first 64 KiB of them. Held as drawn so far.
            drawn = overstrike((self._line + part).decode(errors="surrogateescape"))
            raw = drawn.encode(errors="surrogateescape")
            self._line = bytearray(raw[:LINE_CAP])
            self._more += max(0, len(raw) - LINE_CAP)
            return
        self._line += part[:room]
        self._more += max(0, len(part) - room)

    def _over_budget(self, data: bytes) -> bool:
        """Has the task printed more than FLOOD_LINES lines this FLOOD_SECONDS? Then the
        rest of the window's lines go to the log only, and a line says how many there were."""
        now = time.monotonic()
        if now - self._window_at >= FLOOD_SECONDS:
            self.report_hidden()
            self._window_at, self._window_lines = now, 0
        self._window_lines += data.count(b"\n")
        return self._window_lines > FLOOD_LINES

    def report_hidden(self) -> None:
        if self._hidden:
            self._put(flood_note(self._hidden))
            self._hidden = 0

    def end_line(self) -> None:
        text = self._line.decode(errors="replace").rstrip("\r")
        if self._more:
            text += cut_note(self._more)
        self._line.clear()
        self._more = 0
        self._put(text)



class TaskOutput:
    """Reads a task's output on a thread of its own; see the module's docstring.

    `read` returns the next bytes, or b"" at the end (it may raise OSError: the end too).
    """

    def __init__(self, log_path: str, read: Callable[[], bytes] | None, name: str) -> None:
        """`read` None: no thread of its own; the caller `feed`s the bytes and calls `end`
        (an SSH host's one reader, launch/hostagent.py, for all its tasks). It must never
        wait on one task's lines, so a full queue drops lines for the supervisor (the log
        has them, and a line says how many)."""
        self._read = read
        self._log: BinaryIO | None = open(log_path, "ab")  # noqa: SIM115
        self._times = TimeIndex(log_path)  # when each part was written: `tfo logs` interleaves
        self._queue = _LineQueue(QUEUE_CHARS, block=read is not None)
        self._lines = _Lines(self._queue.put)
        self._ended_line = True  # the log ends with a newline
        self._frames = channel.Reader()
        self._held: list[bytes] = []  # markers for the log once the task's line ends
        self._log_lock = threading.Lock()  # the reader and note() both write
        self._ended = threading.Event()
        if read is not None:
            threading.Thread(target=self._run, name=name, daemon=True).start()

    @property
    def done(self) -> bool:
        """The output ended (EOF) and every line is queued."""
        return self._ended.is_set()

    def feed(self, data: bytes) -> None:
        """The task's next bytes (without a thread of its own)."""
        self._feed(data)

    def end(self) -> None:
        """The task's output ended (without a thread of its own)."""
        if not self._ended.is_set():
            self._finish()

    @property
    def waiting(self) -> bool:
        """The reader waits for the supervisor to take lines (not reading meanwhile)."""
        return self._queue.full

    def lines(self) -> list[str]:
        return self._queue.take()

    def note(self, line: str) -> None:
        """A line of tfo's own about this task: into its log and its lines."""
        self._write(("" if self._ended_line else "\n") + line + "\n")
        self._queue.put(line)

    def close(self, timeout: float = 1.0) -> list[str]:
        """The lines not taken yet, once the output ended or `timeout` passed. Lines that
        arrive after that (from a straggler holding the pipe) still go to the log."""
        until = time.monotonic() + timeout
        rest: list[str] = []
        size = 0
        while not self.done and time.monotonic() < until and size < QUEUE_CHARS:
            got = self._queue.take()
            rest += got
            size += sum(map(len, got))
            self._ended.wait(0.02)
        return rest + self._queue.shut()

    def relink(self, log_path: str) -> bool:
        """The log was deleted (its run directory with it) and is made again at `log_path`:
        what it held, copied from our open file, then written on there. False: no log open
        here (the caller copies it)."""
        with self._log_lock:
            if self._log is None:
                return False
            self._log.flush()
            old, self._log = self._log, os.fdopen(write_back(self._log.fileno(), log_path), "ab")
            self._times.moved(log_path)
        old.close()
        return True

    # ---- the reader thread --------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                data = self._read()
            except OSError:
                data = b""
            if not data:
                break
            self._feed(data)
        self._finish()

    def _finish(self) -> None:
        for _kind, payload in self._frames.end():
            self._task_bytes(payload)
        if self._lines.partial:
            self._lines.end_line()
        self._lines.report_hidden()
        if not self._ended_line:
            self._write(b"\n")  # the next attempt's header starts a line of its own
        if self._held:
            self._write(b"".join(self._held))
        with self._log_lock:
            log, self._log = self._log, None
            self._times.close()
        if log is not None:
            log.close()
        self._ended.set()
        wakeup.notify()  # the output ended: `done`

    def _write(self, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        with self._log_lock:
            if self._log is None:
                return
            try:
                self._times.mark(self._log.tell())
                self._log.write(raw)
                self._log.flush()  # `tfo logs` and the summary's tail see it at once
                self._ended_line = raw.endswith(b"\n")
                return
            except OSError as e:  # e.g. a full disk: the task must not block on our log
                self._log, error = None, e
        self._queue.put(f"[tfo] cannot write the log any more: {error}")

    def _feed(self, data: bytes) -> None:
        """The wrapper's frames: the task's bytes to the log and the lines, markers as
        lines of their own."""
        text: list[bytes] = []  # the task's bytes from frames in a row: one write, one split
        for kind, payload in self._frames.feed(data):
            if kind in (channel.OUTPUT, channel.RAW):
                text.append(payload)
                continue
            if text:
                self._task_bytes(b"".join(text))
                text.clear()
            if kind in (channel.MARKER, channel.OWN):
                self._marker_line(payload, own=kind == channel.OWN)
            elif kind == channel.SAY:  # the wrapper's words ("[tfo] ..."), a traceback's lines
                for line in channel.escape(payload).decode(errors="replace").splitlines():
                    self.note(line)
        if text:
            self._task_bytes(b"".join(text))

    def _task_bytes(self, part: bytes) -> None:
        """The task's own output: to the log as it is, held markers after its line ends."""
        if self._held and (nl := part.find(b"\n")) >= 0:
            line_end, part = part[:nl + 1], part[nl + 1:]
            self._write(line_end)
            self._lines.split(line_end)
            self._write(b"".join(self._held))
            self._held.clear()
        if part:
            self._write(part)
            self._lines.split(part)

    def _marker_line(self, payload: bytes, own: bool) -> None:
        raw = _START + payload + b"\n"
        if self._ended_line:
            self._write(raw)
        else:  # the log is in the middle of the task's line: the marker goes after it
            self._held.append(raw)
        # A usage marker (every task's, every USAGE_SECONDS) is state, not an event: it waits
        # for the loop's next round, at most IDLE_SECONDS, rather than wake it (64 tasks' made
        # 10 rounds a second, each over every task).
        self._queue.put(raw[:-1].decode(errors="replace"),
                        wake=not (own and payload.startswith(_USAGE)))


# Local and Slurm tasks are child processes of ours (the task's wrapper, or srun before it):
# their lifeline is the child's stdin and their output its stdout.
def pipe_output(proc: subprocess.Popen, log_path: str, name: str) -> TaskOutput:
    """The reader of a child task's stdout (a standby's from its GO on)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    return TaskOutput(log_path, lambda: os.read(fd, 65536), name)


def send_lifeline(proc: subprocess.Popen, data: bytes) -> None:
    """Bytes down a child task's lifeline (e.g. markers.STACKS; srun passes them on to the
    wrapper); nothing when the task is gone or the pipe is closed."""
    with contextlib.suppress(OSError, ValueError):
        if proc.stdin is not None:
            proc.stdin.write(data)


def close_pipes(proc: subprocess.Popen, output: TaskOutput | None) -> None:
    """After the task exited and `output.close`: its lifeline, and its output pipe once the
    reader is done. A reader still in read() (something still has the pipe open) keeps the
    pipe: closing it under the reader could hand its number to a file opened meanwhile.
    No reader (a standby discarded before GO): both close at once."""
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    if (output is None or output.done) and proc.stdout is not None:
        with contextlib.suppress(OSError):
            proc.stdout.close()
