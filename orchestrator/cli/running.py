"""`tfo run` and `tfo rerun` at the terminal: orchestrator.pipeline.run with the tasks' lines,
the live view, the summary and the verdict printed, its errors told as the user's with the
exit code, and the signals that come before the supervisor takes over, or after it ended the
job (a second Ctrl-C: counted, never cutting the summary off)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from orchestrator.cli.console import (
    ConsoleWriter,
    console_echo,
)
from orchestrator.cli.messages import fail, made_by, say, warn
from orchestrator.cli.report import (
    err,
    labeled,
    print_summary,
)
from orchestrator.errors import SpecError
from orchestrator.launch import BackendError
from orchestrator.pipeline import CannotStart

if TYPE_CHECKING:
    from orchestrator.planning.plan import Plan


class _Interrupted(BaseException):
    """SIGTERM, SIGHUP or SIGQUIT before the supervisor took over (it has its own handlers)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum


class _Signals:
    """`tfo run`'s handlers around the supervisor's: before it takes over, a signal ends tfo
    (SIGINT as KeyboardInterrupt, the others as _Interrupted); once it has handled the job's
    end, a signal only counts (`late`). A second Ctrl-C lands there when the first one's
    teardown is quick: raised, it cut the summary off and said "nothing was started"."""

    SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")

    def __init__(self) -> None:
        import signal

        self.supervised = False  # the supervisor's handlers took over (and later gave back)
        self.late = 0
        for name in self.SIGNALS:
            signal.signal(getattr(signal, name), self)

    def __call__(self, signum: int, frame: object) -> None:
        import signal

        if self.supervised:
            self.late += 1
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise _Interrupted(signum)

    def ignore(self) -> None:
        """From now on, ignored: Python puts back the default handlers as it exits (a
        Ctrl-C then would end tfo with SIGINT, whatever the job's exit code)."""
        import signal

        for name in self.SIGNALS:
            signal.signal(getattr(signal, name), signal.SIG_IGN)


def run_job(source: Path | dict, run_dir: Path | None, verbose: bool, logs: bool = True,
         show: str | None = None) -> None:
    """orchestrator.pipeline.run, printing: its lines, the tasks' (a ConsoleWriter, and the
    live view on a terminal), the summary; its errors as the user's, with the exit code."""
    # Until the supervisor takes over, SIGTERM, SIGHUP and SIGQUIT end tfo as Ctrl-C does: what was
    # under way (a host's check, a code sync) is said and cleaned up, not cut off silently.
    import signal

    from orchestrator.pipeline import run as run_pipeline

    signals = _Signals()
    stage = ["planning"]  # what was under way, for the message
    shown: list[ConsoleWriter] = []  # the console, once the supervisor takes over
    began: list[float] = []  # when the tasks were started (monotonic)
    only: list[str] = []  # --show's tasks

    @contextlib.contextmanager
    def display(p: Plan) -> Iterator[tuple[Any, Any]]:
        from orchestrator.cli.liveview import LiveView, is_live_terminal

        fd = sys.stdout.fileno()
        console = ConsoleWriter(fd)
        shown.append(console)
        view = LiveView(console, fd) if is_live_terminal(fd) else None
        only.extend(_shown_tasks(show, p))
        echo = console_echo(console.write, verbose, logs, view.seen if view else None,
                            prefixes=prefixes(p), only=set(only) if show else None)
        try:
            yield echo, view
        finally:
            echo.flush()
            if view is not None:
                view.close()  # the summary's table takes its place
            console.close()

    def started(p: Plan) -> None:
        """Said once the tasks are started: rich loads then (liveview defers it too). A
        closed stderr does not stop the run; events.jsonl has it all."""
        signals.supervised = True  # its handlers are in place: ours see only what follows
        began.append(time.monotonic())
        with contextlib.suppress(OSError):
            say(f"run {p.run_id}: {len(p.tasks)} tasks, logs in {p.run_dir}/logs")

    def under_way(what: str) -> None:
        stage[0] = what

    try:
        result = run_pipeline(source, run_dir, say=say, warn=warn, display=display,
                              started=started, stage=under_way, made_by=made_by())
    except (_Interrupted, KeyboardInterrupt) as e:
        signum = e.signum if isinstance(e, _Interrupted) else signal.SIGINT
        err.print(f"tfo: interrupted by {signal.Signals(signum).name} while {stage[0]}; "
                  "nothing was started", soft_wrap=True)
        raise typer.Exit(128 + signum) from None
    except CannotStart as e:
        raise fail(str(e)) from None
    except (SpecError, BackendError) as e:  # planning's own words; later, nothing started
        started_some = stage[0] == "supervising" and isinstance(e, BackendError)
        raise fail(str(e) if stage[0] == "planning" or started_some
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
        print_summary(result, elapsed=time.monotonic() - began[0] if began else None,
                      shown=logs and not console.dropped and not console.reader_gone
                      and (not show or result.failed_task in only))
    signals.ignore()  # the exit code is the job's, not a signal's while the interpreter ends
    raise typer.Exit(result.exit_code)


def _shown_tasks(show: str | None, p: Plan) -> list[str]:
    """--show's task names, each one of the plan's."""
    if not show:
        return []
    names = [t.name for t in p.tasks]
    wanted = [name.strip() for name in show.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in names]
    if unknown:
        raise SpecError(f"--show: no task {unknown[0]!r} in this job; its tasks: "
                        f"{', '.join(names)}")
    return wanted


def prefixes(p: Plan) -> dict[str, str]:
    """Each task's console prefix: `worker:1`, or `worker:1@gpu2` where the job spans
    hosts."""
    if len({t.host for t in p.tasks}) <= 1:
        return {}
    return {t.name: f"{t.name}@{t.host}" for t in p.tasks}


