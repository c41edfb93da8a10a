"""One run, from a spec to its result, callable from Python as from `tfo run`:

    from orchestrator.pipeline import run
    result = run("clusters/localhost.yaml")      # a path, a dict or a ClusterSpec
    print(result.state.value, result.exit_code)

spec → place (a scheduler's nodes) → allocate (ports, GPUs) → plan → check (preflight) →
run directory → sync → supervise → RunResult. `prepare` is the first four (`tfo plan` and
`tfo check` stop after it). Errors are SpecError (the user's input, a field named; nothing
started), `CannotStart` (the preflight's problems), BackendError (a host or scheduler);
Ctrl-C is KeyboardInterrupt. What is said on the way goes to `say` (tfo's own lines) and
`warn`; the command line prints them, a Python caller may keep them.

Imports: as cli.py's (it imports this module at its top): nothing heavy at the top, the
spec, plan, backends and supervisor where they are used (tests/test_startup.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, NamedTuple, TypeAlias

from orchestrator.errors import SpecError
from orchestrator.runs.rundir import RunDir, RunDirError, write_private
from orchestrator.startup import settled

if TYPE_CHECKING:
    from orchestrator.launch.backends import Backends
    from orchestrator.launch.pool import WarmPool
    from orchestrator.launch.preflight import HostCheck
    from orchestrator.loop.decide import Timing
    from orchestrator.loop.job import Job
    from orchestrator.loop.metrics import Exporter
    from orchestrator.loop.supervise import RunResult
    from orchestrator.planning.plan import Plan
    from orchestrator.planning.spec import ClusterSpec, MetricsSpec

Say = Callable[[str], None]
Source: TypeAlias = "Path | str | dict | ClusterSpec"
# What the caller shows while the job runs: given the plan, a context in which the tasks'
# lines go to `echo(task, line)` (None: stdout) and the loop calls `watch(job)` with its
# `Job` (the live view; api's stacks before a deadline).
Display: TypeAlias = ("Callable[[Plan], contextlib.AbstractContextManager[tuple["
                      "Callable[[str, str], None] | None, Callable[[Job], None] | None]]]")

# A TensorFlow task wants about a core and half a GiB; beyond this many on one machine a
# job is a mistake (10,000 workers grew the coordinator to 9.4 GB before anything started).
MAX_LOCAL_TASKS = 256
RUN_ID_PATTERN = "YYYYmmdd-HHMMSS-xxxx"  # what a dry run shows for the id a run will get
FROM_FLAGS = "the cluster made from the command line"  # a dict's name in errors


class CannotStart(Exception):
    """The preflight found problems: nothing was started."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("cannot start, nothing was started:\n  " + "\n  ".join(problems))
        self.problems = problems


def _quiet(line: str) -> None:
    """Where a Python caller's lines go unless it asks for them."""


def check_entry_importable(spec: ClusterSpec, workdir: Path) -> None:
    """The entry's module and function, the module or the script must exist where tasks will
    look for them. Only located and parsed, never imported: user code could import
    TensorFlow, or do anything."""
    from orchestrator.planning.entry import EntryError, check_entry, check_module, check_script
    from orchestrator.planning.spec import LOCALHOST

    job = spec.job
    try:
        if job.script is not None:  # run here, or synced from here: it must be here
            check_script(job.script, workdir)
            return
        # A scheduler's nodes run the tasks here too: in this directory, with this python.
        local = spec.scheduler is not None or any(
            a.host == LOCALHOST for _, _, a in spec.tasks.all())
        shipped = job.package == "worker_entry" or (workdir / job.package).exists() \
            or (workdir / f"{job.package}.py").exists()
        if not (local or shipped):
            return  # lab hosts' own packages; `job_packages` says if the code cannot be shipped
        if job.module is not None:
            check_module(job.module, workdir)
        else:
            check_entry(job.target, workdir)
    except EntryError as e:
        raise SpecError(f"job.{job.kind}: {e} ({job.target})") from None


def check_local_tasks(spec: ClusterSpec, warn: Say = _quiet) -> None:
    """Refuse more localhost tasks than can make sense; warn beyond one per CPU."""
    from orchestrator.planning.spec import LOCALHOST

    count = sum(1 for _, _, a in spec.tasks.all() if a.host == LOCALHOST)
    if count > MAX_LOCAL_TASKS:
        raise SpecError(f"tasks: {count:,} tasks on localhost; at most {MAX_LOCAL_TASKS} run on "
                        "one machine (each TensorFlow task wants about a core and 0.5 GB); "
                        "spread them over hosts:")
    cpus = os.cpu_count() or 1
    if count > cpus:
        warn(f"{count} tasks on localhost but {cpus} CPU(s): each TensorFlow task wants about "
             "a core and 0.5 GB; expect a slow start")


