"""The metrics' and the JSON documents' logic, without a job: the exposition of a snapshot,
the steps counter over restarts, the state of a run from its events, and the JSON Schema kept
in docs/reference/ being the models' (tests/test_metrics.py runs them on a real job)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.cli import statejson
from orchestrator.loop.metrics import Snapshot, StepCounter, TaskSample, families, from_flags
from orchestrator.planning.spec import SpecError
from orchestrator.runs.rundir import RunDir
from tests.conftest import REPO


def exposition(snap: Snapshot) -> dict[tuple[str, tuple], float]:
    """The text a scrape reads, parsed back by prometheus_client's own parser."""

    class One:
        def collect(self):  # noqa: ANN202
            return families(snap)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(One())
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k in (
        "task", "state")))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_snapshot_as_prometheus_reads_it():
    snap = Snapshot(job="j", run="r1", strategy="multi_worker_mirrored", state="restarting",
                    restarts=1, workers=2, tasks=(
                        TaskSample("worker:0", "localhost", "running", restarts=1, steps=120,
                                   epoch=2, steps_per_second=14.5, loss=0.25, cpu_cores=0.9,
                                   rss_bytes=6_000_000, stalls=1),
                        TaskSample("worker:1", "lab2", "starting", restarts=1, steps=80)))
    got = exposition(snap)
    assert got[("tfo_job_state", (("state", "restarting"),))] == 1
    assert got[("tfo_job_state", (("state", "running"),))] == 0
    assert got[("tfo_job_restarts_total", ())] == 1
    assert got[("tfo_job_workers", ())] == 2
    w0, w1 = (("task", "worker:0"),), (("task", "worker:1"),)
    assert got[("tfo_task_steps_total", w0)] == 120
    assert got[("tfo_task_steps_per_second", w0)] == 14.5
    assert got[("tfo_task_memory_rss_bytes", w0)] == 6_000_000
    assert got[("tfo_task_stalls_total", w0)] == 1
    assert got[("tfo_task_up", w1)] == 1  # starting counts as up
    assert got[("tfo_task_state", (("state", "starting"), ("task", "worker:1")))] == 1
    # Not said yet: left out, not 0 (an alert on loss must not fire on silence).
    assert ("tfo_task_loss", w1) not in got and ("tfo_task_steps_per_second", w1) not in got


def test_every_series_carries_the_job_and_run():
    registry = CollectorRegistry(auto_describe=False)

    class One:
        def collect(self):  # noqa: ANN202
            return families(Snapshot("j", "r1", "parameter_server", tasks=(
                TaskSample("ps:0", "h", "running"),)))

    registry.register(One())
    for f in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in f.samples:
            assert s.labels["job"] == "j" and s.labels["run"] == "r1", s
            if s.name.startswith("tfo_task_"):
                assert s.labels["task"] == "ps:0" and s.labels["host"] == "h", s


@pytest.mark.parametrize(("seen", "totals"), [
    ([(0, 5), (0, 10), (0, 30)], [5, 10, 30]),
    ([(0, 30), (1, None), (1, 4), (1, 20)], [30, 30, 34, 50]),  # a restart adds on
    ([(0, 30), (0, 12)], [30, 30]),  # a count that went back (a second loop) never lowers it
    ([(0, None), (2, 7)], [0, 7]),
])
def test_the_steps_counter_only_rises(seen, totals):
    counter = StepCounter()
    assert [counter.total(attempt, step) for attempt, step in seen] == totals


def test_metrics_flags():
    assert from_flags(None, None) is None
    assert from_flags(9400, None).address == "127.0.0.1"
    assert from_flags(0, "0.0.0.0").address == "0.0.0.0"
    with pytest.raises(SpecError, match="--metrics-address needs --metrics-port"):
        from_flags(None, "0.0.0.0")


def test_the_schema_kept_is_the_models():
    kept = json.loads((REPO / "docs" / "reference" / "state-json.schema.json").read_text())
    assert kept == statejson.schema(), "run: python -m orchestrator.cli.statejson"


def write_run(path, evs, plan=None):  # noqa: ANN001, ANN201
    path.mkdir()
    (path / "plan.json").write_text(json.dumps(plan or {"name": "j", "run_id": "j-1"}))
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    return RunDir(str(path))


STARTED = {"event": "run_started", "time": 100.0, "coordinator_pid": 1,
           "coordinator_created": 0.0, "coordinator_host": "elsewhere"}


