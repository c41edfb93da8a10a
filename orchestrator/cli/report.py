"""What tfo prints of a run and a plan, in rich: the consoles (`out`, `err`, made on first
use), a label before untrusted text (`labeled`), the summary of a run's result, the
restart line of a plan, the preflight table. rich is imported where a console is made or a
table drawn, never at the top (tests/test_startup.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cli import slowtasks
from orchestrator.cli.console import ChatterFilter, point_at_devnull, printable
from orchestrator.loop.resumes import lines
from orchestrator.runs.rundir import RUNS, Outcome, RunDir, RunInfo, outcome

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from orchestrator.launch.preflight import HostCheck
    from orchestrator.loop.records import RunResult
    from orchestrator.planning.plan import Plan


def _console(stderr: bool) -> Console:
    from rich.console import Console, ConsoleDimensions

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            """The reader went away (`| head -1`): write no more, and let the command's exit
            code stand (rich's default exits 1)."""
            self.quiet = True
            point_at_devnull(self.file.fileno())

        @property
        def size(self) -> ConsoleDimensions:
            """The terminal this console writes to, as the live view measures it: rich asks
            stdin's first, and takes 80 columns when that one reports 0 (a pty nobody
            sized). COLUMNS, where set, still wins, as rich has it."""
            if self._width is None and "COLUMNS" not in os.environ:
                with contextlib.suppress(OSError, ValueError):
                    width, height = os.get_terminal_size(self.file.fileno())
                    if width > 0 and height > 0:
                        return ConsoleDimensions(width, height)
            return super().size

    tty = (sys.stderr if stderr else sys.stdout).isatty()
    # Piped output (CI, `| less`, tests) gets wide tables instead of rich's 80 columns.
    # No markup or emoji codes: what we print holds paths, users' arguments and hosts' replies
    # (a `[/x]` in one was a MarkupError traceback). Our own styles go through `_labeled`.
    # NO_COLOR (no-color.org): no escape codes at all, bold included (rich drops colors only).
    extra: dict[str, Any] = {"color_system": None} if no_color() else {}
    return _Console(stderr=stderr, highlight=False, markup=False, emoji=False,
                    width=None if tty else 160, **extra)


def no_color() -> bool:
    """NO_COLOR set, and not empty: no colors, no bold (no-color.org)."""
    return bool(os.environ.get("NO_COLOR"))


def print_table(console: Console, table: Any) -> None:
    """A table at the console's width; where it is no terminal, without the spaces rich
    pads its lines with (plain output has no trailing spaces)."""
    if console.is_terminal:
        console.print(table)
        return
    from rich.text import Text

    from orchestrator.cli.liveview import render

    text = render(table, console.width)
    console.print(Text("\n".join(line.rstrip() for line in text.splitlines())),
                  soft_wrap=True)


class _LazyConsole:
    """A rich Console made on first use: rich costs 0.05 s to import, and most commands
    (`--help` above all) print nothing through it."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            self._console = _console(self._stderr)
        return getattr(self._console, name)


out: Console = _LazyConsole(stderr=False)  # type: ignore[assignment]
err: Console = _LazyConsole(stderr=True)  # type: ignore[assignment]

def labeled(label: str, style: str, text: str) -> Any:
    """`label` in `style`, then `text` as it is, line by line through `printable`: a path, a
    host's reply or a task's words are never read as rich markup or terminal escapes."""
    from rich.text import Text

    return Text.assemble((label, style), " ", "\n".join(map(printable, text.split("\n"))))


def restart_line(p: Plan) -> str:
    """Each role's restart policy and what goes down with a lost task (the strategy's)."""
    units = {"alone": "alone", "group": "with every training task"}
    return ", ".join(f"{role.value} {policy.value}" + (
        f" ({units[p.rules.restart_unit[role].value]})" if policy.value != "never" else "")
        for role, policy in p.policy.restart.items()) + \
        f"; max_restarts {p.policy.max_restarts}"


def preflight_table(rows: list[HostCheck]) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="preflight", title_justify="left")
    for col in ("host", "address", "ssh", "sessions", "python", "tensorflow", "tf_keras",
                "ports", "gpus", "cpus", "mem free", "ok"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.host, r.address, "ok" if r.reachable else "FAILED",
                      "-" if r.sessions is None else f"≤ {r.sessions}", r.python or "-",
                      r.versions.get("tensorflow") or "-", r.versions.get("tf_keras") or "-",
                      ",".join(map(str, r.ports)), str(r.gpus) if r.gpus else "-",
                      str(r.cpus or "-"), _gib(r.mem_available),
                      Text("ok", "green") if not r.problems
                      else Text(f"{len(r.problems)} problem(s)", "red"))
    return table


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.1f} GiB"


def print_summary(result: RunResult, elapsed: float | None = None,
                  shown: bool = False) -> None:
    """The end of `tfo run`: the tasks' table, what went wrong, where things are, and last
    the verdict, one line (on an 80x24 screen it is what stays in view): the job's state,
    why, the failing task's error and the total time (`elapsed`). `shown`: the console
    showed the tasks' lines (the failing task's last lines are not repeated then; the line
    above the verdict says how to see its log)."""
    from orchestrator.cli.liveview import FINAL, duration, row_from_outcome, table, without_restarts
    from orchestrator.loop.decide import TaskState
    from orchestrator.loop.exitwords import cell

    rows = [row_from_outcome(t) for t in result.tasks]
    took = "" if elapsed is None else f" after {duration(elapsed)}"
    run_id = Path(result.run_dir).name
    print_table(err, table(rows, without_restarts(rows, FINAL), width=err.width,
                           title=f"{run_id}: job {result.state.value}{took}"))
    error = ""
    if result.failed_task:
        failed = next(t for t in result.tasks if t.name == result.failed_task)
        last = _last_lines(failed.name, failed.log_path, 20)
        error = raised(last)
        if not shown:
            # No exit code: it never started (its start failed), so it is not "still running".
            how = cell(failed.returncode, failed.exit_reason) \
                if failed.returncode is not None else "could not start"
            # A task the job's end stopped (it trained alone) is not said to have failed.
            said = "failed" if failed.state is TaskState.FAILED else failed.state.value
            err.print(labeled(f"{failed.name} {said}: {how};", "bold red",
                              f"last lines of {failed.log_path}:"), soft_wrap=True)
            for line in last:
                err.print(f"  {line}", soft_wrap=True)
    for stall in result.stalls:  # restarted or not: where a hang was is worth seeing
        err.print(labeled("stalled:", "bold red", f"{stall.task} {stall.reason}"))
        for frame in stall.where:
            err.print(f"  in {printable(frame)}", highlight=False, soft_wrap=True)
    for v in slowtasks.read(RunDir(result.run_dir).events_path):  # events.jsonl's own record
        err.print(labeled(SLOW, "bold yellow", slowtasks.words(v)), soft_wrap=True)
    if result.evaluation:
        metrics = ", ".join(f"{k}={v:.4f}" for k, v in (result.evaluation["metrics"] or {}).items())
        err.print(f"evaluator: epoch {result.evaluation['epoch']}: {metrics}")
    board = RunDir(result.run_dir).tensorboard
    if Path(board).is_dir():
        err.print(f"tensorboard: {board} (to view: tensorboard --logdir {shlex.quote(board)})",
                  soft_wrap=True)
    for line in resize_lines(result.resizes) + lines(result.resumes):
        err.print(line, soft_wrap=True, highlight=False, markup=False)
    for note in result.notes:
        err.print(labeled("run directory:", "bold red", note), soft_wrap=True)
    preempted = f", preemptions: {result.preemptions}" if result.preemptions else ""
    logs = f"; its log: tfo logs {run_id} {result.failed_task}" if result.failed_task else ""
    err.print(f"run directory: {result.run_dir} (restarts: {result.restarts}{preempted}){logs}",
              soft_wrap=True)
    err.print(verdict(result.state.value, result.reason, error, elapsed), soft_wrap=True)


_STATE_STYLES = {"succeeded": "bold green", "failed": "bold red"}


def verdict(state: str, reason: str, error: str = "", elapsed: float | None = None) -> Any:
    """The run's last line: `job failed: <why>: <the error it raised> (1m02s)`."""
    from orchestrator.cli.liveview import duration

    said = f"{reason}: {error}" if error and error not in reason else reason
    took = "" if elapsed is None else f" ({duration(elapsed)})"
    return labeled(f"job {state}:", _STATE_STYLES.get(state, "bold yellow"), said + took)


