"""The wrapper's stdout: frames that only the wrapper writes (worker_entry.lifeline).

    MAGIC (0x1f) | kind (1 byte) | length (uint32) | payload

A task's stdout and stderr are a pipe to its wrapper, and its markers another (the
descriptor markers.use_channel holds): the wrapper reads both and writes each read as one
frame on its own stdout, the task's bytes as OUTPUT, its markers as MARKER, its own markers
as OWN. Nothing the task prints can become a marker: its bytes only ever travel as an OUTPUT
payload, and MAGIC in them is written out as the text `\\x1f` first, so MAGIC in the stream
only ever starts a frame, however a frame was cut (srun passes the stream on in pieces and
may write its own messages between them: such a frame is shown as text, never read as a
marker). The same stream reaches the coordinator from a local pipe, from srun, or inside a
host agent's OUTPUT frames (worker_entry.frames), and orchestrator/launch/output.py reads it.

Bytes outside a frame are text: what the interpreter printed before the wrapper began (an
ImportError of the task's python), a host's or srun's own words.
"""

from __future__ import annotations

import struct

MAGIC = b"\x1f"  # markers.START: a marker line in a log starts with it too
ESCAPED = b"\\x1f"  # MAGIC in the task's own bytes, as the console shows a control character
HEADER = struct.Struct(">ccI")
MAX_PAYLOAD = 1 << 20

OUTPUT = b"o"  # the task's stdout and stderr bytes (MAGIC escaped)
MARKER = b"m"  # one marker line the task wrote on its channel, `@tfo {json}`
OWN = b"w"  # one marker line of the wrapper's own (usage, sigterm, ready by port)
SAY = b"s"  # a line of the wrapper's own words for the task's log (`[tfo] ...`)
RAW = b""  # Reader: bytes outside any frame
KINDS = frozenset((OUTPUT, MARKER, OWN, SAY))
# The wrapper's markers alone: a task's marker of these kinds is dropped (a task cannot say
# it got a SIGTERM, nor what its wrapper measured).
WRAPPER_EVENTS = frozenset(("usage", "sigterm"))


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return header(kind, len(payload)) + payload


def header(kind: bytes, length: int) -> bytes:
    return HEADER.pack(MAGIC, kind, length)


def escape(data: bytes) -> bytes:
    """The task's bytes as an OUTPUT payload: no MAGIC in them."""
    return data.replace(MAGIC, ESCAPED) if MAGIC in data else data


class Reader:
    """Frames out of the wrapper's stream, fed in pieces of any size: (kind, payload) each,
    kind RAW for bytes outside a frame (MAGIC in them escaped)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []  # a frame not whole yet, in the pieces it came in
        self._size = 0  # their bytes
        self._need = 0  # the bytes it takes: its header, then the whole frame

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        if self._parts:  # a frame of 256 KiB comes in four reads: joined once, when whole
            self._parts.append(data)
            self._size += len(data)
            if self._size < self._need:
                return []
            buf, self._parts, self._size = b"".join(self._parts), [], 0
        else:
            buf = data
        found: list[tuple[bytes, bytes]] = []
        at, size = 0, len(buf)
        while at < size:
            if buf[at] != MAGIC[0]:
                mark = buf.find(MAGIC, at)
                stop = size if mark < 0 else mark
                found.append((RAW, buf[at:stop]))
                at = stop
                continue
            if size - at < HEADER.size:
                break
            _, kind, length = HEADER.unpack_from(buf, at)
            if kind not in KINDS or length > MAX_PAYLOAD:  # not a frame: MAGIC as text
                found.append((RAW, ESCAPED))
                at += 1
                continue
            end = at + HEADER.size + length
            if end > size:
                break
            found.append((kind, buf[at + HEADER.size:end]))
            at = end
        if at < size:  # the start of a frame: MAGIC, then too few bytes for it yet
            self._parts, self._size = [buf[at:]], size - at
            self._need = HEADER.size
            if self._size >= HEADER.size:
                self._need += HEADER.unpack_from(buf, at)[2]
        return found

    def end(self) -> list[tuple[bytes, bytes]]:
        """The stream ended: a frame cut short is text."""
        rest, self._parts, self._size = b"".join(self._parts), [], 0
        return [(RAW, escape(rest))] if rest else []
