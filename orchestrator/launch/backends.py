"""The registry: which Backend class starts the tasks of each placement kind.

    backends = Backends(spec.hosts)
    backends.start(task, attempt)      # BACKENDS[task.placement.kind], made on first use
    backends.check(plan)               # the preflight; its rows also say which tasks keep
    backends.standby(task, attempt)    # a warm spare (`spares`), where the kind has them

`local` runs tasks on this machine; a host under `hosts:` names its own (`backend: ssh`,
the default). A kind whose class has `options` is a scheduler: `backend: {KIND: {…}}` names
it, and its `place` puts the tasks on its nodes before ports are allocated (`slurm`: steps of
one allocation). A new backend is its module and one line here (tests/fake_backend.py).

Design: Schedulers: backends that place the tasks
====================

Every step before the plan is a method of the `Backend` protocol (launch/__init__.py), asked
by `Backends` of the kinds the job uses: `place` (the node of each task a scheduler places;
a host backend places nothing), `allocate` (ports), `gpus` (hosts whose gpus are `auto`),
`check` (the preflight), `sync`, `start`, `close`. A host backend (`local`, `ssh`;
`HostBackend`) starts tasks on the hosts the cluster file names. A scheduler is a backend
whose class has `options`, the pydantic model (a `spec.SchedulerOptions`) of its request:
the spec's `backend: {KIND: {…}}` names it by its kind and the spec validates the request by
that model, found in the registry (`launch.backends.schedulers()`, imported only for a file
that has `backend:`), so its errors name `backend.KIND.field`; a kind that is none is
`backend: unknown kind 'pbs'; the schedulers' kinds are slurm`. Its job gives counts per
role (`worker: 2`); each becomes a task whose host is the kind until `place` names its node
(`plan.placement`: `Placement(KIND, node, node)`); its tasks run in tfo's workdir with tfo's
python (its nodes share the file system). `--on KIND` (`quick.on_scheduler`) hands a cluster
file's job to one; `tfo export` asks the request for each role's GPUs (`gpus_for`).
`tests/fake_backend.py`'s `FakeScheduler` (about 50 lines with its request) is one: a test
registers it in one line and runs a real job through `pipeline.run` with it.

Slurm (`launch/slurm.py`, `SlurmSpec` its request): `SlurmBackend.place` runs `salloc` as
tfo's child (its own session; its command prints the node list and then reads a pipe tfo
holds, so tfo's death, even SIGKILL, ends the allocation; PDEATHSIG sends salloc SIGHUP,
which withdraws a request still in the queue — not SIGTERM, after which a granted salloc
22.05 spins forever), reports squeue's reason while the job is pending (before the
supervisor starts: queue time never counts against the startup timeout), and maps task i in
start order to node i mod N (`assign_nodes`). `allocate` then asks every node for free ports
in one step, and `make_plan(nodes=…)` gives each task `Placement("slurm", node, node)`; the
tasks run in tfo's workdir with tfo's python (the nodes share the file system). Each start
is a job step, `srun --jobid J -N1 -n1 -w NODE --overlap` named `tfo.<task>.<attempt>`;
`SlurmHandle` is srun's output and exit (128+N → -N), `terminate`/`kill` are `scancel
--signal=TERM|KILL` of the step, and srun forwards its stdin, our pipe, to the wrapper as
its lifeline. `SlurmBackend.close` (Ctrl-C, failure, success) is `scancel` of the job.
`tests/slurmlab.py` brings up a real two-node Slurm in network namespaces for the tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping

from orchestrator.launch import Backend, Say, TaskHandle, one_by_one
from orchestrator.launch.gpus import GpuReport, auto_hosts, gpu_problem
from orchestrator.launch.local import LocalBackend
from orchestrator.launch.preflight import HostCheck, same_versions
from orchestrator.launch.slurm import SlurmBackend
from orchestrator.launch.spares import spares_wanted
from orchestrator.launch.ssh.backend import SshBackend
from orchestrator.planning.plan import (
    Plan,
    TaskPlan,
    placement,
    profiled,
    profiler_key,
    task_name,
)
from orchestrator.planning.slurmspec import SLURM
from orchestrator.planning.spec import ClusterSpec, HostSpec, SpecError

BACKENDS: dict[str, type[Backend]] = {
    "local": LocalBackend,
    "ssh": SshBackend,
    SLURM: SlurmBackend,
}


def schedulers() -> dict[str, type[Backend]]:
    """The kinds that place tasks themselves (a `backend:` of the spec), never a host's."""
    return {kind: cls for kind, cls in BACKENDS.items() if cls.options is not None}


