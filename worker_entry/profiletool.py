"""`tfo profile`'s helper process: one capture of many tasks' profilers, and what each trace
says of its steps. Run by the coordinator (orchestrator/launch/profiling.py), which never imports
TensorFlow nor xprof itself:

    python -m worker_entry.profiletool '{"services": {"worker:0": "localhost:41001", ...},
                                          "logdir": "runs/<id>/tensorboard", "ms": 2000}'

It prints one JSON line: {"session": DIR, "tool": ..., "tasks": {name: {...}}, "errors": ...}.

The capture is one request to every task's profiler service (the profiler client's
comma-separated addresses): xprof's `trace` (`xprof.convert._pywrap_profiler_plugin`, what
TensorBoard's Capture Profile button calls) where the xprof package is installed, which needs
no TensorFlow; else TensorFlow's own `tf.profiler.experimental.client.trace`, the same C++
client behind a whole `import tensorflow` (seconds, and 0.5 GB). The client writes one
`<host>_<port>.xplane.pb` per service into `<logdir>/plugins/profile/<session>/`, which
TensorBoard's profile tab lists by that name; each is renamed here for its task (`worker_1`).

The analysis is xprof's own (`xspace_to_tool_data`), per task: its converters treat the
files of one directory as one multi-host profile (and cache the merge there as
ALL_HOSTS.op_stats_v2.pb), so each trace is linked into a directory of its own first.
`input_pipeline_analyzer` gives the step time and the time each step waited for input
(`steptime_ms_average`, `infeed_time_ms_avg`, and on a GPU `device_collectives_time_ms_avg`);
`framework_op_stats` gives each op's self time, where on a CPU the collectives
(`CollectiveReduceV2`, ...) and the PS send/receive ops show the time spent waiting for the
others. Only figures go back: the shares and the verdict are the coordinator's
(orchestrator/launch/profiling.py, pure).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
from typing import Any

# The ops in which a task waits for its peers: collectives (MWMS), and the RPCs of a
# ParameterServer job (variables read from and updates sent to the ps).
COMMUNICATION_OPS = re.compile(
    r"^(Collective|NcclAllReduce|_Recv|_Send|_HostRecv|_HostSend|RecvTensor|_Retval.*Remote)")

# A capture where no task sent a trace back is tried once more (the client's own retry): at
# load 40 one of the real test's 7 captures came back empty from every task.
ATTEMPTS = 2


def main(argv: list[str]) -> int:
    asked = json.loads(argv[0])
    services: dict[str, str] = asked["services"]
    logdir: str = asked["logdir"]
    result: dict[str, Any] = {"tasks": {}, "errors": []}
    profiles = os.path.join(logdir, "plugins", "profile")
    before = set(os.listdir(profiles)) if os.path.isdir(profiles) else set()
    started = time.monotonic()
    with _quiet_stderr() as said:
        try:
            result["tool"] = _capture(list(services.values()), logdir, int(asked["ms"]))
        except Exception as e:  # noqa: BLE001 - the client's error is the answer
            result["errors"].append(f"capture failed: {str(e).strip()[:500]}")
    result["capture_seconds"] = round(time.monotonic() - started, 2)
    new = sorted(set(os.listdir(profiles)) - before) if os.path.isdir(profiles) else []
    if not new:
        result["errors"].append("no trace was written" + _last(said))
        print(json.dumps(result))
        return 1
    session = os.path.join(profiles, new[-1])
    result["session"] = session
    files = _by_task(session, services)
    with _quiet_stderr():
        for name, path in files.items():
            try:
                result["tasks"][name] = analyze(path)
            except Exception as e:  # noqa: BLE001 - no analysis: the trace is still there
                result["tasks"][name] = {"file": path, "error": str(e)[:300]}
    for name in services:
        result["tasks"].setdefault(name, {"error": "no trace: its profiler did not answer"})
    print(json.dumps(result))
    return 0


def _capture(addresses: list[str], logdir: str, ms: int) -> str:
    """One trace of every address; which client took it."""
    try:
        from xprof.convert import _pywrap_profiler_plugin as xprof
    except ImportError:
        import tensorflow as tf

        tf.profiler.experimental.client.trace(
            ",".join(f"grpc://{a}" for a in addresses), logdir, ms,
            num_tracing_attempts=ATTEMPTS)
        return "tensorflow"
    xprof.trace(",".join(addresses), logdir, "", True, ms, ATTEMPTS,
                {"host_tracer_level": 2, "device_tracer_level": 1, "python_tracer_level": 0,
                 "delay_ms": 0})  # the client starts every task 3 s on all the same
    return "xprof"


def _by_task(session: str, services: dict[str, str]) -> dict[str, str]:
    """Each task's trace, renamed for the task: `localhost_41001.xplane.pb` → `worker_1...`."""
    found = {}
    for name, address in services.items():
        host, _, port = address.rpartition(":")
        old = os.path.join(session, f"{host}_{port}.xplane.pb")
        new = os.path.join(session, f"{name.replace(':', '_')}.xplane.pb")
        if os.path.exists(old):
            os.replace(old, new)
            found[name] = new
    return found


