"""The wrapper's stdout (worker_entry.channel): the task's output and markers relayed as
frames, with the wrapper's own markers and words, never waiting on the reader.

The task's stdout and stderr come on one pipe, its markers on another that nothing it prints
can reach (a line that only looks like a marker stays text). Each marker goes out after
every byte the task printed before it (`emit` flushes stdout first, so they are in the
output pipe by then). What waits to go out is held in `out`, written by writev as the reader
takes it; past _OUT_LIMIT the task's pipes are not read (the task then waits on a full pipe,
as it would on the coordinator's). Unframed (no coordinator reads us, see lifeline.start),
our markers and words are text on our stdout, which the task shares.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import time
from collections import deque
from typing import Any

from worker_entry import channel, markers

_OUT_LIMIT = 1 << 20  # bytes waiting to go out on our stdout: no more reads of the task's
# The task's output pipe's size, and what one read takes (its MAGIC escaped, a frame's payload
# stays under channel.MAX_PAYLOAD): fewer, bigger hops through us than the default 64 KiB.
READ_BYTES = 256 * 1024
_COALESCE_SECONDS = 0.001
_DRAIN_SECONDS = 2.0  # after the task's end: its pipes' last bytes (a straggler holds them)
_FLUSH_SECONDS = 30.0  # then, at most this long writing them out to a reader that is slow
_MARK = markers.MARK.encode()


class Relay:
    """Our stdout: the task's pipes (`pipes`: output, markers; None: unframed) and our own
    frames, out in order."""

    def __init__(self, pipes: tuple[int, int] | None) -> None:
        # The task's output and its markers, until EOF: read by us alone, and written on our
        # stdout as frames from `out` (non-blocking: the loop never waits on a reader).
        self.framed = pipes is not None
        self.output_fd, self.marker_fd = pipes or (None, None)
        self.marker_part = b""  # a marker line not whole yet
        self.out: deque[bytes | memoryview] = deque()  # frames' pieces, written by writev
        self.out_bytes = 0
        self.sent: list[bytes] = []  # frames from a signal handler, moved to `out` by the loop
        self.output_at = 0.0  # the task's output pipe is read again from then
        self.last_read = 0  # bytes of the last read of it

    def own(self, event: str, **fields: Any) -> None:
        """A marker of ours. list.append only: it may run in a signal handler."""
        text = markers.line(event, **fields).encode()
        self.sent.append(channel.frame(channel.OWN, text[1:-1]) if self.framed else text)

    def say(self, message: str) -> None:
        """Our words, to the task's log (after what the task printed so far)."""
        text = message.encode(errors="replace")
        self.sent.append(channel.frame(channel.SAY, text) if self.framed else text + b"\n")

    @property
    def pending(self) -> bool:
        """Anything to write out?"""
        return bool(self.out or self.sent)

    def readable(self, now: float) -> list[int]:
        """The task's pipes to read now: while `out` has room; its output after a pause."""
        if self.out_bytes >= _OUT_LIMIT:
            return []
        return [fd for fd in (self.marker_fd,) + (
            (self.output_fd,) if now >= self.output_at else ()) if fd is not None]

    def due(self, now: float) -> float | None:
        """When the output pipe is read again, if it waits."""
        return self.output_at if self.output_at > now else None

    def on_ready(self, ready: list[int], now: float) -> None:
        """Read what select found ready: the markers (the output before them first), else
        the output."""
        if self.marker_fd is not None and self.marker_fd in ready:
            self._read_markers()
        elif self.output_fd is not None and self.output_fd in ready \
                and self._read_output() and self.last_read < READ_BYTES // 4:
            # A task printing in small pieces (a line at a time, flushed) would wake us
            # for each: after a small read, the next waits _COALESCE_SECONDS.
            self.output_at = now + _COALESCE_SECONDS

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
            data = os.read(self.output_fd, READ_BYTES)
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
            self.flush()  # most often: straight on
        return True

    def _read_markers(self) -> None:
        """The task's markers, each checked to be one, after every byte the task printed
        before it (they are in its output pipe by now: emit flushes stdout first)."""
        assert self.marker_fd is not None
        self._take_sent()
        while self.output_fd is not None and self.out_bytes < _OUT_LIMIT and self._read_output():
            pass
        try:
            data = os.read(self.marker_fd, READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            os.close(self.marker_fd)
            self.marker_fd = None
            return
        *whole, self.marker_part = (self.marker_part + data).split(b"\n")
        self.marker_part = self.marker_part[:READ_BYTES]  # no line without end held for good
        for line in whole:
            if _is_task_marker(line):
                self._queue(channel.frame(channel.MARKER, line[1:]))

    def flush(self, wait: bool = False) -> None:
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

    def drain(self) -> None:
        """The task's last bytes and markers, up to EOF (everything that held its pipes is
        gone by now), or _DRAIN_SECONDS."""
        until = time.monotonic() + _DRAIN_SECONDS
        while (open_fds := [fd for fd in (self.output_fd, self.marker_fd) if fd is not None]) \
                and (left := until - time.monotonic()) > 0:
            full = self.out_bytes >= _OUT_LIMIT  # then only write, until there is room
            ready, writable, _ = select.select([] if full else open_fds,
                                               [1] if self.out else [], [], left)
            if writable:
                self.flush()
            if self.marker_fd in ready:
                self._read_markers()
            elif self.output_fd in ready:
                self._read_output()


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
