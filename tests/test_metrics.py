"""One real 2-worker job, watched as a lab's tools watch it: a real Prometheus (Debian's
`prometheus`) scrapes `tfo run --metrics-port`, a script reads `tfo status --json` (against
the JSON Schema kept in docs/reference/) and waits on `tfo status --wait`.
The tables of orchestrator/loop/metrics.py and statejson.py are tested on their own in
test_metrics_table.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import psutil
import pytest

from tests.conftest import REPO, events, kill_tree, tfo_cmd, wait_until

SCHEMA = json.loads((REPO / "docs" / "reference" / "state-json.schema.json").read_text())
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Prometheus:
    """A Prometheus server of its own (a temporary storage), scraping `target` every second."""

    def __init__(self, tmp: Path, target: str) -> None:
        self.port = free_port()
        config = tmp / "prometheus.yml"
        # The scrape config docs/guide/watching.md gives, with a 1 s interval.
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: tfo\n"
            "    honor_labels: true\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n")
        self.log = open(tmp / "prometheus.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def query(self, q: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
        try:
            answer = json.loads(http_get(url))
        except OSError:
            return []
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def value(self, q: str, **labels: str) -> float | None:
        for r in self.query(q):
            if all(r["metric"].get(k) == v for k, v in labels.items()):
                return float(r["value"][1])
        return None

    def close(self) -> None:
        kill_tree(self.proc.pid)
        self.proc.wait()
        self.log.close()


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator:
    if not Path(PROMETHEUS).exists():
        pytest.fail("prometheus is not installed: `make test` installs it (the prometheus apt "
                    "package)")
    made: list[Prometheus] = []

    def make(target: str) -> Prometheus:
        made.append(Prometheus(tmp_path, target))
        return made[-1]
    yield make
    for p in made:
        p.close()


def non_loopback_ipv4() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def listening(pid: int, port: int) -> list[str]:
    """The addresses the process `pid` listens on at `port`."""
    return [c.laddr.ip for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port]


def status_json(run_dir: Path) -> dict:
    res = subprocess.run(tfo_cmd("status", "--json", str(run_dir)), cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, SCHEMA)
    return doc


@pytest.mark.tf
@pytest.mark.timeout(420)
def test_prometheus_scrapes_a_job_and_status_json_follows_it(run_dir: Path, tmp_path: Path,
                                                              prometheus_for):
    port = free_port()
    prom = prometheus_for(f"127.0.0.1:{port}")
    tfo = subprocess.Popen(
        tfo_cmd("run", "--run-dir", str(run_dir), "--metrics-port", str(port), "--workers", "2",
                "--name", "prom", "--restart", "on-failure", "--max-restarts", "1", "--",
                "python", "tests/scripts/mwms_steps.py", "--epochs", "20",
                "--steps_per_epoch", "10", "--step_seconds", "0.1"),
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    waiter = None
    try:
        wait_until(lambda: (run_dir / "events.jsonl").exists() or tfo.poll() is not None, 120)
        assert tfo.poll() is None, tfo.communicate()[1][-3000:]
        waiter = subprocess.Popen(tfo_cmd("status", "--wait", "--json", str(run_dir)), cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
        # The endpoint listens on loopback only.
        assert wait_until(lambda: listening(tfo.pid, port), 60) == ["127.0.0.1"]
        if (other := non_loopback_ipv4()) is not None:
            with pytest.raises(ConnectionRefusedError), socket.create_connection((other, port), 5):
                pass
        # Steps rise in Prometheus' own answers: two scrapes apart, worker:1's count grew.
        steps = 'tfo_task_steps_total{job="prom"}'
        first = wait_until(lambda: (prom.value(steps, task="worker:1") or 0) > 0, 180, 0.5)
        assert first, f"no steps scraped: {prom.query(steps)}"
        before = prom.value(steps, task="worker:1")
        assert wait_until(lambda: prom.value(steps, task="worker:1") > before, 60, 0.5), \
            prom.query(steps)
        rate = 'sum by (job) (rate(tfo_task_steps_total{job="prom"}[15s]))'
        print(f"\nprometheus: {steps} → {prom.query(steps)}\n{rate} → {prom.query(rate)}")
        assert prom.value('tfo_task_up{job="prom"}', task="worker:0") == 1
        assert prom.value('tfo_job_state{job="prom",state="running"}') == 1
        names = ("tfo_task_steps_per_second", "tfo_task_loss", "tfo_task_epoch",
                 "tfo_task_memory_rss_bytes", "tfo_task_cpu_usage_cores",
                 "tfo_task_stalls_total", "tfo_job_restarts_total", "tfo_job_workers")
        texts = []

        def all_served() -> bool:
            # Steps/s is served only while progress markers come (loop/rate.shown: none once
            # they paused, as between epochs on a loaded machine): each name in one answer.
            texts.append(http_get(f"http://127.0.0.1:{port}/metrics"))
            return all(f"\n{name}{{" in texts[-1] for name in names)

        assert wait_until(all_served, 60, 0.5), [n for n in names if f"\n{n}{{" not in texts[-1]]
        during = status_json(run_dir)
        assert during["state"] == "running" and during["exit_code"] is None
        assert {t["task"]: t["state"] for t in during["tasks"]} == {
            "worker:0": "running", "worker:1": "running"}
        assert all(t["step"] and t["step"] > 0 for t in during["tasks"]), during["tasks"]
        # A SIGKILLed worker: the restarts counters go up in Prometheus.
        pid = next(e["pid"] for e in events(run_dir)
                   if e["event"] == "task_started" and e["task"] == "worker:1")
        os.kill(pid, signal.SIGKILL)
        restarts = 'tfo_task_restarts_total{job="prom"}'
        assert wait_until(lambda: prom.value(restarts, task="worker:1") == 1, 120, 0.5), \
            prom.query(restarts)
        assert wait_until(lambda: prom.value('tfo_job_restarts_total{job="prom"}') == 1, 30, 0.5)
        assert waiter.poll() is None, "tfo status --wait returned while the run ran"
        _, err = tfo.communicate(timeout=240)
        ended = time.time()
        assert tfo.returncode == 0, err[-3000:]
        out, werr = waiter.communicate(timeout=60)
    finally:
        for p in (tfo, waiter):
            if p is not None and p.poll() is None:
                kill_tree(p.pid)
                p.wait()
    # --wait exits with the run's code, once it ended, and prints its final status.
    assert waiter.returncode == tfo.returncode, werr
    waited = json.loads(out)
    jsonschema.validate(waited, SCHEMA)
    assert waited["state"] == "succeeded" and waited["exit_code"] == 0
    after = status_json(run_dir)
    assert after["state"] == "succeeded" and after["restarts"] == 1
    assert {t["task"]: (t["state"], t["restarts"]) for t in after["tasks"]} == {
        "worker:0": ("succeeded", 1), "worker:1": ("succeeded", 1)}
    assert after["finished"] <= ended
    # The endpoint went with the run.
    with pytest.raises(OSError):
        http_get(f"http://127.0.0.1:{port}/metrics", timeout=2)