_TRACEBACK = "Traceback (most recent call last):"


def raised(last: list[str]) -> str:
    """The exception a Python traceback among a task's last lines ended with
    (`FileNotFoundError: [Errno 2] ...`), else "": the first unindented line after the
    last traceback's frames."""
    if _TRACEBACK not in last:
        return ""
    after = last[len(last) - 1 - last[::-1].index(_TRACEBACK) + 1:]
    return next((line for line in after if line and not line[0].isspace()), "")


def _last_lines(task: str, log_path: str, n: int) -> list[str]:
    """The end of a task's log as the console showed it: no markers, no TensorFlow chatter
    nor tfo's traceback frames, escaped (a task's output is untrusted)."""
    from orchestrator.cli.console import OwnFrames
    from orchestrator.loop.markers import is_marker
    from orchestrator.loop.records import tail

    chatter, frames = ChatterFilter(), OwnFrames()
    shown = [printable(line) for line in tail(log_path, 50 * n)
             if not is_marker(line) and not chatter.hides(task, line)
             and not frames.hides(task, line)]
    return shown[-n:]


def print_plan(p: Plan, run_dir_given: bool, made: dict | None, made_by: str) -> None:
    """`tfo plan`: every task's host, port, profiler port, GPUs, TF_CONFIG task and command,
    the cluster, the job, the restart policy and the run directory; and the cluster file a
    command line made (`made`)."""
    from rich.table import Table

    from orchestrator.launch.gpus import auto_gpus, auto_notes
    from orchestrator.planning.quick import cluster_yaml

    table = Table(title=f"{p.name}: {p.strategy.value}, {len(p.tasks)} tasks", title_justify="left")
    for col in ("task", "host", "port", "profiler", "gpus", "TF_CONFIG task", "command"):
        table.add_column(col, overflow="fold")
    for t in p.tasks:
        table.add_row(t.name, t.host, str(t.port), str(t.profiler_port or "-"),
                      ",".join(map(str, t.gpus)) or "-",
                      json.dumps(t.tf_config["task"]), " ".join(t.command))
    out.print(table)
    for note in auto_notes(p.spec, auto_gpus(p.spec, None)):  # local_gpus is cached
        out.print(note)
    out.print(f"cluster: {json.dumps(p.cluster)}")
    if line := data_service_line(p):
        out.print(line)
    for line in cluster_check_lines(p):
        out.print(line)
    # The command column is the task wrapper; this is what it runs.
    args = p.spec.job.args if isinstance(p.spec.job.args, list) else []
    out.print(f"job: {' '.join([p.job, *map(shlex.quote, args)])}")
    out.print(f"restart: {restart_line(p)}")
    if not run_dir_given:
        out.print(f"run directory: {p.run_dir} (a new id for each run; --run-dir picks one)")
    else:
        out.print(f"run directory: {p.run_dir}")
    if made is not None:
        out.print("cluster file (`tfo run` writes it into the run directory as cluster.yaml):")
        out.print(cluster_yaml(made, made_by), end="", soft_wrap=True)


