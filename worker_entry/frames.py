"""The host agent's wire format (worker_entry.agent ↔ orchestrator/launch/ssh/hostagent.py).

One SSH channel carries every task of a host, both ways, as frames:

    kind (1 byte) | slot (uint32, the task's number on this channel) | length (uint32) | payload

A task's output is untrusted: it never reaches the channel as it is. The agent reads each
task's stdout from a pipe of its own and writes it as the payload of an OUTPUT frame whose
header (kind, slot, length) the agent alone writes, so no byte a task prints can end a
frame early, start one of its own, or speak for another slot or for the agent. The
coordinator drops everything before SYNC (a login shell's chatter) and treats a malformed
header (unknown kind, a payload over MAX_PAYLOAD) as a lost host.
"""

from __future__ import annotations

import struct

HEADER = struct.Struct(">cII")
MAX_PAYLOAD = 1 << 20
SYNC = b"\x00tfo-agent 1\n"  # the agent's first bytes: frames follow

# coordinator → agent
BEAT = b"b"  # I am here (every HEARTBEAT_SECONDS, both ways)
START = b"s"  # payload: JSON {command, env, cwd, standby}
SIGNAL = b"k"  # payload: a signal's name without SIG ("TERM", "KILL")
INPUT = b"i"  # payload: bytes for the task's wrapper's stdin (GO, STACKS)
CLEAN = b"c"  # payload: the task's temp dir, removed (and its parent, if empty)
QUIT = b"q"  # kill every task and exit
# agent → coordinator
ALIVE = b"B"
STARTED = b"P"  # payload: the wrapper's pid (ASCII)
FAILED = b"F"  # payload: why it could not start (UTF-8)
OUTPUT = b"O"  # payload: the task's bytes
EXITED = b"X"  # payload: its code (ASCII; -N: killed by signal N), after its last OUTPUT

TO_AGENT = frozenset((BEAT, START, SIGNAL, INPUT, CLEAN, QUIT))
TO_COORDINATOR = frozenset((ALIVE, STARTED, FAILED, OUTPUT, EXITED))


def frame(kind: bytes, slot: int = 0, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, slot, len(payload)) + payload


class FrameError(ValueError):
    """The stream is not ours (or was cut mid-frame and resumed): give up on it."""


class Reader:
    """Frames out of a byte stream fed in pieces of any size."""

    def __init__(self, kinds: frozenset[bytes]) -> None:
        self._kinds = kinds
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, int, bytes]]:
        self._buf += data
        found = []
        at = 0
        while len(self._buf) - at >= HEADER.size:
            kind, slot, size = HEADER.unpack_from(self._buf, at)
            if kind not in self._kinds or size > MAX_PAYLOAD:
                raise FrameError(f"bad frame header {bytes(self._buf[at:at + 9])!r}")
            end = at + HEADER.size + size
            if end > len(self._buf):
                break
            found.append((kind, slot, bytes(self._buf[at + HEADER.size:end])))
            at = end
        del self._buf[:at]
        return found