def check_run_dir(run_dir: Path) -> None:
    """What can be told without creating it: the run directory, or the nearest existing
    folder above it, must be a directory, and it must not hold a run already."""
    path = run_dir
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir():
        raise SpecError(f"--run-dir {run_dir}: {path} is not a directory")
    try:
        RunDir(str(run_dir)).check_new()
    except RunDirError as e:
        raise SpecError(str(e)) from None


def make_run_dir(p: Plan) -> IO[bytes]:
    """Made, locked, and plan.json written, before anything starts: a bad place, a full disk
    or another run there is an error for the user here, not a traceback or a mixed run
    later. The returned file holds the lock while the run goes on."""
    try:
        return RunDir(p.run_dir).create(p.to_json())
    except RunDirError as e:
        raise SpecError(str(e)) from None
    except OSError as e:
        raise SpecError(f"run directory {p.run_dir}: cannot write {e.filename or p.run_dir}: "
                        f"{e.strerror or e}") from None


class Loaded(NamedTuple):
    """A source, read once: the spec, and for a run's plan.json the plan it reruns."""

    spec: ClusterSpec
    old: Plan | None = None  # a rerun's: its tasks' ports (the same TF_CONFIGs) and backups

    @property
    def ports(self) -> dict[str, int] | None:
        return self.old.ports() if self.old is not None else None


def load_source(source: Source) -> Loaded:
    """A cluster file; or a run's plan.json, to run the same tasks again: the spec it was
    made from, and its plan (the ports it had: the same TF_CONFIGs, `auto` ports included);
    or a cluster file's data (a dict: made from flags, or a Python caller's); or a
    ClusterSpec."""
    from orchestrator.planning.spec import ClusterSpec, parse_spec
    from orchestrator.planning.specfile import SpecFileError, read_data

    if isinstance(source, ClusterSpec):
        return Loaded(source)
    if isinstance(source, dict):
        return Loaded(parse_spec(source, FROM_FLAGS))
    try:
        data = read_data(Path(source))
    except SpecFileError as err:
        raise SpecError(str(err)) from None
    old = _as_plan(data, str(source))
    if old is None:
        return Loaded(parse_spec(data, str(source)))
    return Loaded(old.spec, old)


def _as_plan(data: object, source: str) -> Plan | None:
    """A file's data as a run's plan.json (SpecError naming the field), None: a cluster
    file's."""
    from orchestrator.planning.plan import Plan

    if not (isinstance(data, dict) and {"run_id", "spec", "tasks"} <= data.keys()):
        return None
    return Plan.from_json(data, source)


def prepare(source: Source | Loaded, run_dir: Path | None, dry_run: bool = False,
            ask_hosts: bool = True, say: Say = _quiet, warn: Say = _quiet
            ) -> tuple[Plan, Backends]:
    """Load (unless `source` was: `Loaded`), validate, allocate (ports, and GPUs of `auto`
    hosts) and plan; raises SpecError with a message for the user. A dry run names no run
    id: each real run gets a new one, so a made-up id would be a false promise. Without
    `ask_hosts` lab hosts are not contacted (`tfo plan`). The caller closes the backends."""
    from orchestrator.launch.backends import Backends
    from orchestrator.planning.plan import make_plan

    loaded = source if isinstance(source, Loaded) else load_source(source)
    spec, ports = loaded.spec, loaded.ports
    check_entry_importable(spec, Path.cwd())
    check_local_tasks(spec, warn)
    stamp = RUN_ID_PATTERN if dry_run else \
        f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}"  # not secrets: 0.02 s to import
    run_id = f"{spec.name}-{stamp}"
    rd = RunDir(str(Path(run_dir).resolve())) if run_dir else RunDir.default(run_id)
    check_run_dir(Path(rd.path))
    backends = Backends(spec.hosts)
    try:
        # A scheduler's nodes first (Slurm: the allocation), then ports on them.
        nodes = backends.place(spec, dry_run, say)
        if ports is None or nodes:  # a scheduler's ports are the new nodes' own
            ports = backends.allocate(spec)
        gpus = backends.gpus(spec, ask_hosts)
        for name, report in gpus.items():
            if report.note:
                warn(f"{name}: gpus auto: {report}")
        plan = make_plan(spec, run_id=run_id, run_dir=rd.path, workdir=Path.cwd(), ports=ports,
                         gpus={host: report.ids for host, report in gpus.items()}, nodes=nodes)
    except BaseException:  # Ctrl-C in the queue too: an allocation is given back
        backends.close()
        raise
    return plan, backends


