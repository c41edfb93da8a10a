"""`/metrics` for Prometheus: `tfo run --metrics-port 9400` or the cluster file's
`metrics: {port: 9400}` (address 127.0.0.1 unless `metrics.address` or `--metrics-address`
names another: what the tasks print is no one else's to read by default).

    exporter = Exporter.serve(spec.metrics, plan)   # a daemon thread: prometheus_client's
    supervisor = Supervisor(..., watch=exporter.chain(watch))
    ...
    exporter.close()

Cost: the HTTP thread never touches the loop's state. The loop's watch (every
supervise.WATCH_SECONDS, on its own thread) copies what it already keeps into a `Snapshot`
(frozen; one reference swapped), and a scrape renders the last snapshot. So a scrape costs the
loop nothing but the GIL while the text is written, and the loop's copy costs O(tasks) once a
second whether anyone scrapes or not (bench/metrics_cost.py measures both).

Names follow Prometheus' conventions (units in the name, `_total` for counters, base units:
bytes, seconds). Every series has the labels `job` (the cluster file's name) and `run` (the
run id); a task's also `task` (worker:1) and `host`:

    tfo_job_info{strategy}            1
    tfo_job_state{state}              1 for the job's state, 0 for each other (decide.JobState)
    tfo_job_restarts_total            restarts counted against max_restarts
    tfo_job_workers                   workers in the group now (an elastic job's size)
    tfo_job_resizes_total             an elastic job's resizes
    tfo_task_up                       1 while the task's attempt is starting or running
    tfo_task_state{state}             1 for its state, 0 for each other (decide.TaskState)
    tfo_task_restarts_total
    tfo_task_steps_total              steps run, over all its attempts (a restart adds on)
    tfo_task_epoch                    its epoch (0-based), where its progress says
    tfo_task_steps_per_second         where known (progress markers still coming)
    tfo_task_loss                     where its progress says
    tfo_task_cpu_usage_cores          its process tree's CPU (1.0: one core busy)
    tfo_task_memory_rss_bytes
    tfo_task_stalls_total             hangs found (orchestrator.loop.stall)
    tfo_metrics_errors_total          (no labels) snapshots that failed: a bug of ours, the
                                      last good snapshot is served, the training goes on

A series with no value yet (no loss reported) is left out, not 0: an alert on `loss > x`
must not fire on a task that has not said.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.loop.decide import JobState, TaskState

if TYPE_CHECKING:
    from orchestrator.loop.job import Job
    from orchestrator.planning.plan import Plan
    from orchestrator.planning.spec import MetricsSpec

LOOPBACK = "127.0.0.1"
PREFIX = "tfo_"


@dataclass(frozen=True)
class TaskSample:
    """One task, as the loop knew it at the snapshot."""

    task: str
    host: str
    state: str
    restarts: int = 0
    steps: int = 0  # over all attempts
    epoch: int | None = None
    steps_per_second: float | None = None
    loss: float | None = None
    cpu_cores: float | None = None
    rss_bytes: int | None = None
    stalls: int = 0


@dataclass(frozen=True)
class Snapshot:
    job: str
    run: str
    strategy: str
    state: str = JobState.PENDING.value
    restarts: int = 0
    workers: int = 0
    resizes: int = 0
    tasks: tuple[TaskSample, ...] = ()


@dataclass
class StepCounter:
    """Steps over attempts: a task's progress counts the steps of its attempt, which start
    again at a restart; the counter adds the attempt before's last count on."""

    before: int = 0  # steps of the attempts before this one
    attempt: int = -1
    last: int = 0  # this attempt's last count

    def total(self, attempt: int, step: int | None) -> int:
        if attempt != self.attempt:
            self.before += self.last
            self.attempt, self.last = attempt, 0
        if step is not None and step >= self.last:
            self.last = step
        return self.before + self.last


def snapshot(job: Job, counters: dict[str, StepCounter], resizes: int, now: float) -> Snapshot:
    """What the loop keeps, copied (on the loop's thread): no reference into it survives."""
    from orchestrator.loop.rate import shown

    stalls: dict[str, int] = {}
    for s in job.stalls:
        stalls[s.task] = stalls.get(s.task, 0) + 1
    tasks = []
    for rec in job.records.values():
        work = rec.current.work
        progress = work.progress if rec.attempt >= 0 else None
        usage = work.usage if rec.state.live else None
        counter = counters.setdefault(rec.name, StepCounter())
        tasks.append(TaskSample(
            task=rec.name, host=rec.task.host, state=rec.state.value, restarts=rec.restarts,
            steps=counter.total(rec.attempt, progress.step if progress else None),
            epoch=progress.epoch if progress else None,
            steps_per_second=shown(work.rate, now) if rec.state.live else None,
            loss=progress.loss if progress else None,
            cpu_cores=usage.cpu / 100 if usage else None,
            rss_bytes=usage.rss if usage else None, stalls=stalls.get(rec.name, 0)))
    plan = job.plan
    return Snapshot(job=plan.spec.name, run=plan.run_id, strategy=plan.strategy.value,
                    state=job.state.value, restarts=job.restarts,
                    workers=sum(r.role == "worker" for r in job.records.values()),
                    resizes=resizes, tasks=tuple(tasks))


