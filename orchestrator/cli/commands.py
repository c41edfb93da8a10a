"""The `tfo` command: plan, run, rerun, status, logs, check.

    tfo plan clusters/localhost.yaml          # the dry run: every task's TF_CONFIG and command
    tfo run clusters/localhost.yaml           # bring up, watch, restart, tear down
    tfo run --workers 2 -- python train.py    # no file: flags make one (planning/quick.py)
    tfo run runs/<id>/plan.json               # the same tasks again, in a new run directory
    tfo rerun last                            # the same (RUN: a run directory, id, id prefix)
    tfo runs                                  # past runs: id, name, start, duration, outcome
    tfo status [RUN]                          # a run's tasks, from its events.jsonl
    tfo logs [RUN] [worker:1] [-f]            # one task's log, or all; -f follows the run
    tfo schema                                # the cluster file's JSON Schema

`tfo run` is: spec → place (a Slurm job's nodes) → allocate (ports) → plan → check → sync →
supervise.

Imports: `tfo --help` and `tfo plan` answer in a fraction of a second because this module
imports only typer and light modules at the top. Anything heavier (pydantic models: spec,
plan, quick, markers; rich; psutil; fabric and paramiko; yaml; supervise; the backends) is
imported inside the command or function that uses it; `out` and `err` make their rich
Console on first use. tests/test_startup.py holds this to account.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.common import HELP
from orchestrator.cli.console import (
    point_at_devnull,
    printable,
    reopen_closed_std_streams,
)
from orchestrator.cli.exportcmd import export_app
from orchestrator.cli.guide import EPILOG
from orchestrator.cli.messages import (
    fail,
    made_by,
    one_error_style,
    say,
    warn,
)
from orchestrator.cli.options import (
    _COMMAND,
    AccountOpt,
    ChiefOpt,
    CommandAfterDashes,
    DataWorkersOpt,
    EvaluatorOpt,
    FileArg,
    GpusPerTaskOpt,
    HostsFileOpt,
    HostsOpt,
    IndependentOpt,
    JsonOpt,
    LogsOpt,
    MaxRestartsOpt,
    MetricsAddressOpt,
    MetricsPortOpt,
    NameOpt,
    NodesOpt,
    OnOpt,
    PartitionOpt,
    PsOpt,
    RestartOpt,
    RunArg,
    RunDirOpt,
    SecondsOpt,
    ShowOpt,
    SlurmArgOpt,
    SourceArg,
    StrategyOpt,
    TasksOpt,
    TasksPerNodeOpt,
    TimeOpt,
    VerboseOpt,
    WorkersOpt,
)
from orchestrator.cli.report import (
    err,
    job_line,
    labeled,
    out,
    preflight_table,
    print_plan,
    print_table,
    runs_table,
    status_lines,
)
from orchestrator.cli.running import run_job
from orchestrator.errors import SpecError
from orchestrator.launch import BackendError
from orchestrator.pipeline import problems as host_problems
from orchestrator.runs.rundir import (
    RUNS,
    RunDir,
    RunDirError,
    list_runs,
    run_over,
)
from orchestrator.startup import settled, starting

if TYPE_CHECKING:

    from orchestrator.launch.backends import Backends
    from orchestrator.planning.plan import Plan
    from orchestrator.planning.quick import QuickFlags, SlurmFlags

app = typer.Typer(**HELP,
                  help="Run multi-worker TensorFlow jobs on this machine or on a lab's machines.",
                  epilog=EPILOG)


def _version(value: bool) -> None:
    if value:
        # The installed distribution's (pyproject's version), as pip shows it.
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"tfo {version('tf-orchestrator')}")
        except PackageNotFoundError:
            print("tfo (not installed: run from a source tree)")
        raise typer.Exit(0)


@app.callback()
def _main(version: Annotated[bool, typer.Option(
        "--version", help="print tfo's version and exit", callback=_version,
        is_eager=True)] = False) -> None:
    """Run multi-worker TensorFlow jobs on this machine or on a lab's machines."""


