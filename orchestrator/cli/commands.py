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
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli.console import (
    ConsoleWriter,
    console_echo,
    point_at_devnull,
    printable,
    reopen_closed_std_streams,
)
from orchestrator.cli.guide import EPILOG, guide_page
from orchestrator.cli.options import (
    _COMMAND,
    AccountOpt,
    ChiefOpt,
    CommandAfterDashes,
    EvaluatorOpt,
    FileArg,
    GpusPerTaskOpt,
    HostsFileOpt,
    HostsOpt,
    IndependentOpt,
    LogsOpt,
    MaxRestartsOpt,
    NameOpt,
    NodesOpt,
    OnOpt,
    PartitionOpt,
    PsOpt,
    RestartOpt,
    RunArg,
    RunDirOpt,
    SlurmArgOpt,
    SourceArg,
    StrategyOpt,
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
    print_summary,
    resize_lines,
    runs_table,
)
from orchestrator.errors import SpecError
from orchestrator.launch import BackendError
from orchestrator.pipeline import CannotStart, load_source
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

EXIT_BAD_SPEC = 2
# Plain help and errors: typer's rich formatting imports rich's markdown and traceback
# modules (0.16 s of CPU here, more than half of what `tfo --help` may take). So help
# strings are plain text: write `[default: x]`, no markup, no escapes.
HELP = {"rich_markup_mode": None, "add_completion": False, "no_args_is_help": True,
        "pretty_exceptions_enable": False}
app = typer.Typer(**HELP,
                  help="Run multi-worker TensorFlow jobs on this machine or on a lab's machines.",
                  epilog=EPILOG)


def _fail(message: str) -> typer.Exit:
    err.print(labeled("error:", "bold red", message), soft_wrap=True)
    page = guide_page(message)
    if page:
        err.print(f"see: {page}", soft_wrap=True)
    return typer.Exit(EXIT_BAD_SPEC)


def _say(line: str) -> None:
    err.print(labeled("tfo:", "bold", line), soft_wrap=True)


def _warn(line: str) -> None:
    err.print(labeled("warning:", "yellow", line), soft_wrap=True)


def prepare(source: Path | dict, run_dir: Path | None, dry_run: bool = False,
            ask_hosts: bool = True) -> tuple[Plan, Backends]:
    """orchestrator.pipeline.prepare, saying what it does on stderr."""
    from orchestrator import pipeline

    return pipeline.prepare(source, run_dir, dry_run, ask_hosts, say=_say, warn=_warn)


def _source(ctx: typer.Context | None, file: Path | None, flags: QuickFlags,
            slurm: SlurmFlags | None = None) -> Path | dict:
    """What to run (quick.source_from); a wrong combination is the user's error, exit 2."""
    from orchestrator.planning.quick import source_from

    try:
        return source_from(ctx.meta.get(_COMMAND) if ctx is not None else None, file, flags,
                           slurm, ctx.info_name if ctx is not None else "run")
    except SpecError as e:
        raise _fail(str(e)) from None


def _made_by() -> str:
    return shlex.join(["tfo", *sys.argv[1:]])


@app.command(cls=CommandAfterDashes)
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
         account: AccountOpt = None, slurm_arg: SlurmArgOpt = None) -> None:
    """Print what `run` would start, without starting anything: `tfo plan FILE`, or
    `tfo plan --workers 2 -- python train.py` (then also the cluster file it makes)."""
    from orchestrator.planning.quick import QuickFlags, SlurmFlags

    source = _source(ctx, file, QuickFlags(
        workers, chief, ps, evaluator, strategy, hosts, _str(hosts_file), None, name, restart,
        max_restarts, independent), SlurmFlags(on, partition, time_limit, nodes, tasks_per_node,
                                  gpus_per_task, account, tuple(slurm_arg or ())))
    try:
        p, backends = prepare(source, run_dir, dry_run=True, ask_hosts=False)
    except SpecError as e:
        raise _fail(str(e)) from None
    backends.close()
    if as_json:  # the plan as plan.json holds it
        from orchestrator.planning.plan import json_text

        sys.stdout.write(json_text(p.to_json()))
        return
    print_plan(p, run_dir is not None, source if isinstance(source, dict) else None,
               _made_by())


@app.command()
def check(file: FileArg) -> None:
    """Preflight every host at once: reachable, authenticated, python, TF versions, ports,
    workdir. Exit 0 when all is well, 1 naming each problem."""
    try:
        p, backends = prepare(file, None, dry_run=True)
    except (SpecError, BackendError) as e:
        raise _fail(str(e)) from None
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
    for problem in problems:
        err.print(labeled("problem:", "red", problem), soft_wrap=True)
    raise typer.Exit(1 if problems else 0)


@app.command()
def schema() -> None:
    """Print the cluster file's JSON Schema, for editors: `tfo schema > cluster.schema.json`."""
    from orchestrator.planning.spec import cluster_schema

    print(json.dumps(cluster_schema(), indent=2))


