"""Backends that are only a class each, to show that one class and one line in BACKENDS are
all `tfo run` needs (tests/test_backend.py registers them):

- `FakeBackend`, a host backend (`hosts: {sim: {backend: fake}}`): tasks are in-process
  fakes that say they are ready, print a line, and exit 0.
- `FakeScheduler`, a scheduler (`backend: {fakesched: {nodes: 2}}`): it decides where the
  tasks go, as Slurm does from its allocation, on nodes that are loopback addresses
  (127.0.0.2, …), so the tasks are real processes on this machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field

from orchestrator.launch import HostBackend, Say
from orchestrator.launch.gpus import GpuReport
from orchestrator.launch.local import LocalBackend, LocalHandle
from orchestrator.launch.ports import free_ports
from orchestrator.launch.preflight import HostCheck
from orchestrator.planning.plan import Plan, TaskPlan, task_name
from orchestrator.planning.spec import ClusterSpec, HostSpec, Int, SchedulerOptions
from tests.fakes import FakeHandle, Script

STARTED: list[tuple[str, int, str]] = []  # (task, attempt, TF_CONFIG) of every start


class FakeTask(FakeHandle):
    """Ready at once, one line of its own, exit 0 after 0.2 s; its handle writes its log."""

    def __init__(self, task: TaskPlan, attempt: int) -> None:
        super().__init__(task, attempt, Script([(0, 0.2, True)]))
        self._lines.append(f"{task.name} trained")

    def lines(self) -> list[str]:
        out = super().lines()
        with open(self.task.log_path, "a") as log:
            log.writelines(line + "\n" for line in out)
        return out


class FakeBackend(HostBackend):
    def __init__(self, hosts: Mapping[str, HostSpec]) -> None:
        self.hosts = hosts

    def allocate(self, names: list[str], avoid: set[int]) -> dict[str, int]:
        free = (p for p in range(41000, 42000) if p not in avoid)
        return dict(zip(names, free, strict=False))

    def gpus(self, hosts: list[str], ask: bool) -> dict[str, GpuReport]:
        return {}

    def check(self, tasks: list[TaskPlan]) -> list[HostCheck]:
        return [HostCheck(t.host, t.address, reachable=True, ports=[t.port]) for t in tasks]

    def sync(self, plan: Plan, tasks: list[TaskPlan]) -> list[str]:
        return [f"fake: nothing to copy for {len(tasks)} task(s)"]

    def start(self, task: TaskPlan, attempt: int) -> FakeTask:
        STARTED.append((task.name, attempt, task.env["TF_CONFIG"]))
        return FakeTask(task, attempt)

    def close(self) -> None:
        pass


class FakeRequest(SchedulerOptions):
    """`backend: {fakesched: {nodes: N}}`: what the job asks the scheduler for."""

    title: ClassVar[str] = "Fakesched"
    nodes: Int = Field(default=2, ge=1, le=200)


class FakeScheduler:
    """Places task i (in start order) on node i mod N of its own nodes, backwards: not the
    cluster file's hosts, nor Slurm's order. Ports are free ones on those nodes; a task is a
    real process, started as a local one (the nodes share this machine's file system)."""

    options = FakeRequest
    PLACED: ClassVar[dict[str, str]] = {}  # task → node, as place() decided
    PORTS: ClassVar[dict[str, int]] = {}  # task → port, as allocate() gave them

    def __init__(self, hosts: Mapping[str, HostSpec]) -> None:
        self._local = LocalBackend(hosts)

    def place(self, spec: ClusterSpec, dry_run: bool, say: Say) -> dict[str, str]:
        assert spec.backend is not None and isinstance(spec.backend.options, FakeRequest)
        count = spec.backend.options.nodes
        nodes = [f"127.0.0.{count + 1 - i}" for i in range(count)]
        names = [task_name(role, index) for role, index, _ in spec.tasks.all()]
        say(f"fakesched: {len(names)} task(s) on {count} node(s)")
        FakeScheduler.PLACED = {name: nodes[i % count] for i, name in enumerate(names)}
        return dict(FakeScheduler.PLACED)

    def allocate(self, names: list[str], avoid: set[int]) -> dict[str, int]:
        FakeScheduler.PORTS = dict(zip(names, free_ports(len(names), avoid=avoid), strict=True))
        return dict(FakeScheduler.PORTS)

    def gpus(self, hosts: list[str], ask: bool) -> dict[str, GpuReport]:
        return {}

    def check(self, tasks: list[TaskPlan]) -> list[HostCheck]:
        nodes = dict.fromkeys(t.host for t in tasks)
        return [HostCheck(node, node, reachable=True, ports=[t.port for t in tasks
                                                            if t.host == node]) for node in nodes]

    def sync(self, plan: Plan, tasks: list[TaskPlan]) -> list[str]:
        return [f"fakesched: {len(tasks)} task(s) share this file system"]

    def start(self, task: TaskPlan, attempt: int) -> LocalHandle:
        STARTED.append((task.name, attempt, task.env["TF_CONFIG"]))
        return self._local.start(task, attempt)

    def close(self) -> None:
        self._local.close()