class Backends:
    """The backends one run uses, one per placement kind, each made on first use."""

    def __init__(self, hosts: Mapping[str, HostSpec]) -> None:
        self._hosts = hosts
        self._made: dict[str, Backend] = {}
        # The tasks that keep a warm spare in this run, by name: the last check's
        # (spares_wanted of its rows); none before one.
        self.spares: frozenset[str] = frozenset()
        hosts_kinds = ", ".join(sorted(set(BACKENDS) - set(schedulers())))
        for name, host in hosts.items():
            if host.backend in schedulers():
                raise SpecError(f"hosts.{name}.backend: {host.backend} picks its own hosts; "
                                f"write backend: {{{host.backend}: {{…}}}} at the "
                                "top level and give counts under tasks:")
            if host.backend not in BACKENDS:
                raise SpecError(f"hosts.{name}.backend: unknown backend {host.backend!r}; "
                                f"backends are {hosts_kinds}")

    def get(self, kind: str) -> Backend:
        if kind not in self._made:
            self._made[kind] = BACKENDS[kind](self._hosts)
        return self._made[kind]

    def local(self) -> LocalBackend:
        backend = self.get("local")
        assert isinstance(backend, LocalBackend)
        return backend

    def _by_kind(self, plan: Plan) -> dict[str, list[TaskPlan]]:
        kinds: dict[str, list[TaskPlan]] = {}
        for t in plan.tasks:
            kinds.setdefault(t.placement.kind, []).append(t)
        return kinds

    def _kinds(self, spec: ClusterSpec, hosts: Iterable[str]) -> dict[str, list[str]]:
        """The hosts by the kind of their backend, in order."""
        kinds: dict[str, list[str]] = {}
        for host in hosts:
            kinds.setdefault(placement(spec, host).kind, []).append(host)
        return kinds

    def place(self, spec: ClusterSpec, dry_run: bool, say: Say) -> dict[str, str]:
        """The node of each task a scheduler places (task name → node): {} for a job whose
        cluster file names the hosts. A dry run asks no scheduler."""
        nodes: dict[str, str] = {}
        for kind in self._kinds(spec, dict.fromkeys(a.host for _, _, a in spec.tasks.all())):
            nodes.update(self.get(kind).place(spec, dry_run, say))
        return nodes

    def allocate(self, spec: ClusterSpec) -> dict[str, int]:
        """Ports for the `auto` tasks and the profilers (`profiler_key`), each from its own
        backend, all distinct."""
        taken = {a.port for _, _, a in spec.tasks.all() if a.port is not None}
        wanted: dict[str, list[str]] = {}
        for role, index, addr in spec.tasks.all():
            if addr.port is None:
                kind = placement(spec, addr.host).kind
                wanted.setdefault(kind, []).append(task_name(role, index))
        kinds = {task_name(r, i): placement(spec, a.host).kind for r, i, a in spec.tasks.all()}
        for name in profiled(spec):  # after the tasks': theirs are as they were
            wanted.setdefault(kinds[name], []).append(profiler_key(name))
        ports: dict[str, int] = {}
        for kind, names in wanted.items():
            got = self.get(kind).allocate(names, taken | set(ports.values()))
            ports.update(got)
        return ports

    def check(self, plan: Plan, versions: bool = False) -> list[HostCheck]:
        """Every kind's preflight at once; then the same TensorFlow everywhere. This
        machine's versions are looked up where there are others to compare them with, or
        `versions` asks (the table of `tfo check`)."""
        kinds = self._by_kind(plan)

        def check(kind: str) -> list[HostCheck]:
            backend = self.get(kind)
            if (expect := getattr(backend, "expect_code", None)) is not None:
                expect(plan)  # a backend that copies code: its check asks what is there
            return backend.check(kinds[kind])

        if len(kinds) == 1:  # one kind (localhost alone, say): no thread pool to start
            found = list(map(check, kinds))
        else:
            from concurrent.futures import ThreadPoolExecutor  # only for hosts to check

            with ThreadPoolExecutor(max_workers=len(kinds)) as pool:
                found = list(pool.map(check, kinds))
        rows = [row for part in found for row in part]
        for r in rows:
            if r.gpus and (problem := gpu_problem(plan.spec, r.host, r.gpus)):
                r.problems.append(problem)
        rows = same_versions(rows, shown=versions)
        self.spares = spares_wanted(plan, rows)
        return rows

    def gpus(self, spec: ClusterSpec, ask_hosts: bool) -> dict[str, GpuReport]:
        """What nvidia-smi -L reports on each host whose gpus are `auto`, asked by its
        backend: this machine always, lab hosts only with `ask_hosts` (a dry run does not
        connect). In the spec's order."""
        wanted = auto_hosts(spec)
        found: dict[str, GpuReport] = {}
        for kind, hosts in self._kinds(spec, wanted).items():
            found.update(self.get(kind).gpus(hosts, ask_hosts))
        return {host: found[host] for host in wanted if host in found}

    def sync(self, plan: Plan) -> Iterator[str]:
        """What each kind's sync says, as it says it."""
        for kind, tasks in self._by_kind(plan).items():
            yield from self.get(kind).sync(plan, tasks)

    def start(self, task: TaskPlan, attempt: int) -> TaskHandle:
        return self.get(task.placement.kind).start(task, attempt)

    def start_batch(self, items: Iterable[tuple[TaskPlan, int]]
                    ) -> Iterator[TaskHandle | Exception]:
        """Tasks to start together (the supervisor's starts of one round): each backend
        that starts a batch gets its run of them at once, the others start theirs one by
        one; each task answered in order (launch.BatchLauncher)."""
        for kind, group in itertools.groupby(list(items), key=lambda i: i[0].placement.kind):
            run, backend = list(group), self.get(kind)
            make = getattr(backend, "start_batch", None)
            yield from make(run) if make is not None else one_by_one(backend.start, run)

    def standby(self, task: TaskPlan, attempt: int) -> int | None:
        """A warm spare for the task's `attempt` where its backend keeps them (local, SSH:
        launch/spares.py) and the task keeps one (`spares`, the check's); its pid, or None
        (none made)."""
        if task.name not in self.spares:
            return None
        make = getattr(self.get(task.placement.kind), "standby", None)
        return make(task, attempt) if make is not None else None

    def close(self) -> None:
        for backend in self._made.values():
            backend.close()
        self._made.clear()