@app.command(cls=CommandAfterDashes)
def run(file: SourceArg = None, run_dir: RunDirOpt = None,
        verbose: VerboseOpt = False, logs: LogsOpt = True, workers: WorkersOpt = None,
        chief: ChiefOpt = False, ps: PsOpt = None, evaluator: EvaluatorOpt = False,
        strategy: StrategyOpt = None,
        hosts: HostsOpt = None, hosts_file: HostsFileOpt = None, name: NameOpt = None,
        restart: RestartOpt = None, max_restarts: MaxRestartsOpt = None,
        independent: IndependentOpt = False, on: OnOpt = None,
        partition: PartitionOpt = None, time_limit: TimeOpt = None, nodes: NodesOpt = None,
        tasks_per_node: TasksPerNodeOpt = None, gpus_per_task: GpusPerTaskOpt = None,
        account: AccountOpt = None, slurm_arg: SlurmArgOpt = None,
        ctx: typer.Context = None) -> None:  # type: ignore[assignment]  # last: run(FILE) works
    """Bring the job up, watch it, restart by policy, tear it down; exit 0/1/2/129/130/131/143.
    FILE may be a run's plan.json: the same tasks again, in a new run directory. Without
    FILE, the command after -- runs (`tfo run --workers 2 -- python train.py --epochs 3`), and
    the cluster file made for it is written into the run directory as cluster.yaml. With
    `--on slurm`, the same job runs in one Slurm allocation, each task a job step.
    On a terminal a table of the tasks (state, CPU, memory, epoch, step, loss, last line)
    stays below their lines, redrawn every second; piped, the lines only, and the table at
    the end."""
    from orchestrator.planning.quick import QuickFlags, SlurmFlags

    source = _source(ctx, file, QuickFlags(
        workers, chief, ps, evaluator, strategy, hosts, _str(hosts_file), None, name, restart,
        max_restarts, independent), SlurmFlags(on, partition, time_limit, nodes, tasks_per_node,
                                  gpus_per_task, account, tuple(slurm_arg or ())))
    _run(source, run_dir, verbose, logs)


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


class _Interrupted(BaseException):
    """SIGTERM, SIGHUP or SIGQUIT before the supervisor took over (it has its own handlers)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum


def _interrupt(signum: int, frame: object) -> None:
    raise _Interrupted(signum)


def _run(source: Path | dict, run_dir: Path | None, verbose: bool, logs: bool = True) -> None:
    """orchestrator.pipeline.run, printing: its lines, the tasks' (a ConsoleWriter, and the
    live view on a terminal), the summary; its errors as the user's, with the exit code."""
    # Until the supervisor takes over, SIGTERM, SIGHUP and SIGQUIT end tfo as Ctrl-C does: what was
    # under way (a host's check, a code sync) is said and cleaned up, not cut off silently.
    import signal

    from orchestrator.pipeline import run as run_pipeline

    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, _interrupt)
    stage = ["planning"]  # what was under way, for the message
    shown: list[ConsoleWriter] = []  # the console, once the supervisor takes over

    @contextlib.contextmanager
    def display(p: Plan) -> Iterator[tuple[Any, Any]]:
        from orchestrator.cli.liveview import LiveView, is_live_terminal

        fd = sys.stdout.fileno()
        console = ConsoleWriter(fd)
        shown.append(console)
        view = LiveView(console, fd) if is_live_terminal(fd) else None
        try:
            yield console_echo(console.write, verbose, logs, view.seen if view else None), view
        finally:
            if view is not None:
                view.close()  # the summary's table takes its place
            console.close()

    def started(p: Plan) -> None:
        """Said once the tasks are started: rich loads then (liveview defers it too). A
        closed stderr does not stop the run; events.jsonl has it all."""
        with contextlib.suppress(OSError):
            _say(f"run {p.run_id}: {len(p.tasks)} tasks, logs in {p.run_dir}/logs")

    def under_way(what: str) -> None:
        stage[0] = what

    try:
        result = run_pipeline(source, run_dir, say=_say, warn=_warn, display=display,
                              started=started, stage=under_way, made_by=_made_by())
    except (_Interrupted, KeyboardInterrupt) as e:
        signum = e.signum if isinstance(e, _Interrupted) else signal.SIGINT
        err.print(f"tfo: interrupted by {signal.Signals(signum).name} while {stage[0]}; "
                  "nothing was started", soft_wrap=True)
        raise typer.Exit(128 + signum) from None
    except CannotStart as e:
        raise _fail(str(e)) from None
    except (SpecError, BackendError) as e:  # planning's own words; later, nothing started
        started_some = stage[0] == "supervising" and isinstance(e, BackendError)
        raise _fail(str(e) if stage[0] == "planning" or started_some
                    else f"{e}; nothing was started") from None
    except OSError as e:  # e.g. the run directory's disk filled up once the run was going
        if stage[0] == "planning":
            raise
        where = f"{e.filename}: " if e.filename else ""
        err.print(labeled("error:", "bold red", f"{where}{e.strerror or e}"), soft_wrap=True)
        raise typer.Exit(1) from None
    with contextlib.suppress(OSError):  # a closed terminal (SIGHUP); events.jsonl has it all
        console = shown[0]
        if console.dropped:
            err.print(f"tfo: {console.dropped} console lines dropped (slow reader); logs are "
                      f"complete in {result.run_dir}/logs", soft_wrap=True)
        if console.reader_gone:
            err.print(f"tfo: stdout was closed; console echo stopped; logs are complete in "
                      f"{result.run_dir}/logs", soft_wrap=True)
        print_summary(result)
    raise typer.Exit(result.exit_code)


