"""`tfo status --json` and `tfo runs --json`: a run's state for scripts, in a shape that is
versioned and kept (docs/reference/state-json.md; its JSON Schema,
docs/reference/state-json.schema.json, is written from these models by
`python -m orchestrator.cli.statejson` and tests/test_metrics_table.py holds the two together).

    {"schema": "tfo.status/1", "run": "...", "state": "running", "exit_code": null,
     "tasks": [{"task": "worker:0", "state": "running", "step": 41, ...}], ...}

Versioning: `schema` is "tfo.status/N" or "tfo.runs/N". A field may be added within a
version; a field removed, renamed or given another meaning is a new N. Everything comes from
the run's events.jsonl (what `tfo status` prints as a table), so it reads the same on the
machine that runs the job and on any that shares its run directory (a Slurm login node).

`state` is the run's: running, succeeded, failed, interrupted, or lost (its coordinator is
gone and wrote no end: killed, or its machine went down). `exit_code` is tfo run's, once the
run ended (null while it runs, or when it was lost).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.cli.liveview import rows_from_events
from orchestrator.cli.slowtasks import verdicts
from orchestrator.runs.rundir import Outcome, RunDir, RunInfo, coordinator_gone, outcome

STATUS_SCHEMA = "tfo.status/1"
RUNS_SCHEMA = "tfo.runs/1"
SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "reference" / \
    "state-json.schema.json"
RunState = Literal["running", "succeeded", "failed", "interrupted", "lost"]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskStatus(_Doc):
    """One task, its last attempt."""

    task: str = Field(description="role:index, e.g. worker:1")
    host: str = Field(description="where its last attempt ran ('-': never started)")
    pid: int | None = Field(description="its last attempt's process id")
    state: str = Field(description="pending, starting, running, succeeded, failed, stopped, "
                       "or unfinished (the run ended abnormally while it ran)")
    restarts: int = Field(ge=0)
    epoch: int | None = Field(description="0-based, as its last progress said")
    epochs: int | None
    step: int | None = Field(description="steps of its last attempt")
    steps_per_second: float | None = Field(description="while its progress still comes")
    loss: float | None
    exit_code: int | None = Field(description="its last attempt's exit status (negative: "
                                  "the signal that ended it)")
    exit_reason: str = Field(description="how it ended where the exit status says less")
    last_event: str = Field(description="the last event of it in events.jsonl")
    slow: bool = Field(description="named slow (task_slow) in its last attempt (the table "
                       "reads `slow` for `running` while that attempt runs)")


class SlowTask(_Doc):
    """A task tfo named slow (a `task_slow` event): `tfo status`'s `slow:` lines."""

    task: str
    attempt: int | None = Field(description="the attempt it was said of (0: the first); a "
                                "restarted task needs a fresh verdict")
    cause: str = Field(description="what holds it back: steps (its steps/s against its "
                       "peers'), compute, input or network")
    why: str = Field(description="one sentence, the console's words")
    time: float | None = Field(description="unix time it was said")
    figures: dict[str, float] = Field(description="the figures of the signal that fired, by "
                                      "name (steps_per_second, ...)")


class RunStatus(_Doc):
    """`tfo status --json`."""

    schema_: Literal["tfo.status/1"] = Field(STATUS_SCHEMA, alias="schema")
    run: str = Field(description="the run id (plan.json's; else its directory's name)")
    run_dir: str
    name: str | None = Field(description="the cluster file's name")
    state: RunState
    exit_code: int | None = Field(description="tfo run's exit status once it ended")
    reason: str = Field(description="why it ended, as tfo said")
    started: float | None = Field(description="unix time")
    finished: float | None = Field(description="unix time")
    restarts: int | None = Field(description="the job's restarts, once it ended")
    tasks: list[TaskStatus]
    slow_tasks: list[SlowTask] = Field(description="the tasks tfo named slow, in the order it "
                                       "said so")
    skipped_lines: int = Field(ge=0, description="lines of events.jsonl that were no event")


class RunEntry(_Doc):
    run: str
    name: str
    started: float = Field(description="unix time")
    duration_seconds: float = Field(description="to its end, or to now while it runs")
    state: RunState
    reason: str
    restarts: int | None