def prepare(source: Path | dict, run_dir: Path | None, dry_run: bool = False,
            ask_hosts: bool = True) -> tuple[Plan, Backends]:
    """orchestrator.pipeline.prepare, saying what it does on stderr."""
    from orchestrator import pipeline

    return pipeline.prepare(source, run_dir, dry_run, ask_hosts, say=say, warn=warn)


def _source(ctx: typer.Context | None, file: Path | None, flags: QuickFlags,
            slurm: SlurmFlags | None = None) -> Path | dict:
    """What to run (quick.source_from); a wrong combination is the user's error, exit 2."""
    from orchestrator.planning.quick import source_from

    try:
        return source_from(ctx.meta.get(_COMMAND) if ctx is not None else None, file, flags,
                           slurm, ctx.info_name if ctx is not None else "run")
    except SpecError as e:
        raise fail(str(e)) from None


@app.command(cls=CommandAfterDashes,
             short_help="Print what run would start, without starting anything")
def plan(ctx: typer.Context, file: SourceArg = None, as_json: Annotated[bool, typer.Option(
        "--json", help="print the plan as JSON, as plan.json holds it")] = False,
         run_dir: RunDirOpt = None,
         workers: WorkersOpt = None, chief: ChiefOpt = False, ps: PsOpt = None,
         evaluator: EvaluatorOpt = False, strategy: StrategyOpt = None, hosts: HostsOpt = None,
         hosts_file: HostsFileOpt = None, name: NameOpt = None, restart: RestartOpt = None,
         max_restarts: MaxRestartsOpt = None, independent: IndependentOpt = False,
         on: OnOpt = None, partition: PartitionOpt = None, time_limit: TimeOpt = None,
         nodes: NodesOpt = None,
         tasks_per_node: TasksPerNodeOpt = None, gpus_per_task: GpusPerTaskOpt = None,
         account: AccountOpt = None, slurm_arg: SlurmArgOpt = None,
         data_workers: DataWorkersOpt = None) -> None:
    """Print what `run` would start, without starting anything: `tfo plan FILE`, or
    `tfo plan --workers 2 -- python train.py` (then also the cluster file it makes).

    \b
    Examples:
      tfo plan clusters/localhost.yaml
      tfo plan --workers 2 -- python train.py
      tfo plan clusters/lab.yaml --json"""
    from orchestrator.planning.quick import QuickFlags, SlurmFlags

    source = _source(ctx, file, QuickFlags(
        workers, chief, ps, evaluator, strategy, hosts, _str(hosts_file), None, name, restart,
        max_restarts, independent, data_workers), SlurmFlags(
            on, partition, time_limit, nodes, tasks_per_node, gpus_per_task, account,
            tuple(slurm_arg or ())))
    try:
        p, backends = prepare(source, run_dir, dry_run=True, ask_hosts=False)
    except SpecError as e:
        raise fail(str(e)) from None
    backends.close()
    if as_json:  # the plan as plan.json holds it
        from orchestrator.planning.plan import json_text

        sys.stdout.write(json_text(p.to_json()))
        return
    print_plan(p, run_dir is not None, source if isinstance(source, dict) else None,
               made_by())


@app.command(short_help="Preflight every host: reachable, python, TF, ports")
def check(file: FileArg) -> None:
    """Preflight every host at once: reachable, authenticated, python, TF versions, ports,
    workdir. Exit 0 when all is well, 1 naming each problem.

    \b
    Examples:
      tfo check clusters/lab.yaml"""
    try:
        p, backends = prepare(file, None, dry_run=True)
    except (SpecError, BackendError) as e:
        raise fail(str(e)) from None
    t0 = time.monotonic()
    try:
        rows = backends.check(p, versions=True)  # the table shows them
    finally:
        backends.close()
    out.print(preflight_table(rows))
    out.print(f"checked {len(rows)} host(s) in {time.monotonic() - t0:.2f} s")
    problems = host_problems(rows)
    from orchestrator.launch.loopback import listen_note

    out.print(listen_note(p.tasks), soft_wrap=True)
    for note in (note for r in rows for note in r.notes):  # said; the run would start
        err.print(labeled("note:", "yellow", note), soft_wrap=True)
    for problem in problems:
        err.print(labeled("problem:", "red", problem), soft_wrap=True)
    raise typer.Exit(1 if problems else 0)