def analyze(path: str) -> dict[str, Any]:
    """What xprof's analyses say of one task's steps: step time, input and communication per
    step (ms), the steps seen."""
    from xprof.convert.raw_to_tool_data import xspace_to_tool_data

    with tempfile.TemporaryDirectory() as alone:
        link = os.path.join(alone, os.path.basename(path))
        os.symlink(os.path.abspath(path), link)
        pipeline = _tables(xspace_to_tool_data([link], "input_pipeline_analyzer", {})[0])
        ops = _tables(xspace_to_tool_data([link], "framework_op_stats", {})[0])
    steps_table = next((t for t in pipeline if "steptime_ms_average" in t.get("p", {})), None)
    if steps_table is None:
        return {"file": path, "steps": 0}
    p = steps_table["p"]
    steps = len(steps_table.get("rows", []))
    comm_us = sum(_op_self_us(t) for t in ops[:1])  # the first table: host and device ops
    return {"file": path, "steps": steps,
            "step_ms": float(p["steptime_ms_average"]),
            "input_ms": float(p.get("infeed_time_ms_avg", 0) or 0),
            "device_collectives_ms": float(p.get("device_collectives_time_ms_avg", 0) or 0),
            "communication_ms": comm_us / 1000 / steps if steps else 0.0,
            "conclusion": str(p.get("input_conclusion", ""))[:300]}


def _tables(data: Any) -> list[dict[str, Any]]:
    parsed = json.loads(data) if isinstance(data, (bytes, str)) else data
    return parsed if isinstance(parsed, list) else [parsed]


def _op_self_us(table: dict[str, Any]) -> float:
    """The self time (us) of the communication ops in one framework_op_stats table."""
    cols = [c.get("id") for c in table.get("cols", [])]
    try:
        kind, self_us = cols.index("type"), cols.index("total_self_time")
    except ValueError:
        return 0.0
    total = 0.0
    for row in table.get("rows", []):
        cells = [c.get("v") for c in row.get("c", [])]
        if COMMUNICATION_OPS.match(str(cells[kind])):
            total += float(cells[self_us] or 0)
    return total


@contextlib.contextmanager
def _quiet_stderr():  # type: ignore[no-untyped-def]
    """The C++ clients log to fd 2 (absl's INFO lines): kept, for an error's last line."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        said = io.StringIO()
        try:
            yield said
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            said.write(f.read().decode(errors="replace"))


def _last(said: io.StringIO) -> str:
    lines = [ln for ln in said.getvalue().splitlines() if ln.strip() and " I0" not in ln[:3]]
    return f": {lines[-1][-300:]}" if lines else ""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