class RunList(_Doc):
    """`tfo runs --json`, oldest first."""

    schema_: Literal["tfo.runs/1"] = Field(RUNS_SCHEMA, alias="schema")
    runs: list[RunEntry]
    skipped: int = Field(ge=0, description="directories under runs/ that are no readable run")


def _first(events: list[dict[str, Any]], kind: str, last: bool = False) -> dict[str, Any] | None:
    return next((e for e in (reversed(events) if last else events) if e["event"] == kind), None)


def run_state(events: list[dict[str, Any]], held: bool) -> RunState:
    """The run's state from its events; `held`: a tfo holds its lock now (so it runs)."""
    started, finished = _first(events, "run_started"), _first(events, "job_finished", True)
    if started is None and finished is None:
        return "running" if held else "lost"
    state = outcome(started or {}, finished)
    if state is Outcome.RUNNING and started is not None and not held \
            and coordinator_gone(started):
        return "lost"
    return state.value  # type: ignore[return-value]


def status(rd: RunDir, events: list[dict[str, Any]], skipped: int) -> RunStatus:
    started, finished = _first(events, "run_started"), _first(events, "job_finished", True)
    state = run_state(events, rd.held())
    last_event: dict[str, str] = {}
    for e in events:
        if isinstance(e.get("task"), str) and not e["event"].startswith("task_standby_"):
            last_event[e["task"]] = e["event"]
    try:
        plan = rd.read_plan()
    except (OSError, ValueError):
        plan = {}
    name, run_id = (plan.get("name"), plan.get("run_id")) if isinstance(plan, dict) else (None,
                                                                                           None)
    end = finished or {}
    return RunStatus(
        run=run_id if isinstance(run_id, str) else rd.name, run_dir=str(rd),
        name=name if isinstance(name, str) else None, state=state,
        exit_code=_int(end.get("exit_code")), reason=str(end.get("reason") or ""),
        started=_num((started or {}).get("time")), finished=_num(end.get("time")),
        restarts=_int(end.get("restarts")), skipped_lines=skipped,
        tasks=[TaskStatus(task=r.task, host=r.host, pid=r.pid, state=r.state,
                          restarts=r.restarts, epoch=r.trained.epoch, epochs=r.trained.epochs,
                          step=r.trained.step, steps_per_second=r.steps_per_second,
                          loss=r.trained.loss, exit_code=r.exit, exit_reason=r.exit_reason,
                          last_event=last_event.get(r.task, r.last), slow=r.slow)
               for r in rows_from_events(events, over=state == "lost", now=time.time())],
        slow_tasks=[SlowTask(**asdict(v)) for v in verdicts(events)])


def runs(found: list[RunInfo], skipped: int) -> RunList:
    return RunList(skipped=skipped, runs=[RunEntry(
        run=r.run_id, name=r.name, started=r.started, duration_seconds=r.duration,
        state=r.outcome.value, reason=r.reason, restarts=r.restarts) for r in found])


WAIT_SECONDS = 0.5  # how often `tfo status --wait` looks


def wait(rd: RunDir, sleep: Any = time.sleep) -> None:
    """Until the run is over: its job_finished written, or its coordinator gone."""
    from orchestrator.runs.rundir import run_over

    while not run_over(rd):
        sleep(WAIT_SECONDS)


def exit_code(doc: RunStatus) -> int:
    """`tfo status --wait`'s exit: the run's own; 1 for a run that was lost (no code)."""
    return doc.exit_code if doc.exit_code is not None else 1


def text(doc: BaseModel) -> str:
    return doc.model_dump_json(by_alias=True, indent=2) + "\n"


def schema() -> dict[str, Any]:
    """The JSON Schema of both documents (`oneOf`), as the repo keeps it."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "tfo status --json, tfo runs --json",
            "oneOf": [{"$ref": "#/$defs/RunStatus"}, {"$ref": "#/$defs/RunList"}],
            "$defs": _defs()}


def _defs() -> dict[str, Any]:
    from pydantic.json_schema import models_json_schema

    _, top = models_json_schema([(RunStatus, "serialization"), (RunList, "serialization")],
                                by_alias=True, ref_template="#/$defs/{model}")
    return top["$defs"]


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


if __name__ == "__main__":  # python -m orchestrator.cli.statejson: the schema file, written again
    SCHEMA_FILE.write_text(json.dumps(schema(), indent=2) + "\n")
    print(f"wrote {SCHEMA_FILE}")