def families(snap: Snapshot) -> Iterator[Any]:
    """The snapshot as prometheus_client's metric families (pure: a table test reads them)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    jl, jv = ["job", "run"], [snap.job, snap.run]
    info = GaugeMetricFamily(PREFIX + "job_info", "the job: its cluster file's name, its "
                             "run id, its strategy", labels=[*jl, "strategy"])
    info.add_metric([*jv, snap.strategy], 1)
    yield info
    state = GaugeMetricFamily(PREFIX + "job_state", "1 for the job's state, 0 for the others",
                              labels=[*jl, "state"])
    for s in JobState:
        state.add_metric([*jv, s.value], float(s.value == snap.state))
    yield state
    for name, doc, value, kind in (
            ("job_restarts", "restarts counted against restart.max_restarts", snap.restarts,
             CounterMetricFamily),
            ("job_workers", "workers in the group now (an elastic job's size)", snap.workers,
             GaugeMetricFamily),
            ("job_resizes", "an elastic job's resizes", snap.resizes, CounterMetricFamily)):
        family = kind(PREFIX + name, doc, labels=jl)
        family.add_metric(jv, value)
        yield family

    tl = [*jl, "task", "host"]

    def per_task(name: str, doc: str, value: Callable[[TaskSample], float | None],
                 kind: type = GaugeMetricFamily) -> Any:
        family = kind(PREFIX + name, doc, labels=tl)
        for t in snap.tasks:
            if (v := value(t)) is not None:
                family.add_metric([*jv, t.task, t.host], v)
        return family

    yield per_task("task_up", "1 while the task's attempt is starting or running",
                   lambda t: float(t.state in (TaskState.STARTING.value, TaskState.RUNNING.value)))
    tstate = GaugeMetricFamily(PREFIX + "task_state", "1 for the task's state, 0 for the others",
                               labels=[*tl, "state"])
    for t in snap.tasks:
        for s in TaskState:
            tstate.add_metric([*jv, t.task, t.host, s.value], float(s.value == t.state))
    yield tstate
    yield per_task("task_restarts", "the task's restarts", lambda t: t.restarts,
                   CounterMetricFamily)
    yield per_task("task_steps", "training steps run, over all the task's attempts",
                   lambda t: t.steps, CounterMetricFamily)
    yield per_task("task_epoch", "the task's epoch (0-based), as its progress says",
                   lambda t: t.epoch)
    yield per_task("task_steps_per_second", "the task's steps per second, while its progress "
                   "comes", lambda t: t.steps_per_second)
    yield per_task("task_loss", "the task's last loss, as its progress says", lambda t: t.loss)
    yield per_task("task_cpu_usage_cores", "CPU of the task's processes (1.0: one core busy)",
                   lambda t: t.cpu_cores)
    yield per_task("task_memory_rss_bytes", "resident memory of the task's processes",
                   lambda t: t.rss_bytes)
    yield per_task("task_stalls", "hangs found in the task (no progress for its limit)",
                   lambda t: t.stalls, CounterMetricFamily)


@dataclass(eq=False)  # hashable: prometheus_client keeps its collectors in a dict
class Exporter:
    """The endpoint of one run: the last snapshot, served by prometheus_client's thread."""

    snap: Snapshot
    resizes: Callable[[], int] = lambda: 0  # the supervisor's, once it exists
    counters: dict[str, StepCounter] = field(default_factory=dict)
    server: Any = None
    thread: threading.Thread | None = None
    address: str = LOOPBACK
    port: int = 0
    errors: int = 0  # snapshots that failed (a bug of ours): the last good one is served
    error: str = ""

    @classmethod
    def serve(cls, spec: MetricsSpec, plan: Plan) -> Exporter:
        """Listen on spec.address:spec.port (0: any free port; `port` then says which).
        An address or port in use is an OSError, the caller's to tell."""
        from prometheus_client import CollectorRegistry, start_http_server

        exporter = cls(Snapshot(job=plan.spec.name, run=plan.run_id,
                                strategy=plan.strategy.value))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(exporter)
        exporter.server, exporter.thread = start_http_server(spec.port, spec.address,
                                                             registry=registry)
        exporter.address = spec.address
        exporter.port = exporter.server.server_address[1]
        return exporter

    def collect(self) -> Iterator[Any]:  # prometheus_client's thread
        from prometheus_client.core import CounterMetricFamily

        yield from families(self.snap)
        failed = CounterMetricFamily(PREFIX + "metrics_errors", "snapshots of the job that "
                                     "failed (a bug of tfo's; the last good one is served)")
        failed.add_metric([], self.errors)
        yield failed

    def watch(self, job: Job) -> None:  # the loop's thread
        try:
            self.snap = snapshot(job, self.counters, self.resizes(), job.clock())
        except Exception as e:  # noqa: BLE001 - a bug here must not stop the training
            self.error = f"{type(e).__name__}: {e}"  # served as tfo_metrics_errors_total
            self.errors += 1

    def chain(self, other: Callable[[Job], None] | None) -> Callable[[Job], None]:
        """The loop has one watch: this one, then the live view's."""
        if other is None:
            return self.watch

        def both(job: Job) -> None:
            self.watch(job)
            other(job)
        return both

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def from_flags(port: int | None, address: str | None) -> MetricsSpec | None:
    """`--metrics-port`/`--metrics-address` as the cluster file's `metrics:` (None: the
    file's stands)."""
    from orchestrator.errors import SpecError
    from orchestrator.planning.spec import MetricsSpec

    if port is None:
        if address is not None:
            raise SpecError("--metrics-address needs --metrics-port PORT (or 0 for any)")
        return None
    return MetricsSpec(port=port, address=address or LOOPBACK)