@app.command(short_help="Print the cluster file's JSON Schema, for editors")
def schema() -> None:
    """Print the cluster file's JSON Schema, for editors: `tfo schema > cluster.schema.json`."""
    from orchestrator.planning.spec import cluster_schema

    print(json.dumps(cluster_schema(), indent=2))


@app.command(cls=CommandAfterDashes,
             short_help="Bring the job up, watch it, restart by policy, tear it down")
def run(file: SourceArg = None, run_dir: RunDirOpt = None,
        verbose: VerboseOpt = False, logs: LogsOpt = True, workers: WorkersOpt = None,
        chief: ChiefOpt = False, ps: PsOpt = None, evaluator: EvaluatorOpt = False,
        strategy: StrategyOpt = None,
        hosts: HostsOpt = None, hosts_file: HostsFileOpt = None, name: NameOpt = None,
        restart: RestartOpt = None, max_restarts: MaxRestartsOpt = None,
        independent: IndependentOpt = False, on: OnOpt = None,
        partition: PartitionOpt = None, time_limit: TimeOpt = None, nodes: NodesOpt = None,
        tasks_per_node: TasksPerNodeOpt = None, gpus_per_task: GpusPerTaskOpt = None,
        account: AccountOpt = None, slurm_arg: SlurmArgOpt = None, show: ShowOpt = None,
        metrics_port: MetricsPortOpt = None, metrics_address: MetricsAddressOpt = None,
        data_workers: DataWorkersOpt = None,
        ctx: typer.Context = None) -> None:  # type: ignore[assignment]  # last: run(FILE) works
    """Bring the job up, watch it, restart by policy, tear it down.
    FILE may be a run's plan.json: the same tasks again, in a new run directory. Without
    FILE, the command after -- runs (`tfo run --workers 2 -- python train.py --epochs 3`), and
    the cluster file made for it is written into the run directory as cluster.yaml. With
    `--on slurm`, the same job runs in one Slurm allocation, each task a job step.
    On a terminal a table of the tasks (state, CPU, memory, epoch, step, loss, last line)
    and a progress bar stay below their lines, redrawn every second; piped, the lines only.
    Either way the table at the end, and last the verdict.

    Exit codes: 0 the job succeeded, 1 it failed, 2 bad cluster file or usage (nothing
    started), 129 hung up (SIGHUP), 130 interrupted (Ctrl-C), 131 quit (SIGQUIT), 143
    terminated (SIGTERM).

    \b
    Examples:
      tfo run --workers 2 -- python train.py --epochs 3
      tfo run clusters/localhost.yaml --show worker:0
      tfo run runs/<id>/plan.json
      tfo run clusters/localhost.yaml --metrics-port 9400   # Prometheus: docs/guide/watching.md"""
    from orchestrator.loop.metrics import from_flags
    from orchestrator.planning.quick import QuickFlags, SlurmFlags

    source = _source(ctx, file, QuickFlags(
        workers, chief, ps, evaluator, strategy, hosts, _str(hosts_file), None, name, restart,
        max_restarts, independent, data_workers), SlurmFlags(
            on, partition, time_limit, nodes, tasks_per_node, gpus_per_task, account,
            tuple(slurm_arg or ())))
    try:
        metrics = from_flags(metrics_port, metrics_address)
    except SpecError as e:
        raise fail(str(e)) from None
    run_job(source, run_dir, verbose, logs, show, metrics)


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