@pytest.mark.parametrize(("evs", "state", "code"), [
    ([STARTED], "running", None),  # another machine's coordinator: not known gone
    ([STARTED, {"event": "job_finished", "time": 150.0, "state": "failed", "exit_code": 1,
                "reason": "worker:1 failed", "restarts": 3}], "failed", 1),
    ([STARTED, {"event": "job_finished", "time": 150.0, "state": "interrupted",
                "exit_code": 130, "reason": "SIGINT", "restarts": 0}], "interrupted", 130),
    ([], "lost", None),
])
def test_status_document(tmp_path, evs, state, code):
    rd = write_run(tmp_path / "r", [*evs[:1], {
        "event": "task_started", "task": "worker:0", "pid": 7, "host": "h", "time": 101.0},
        {"event": "task_progress", "task": "worker:0", "step": 12, "epoch": 1, "loss": 0.5,
         "time": 102.0}, *evs[1:]] if evs else [])
    events, skipped = rd.read_events()
    doc = json.loads(statejson.text(statejson.status(rd, events, skipped)))
    jsonschema.validate(doc, statejson.schema())
    assert (doc["schema"], doc["run"], doc["state"], doc["exit_code"]) == (
        "tfo.status/1", "j-1", state, code)
    if evs:
        assert doc["tasks"][0]["step"] == 12 and doc["tasks"][0]["pid"] == 7
        assert statejson.exit_code(statejson.status(rd, events, skipped)) == (
            code if code is not None else 1)


def test_wait_returns_once_the_run_is_over(tmp_path):
    rd = write_run(tmp_path / "r", [STARTED])
    slept = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:  # the run ends while waited on
            with open(rd.events_path, "a") as f:
                f.write(json.dumps({"event": "job_finished", "time": 200.0,
                                    "state": "succeeded", "exit_code": 0}) + "\n")

    statejson.wait(rd, sleep)
    assert len(slept) == 3


def test_the_grafana_dashboard_asks_only_for_metrics_tfo_serves():
    import re

    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    asked = set(re.findall(r"\btfo_[a-z_]+", json.dumps(dashboard["panels"])))
    served = {f.name + ("_total" if f.type == "counter" else "") for f in families(
        Snapshot("j", "r", "multi_worker_mirrored"))}
    assert asked and asked <= served, asked - served


def _non_loopback_ipv4() -> str | None:
    import socket

    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def test_the_endpoint_listens_where_asked():
    """127.0.0.1 by default; another address (0.0.0.0: every network) only when asked."""
    import socket
    import urllib.request
    from types import SimpleNamespace

    from orchestrator.loop.metrics import Exporter
    from orchestrator.planning.spec import MetricsSpec

    plan = SimpleNamespace(spec=SimpleNamespace(name="j"), run_id="r1",
                           strategy=SimpleNamespace(value="multi_worker_mirrored"))
    other = _non_loopback_ipv4()
    if other is None:
        pytest.skip("this machine has no address but loopback to try from")
    for address, reachable in (("127.0.0.1", False), ("0.0.0.0", True)):
        exporter = Exporter.serve(MetricsSpec(port=0, address=address), plan)
        try:
            url = f"http://{other}:{exporter.port}/metrics"
            if reachable:
                with urllib.request.urlopen(url, timeout=5) as r:
                    assert b'tfo_job_info{job="j",run="r1"' in r.read()
            else:
                with pytest.raises(ConnectionRefusedError), \
                        socket.create_connection((other, exporter.port), 5):
                    pass
            assert exporter.url == f"http://{address}:{exporter.port}/metrics"
        finally:
            exporter.close()


def test_a_failing_snapshot_keeps_the_last_one_and_counts():
    from types import SimpleNamespace

    from orchestrator.loop.metrics import Exporter

    exporter = Exporter(Snapshot("j", "r1", "multi_worker_mirrored", state="running"))
    exporter.watch(SimpleNamespace(clock=lambda: 0.0))  # no records: a bug's AttributeError
    assert exporter.errors == 1 and "AttributeError" in exporter.error
    names = {f.name: f for f in exporter.collect()}
    assert names["tfo_metrics_errors"].samples[0].value == 1
    assert names["tfo_job_state"].samples[1].labels["state"] == "running"
    assert names["tfo_job_state"].samples[1].value == 1
