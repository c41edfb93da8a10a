"""`tfo profile`'s helper process: one capture of many tasks' profilers, and what each trace
says of its steps. Run by the coordinator (orchestrator/launch/profiling.py), which never imports
TensorFlow nor xprof itself:

    python -m worker_entry.profiletool '{"services": {"worker:0": "localhost:41001", ...},
                                          "logdir": "runs/<id>/tensorboard", "ms": 2000}'

It prints one JSON line: {"session": DIR, "tool": ..., "tasks": {name: {...}}, "errors": ...}.

The capture is one request to every task's profiler service at once, from the same instant
(worker_entry/profilerpc.py: TensorFlow's profiler RPC, asked to send each trace back rather
than write it on the task's own machine, so that a task on a lab host or a Slurm node is
captured as a local one: its trace lands here). Each is written as
`<logdir>/plugins/profile/<session>/<task>.xplane.pb` (`worker_1.xplane.pb`), where
TensorBoard's profile tab lists it.

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
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from worker_entry import profilerpc

# The ops in which a task waits for its peers: collectives (MWMS), and the RPCs of a
# ParameterServer job (variables read from and updates sent to the ps).
COMMUNICATION_OPS = re.compile(
    r"^(Collective|NcclAllReduce|_Recv|_Send|_HostRecv|_HostSend|RecvTensor|_Retval.*Remote)")

# A capture where no task sent a trace back is tried once more (as TensorFlow's client
# retries): at load 40 one of the real test's 7 captures came back empty from every task.
ATTEMPTS = 2


def main(argv: list[str]) -> int:
    asked = json.loads(argv[0])
    services: dict[str, str] = asked["services"]
    profiles = os.path.join(asked["logdir"], "plugins", "profile")
    result: dict[str, Any] = {"tasks": {}, "errors": [], "tool": "profiler-rpc"}
    started = time.monotonic()
    got: dict[str, bytes | str] = {}
    try:
        with _quiet_stderr():
            for _ in range(ATTEMPTS):
                session = _session_name(profiles)
                got = profilerpc.capture(services, int(asked["ms"]), session, profiles)
                if any(isinstance(trace, bytes) for trace in got.values()):
                    break
    except ImportError as e:
        got = dict.fromkeys(services, f"{e} (pip install 'tf-orchestrator[profile]')")
    result["capture_seconds"] = round(time.monotonic() - started, 2)
    if not any(isinstance(trace, bytes) for trace in got.values()):
        result["errors"].append("no trace was written: " + "; ".join(
            f"{name}: {why}" for name, why in got.items()))
        print(json.dumps(result))
        return 1
    session = os.path.join(profiles, session)
    os.makedirs(session, exist_ok=True)
    result["session"] = session
    for name, trace in got.items():
        if not isinstance(trace, bytes):
            result["tasks"][name] = {"error": f"no trace: {trace}"}
            continue
        path = os.path.join(session, f"{name.replace(':', '_')}.xplane.pb")
        with open(path, "wb") as f:
            f.write(trace)
        with _quiet_stderr():
            try:
                result["tasks"][name] = analyze(path)
            except ImportError as e:
                result["tasks"][name] = {"file": path, "error": f"not analysed: {e} (pip install "
                                         "'tf-orchestrator[profile]')"}
            except Exception as e:  # noqa: BLE001 - no analysis: the trace is still there
                result["tasks"][name] = {"file": path, "error": str(e)[:300]}
    print(json.dumps(result))
    return 0


def _session_name(profiles: str) -> str:
    """The capture's directory: its time, as TensorFlow's client names one (once more with a
    suffix where a capture of the same second has it)."""
    name = time.strftime("%Y_%m_%d_%H_%M_%S")
    n = 1
    while os.path.exists(os.path.join(profiles, name if n == 1 else f"{name}_{n}")):
        n += 1
    return name if n == 1 else f"{name}_{n}"


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
def _quiet_stderr() -> Iterator[None]:
    """gRPC's and xprof's C++ log to fd 2 (absl's INFO lines): not the answer's."""
    saved = os.dup(2)
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