@app.command(short_help="Submit the job as a Slurm batch job")
def submit(file: FileArg, partition: PartitionOpt = None, time_limit: TimeOpt = None,
           nodes: NodesOpt = None, tasks_per_node: TasksPerNodeOpt = None,
           gpus_per_task: GpusPerTaskOpt = None, account: AccountOpt = None,
           slurm_arg: SlurmArgOpt = None) -> None:
    """Submit FILE as a Slurm batch job (sbatch) that runs `tfo run` inside its allocation:
    the request from backend.slurm (or these flags), the run directory chosen now, so
    `tfo status`/`tfo logs` follow it from here. It outlives your login session."""
    from orchestrator.cli.submit import submit as submit_job
    from orchestrator.planning.quick import SlurmFlags

    try:
        job_id, rd, script = submit_job(file, SlurmFlags(
            "slurm", partition, time_limit, nodes, tasks_per_node, gpus_per_task, account,
            tuple(slurm_arg or ())), made_by(), sys.executable, Path(RUNS))
    except SpecError as e:
        raise fail(str(e)) from None
    out.print(f"submitted slurm job {job_id}: {script}\nfollow it: tfo status {rd}   "
              f"tfo logs {rd} -f   tfo status --wait {rd}   squeue -j {job_id}",
              soft_wrap=True, highlight=False, markup=False)


@app.command(short_help="Run a run's plan again, in a new run directory")
def rerun(run_ref: RunArg = None, run_dir: RunDirOpt = None, verbose: VerboseOpt = False,
          logs: LogsOpt = True, show: ShowOpt = None) -> None:
    """Run a run's plan again: the same tasks, ports and TF_CONFIGs, in a new run directory;
    training resumes from the run's backups (or starts over where it left none, as said).

    \b
    Examples:
      tfo rerun last
      tfo rerun train-20261127"""
    run_job(Path(_find_run(run_ref).plan_path), run_dir, verbose, logs, show)


def _find_run(ref: str | None) -> RunDir:
    try:
        return RunDir.find(ref)
    except RunDirError as e:
        raise fail(str(e)) from None


@app.command(short_help="A run's tasks: state, epoch, loss, exit")
def status(run_ref: RunArg = None, as_json: JsonOpt = False, wait: Annotated[bool, typer.Option(
        "--wait", help="wait for the run to end, then print and exit with its exit code "
        "(1 for a run whose coordinator was lost)")] = False) -> None:
    """The tasks of a run (the latest by default) as its events.jsonl tells them: state,
    restarts, last epoch, step, steps/s and loss, last event, exit; and the tasks it named slow.

    \b
    Examples:
      tfo status
      tfo status last
      tfo status train-20261127-0349
      tfo status --wait --json RUN_DIR     # for scripts: docs/reference/state-json.md"""
    from orchestrator.cli import statejson
    from orchestrator.cli.liveview import STATUS, rows_from_events, table, without_restarts
    from orchestrator.cli.submit import not_started

    rd = _find_run(run_ref)
    try:
        not_started(Path(rd.path), wait)
    except SpecError as e:
        raise fail(str(e)) from None
    if wait:
        statejson.wait(rd)
    try:
        events, skipped = rd.read_events()
    except OSError as e:
        raise fail(f"{rd}: cannot read events.jsonl: {e.strerror or e}") from None
    doc = statejson.status(rd, events, skipped) if as_json or wait else None
    if as_json:
        sys.stdout.write(statejson.text(doc))
        raise typer.Exit(statejson.exit_code(doc) if wait else 0)
    line, abnormal = job_line(events, skipped, rd.held())
    rows = rows_from_events(events, over=abnormal, now=time.time())
    print_table(out, table(rows, without_restarts(rows, STATUS), title=f"{rd.name}: {line}",
                           width=out.width))
    for line in status_lines(events):
        out.print(printable(line), soft_wrap=True, highlight=False, markup=False)
    if skipped:
        err.print(f"{rd.events_path}: skipped {skipped} unreadable line(s)")
    if doc is not None:
        raise typer.Exit(statejson.exit_code(doc))


@app.command(short_help="The runs under runs/: id, start, duration, outcome")
def runs(as_json: JsonOpt = False) -> None:
    """The runs under runs/, oldest first: id, cluster name, start, duration, outcome,
    restarts.

    \b
    Examples:
      tfo runs
      tfo runs --json"""
    found, broken = list_runs()
    if as_json:
        from orchestrator.cli import statejson

        sys.stdout.write(statejson.text(statejson.runs(found, broken)))
        return
    print_table(out, runs_table(found, width=out.width))
    if broken:
        what = "directory that is not a readable run" if broken == 1 else \
            "directories that are not readable runs"
        err.print(f"skipped {broken} {what} under {RUNS}/ (no plan.json, or no events.jsonl "
                  "that starts with run_started)", soft_wrap=True)