def problems(rows: list[HostCheck]) -> list[str]:
    return [problem for r in rows for problem in r.problems]


def write_cluster_file(p: Plan, spec: dict, made_by: str) -> Path:
    """The cluster file a command line made, so the run can be repeated and grown into a
    file; where it was written."""
    from orchestrator.planning.quick import cluster_yaml

    path = Path(RunDir(p.run_dir).cluster_path)
    try:
        write_private(path, cluster_yaml(spec, made_by))
    except OSError as e:
        raise SpecError(f"run directory {p.run_dir}: cannot write {path}: "
                        f"{e.strerror or e}") from None
    return path


def serve_metrics(spec: MetricsSpec | None, p: Plan, say: Say) -> Exporter | None:
    """The run's /metrics endpoint, said; an address or port that cannot be had is the
    user's error, before any task starts."""
    if spec is None:
        return None
    from orchestrator.loop.metrics import Exporter

    try:
        exporter = Exporter.serve(spec, p)
    except OSError as e:
        raise SpecError(f"metrics: cannot listen on {spec.address}:{spec.port}: "
                        f"{e.strerror or e} (metrics.port, or --metrics-port: a free port, "
                        "or 0 for any)") from None
    say(f"metrics at {exporter.url}")
    return exporter


@contextlib.contextmanager
def _no_display(p: Plan) -> Iterator[tuple[None, None]]:
    yield None, None


def run(source: Source, run_dir: Path | str | None = None, *, say: Say = _quiet,
        warn: Say = _quiet, display: Display = _no_display,
        started: Callable[[Plan], None] | None = None, stage: Say = _quiet,
        made_by: str = "python", pool: WarmPool | None = None,
        timing: Timing | None = None, metrics: MetricsSpec | None = None) -> RunResult:
    """Run a job to its end and return its result: the whole of `tfo run` but the printing.
    `stage(what)` is told what is under way (for a message if a signal cuts it short);
    `started(plan)` is called once the tasks are started. A dict source is written into the
    run directory as cluster.yaml (`made_by` its first comment). A `pool` (launch/pool.py)
    serves local tasks with processes that imported TensorFlow already; `timing`, the loop's own
    limits (decide.Timing: the test kit's shorter teardown grace); `metrics`, a Prometheus
    endpoint (loop/metrics.py) in place of the cluster file's."""
    from orchestrator.elastic.backupstore import for_lab
    from orchestrator.elastic.groups import first as elastic_first
    from orchestrator.loop import backupfill
    from orchestrator.loop.supervise import Supervisor

    stage("planning")
    loaded = load_source(source)  # read once: a rerun's old plan is kept, not read again
    p, backends = prepare(loaded, Path(run_dir) if run_dir else None, say=say, warn=warn)
    # An elastic job runs its first group: planned here, once (plan.json keeps the pool's).
    first = elastic_first(p) if p.spec.elastic is not None else None
    if pool is not None:
        backends.local().pool = pool
    settled()  # before anything is started: the tasks get the user's environment
    lock: IO[bytes] | None = None  # the run directory's, while the run goes on
    exporter = None
    try:
        stage("checking the hosts")
        checks = backends.check(p, versions=False)  # check
        if found := problems(checks):
            raise CannotStart(found)
        for note in (note for r in checks for note in r.notes):
            warn(note)
        lock = make_run_dir(p)
        if isinstance(source, dict):
            path = write_cluster_file(p, source, made_by)
            shown = os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)
            say(f"cluster file {shown}; to repeat: tfo run {shlex.quote(shown)}")
        stage("copying the code to the hosts (partial files removed)")
        for line in backends.sync(p):  # sync
            say(line)
        stage("starting the supervisor")
        exporter = serve_metrics(metrics or p.spec.metrics, p, say)
        with display(p) as (echo, watch):  # supervise
            if exporter is not None:
                watch = exporter.chain(watch)
            standby = backends.standby if backends.spares else None  # the check's
            stage("supervising")
            supervisor = Supervisor(p, start=backends.start, echo=echo, watch=watch,
                                    standby=standby, start_batch=backends.start_batch,
                                    backup_store=for_lab(p.spec.hosts,
                                                         lambda: backends.get("ssh")),
                                    timing=timing, elastic=first)
            if exporter is not None and supervisor.resizing is not None:
                resizing = supervisor.resizing
                exporter.resizes = lambda: len(resizing.resized)
            if loaded.old is not None:  # a rerun resumes
                backupfill.rerun(loaded.old, supervisor.refill, say)
            return supervisor.run(started=functools.partial(started, p) if started else None)
    finally:
        if exporter is not None:
            exporter.close()
        backends.close()
        if lock is not None:
            lock.close()

