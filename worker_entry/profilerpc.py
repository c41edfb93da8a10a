"""TensorFlow's profiler RPC, asked to send each task's trace back to the one who asked:
`tfo profile`'s capture (worker_entry/profiletool.py), wherever the tasks run.

    got = profilerpc.capture({"worker:0": "10.200.0.11:41001", ...}, ms=2000)
    got["worker:0"]  # the XSpace's bytes (`<task>.xplane.pb`), or the error's words

Why not TensorFlow's client (`tf.profiler.experimental.client.trace`, xprof's `trace`): its
request leaves `emit_xspace` unset, and each task's profiler service then writes its trace
itself, under the request's `repository_root` on the task's own machine
(`ProfilerServiceImpl::Profile` → `SaveXSpace`, xla/tsl/profiler/rpc). For a task on a lab host
or a Slurm node that is the coordinator's run directory's path on that host: the trace is not
where `tfo profile` says (only a shared filesystem hid it). With `emit_xspace` (TensorFlow
2.21's service honours it) the service answers with the trace instead, over the same
connection the request came on, and it is written here.

The request is the client's own (`PopulateProfileRequest` in xla/tsl's capture_profile.cc):
the trace's duration, `max_events`, the session and host names, the tools, and the
ProfileOptions (host tracer level 2, device tracer 1, no Python tracer, dataset ops). Every
task is asked at once, from a thread each, with the same `start_timestamp_ns` (`DELAY_MS`
ahead: every service waits until then, so all trace the same seconds, as the client's list
of addresses does). The messages are a few fields, encoded and read here by hand
(protobuf's wire format): TensorFlow ships no Python module for this service, and the
coordinator's side imports no TensorFlow. grpcio is the only need (the `profile` extra).
"""

from __future__ import annotations

import threading
import time

SERVICE = "/tensorflow.ProfilerService/Profile"
DELAY_MS = 2000  # the request reaches every task before the common start, at load 40 too
CONNECT_SECONDS = 10.0  # a service that does not take the connection in this long: none
# (a port another process holds may accept and never speak gRPC)
SLACK_SECONDS = 30  # an answer's time beyond the trace: collecting and sending the trace
MAX_EVENTS = 1_000_000  # the client's kMaxEvents


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: int | bool | str | bytes) -> bytes:
    """One field in protobuf's wire format: an integer as a varint, text as bytes."""
    if isinstance(value, (bool, int)):
        return _varint(number << 3) + _varint(int(value))
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def request(ms: int, start_ns: int, session: str, host: str, repository: str) -> bytes:
    """A ProfileRequest (tsl/profiler/protobuf/profiler_service.proto) with emit_xspace."""
    opts = b"".join([
        _field(1, True),  # include_dataset_ops
        _field(2, 2),  # host_tracer_level
        _field(3, 1),  # device_tracer_level
        _field(5, 1),  # version
        _field(8, start_ns),  # start_timestamp_ns
        _field(9, ms),  # duration_ms
    ])
    return b"".join([
        _field(1, ms),  # duration_ms
        _field(2, MAX_EVENTS),
        _field(3, "xplane.pb"),  # tools
        _field(4, opts),
        _field(5, repository),  # repository_root: unused with emit_xspace
        _field(6, session),
        _field(7, host),
        _field(9, True),  # emit_xspace
    ])


def fields(data: bytes) -> dict[int, list[int | bytes]]:
    """A message's fields by number (varints as ints, length-delimited ones as bytes)."""
    found: dict[int, list[int | bytes]] = {}
    i = 0

    def varint() -> int:
        nonlocal i
        value = shift = 0
        while True:
            if i >= len(data):
                raise ValueError("truncated message")
            b = data[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    while i < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value = varint()
        else:
            if wire not in (1, 2, 5):
                raise ValueError(f"wire type {wire}")
            size = varint() if wire == 2 else 8 if wire == 1 else 4  # fixed 64 / 32 bits
            if i + size > len(data):
                raise ValueError("truncated message")
            value, i = data[i:i + size], i + size
        found.setdefault(number, []).append(value)
    return found


def xspace_of(response: bytes) -> bytes:
    """The trace in a ProfileResponse (xspace = 8), b"" for an empty one (empty_trace = 7)."""
    got = fields(response)
    space = got.get(8, [b""])[-1]
    return space if isinstance(space, bytes) and not got.get(7, [0])[-1] else b""


def capture(services: dict[str, str], ms: int, session: str, repository: str = "",
            delay_ms: int = DELAY_MS) -> dict[str, bytes | str]:
    """Trace every service (`name: host:port`) for `ms`, all from the same instant; per name
    its trace's bytes, or why there is none."""
    import grpc

    start_ns = time.time_ns() + delay_ms * 1_000_000
    got: dict[str, bytes | str] = {}

    def one(name: str, address: str) -> None:
        host = address.rpartition(":")[0].strip("[]")
        channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", -1)])
        try:
            grpc.channel_ready_future(channel).result(timeout=CONNECT_SECONDS)
            answer = channel.unary_unary(SERVICE)(
                request(ms, start_ns, session, host, repository),
                timeout=(delay_ms + ms) / 1000 + SLACK_SECONDS)
            got[name] = xspace_of(answer) or "its trace was empty"
        except grpc.FutureTimeoutError:
            got[name] = "its profiler did not answer"
        except grpc.RpcError as e:  # the task gone while traced (UNAVAILABLE), ...
            got[name] = f"its profiler did not answer ({e.code().name}: {e.details()})"[:300]
        except ValueError as e:
            got[name] = f"its answer is not a profile: {e}"
        finally:
            channel.close()

    threads = [threading.Thread(target=one, args=item, daemon=True)
               for item in services.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got
