"""The `tfo` command: plan, run, status, logs, check.

    tfo plan clusters/localhost.yaml          # the dry run: every task's TF_CONFIG and command
    tfo run clusters/localhost.yaml           # bring up, watch, restart, tear down
    tfo status                                # the latest run's tasks, from its events.jsonl
    tfo logs [RUN_DIR] worker:1               # one task's log
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import secrets
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.launch import TaskHandle, describe_exit
from orchestrator.launch.local import start_local
from orchestrator.launch.ports import free_ports
from orchestrator.launch.preflight import HostCheck, preflight
from orchestrator.launch.ssh import SshError, SshHosts
from orchestrator.plan import Plan, TaskPlan, make_plan, task_name
from orchestrator.spec import LOCALHOST, ClusterSpec, SpecError, load_spec
from orchestrator.supervise import (
    RunResult,
    Supervisor,
    coordinator_gone,
    read_events,
    tail,
)

EXIT_BAD_SPEC = 2
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Run multi-worker TensorFlow jobs on this machine or on a lab's machines.")
# Piped output (CI, `| less`, tests) gets wide tables instead of rich's 80 columns.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)

FileArg = Annotated[Path, typer.Argument(help="cluster file (YAML or JSON)", show_default=False)]
RunDirOpt = Annotated[Path | None, typer.Option(
    "--run-dir", help="where the run's plan, events and logs go [default: runs/<run-id>]")]



def _fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", markup=True, soft_wrap=True)
    return typer.Exit(EXIT_BAD_SPEC)


def _auto_ports(spec: ClusterSpec) -> dict[str, int]:
    wanted = [task_name(r, i) for r, i, a in spec.tasks.all() if a.port is None]
    taken = {a.port for _, _, a in spec.tasks.all() if a.port is not None}
    return dict(zip(wanted, free_ports(len(wanted), avoid=taken), strict=True))


def check_entry_importable(spec: ClusterSpec, workdir: Path) -> None:
    """The entry's top-level package must be findable by local tasks. Only located, never
    imported: importing user code could import TensorFlow into the coordinator."""
    if not any(a.host == LOCALHOST for _, _, a in spec.tasks.all()):
        return
    top = spec.job.package
    sys.path.insert(0, str(workdir))
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    finally:
        sys.path.remove(str(workdir))
    if not found:
        raise SpecError(f"job.entry: no module named {top!r} in {workdir} or the installed "
                        f"packages ({spec.job.entry}); run tfo from the directory that holds it")


def prepare(file: Path, run_dir: Path | None) -> tuple[ClusterSpec, Plan]:
    """Load, validate and plan; raises SpecError with a message for the user."""
    spec = load_spec(file)
    check_entry_importable(spec, Path.cwd())
    run_id = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    run_dir = (run_dir or Path("runs") / run_id).resolve()
    plan = make_plan(spec, run_id=run_id, run_dir=run_dir, workdir=Path.cwd(),
                     ports=_auto_ports(spec))
    return spec, plan


@app.command()
def plan(file: FileArg, as_json: Annotated[bool, typer.Option(
        "--json", help="print a JSON list of tasks")] = False, run_dir: RunDirOpt = None) -> None:
    """Print what `run` would start, without starting anything."""
    try:
        _, p = prepare(file, run_dir)
    except SpecError as e:
        raise _fail(str(e)) from None
    if as_json:
        print(json.dumps([t.to_json() for t in p.tasks], indent=2))
        return
    table = Table(title=f"{p.name}: {p.strategy.value}, {len(p.tasks)} tasks", title_justify="left")
    for col in ("task", "host", "port", "TF_CONFIG task", "command"):
        table.add_column(col, overflow="fold")
    for t in p.tasks:
        table.add_row(t.name, t.host, str(t.port), json.dumps(t.tf_config["task"]),
                      " ".join(t.command))
    out.print(table)
    cluster = p.tasks[0].tf_config["cluster"] if p.tasks else {}
    out.print(f"cluster: {json.dumps(cluster)}")
    out.print(f"run directory: {p.run_dir}")


def job_packages(spec: ClusterSpec, workdir: Path) -> list[Path]:
    """What a lab machine needs of the job's code: worker_entry and the entry's package."""
    import worker_entry

    pkgs = [Path(worker_entry.__file__).parent]
    top = spec.job.package
    if top != "worker_entry":
        for candidate in (workdir / top, workdir / f"{top}.py"):
            if candidate.exists():
                pkgs.append(candidate)
                break
        else:
            raise SpecError(f"job.entry: package {top!r} not found in {workdir}; run tfo from "
                            f"the directory that holds it")
    return pkgs


def _preflight_table(rows: list[HostCheck]) -> Table:
    table = Table(title="preflight", title_justify="left")
    for col in ("host", "address", "ssh", "python", "tensorflow", "tf_keras", "ports", "ok"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.host, r.address, "ok" if r.reachable else "FAILED", r.python or "-",
                      r.versions.get("tensorflow") or "-", r.versions.get("tf_keras") or "-",
                      ",".join(map(str, r.ports)),
                      "[green]ok[/]" if not r.problems else f"[red]{len(r.problems)} problem(s)[/]")
    return table


def _preflight(spec: ClusterSpec, p: Plan, hosts: SshHosts, show: bool) -> list[str]:
    t0 = time.monotonic()
    rows = preflight(spec, p, hosts)
    if show:
        out.print(_preflight_table(rows))
        out.print(f"checked {len(rows)} host(s) in {time.monotonic() - t0:.2f} s")
    return [problem for r in rows for problem in r.problems]


@app.command()
def check(file: FileArg) -> None:
    """Preflight every host at once: reachable, authenticated, python, TF versions, ports,
    workdir. Exit 0 when all is well, 1 naming each problem."""
    try:
        spec, p = prepare(file, None)
    except SpecError as e:
        raise _fail(str(e)) from None
    hosts = SshHosts(spec.hosts)
    try:
        problems = _preflight(spec, p, hosts, show=True)
    finally:
        hosts.close()
    for problem in problems:
        err.print(f"[red]problem:[/] {problem}", soft_wrap=True)
    raise typer.Exit(1 if problems else 0)


# TensorFlow's C++ INFO/WARNING lines (glog format) and its start-up banners: in the task
# logs, not on the console. Errors (E lines) always show.
_TF_CHATTER = re.compile(
    r"^[IW]\d{4} \d+:\d+:\d+\.\d+\s+\d+ \S+:\d+\]"
    r"|^WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|^To enable the following instructions: .* rebuild TensorFlow")


def _console_echo(verbose: bool) -> Callable[[str, str], None]:
    def echo(task: str, line: str) -> None:
        if verbose or not _TF_CHATTER.match(line):
            sys.stdout.write(f"[{task}] {line}\n")

    return echo


@app.command()
def run(file: FileArg, run_dir: RunDirOpt = None, verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="also show TensorFlow's C++ INFO/WARNING lines")] = False,
        ) -> None:
    """Bring the job up, watch it, restart by policy, tear it down; exit 0/1/2/129/130/143."""
    try:
        spec, p = prepare(file, run_dir)
        packages = job_packages(spec, Path.cwd()) if spec.hosts else []
    except SpecError as e:
        raise _fail(str(e)) from None
    hosts = SshHosts(spec.hosts)
    try:
        problems = _preflight(spec, p, hosts, show=False)
        if problems:
            raise _fail("cannot start, nothing was started:\n  " + "\n  ".join(problems))
        remote = list(dict.fromkeys(t.host for t in p.tasks if not t.is_local))
        with ThreadPoolExecutor(max_workers=max(1, len(remote))) as pool:
            copied = pool.map(lambda n: hosts.sync_code(n, packages, spec.hosts[n].workdir),
                              remote)
            for name, count in zip(remote, copied, strict=True):
                err.print(f"[bold]tfo[/]: {name}: code synced ({count} file(s) copied)")
        err.print(f"[bold]tfo[/]: run {p.run_id}: {len(p.tasks)} tasks, logs in {p.run_dir}/logs")

        def start(task: TaskPlan, attempt: int) -> TaskHandle:
            return start_local(task, attempt) if task.is_local else hosts.start(task, attempt)

        result = Supervisor(p, spec, start=start, echo=_console_echo(verbose)).run()
    except SshError as e:
        raise _fail(str(e)) from None
    finally:
        hosts.close()
    with contextlib.suppress(OSError):  # a closed terminal (SIGHUP); events.jsonl has it all
        print_summary(result)
    raise typer.Exit(result.exit_code)


def print_summary(result: RunResult) -> None:
    table = Table(title=f"job {result.state.value}: {result.reason}", title_justify="left")
    for col in ("task", "state", "exit", "restarts"):
        table.add_column(col)
    for t in result.tasks:
        table.add_row(t.name, t.state.value, describe_exit(t.returncode) if t.returncode
                      is not None else "-", str(t.restarts))
    err.print(table)
    if result.failed_task:
        failed = next(t for t in result.tasks if t.name == result.failed_task)
        err.print(f"[bold red]{failed.name} failed: {describe_exit(failed.returncode)}[/]; "
                  f"last lines of {failed.log_path}:", soft_wrap=True)
        for line in tail(failed.log_path, 20):
            err.print(f"  {line}", markup=False, soft_wrap=True)
    if result.evaluation:
        metrics = ", ".join(f"{k}={v:.4f}" for k, v in (result.evaluation["metrics"] or {}).items())
        err.print(f"evaluator: epoch {result.evaluation['epoch']}: {metrics}")
    err.print(f"run directory: {result.run_dir} (restarts: {result.restarts})")


def _latest_run(run_dir: Path | None) -> Path:
    if run_dir is not None:
        return run_dir
    runs = sorted(Path("runs").glob("*/events.jsonl"), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise _fail("no run found under runs/; give a run directory")
    return runs[-1].parent


@app.command()
def status(run_dir: Annotated[Path | None, typer.Argument(help="a run directory")] = None) -> None:
    """The tasks of a run (the latest by default) as its events.jsonl tells them."""
    rd = _latest_run(run_dir)
    try:
        events, skipped = read_events(rd / "events.jsonl")
    except OSError as e:
        raise _fail(f"{rd}: cannot read events.jsonl: {e.strerror or e}") from None
    tasks: dict[str, dict] = {}
    job = "running"
    for e in events:
        if e["event"] == "run_started":
            job = (f"coordinator lost: pid {e['coordinator_pid']} is gone; the run did not "
                   "finish cleanly") if coordinator_gone(e) else "running"
        elif e["event"] == "job_finished":
            job = f"{e.get('state')}: {e.get('reason', '')}"
        if isinstance(e.get("task"), str):
            tasks.setdefault(e["task"], {}).update(
                last=e["event"], pid=_int_or_none(e.get("pid")),
                returncode=_int_or_none(e.get("returncode")))
    # Text, not markup: a reason or task name may hold brackets.
    table = Table(title=Text(f"{rd.name}: {job}"), title_justify="left")
    for col in ("task", "last event", "pid", "exit"):
        table.add_column(col)
    for name, t in sorted(tasks.items()):
        table.add_row(Text(name), Text(t["last"]), str(t["pid"] or "-"),
                      describe_exit(t["returncode"]) if t["returncode"] is not None else "-")
    out.print(table)
    if skipped:
        err.print(f"{rd / 'events.jsonl'}: skipped {skipped} unreadable line(s)", markup=False)


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@app.command()
def logs(run_dir: Annotated[Path | None, typer.Argument(help="a run directory")] = None,
         task: Annotated[str | None, typer.Argument(help="e.g. worker:1")] = None,
         lines: Annotated[int, typer.Option("-n", help="last N lines")] = 0) -> None:
    """Print a task's log (every task's, when none is named)."""
    rd = _latest_run(run_dir)
    paths = sorted((rd / "logs").glob("*.log"))
    if task:
        paths = [rd / "logs" / (task.replace(":", "-") + ".log")]
    for path in paths:
        if not path.exists():
            raise _fail(f"no log {path}; tasks: "
                        + ", ".join(p.stem for p in (rd / "logs").glob("*.log")))
        text = path.read_text(errors="replace").splitlines()
        for line in text[-lines:] if lines else text:
            print(f"[{path.stem}] {line}" if not task else line)


def main() -> None:
    # Line-buffered even into a pipe, so `[worker:1]` lines arrive as they happen.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        app()
    except KeyboardInterrupt:  # Ctrl-C before the supervisor took over: nothing started yet
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
