"""The `tfo` command: plan, run, status, logs, check.

    tfo plan clusters/localhost.yaml          # the dry run: every task's TF_CONFIG and command
    tfo run clusters/localhost.yaml           # bring up, watch, restart, tear down
    tfo status                                # the latest run's tasks, from its events.jsonl
    tfo logs [RUN_DIR] worker:1               # one task's log
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from orchestrator.launch import describe_exit
from orchestrator.launch.ports import free_ports, port_problem
from orchestrator.plan import Plan, make_plan, task_name
from orchestrator.spec import ClusterSpec, SpecError, load_spec
from orchestrator.supervise import RunResult, Supervisor, tail

EXIT_BAD_SPEC = 2
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Run multi-worker TensorFlow jobs on this machine or on a lab's machines.")
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

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


def prepare(file: Path, run_dir: Path | None) -> tuple[ClusterSpec, Plan]:
    """Load, validate and plan; raises SpecError with a message for the user."""
    spec = load_spec(file)
    run_id = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    run_dir = (run_dir or Path("runs") / run_id).resolve()
    plan = make_plan(spec, run_id=run_id, run_dir=run_dir, workdir=Path.cwd(),
                     ports=_auto_ports(spec))
    return spec, plan


def preflight_local(plan: Plan) -> list[str]:
    """Problems with this machine that would stop the job: ports in use."""
    problems = []
    for t in plan.tasks:
        if t.is_local and (p := port_problem(t.port)):
            problems.append(f"{t.name} (localhost:{t.port}): {p}")
    return problems


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


def _start(task, attempt):  # type: ignore[no-untyped-def]
    from orchestrator.launch.local import start_local

    return start_local(task, attempt)


@app.command()
def run(file: FileArg, run_dir: RunDirOpt = None) -> None:
    """Bring the job up, watch it, restart by policy, tear it down; exit 0/1/2/130/143."""
    try:
        spec, p = prepare(file, run_dir)
    except SpecError as e:
        raise _fail(str(e)) from None
    problems = preflight_local(p)
    if problems:
        raise _fail("cannot start, nothing was started:\n  " + "\n  ".join(problems))
    err.print(f"[bold]tfo[/]: run {p.run_id}: {len(p.tasks)} tasks, logs in {p.run_dir}/logs")
    result = Supervisor(p, spec, start=_start).run()
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
                  f"last lines of {failed.log_path}:")
        for line in tail(failed.log_path, 20):
            err.print(f"  {line}", markup=False)
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
        events = [json.loads(line) for line in (rd / "events.jsonl").read_text().splitlines()]
    except (OSError, json.JSONDecodeError) as e:
        raise _fail(f"{rd}: cannot read events.jsonl: {e}") from None
    tasks: dict[str, dict] = {}
    job = "running"
    for e in events:
        if e["event"] == "job_finished":
            job = f"{e['state']}: {e.get('reason', '')}"
        if e.get("task"):
            tasks.setdefault(e["task"], {}).update(last=e["event"], pid=e.get("pid"),
                                                   returncode=e.get("returncode"))
    table = Table(title=f"{rd.name}: {job}", title_justify="left")
    for col in ("task", "last event", "pid", "exit"):
        table.add_column(col)
    for name, t in sorted(tasks.items()):
        table.add_row(name, t["last"], str(t["pid"] or "-"), describe_exit(t["returncode"])
                      if t["returncode"] is not None else "-")
    out.print(table)


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
    app()


if __name__ == "__main__":
    main()