_TASK_NAME = re.compile(r"^[a-z_]+:\d+$")


FOLLOW_SECONDS = 0.25  # how often `tfo logs -f` looks for new lines


@app.command(short_help="Trace a running job's tasks at once and name the slow one")
def profile(run_ref: RunArg = None, seconds: SecondsOpt = 2.0, tasks: TasksOpt = None) -> None:
    """Trace every training task at once into the run's TensorBoard folder; print each task's
    step time and shares of input, compute and communication, and name the slow task.
    Exit 1 when no trace was written (the table says why), 2 for a run that is over.

    \b
    Examples:
      tfo profile
      tfo profile last --seconds 5 --tasks worker:0,worker:1"""
    from orchestrator.launch import profiling
    try:
        found = profiling.profile(_find_run(run_ref), seconds, tasks.split(",") if tasks else None)
    except profiling.ProfileError as e:
        raise fail(str(e)) from None
    out.print("\n".join(map(printable, profiling.lines(found))), soft_wrap=True, markup=False)
    raise typer.Exit(0 if found.traced else 1)


@app.command(short_help="Print a task's log, or every task's; -f follows the run")
def logs(run_dir: Annotated[str | None, typer.Argument(
            help="a run directory, id or id prefix, or a task name (of the latest run)",
            show_default=False)] = None,
         task: Annotated[str | None, typer.Argument(help="e.g. worker:1")] = None,
         lines: Annotated[int, typer.Option("-n", help="last N lines")] = 0,
         follow: Annotated[bool, typer.Option(
             "--follow", "-f", help="go on printing lines as they come, until the run ends "
             "(Ctrl-C stops sooner)")] = False,
         raw: Annotated[bool, typer.Option(
             "--raw", help="also the @tfo marker lines tfo itself reads")] = False) -> None:
    """Print a task's log, or every task's interleaved by time, each line [role:index] first:
    `tfo logs`, `tfo logs worker:1`, `tfo logs last worker:1 -f`, `tfo logs RUN_DIR worker:1`.

    \b
    Examples:
      tfo logs worker:1
      tfo logs last worker:1 -f
      tfo logs train-20261127 -n 50"""
    from orchestrator.cli.logprint import LogPrinter

    if task is None and run_dir and _TASK_NAME.match(run_dir) and not Path(run_dir).is_dir():
        run_dir, task = None, run_dir
    rd = _find_run(run_dir)
    found = rd.task_logs()
    if not found:
        raise fail(f"{rd}: no task logs there (is it a run directory?)")
    if task and task not in found:
        raise fail(f"no task {task!r} in {rd}; tasks: {', '.join(found)}")
    # A task's output is untrusted: escaped for a terminal, as printed into a file or pipe.
    show = LogPrinter(rd, task, raw, printable if sys.stdout.isatty() else str).show
    try:
        show(lines, whole=not follow)
        if follow:
            settled()
        while follow:
            over = run_over(rd)  # before reading: the lines written before the end are read
            show(0, whole=over)
            if over:
                break
            time.sleep(FOLLOW_SECONDS)
    except BrokenPipeError:  # `tfo logs | head`: the reader has what it wanted
        point_at_devnull(sys.stdout.fileno())
        return
    if follow:  # how the run ended, rather than a silent return to the prompt
        with contextlib.suppress(OSError):
            events, skipped = rd.read_events()
            err.print(labeled("tfo:", "bold", f"run {rd.name} ended: "
                              f"{job_line(events, skipped, rd.held())[0]}"), soft_wrap=True)


app.add_typer(export_app, name="export",
              short_help="Hand the job to another engine: a Kubernetes JobSet, a Kubeflow TFJob")


def main() -> None:
    reopen_closed_std_streams()
    # Line-buffered even into a pipe, so `[worker:1]` lines arrive as they happen.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    one_error_style()
    try:
        with starting():
            app()
    except KeyboardInterrupt:  # Ctrl-C before the supervisor took over: nothing started yet
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
