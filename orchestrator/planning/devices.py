"""Which GPUs each task gets: a pure function of the tasks, the hosts' GPUs and the job's ask.

    allocate_gpus([("worker", 0, "lab1"), ("worker", 1, "lab1")], {"lab1": [0, 1, 2, 3]},
                  need=lambda role: 2)                 # [[0, 1], [2, 3]]
    visible_devices([2, 3])                            # "2,3"; [] gives "" (no GPU at all)

Tasks on one host get disjoint GPUs, in plan order, from the host's list. A host whose GPUs
are not known yet (`auto` before it was asked, `tfo plan` of a lab host) is taken to have
nvidia-smi's numbering, 0, 1, ...: the launcher resolves it before the run's plan
(orchestrator/launch/gpus.py), and the run is refused then if it has too few.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from orchestrator.planning.spec import LOCALHOST, ClusterSpec, SpecError

TaskRef = tuple[str, int, str]  # role, index, host


def task_gpus(spec: ClusterSpec, resolved: Mapping[str, Sequence[int]]) -> list[list[int]]:
    """Each task's GPUs in `spec.tasks.all()` order. `resolved`: the GPUs of the hosts whose
    gpus are `auto`, as nvidia-smi reported them; one not in it is not known yet."""
    listed = {LOCALHOST: spec.localhost.gpus, **{n: h.gpus for n, h in spec.hosts.items()}}
    host_gpus = {n: resolved.get(n) if gpus == "auto" else gpus for n, gpus in listed.items()}
    return allocate_gpus([(role, index, addr.host) for role, index, addr in spec.tasks.all()],
                         host_gpus, spec.job.gpus_for)


def allocate_gpus(tasks: Sequence[TaskRef], host_gpus: Mapping[str, Sequence[int] | None],
                  need: Callable[[str], int]) -> list[list[int]]:
    """Each task's GPU ids, in the order of `tasks`; SpecError, naming the host, the need and
    what it has, when a host has too few. `host_gpus[host]` None: not known yet (see above);
    a host missing from it has none."""
    wanted: dict[str, list[tuple[str, int]]] = {}  # host → (task, count), in plan order
    for role, index, host in tasks:
        wanted.setdefault(host, []).append((f"{role}:{index}", need(role)))
    free: dict[str, list[int]] = {}
    for host, asks in wanted.items():
        total = sum(count for _, count in asks)
        known = host_gpus.get(host, [])
        have = list(range(total)) if known is None else list(known)
        if total > len(have):
            raise SpecError(f"host {host}: {_describe(asks)} need {total}, it has "
                            f"{_has(have)}; list more under {gpus_field(host)} or lower "
                            "job.gpus_per_task")
        free[host] = have
    out = []
    for role, _, host in tasks:
        count = need(role)
        out.append(free[host][:count])
        free[host] = free[host][count:]
    return out


def visible_devices(gpus: Sequence[int]) -> str:
    """CUDA_VISIBLE_DEVICES: the ids joined by commas; "" hides every GPU (unset would show
    the task all of them)."""
    return ",".join(map(str, gpus))


def _describe(asks: list[tuple[str, int]]) -> str:
    counts = {count for _, count in asks if count}
    if len(counts) == 1:
        count, tasks = counts.pop(), [name for name, c in asks if c]
        return f"{len(tasks)} task{'s' * (len(tasks) > 1)} × {count} GPU{'s' * (count > 1)}"
    return "tasks " + ", ".join(f"{name} ({count})" for name, count in asks if count)


def _has(gpus: list[int]) -> str:
    return f"{len(gpus)} ({gpus})" if gpus else "none"


def gpus_field(host: str) -> str:
    """Where a host's GPUs are listed in the cluster file."""
    return "localhost.gpus" if host == LOCALHOST else f"hosts.{host}.gpus"
