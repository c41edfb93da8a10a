"""What `tfo run` shows on stdout: the tasks' lines, filtered, never holding up supervision.

    writer = ConsoleWriter(sys.stdout.fileno())
    echo = console_echo(writer.write, verbose=False)   # the supervisor's echo(task, line)
    writer.set_footer(lambda: table_text)        # on a terminal: a block kept below the lines
    ...
    writer.close()                               # writer.dropped, writer.broken

The supervisor hands lines to a bounded buffer that a thread of its own writes out: a
reader that does not keep up (`| less` left waiting, `| sleep 600`) costs console lines,
counted, never the supervisor's time; a reader that goes away (`| head -1`) ends the echo,
not the job. The tasks' logs have every line either way.

On a terminal the live view (orchestrator/cli/liveview.py) sets a footer: the same thread erases
it, writes the lines above it and draws it again, so only one thread ever writes to the
terminal. A task's line is untrusted: `printable` escapes control characters (ANSI included)
before it reaches a terminal; the logs keep the bytes as printed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

from orchestrator.launch.printable import printable

BUFFER_CHARS = 1024 * 1024  # console text waiting for a slow reader
# With a footer, each write redraws it: batch lines for this long rather than redraw per line.
FOOTER_BATCH_SECONDS = 0.1




class ConsoleWriter:
    """Writes lines to a file descriptor from a thread; see the module's docstring."""

    def __init__(self, fd: int, limit: int = BUFFER_CHARS) -> None:
        self._fd, self._limit = fd, limit
        self._lines: deque[str] = deque()
        self._size = 0
        self._cond = threading.Condition()
        self._unannounced = 0  # drops the reader has not been told about yet
        self._written = 0  # lines written: progress, for close()
        self._inflight = 0  # lines the thread is writing now
        self.dropped = 0
        self.broken = False  # no more echo: the reader went away, or close()
        self.reader_gone = False  # the reader closed the pipe (`| head -1`)
        self._footer: Callable[[], str] | None = None  # renders the block kept below the lines
        self._footer_dirty = False  # a new footer (or none) waits to be drawn
        self._footer_height = 0  # lines of the footer on the screen now
        self._thread = threading.Thread(target=self._run, name="console", daemon=True)
        self._thread.start()

    def write(self, line: str) -> None:
        """Queues one line (newline added); never waits."""
        with self._cond:
            if self.broken:
                return
            if self._size + len(line) > self._limit:
                self.dropped += 1
                self._unannounced += 1
                return
            self._lines.append(line)
            self._size += len(line)
            self._cond.notify()

    def set_footer(self, render: Callable[[], str] | None) -> None:
        """The block to keep below the lines, replacing the last (None: erase it). `render`
        runs on the writer's thread, so it must read only data of its own; never waits."""
        with self._cond:
            if self.broken:
                return
            self._footer, self._footer_dirty = render, True
            self._cond.notify()

    def close(self, stall_seconds: float = 1.0, limit_seconds: float = 10.0) -> None:
        """Waits for the buffer to go out, while the reader makes progress (at most
        `limit_seconds`); what is still buffered then counts as dropped."""
        until = time.monotonic() + limit_seconds
        with self._cond:
            seen, stalled_at = self._written, time.monotonic()
            while (self._lines or self._inflight or self._footer_dirty) and not self.broken \
                    and time.monotonic() < until:
                self._cond.wait(0.05)
                if self._written != seen:
                    seen, stalled_at = self._written, time.monotonic()
                elif time.monotonic() - stalled_at > stall_seconds:
                    break
            if not self.broken:
                self.dropped += len(self._lines) + self._inflight
            self._lines.clear()
            self.broken = True  # nothing more goes out; the thread may stay blocked in write

    def _run(self) -> None:
        footer = ""  # the footer's text, as last rendered
        while True:
            with self._cond:
                while not (self._lines or self._footer_dirty) and not self.broken:
                    self._cond.wait()
                if self.broken:
                    return
                if self._footer is not None or self._footer_height:
                    self._cond.wait(FOOTER_BATCH_SECONDS)  # let lines gather: one redraw
                    if self.broken:
                        return
                lines = list(self._lines)
                self._lines.clear()
                self._size = 0
                self._inflight = len(lines)
                if self._unannounced:
                    lines.append(f"[tfo] {self._unannounced} console lines dropped (slow "
                                 f"reader); the logs have them")
                    self._unannounced = 0
                render, dirty, self._footer_dirty = self._footer, self._footer_dirty, False
            if dirty:  # rendered once per footer, however many line batches it is redrawn for
                footer = _footer_text(render)
            text = "".join(f"{line}\n" for line in lines)
            if self._footer_height or footer:
                # Back to the footer's first line, erase to the end, lines, the footer again.
                erase = f"\r\x1b[{self._footer_height}A\x1b[J" if self._footer_height else ""
                text = erase + text + footer
                self._footer_height = footer.count("\n")
            try:
                _write_all(self._fd, text.encode(errors="replace"))
            except OSError as e:
                with self._cond:
                    self.broken = True
                    self._lines.clear()
                    self._cond.notify_all()
                if e.errno == errno.EPIPE:
                    self.reader_gone = True
                    point_at_devnull(self._fd)
                return
            with self._cond:
                self._written += len(lines)
                self._inflight = 0
                self._cond.notify_all()