def data_service_line(p: Plan) -> str | None:
    """`tfo plan`: the tf.data service's address, as every task is given it, and its
    workers'; None without one."""
    from orchestrator.planning.plan import DATA_SERVICE_ENV
    from worker_entry.markers import Role

    address = p.tasks[0].env.get(DATA_SERVICE_ENV) if p.tasks else None
    if address is None:
        return None
    workers = [f"{t.address}:{t.port}" for t in p.tasks if t.role is Role.DATA_WORKER]
    return (f"data service: {DATA_SERVICE_ENV}={address} in every task; data workers "
            f"{', '.join(workers)}")


def cluster_check_lines(p: Plan) -> list[str]:
    """`tfo plan`: the DTensor clients the tasks are given, and whether a task that trains
    outside the cluster fails the job (orchestrator/loop/joined.py)."""
    from orchestrator.loop.joined import expects_cluster
    from worker_entry.markers import dtensor_env

    lines = []
    envs = [(t.name, e) for t in p.tasks
            if (e := dtensor_env(p.strategy.value, p.cluster, t.role.value, t.index))]
    clients = [(name, env["DTENSOR_CLIENT_ID"]) for name, env in envs]
    if envs:
        env = envs[0][1]
        lines.append(f"DTensor: DTENSOR_JOBS={env['DTENSOR_JOBS']} DTENSOR_NUM_CLIENTS="
                     f"{env['DTENSOR_NUM_CLIENTS']} DTENSOR_JOB_NAME={env['DTENSOR_JOB_NAME']}"
                     f"; DTENSOR_CLIENT_ID: {', '.join(f'{n} {c}' for n, c in clients)}")
    if not expects_cluster(p.cluster):
        return lines
    if p.policy.expect_cluster:
        return [*lines, "cluster check: a training task that trains outside this cluster fails "
                "the job (expect_cluster: false, --independent: allowed)"]
    return [*lines, "cluster check: off (expect_cluster: false): the tasks may train "
            "independently"]


