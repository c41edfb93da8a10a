"""Golden event sequences: what a scenario wrote to events.jsonl, kept in
tests/data/golden/<suite>/<test>.json, so that moving the supervisor's code provably keeps
its behaviour (issue 25). A run's times, pids and measured waits differ between runs and are
stripped; everything else (which events, in which order, their tasks, attempts, exit codes,
reasons) must stay as recorded.

    TFO_GOLDEN=record pytest -p no:xdist tests/test_supervise.py   # (re)record

A recorded file is compared, never rewritten, in an ordinary run: a change in behaviour is a
failing test, and a wanted one is recorded again on purpose (and reviewed in the diff)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
RECORD = os.environ.get("TFO_GOLDEN") == "record"
# What differs from one run of the same scenario to the next.
VARYING = {"time", "pid", "coordinator_pid", "coordinator_created", "coordinator_host",
           "run_id", "waited"}
# Per-task streams whose interleaving with other tasks' events depends on timing: their
# count and content per task is kept, their place in the whole sequence is not.
# How a restart began (task_resumed) is said at its first progress, and its steps are counted.
UNORDERED = {"task_usage", "task_progress", "task_first_step", "task_standby_started",
             "task_standby_lost", "task_standby_failed", "task_resumed"}
# What tasks print (their markers) arrives in the order the loop reads them, which for two
# tasks that print at about the same moment depends on timing: in a row of such events,
# each task's keep their order, the tasks are put in name order.
PRINTED = {f"task_{m}" for m in ("up", "connecting", "joined", "ready", "epoch", "sigterm",
                                 "evaluated", "saved", "checkpoint", "done", "exiting",
                                 "bad_marker")}
# Exits the loop notices in one wake-up (two tasks that end at about the same moment) are
# alike: in a row of them and the markers, each task's keep their order, tasks in name order.
SAME_MOMENT = PRINTED | {"task_exited"}
# A real TensorFlow task's exit 0 may come by itself or, when its teardown waits for a peer
# that is gone, by our stop (`task_teardown_stopped`; about half of all runs here): both are
# a success, and which one depends on the machine's load.
TEARDOWN_TIMING = {"task_teardown_stopped"}
SUCCESS_WORDS = ("how", "returncode", "teardown")
# Durations in words ("no progress for 1 s", "auto: 1.1 s") are measured.
SECONDS = re.compile(r"\b\d+(?:\.\d+)? s\b")


def normalize(events: list[dict[str, Any]], tmp_path: Path, decisions_only: bool = False
              ) -> dict[str, Any]:
    """`events` as a golden file holds them: varying fields dropped, the tmp path replaced,
    the timing-dependent streams apart (per task, in order). `decisions_only`: what the
    supervisor decided and did, without what the tasks printed (a real TensorFlow job's
    epochs and progress depend on the machine's load; its starts, exits, stops and restarts
    do not)."""
    root = str(tmp_path)
    if decisions_only:
        events = [decided(e) for e in events
                  if e["event"] not in PRINTED | UNORDERED | TEARDOWN_TIMING]

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return SECONDS.sub("<n> s", value.replace(root, "<tmp>"))
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in VARYING}
        return value

    ordered, streams = [], {}
    for e in events:
        record = clean(e)
        if e["event"] in UNORDERED:
            streams.setdefault(f"{e.get('task')} {e['event']}", []).append(record)
        else:
            ordered.append(record)
    return {"events": _by_task_in_rows(ordered), "streams": streams}


def decided(e: dict[str, Any]) -> dict[str, Any]:
    """An event as the faults' golden files keep it: without an auto port (a new one each
    run), a success without how TensorFlow's teardown went, and a start without its path
    (warm or cold: under `warm_spares: auto` whether a standby was made in time depends on
    the machine's memory and load)."""
    drop = {"port"} | (set(SUCCESS_WORDS) if e["event"] == "task_exited"
                       and e.get("state") == "succeeded" else set()) | (
        {"warm", "path"} if e["event"] == "task_started" else set())
    return {k: v for k, v in e.items() if k not in drop}


def _by_task_in_rows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    row: list[dict[str, Any]] = []
    for e in [*events, None]:
        if e is not None and e["event"] in SAME_MOMENT:
            row.append(e)
            continue
        out += sorted(row, key=lambda r: str(r.get("task")))  # stable: a task's own order
        row = []
        if e is not None:
            out.append(e)
    return out


def file_for(suite: str, nodeid: str) -> Path:
    # Under `make test` (xdist's loadgroup) a test's id ends in @GROUP: the same golden file.
    test = nodeid.split("::", 1)[-1].split("@", 1)[0]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", test).strip("_")
    return GOLDEN / suite / f"{name}.json"


def check(suite: str, nodeid: str, runs: list[list[dict[str, Any]]], tmp_path: Path,
          decisions_only: bool = False) -> None:
    """Compare the runs' events (one list per run directory) with the golden file, or
    record them under TFO_GOLDEN=record. A scenario without a golden file fails: each one
    is recorded once, on purpose."""
    got = [normalize(events, tmp_path, decisions_only) for events in runs]
    path = file_for(suite, nodeid)
    if RECORD:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        return
    assert path.exists(), f"no golden events for {nodeid}: record with TFO_GOLDEN=record"
    want = json.loads(path.read_text())
    assert got == want, f"events differ from {path.relative_to(GOLDEN.parent.parent)}: " \
        + _first_difference(got, want)


def check_runs(suite: str, nodeid: str, tmp_path: Path, decisions_only: bool = False) -> None:
    """check() every run directory's events.jsonl under `tmp_path` (none: nothing to check):
    a test module's autouse fixture calls it after each test."""
    runs = [[json.loads(line) for line in p.read_text().splitlines()]
            for p in sorted(tmp_path.rglob("events.jsonl"))]
    if runs:
        check(suite, nodeid, runs, tmp_path, decisions_only)


def _first_difference(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> str:
    if len(got) != len(want):
        return f"{len(got)} run(s), {len(want)} recorded"
    for run, (g, w) in enumerate(zip(got, want, strict=True)):
        for i, (a, b) in enumerate(zip(g["events"], w["events"], strict=False)):
            if a != b:
                return f"run {run}, event {i}: got {a}, recorded {b}"
        if len(g["events"]) != len(w["events"]):
            return f"run {run}: {len(g['events'])} events, {len(w['events'])} recorded"
        if g["streams"] != w["streams"]:
            keys = sorted(k for k in {*g["streams"], *w["streams"]}
                          if g["streams"].get(k) != w["streams"].get(k))
            return f"run {run}: streams differ: {', '.join(keys)}"
    return "?"
