"""A backend that is only a class: tasks are in-process fakes that say they are ready, print
a line, and exit 0. Registering it (one line in BACKENDS) is all `tfo run` needs to use it
for a host with `backend: fake`."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.launch.preflight import HostCheck
from orchestrator.plan import Plan, TaskPlan
from orchestrator.spec import HostSpec
from tests.test_supervise import FakeHandle, Script

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


class FakeBackend:
    def __init__(self, hosts: Mapping[str, HostSpec]) -> None:
        self.hosts = hosts

    def allocate(self, names: list[str], avoid: set[int]) -> dict[str, int]:
        free = (p for p in range(41000, 42000) if p not in avoid)
        return dict(zip(names, free, strict=False))

    def check(self, tasks: list[TaskPlan]) -> list[HostCheck]:
        return [HostCheck(t.host, t.address, reachable=True, ports=[t.port]) for t in tasks]

    def sync(self, plan: Plan, tasks: list[TaskPlan]) -> list[str]:
        return [f"fake: nothing to copy for {len(tasks)} task(s)"]

    def start(self, task: TaskPlan, attempt: int) -> FakeTask:
        STARTED.append((task.name, attempt, task.env["TF_CONFIG"]))
        return FakeTask(task, attempt)

    def close(self) -> None:
        pass
