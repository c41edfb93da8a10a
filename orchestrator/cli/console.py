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

Lines are read as records, in the console only (the logs keep every line): a C++ log
record's tab-indented further lines go with it (`Records`); tfo's own frames in a task's
Python traceback are left out (`OwnFrames`); the same line again within REPEAT_SECONDS is
counted, and the count said once (`Repeats`).
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
        self._footer_widths: list[int] = []  # their widths, in columns
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
                # Its height now: a terminal made narrower since rewrapped its lines.
                height = rows_on(self._footer_widths, _columns(self._fd))
                erase = f"\r\x1b[{height}A\x1b[J" if height else ""
                text = erase + text + footer
                self._footer_widths = [cell_width(line) for line in footer.split("\n")[:-1]]
                self._footer_height = len(self._footer_widths)
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


_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def cell_width(line: str) -> int:
    """Columns a line of the footer takes: its text without escape sequences (rich's
    cell_len: wide characters take two)."""
    from rich.cells import cell_len  # loaded by then: the footer is rich's rendering

    return cell_len(_ESCAPE.sub("", line))


def rows_on(widths: list[int], columns: int | None) -> int:
    """Rows lines of these widths take on a terminal `columns` wide, as one that rewraps
    its lines on a resize (tmux, VTE, kitty, iTerm2) shows them; a line as wide as the
    terminal takes one row."""
    if not columns:
        return len(widths)
    return sum(max(1, -(-w // columns)) for w in widths)


def _columns(fd: int) -> int | None:
    try:
        return os.get_terminal_size(fd).columns or None
    except OSError:
        return None


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
    r"^\s*$|^\s*\w+ \{$|^\s*\}$|^\s*\w+: (\"[^\"]*\"|[-+.\w]+)$|^/job:\w+/replica:\d+/task:\d+$"
    r"|^\t")
# Any record of TensorFlow's C++ log (glog: I, W, E or F), and the lines that go on with one:
# TF indents them with a tab (`\t [[{{node PyFunc}}]]`, an error's op and its inputs).
_GLOG = re.compile(r"^[IWEF]\d{4} \d+:\d+:\d+\.\d+\s+\d+ \S+:\d+\]")
_GOES_ON = re.compile(r"^\t")


class Records:
    """Which of a task's lines begin a record: a C++ log record's tab-indented lines go with
    it (shown or hidden with it, never a task's "last line" on their own)."""

    def __init__(self) -> None:
        self._in_glog: set[str] = set()

    def begins(self, task: str, line: str) -> bool:
        if _GLOG.match(line):
            self._in_glog.add(task)
            return True
        if task in self._in_glog and _GOES_ON.match(line):
            return False
        self._in_glog.discard(task)
        return True


# A frame of tfo's own code in a task's Python traceback (the wrapper's, between the
# script's frames and TensorFlow's): the log keeps it; the console leaves it out, so the
# traceback points at the user's code and TensorFlow's, not at tfo.
_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line \d+, in ')
_OURS = re.compile(r"(^|[/\\])(worker_entry|orchestrator)([/\\]\w+)+\.py$|^<frozen runpy>$")


class OwnFrames:
    """Hides tfo's frames in a task's tracebacks: a `File "…/worker_entry/x.py"` line and
    the source lines under it (indented deeper), per task."""

    def __init__(self) -> None:
        self._hiding: set[str] = set()

    def hides(self, task: str, line: str) -> bool:
        if (m := _FRAME.match(line)) is not None:
            if _OURS.search(m["file"]):
                self._hiding.add(task)
                return True
            self._hiding.discard(task)
            return False
        if task in self._hiding and line.startswith("    "):
            return True
        self._hiding.discard(task)
        return False


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


# The same line again from a task within this long of its first showing is counted, not
# shown (a ParameterServer chief printed 21 identical "Failed to register function
# remotely" errors while a worker restarted); its log keeps every one.
REPEAT_SECONDS = 30.0
# A C++ log record's time and thread: two records saying the same differ only there.
_GLOG_STAMP = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ ")


def repeat_note(more: int, seconds: float) -> str:
    within = f" in {seconds:.0f} s" if seconds >= 1 else ""
    return f"… {more} more like this{within}"


class Repeats:
    """Per task: a line equal to the last one shown (a C++ record's message, its time
    aside), within REPEAT_SECONDS of it, is counted instead; the count is said
    (`repeat_note`) before the task's next different line, or at `flush`. Empty lines are
    never counted."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._shown: dict[str, tuple[str, float]] = {}  # task: (its last line's key, when)
        self._more: dict[str, tuple[int, float]] = {}  # task: (repeats counted, the last's time)

    def lines(self, task: str, line: str) -> list[str]:
        """What to show for `line`: nothing (a repeat), or the line, after a note of the
        repeats before it."""
        key, now = _GLOG_STAMP.sub(r"\1 ", line), self._clock()
        shown = self._shown.get(task)
        if key.strip() and shown is not None and shown[0] == key \
                and now - shown[1] <= REPEAT_SECONDS:
            self._more[task] = (self._more.get(task, (0, now))[0] + 1, now)
            return []
        note = self._note(task)
        self._shown[task] = (key, now)
        return [*note, line]

    def _note(self, task: str) -> list[str]:
        more = self._more.pop(task, None)
        if more is None:
            return []
        return [repeat_note(more[0], more[1] - self._shown[task][1])]

    def flush(self) -> list[tuple[str, str]]:
        """(task, note) for each task's repeats not said yet."""
        return [(task, note) for task in list(self._more) for note in self._note(task)]


class ConsoleEcho:
    """The supervisor's echo: `[task] line` to `write` (ConsoleWriter.write), escaped, TF's
    chatter and tfo's own traceback frames hidden unless verbose, a line repeated counted
    (Repeats); without `logs` only tfo's own lines. `seen(task, line)` gets each task line
    that is not chatter and begins a record, shown or not (the live view's last line). A
    C++ log record's further lines go where its first went: shown, hidden or counted.
    A job on several hosts prefixes each line with its host too (`[worker:1@gpu2]`);
    `only` (--show) keeps the others' lines to their logs (and the live view's last line)."""

    def __init__(self, write: Callable[[str], None], verbose: bool, logs: bool = True,
                 seen: Callable[[str, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 prefixes: dict[str, str] | None = None, only: set[str] | None = None) -> None:
        self._write, self._verbose, self._logs, self._seen = write, verbose, logs, seen
        self._prefixes = prefixes or {}  # task: its prefix, where not its name (its host too)
        self._only = only  # the tasks whose lines show (--show); None: all
        self._chatter, self._frames, self._records = ChatterFilter(), OwnFrames(), Records()
        self._repeats = Repeats(clock)
        self._counted: set[str] = set()  # tasks whose current record was a counted repeat

    def __call__(self, task: str, line: str) -> None:
        if task == TFO:
            self._write(f"[{task}] {printable(line)}")
            return
        if not self._verbose and (self._chatter.hides(task, line)
                                  or self._frames.hides(task, line)):
            return
        begins = self._records.begins(task, line)
        if begins and self._seen is not None:
            self._seen(task, line)
        if not self._logs or (self._only is not None and task not in self._only):
            return
        if begins:
            shown = self._repeats.lines(task, line)
            if shown:
                self._counted.discard(task)
            else:
                self._counted.add(task)
        else:
            shown = [] if task in self._counted else [line]
        prefix = self._prefixes.get(task, task)
        for text in shown:
            self._write(f"[{prefix}] {printable(text)}")

    def flush(self) -> None:
        """Says the repeats counted and not said yet (the run's end)."""
        for task, note in self._repeats.flush():
            self._write(f"[{self._prefixes.get(task, task)}] {note}")


def console_echo(write: Callable[[str], None], verbose: bool, logs: bool = True,
                 seen: Callable[[str, str], None] | None = None,
                 prefixes: dict[str, str] | None = None,
                 only: set[str] | None = None) -> ConsoleEcho:
    """The supervisor's echo (ConsoleEcho): `prefixes` a task's where not its name
    (`worker:1@gpu2`), `only` the tasks whose lines show (None: all)."""
    return ConsoleEcho(write, verbose, logs, seen, prefixes=prefixes, only=only)


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