@app.command()
def rerun(run_ref: RunArg = None, run_dir: RunDirOpt = None, verbose: VerboseOpt = False,
          logs: LogsOpt = True) -> None:
    """Run a run's plan again: the same tasks, ports and TF_CONFIGs, in a new run directory;
    training resumes from the run's backups (or starts over where it left none, as said)."""
    _run(Path(_find_run(run_ref).plan_path), run_dir, verbose, logs)


def _find_run(ref: str | None) -> RunDir:
    try:
        return RunDir.find(ref)
    except RunDirError as e:
        raise _fail(str(e)) from None


@app.command()
def status(run_ref: RunArg = None) -> None:
    """The tasks of a run (the latest by default) as its events.jsonl tells them: state,
    restarts, last epoch, step, steps/s and loss, last event, exit."""
    from orchestrator.cli.liveview import STATUS, rows_from_events, table
    from orchestrator.loop import resumes

    rd = _find_run(run_ref)
    try:
        events, skipped = rd.read_events()
    except OSError as e:
        raise _fail(f"{rd}: cannot read events.jsonl: {e.strerror or e}") from None
    line, abnormal = job_line(events, skipped, rd.held())
    out.print(table(rows_from_events(events, over=abnormal, now=time.time()), STATUS,
                    title=f"{rd.name}: {line}"))
    for line in resize_lines([e for e in events if e["event"] == "job_resized"]) + \
            resumes.lines([e for e in events if e["event"] == "task_resumed"]):
        out.print(printable(line), soft_wrap=True, highlight=False, markup=False)
    if skipped:
        err.print(f"{rd.events_path}: skipped {skipped} unreadable line(s)")


@app.command()
def runs() -> None:
    """The runs under runs/, oldest first: id, cluster name, start, duration, outcome,
    restarts."""
    found, broken = list_runs()
    out.print(runs_table(found))
    if broken:
        what = "directory that is not a readable run" if broken == 1 else \
            "directories that are not readable runs"
        err.print(f"skipped {broken} {what} under {RUNS}/ (no plan.json, or no events.jsonl "
                  "that starts with run_started)", soft_wrap=True)


_TASK_NAME = re.compile(r"^[a-z_]+:\d+$")


FOLLOW_SECONDS = 0.25  # how often `tfo logs -f` looks for new lines


@app.command()
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
    """Print a task's log (every task's, [role:index] first, when none is named): `tfo logs`,
    `tfo logs worker:1`, `tfo logs last worker:1 -f`, `tfo logs RUN_DIR worker:1`."""
    from orchestrator.cli.logprint import LogPrinter

    if task is None and run_dir and _TASK_NAME.match(run_dir) and not Path(run_dir).is_dir():
        run_dir, task = None, run_dir
    rd = _find_run(run_dir)
    found = rd.task_logs()
    if not found:
        raise _fail(f"{rd}: no task logs there (is it a run directory?)")
    if task and task not in found:
        raise _fail(f"no task {task!r} in {rd}; tasks: {', '.join(found)}")
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


export_app = typer.Typer(**HELP, help="Hand the job to another engine, as a file it runs: a "
                         "Kubeflow TFJob.")
app.add_typer(export_app, name="export")


@export_app.command("tfjob")
def export_tfjob(
        file: FileArg,
        image: Annotated[str, typer.Option(
            "--image", help="the container image: TensorFlow, and the project as its working "
            "directory", show_default=False)],
        output: Annotated[Path | None, typer.Option(
            "--output", "-o", help="write the TFJob here [default: stdout]",
            show_default=False)] = None,
        name: Annotated[str | None, typer.Option(
            "--name", help="the TFJob's name [default: the cluster file's name]",
            show_default=False)] = None) -> None:
    """Write a Kubeflow TFJob (kubeflow.org/v1) that runs FILE's tasks as pods: one replica
    spec per role, the restart section as restartPolicy and backoffLimit. What does not carry
    over is a warning on stderr (docs/guide/kubernetes.md)."""
    from orchestrator.planning.export import tfjob

    try:
        spec, _ = load_source(file)
        exported = tfjob(spec, image=image, name=name)
    except SpecError as e:
        raise _fail(str(e)) from None
    for warning in exported.warnings:
        err.print(labeled("warning:", "yellow", warning), soft_wrap=True)
    text = exported.text(_made_by())
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text)
    except OSError as e:
        raise _fail(f"--output {output}: cannot write: {e.strerror or e}") from None
    err.print(f"tfo: wrote {output}; run it with kubectl apply -f {output}")


def main() -> None:
    reopen_closed_std_streams()
    # Line-buffered even into a pipe, so `[worker:1]` lines arrive as they happen.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        with starting():
            app()
    except KeyboardInterrupt:  # Ctrl-C before the supervisor took over: nothing started yet
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