def _footer_text(render: Callable[[], str] | None) -> str:
    if render is None:
        return ""
    try:
        text = render()
    except Exception as e:  # noqa: BLE001 - a bug of the view must not end the console
        text = f"[tfo] live view failed: {e!r}"
    return text if not text or text.endswith("\n") else text + "\n"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:  # a stdout left non-blocking by another program
            select.select([], [fd], [], 1.0)


def point_at_devnull(fd: int) -> None:
    """The reader closed the pipe: from now on, whatever writes to `fd` (print, rich, the
    exit-time flush of sys.stdout) writes nowhere, without an error."""
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)


# TensorFlow's C++ INFO/WARNING lines (glog format) and its start-up banners: in the task
# logs, not on the console. Errors (E lines) show, but for the one TF prints on every machine
# without a GPU (after it said so in an INFO line).
_GLOG_INFO = re.compile(r"^[IW]\d{4} \d+:\d+:\d+\.\d+\s+\d+ \S+:\d+\]")
_BANNERS = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|^To enable the following instructions: .* rebuild TensorFlow")
_NO_GPU = re.compile(r"Could not find cuda drivers on your machine, GPU will not be used")
_NO_GPU_ERROR = re.compile(r"^E\d{4} [\d:. ]+\d+ cuda_platform\.cc:\d+\] failed call to cuInit")
# The further lines of a multi-line INFO message: a ConfigProto dump (after "SessionOptions:"),
# the task names after "Example stragglers:".
_CONTINUATION = re.compile(
    r"^\s*$|^\s*\w+ \{$|^\s*\}$|^\s*\w+: (\"[^\"]*\"|[-+.\w]+)$|^/job:\w+/replica:\d+/task:\d+$")


class ChatterFilter:
    """Which task lines are TensorFlow's chatter. Keeps per task whether the last shown-or-
    hidden line was a hidden INFO line (its message may go on over more lines) and whether
    TF said there is no GPU."""

    def __init__(self) -> None:
        self._in_message: set[str] = set()
        self._no_gpu: set[str] = set()

    def hides(self, task: str, line: str) -> bool:
        if _GLOG_INFO.match(line):
            self._in_message.add(task)
            if _NO_GPU.search(line):
                self._no_gpu.add(task)
            return True
        if task in self._in_message and _CONTINUATION.match(line):
            return True
        self._in_message.discard(task)
        if _BANNERS.match(line):
            return True
        return task in self._no_gpu and bool(_NO_GPU_ERROR.match(line))


TFO = "tfo"  # the echo's task name for tfo's own lines


def console_echo(write: Callable[[str], None], verbose: bool, logs: bool = True,
                 seen: Callable[[str, str], None] | None = None) -> Callable[[str, str], None]:
    """The supervisor's echo: `[task] line` to `write` (ConsoleWriter.write), escaped, TF's
    chatter hidden unless verbose; without `logs` only tfo's own lines. `seen(task, line)`
    gets each task line that is not chatter, shown or not (the live view's last line)."""
    chatter = ChatterFilter()

    def echo(task: str, line: str) -> None:
        if task != TFO and (not verbose and chatter.hides(task, line)):
            return
        if seen is not None and task != TFO:
            seen(task, line)
        if logs or task == TFO:
            write(f"[{task}] {printable(line)}")

    return echo


def reopen_closed_std_streams() -> None:
    """A standard stream whose fd was closed when tfo started (`tfo run … 2>&-`, a daemon's
    child) is None in Python, and printing to it was a traceback (once a run had started:
    a failed job). It goes to /dev/null instead: those lines are dropped, events.jsonl and
    the task logs have it all."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is None:
            null = os.open(os.devnull, os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            setattr(sys, name, open(fd, "w", closefd=False))  # noqa: SIM115 (for good)