def runs_table(found: list[RunInfo], width: int | None = None) -> Any:
    """`tfo runs`: each run's id, cluster name, start, duration, outcome and restarts; fit to
    `width` by dropping columns (liveview.fit), the id always whole."""
    from orchestrator.cli.liveview import duration, fitted

    columns = ("run", "name", "started", "duration", "outcome", "restarts")
    cells = [[printable(r.run_id), printable(r.name),
              time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started)),
              duration(r.duration), r.outcome.value,
              "-" if r.restarts is None else str(r.restarts)] for r in found]
    return fitted(columns, cells, width, title=f"{len(found)} run(s) under {RUNS}/")


SLOW = "slow:"


def status_lines(events: list[dict[str, Any]]) -> list[str]:
    """`tfo status`'s lines under its table: the resizes, how each attempt after the first
    began, and the tasks tfo named slow."""
    return resize_lines([e for e in events if e["event"] == "job_resized"]) + \
        lines([e for e in events if e["event"] == "task_resumed"]) + \
        [f"{SLOW} {slowtasks.words(v)}" for v in slowtasks.verdicts(events)]


def resize_lines(resized: list[dict[str, Any]]) -> list[str]:
    """An elastic job's resizes (job_resized's fields), a line each, in order."""
    return [f"resized: {r.get('from')} → {r.get('to')} workers"
            + (f", {r['ps'].get('from')} → {r['ps'].get('to')} ps"  # a parameter_server job's
               if isinstance(r.get("ps"), dict) else "")
            + f": {r.get('reason', '')}"
            + (f" (from backup {r['save']})" if r.get("save") is not None else "")
            for r in resized]


ABNORMAL = "ended abnormally"


def job_line(events: list[dict[str, Any]], skipped: int = 0,
             held: bool = False) -> tuple[str, bool]:
    """How a run's events.jsonl says its job ended, and whether it ended abnormally (its
    tasks' last states are not what they are now). `skipped`: its lines that were no event
    (a line cut short by a full disk, garbage); `held`: a tfo holds the run's lock now."""
    if not events:
        return ("no events: events.jsonl is empty (the run never started, or the file was "
                "emptied)" if not skipped else f"unreadable: events.jsonl holds {skipped} "
                "line(s), none of them an event (corrupt)"), True
    started = next((e for e in events if e["event"] == "run_started"), None)
    finished = next((e for e in reversed(events) if e["event"] == "job_finished"), None)
    cut = f"; {skipped} unreadable line(s) skipped" if skipped else ""
    last = f"; its last event: {_event_words(events[-1])}{cut}"
    if started is None and finished is None:  # its start is gone: the lock tells
        if held:
            return "running (events.jsonl lost its run_started: emptied while it ran?)", False
        return f"{ABNORMAL}: events.jsonl has neither run_started nor job_finished{last}", True
    state = outcome(started or {}, finished)
    if state is Outcome.LOST:
        return (f"{ABNORMAL}: coordinator lost: pid {started.get('coordinator_pid')} is gone; "
                f"the run did not finish cleanly{last}"), True
    if finished is None:
        return state.value, False
    return f"{state.value}: {finished.get('reason', '')}", False


def _event_words(e: dict[str, Any]) -> str:
    task = f" ({e['task']})" if isinstance(e.get("task"), str) else ""
    when = e.get("time")
    at = f" at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(when))}" \
        if isinstance(when, int | float) and not isinstance(when, bool) else ""
    return f"{e['event']}{task}{at}"
