"""The per-task table: live under `tfo run` on a terminal, and after a run (`tfo run`'s
summary, `tfo status`), from the same rows.

    view = LiveView(writer, fd)              # writer: the run's ConsoleWriter
    echo = console_echo(writer.write, verbose, seen=view.seen)  # each task's last line
    Supervisor(plan, start=..., echo=echo, watch=view)  # view(supervisor.job) once a second
    view.close()                             # erases the table; the summary follows

    rows_from_events(events)                 # tfo status: the rows a finished run ended with
    render(table(rows, FINAL), width=160)    # plain text, no ANSI

The loop only copies what it shows into `Row`s (plain data); the ConsoleWriter's thread
renders them (rich) and draws them below the tasks' lines, so a slow terminal never holds
the loop up. Every cell is a rich `Text` of `printable` characters: no markup and no escape
sequence a task prints reaches the terminal.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from orchestrator.cli.console import ConsoleWriter, printable
from orchestrator.launch import describe_exit
from orchestrator.loop.decide import exited_how
from orchestrator.loop.rate import STALE_INTERVALS, STALE_SECONDS, shown

if TYPE_CHECKING:
    from rich.table import Table

    from orchestrator.loop.job import Job
    from orchestrator.loop.records import TaskOutcome, TaskRecord
    from orchestrator.planning.spec import ClusterSpec

DUMB_TERMS = ("dumb", "unknown")


def is_live_terminal(fd: int) -> bool:
    """A terminal that can redraw: not a pipe or file (CI, `| tee`), not TERM=dumb."""
    return os.isatty(fd) and os.environ.get("TERM", "") not in DUMB_TERMS


@dataclass(frozen=True)
class Trained:
    """How far a task's training got, as its last progress marker says."""

    epoch: int | None = None  # 0-based, as the progress marker has it
    epochs: int | None = None
    step: int | None = None  # steps this attempt
    step_in_epoch: int | None = None
    steps: int | None = None  # per epoch
    loss: float | None = None


TRAINED = ("epoch", "epochs", "step", "step_in_epoch", "steps", "loss")


@dataclass(frozen=True)
class Row:
    """One task as the tables show it; None shows as '-'."""

    task: str
    host: str = "-"
    pid: int | None = None
    state: str = "pending"
    restarts: int = 0
    uptime: float | None = None  # seconds this attempt has run
    cpu: float | None = None  # percent of one core (the wrapper's `usage` marker)
    rss: int | None = None  # bytes
    trained: Trained = field(default_factory=lambda: Trained())  # its last progress
    steps_per_second: float | None = None
    exit: int | None = None
    torn_down: bool = False  # stopped in its teardown after its peers left: a success
    exit_reason: str = ""  # how it ended where the exit code says less (a lab host lost)
    last: str = ""  # the last line it printed, or (tfo status) its last event


def _progress(progress: Any, epoch_begun: int | None = None) -> dict[str, Any]:
    trained = Trained() if progress is None else \
        Trained(**{k: getattr(progress, k) for k in TRAINED})
    return {"trained": begun(trained, epoch_begun)}


def begun(trained: Trained, epoch: int | None) -> Trained:
    """`trained` once an `epoch` marker said `epoch` began: that epoch, none of its steps
    done yet (the last progress told the epoch before's last step; shown, its epoch lagged
    the "Epoch 5/200" Keras printed as the next one began)."""
    if epoch is None or (trained.epoch is not None and epoch <= trained.epoch):
        return trained
    return replace(trained, epoch=epoch, step_in_epoch=0 if trained.steps else None)


def row_from_record(rec: TaskRecord, now: float, last: str | None = None) -> Row:
    """A copy of what the live table shows of one task (the loop's thread calls this);
    `last`: its last line but TensorFlow's chatter, when known."""
    live = rec.state.live
    usage = rec.current.work.usage if live else None
    state = rec.state.value
    if usage is not None and usage.stopped:
        state += " (stopped)"  # SIGSTOP / Ctrl-Z: state T, it will not move
    return Row(
        task=rec.name, host=rec.task.host, pid=rec.handle.pid if rec.handle else None,
        state=state, restarts=rec.restarts,
        uptime=now - rec.current.started_at if live and rec.current.started_at else None,
        cpu=usage.cpu if usage else None, rss=usage.rss if usage else None,
        steps_per_second=shown(rec.current.work.rate, now) if live else None,
        exit=rec.current.returncode,
        torn_down=rec.torn_down_ok, exit_reason=rec.current.exit_reason,
        last=rec.last_line if last is None else last,
        **_progress(rec.current.work.progress, rec.current.work.epoch_begun))


def row_from_outcome(t: TaskOutcome) -> Row:
    """A task's row in the summary, from the run's result."""
    return Row(task=t.name, host=t.host or "-", state=t.state.value, restarts=t.restarts,
               exit=t.returncode, torn_down=t.torn_down, exit_reason=t.exit_reason,
               **_progress(t.progress))


def rows_from_events(events: Iterable[dict[str, Any]], over: bool = False,
                     now: float | None = None) -> list[Row]:
    """Each task's row as a run's events.jsonl tells it: its last attempt's pid and host,
    its last progress (and its steps/s then: at `now`, a wall-clock time, a running task's
    only while its progress events still come, as the live table's), its restarts, how it
    ended, and its last event (not a standby's: that is the next attempt's, started beside
    this one). `over`: the run ended abnormally (its coordinator is gone: so are its tasks),
    so a task still starting or running then is `unfinished`, not running now."""
    tasks: dict[str, dict[str, Any]] = {}
    progressed: dict[str, tuple[float, float]] = {}  # a task's last two progress times
    for e in events:
        name = e.get("task")
        if not isinstance(name, str):
            continue
        t = tasks.setdefault(name, {"task": name})
        kind = e["event"]
        if not kind.startswith("task_standby_"):
            t["last"] = kind
        if kind == "task_started":
            t.update(pid=_int(e.get("pid")), host=str(e.get("host") or "-"), state="starting",
                     exit=None, exit_reason="", trained=Trained(), steps_per_second=None)
        elif kind == "task_ready":
            t["state"] = "running"
        elif kind == "task_progress":
            t["trained"] = Trained(**{k: _number(e.get(k)) for k in TRAINED})
            t["steps_per_second"] = _number(e.get("steps_per_second"))
            if isinstance(at := _number(e.get("time")), float | int):
                progressed[name] = (progressed.get(name, (at, at))[1], at)
        elif kind == "task_epoch" and _int(e.get("epoch")) is not None:
            t["trained"] = begun(t.get("trained", Trained()), e["epoch"])
        elif kind == "task_restarted":
            t.update(restarts=_int(e.get("restarts")) or 0, state="pending")
        elif kind in ("task_exited", "task_stopped"):
            rc = _int(e.get("returncode"))
            t["exit"], t["torn_down"] = rc, e.get("teardown") is True
            how = e.get("how")
            t["exit_reason"] = how if isinstance(how, str) and how.startswith("lost") else ""
            decided = e.get("state")  # the supervisor's (a run before it wrote it: none)
            t["state"] = "stopped" if kind == "task_stopped" else decided \
                if decided in ("succeeded", "failed") else \
                "succeeded" if rc == 0 or t["torn_down"] else "failed"
        elif kind == "task_start_failed":
            t["state"] = "failed"
    for name, (before, last) in progressed.items():
        t = tasks[name]
        if now is not None and t.get("state") == "running" \
                and now - last > max(STALE_SECONDS, STALE_INTERVALS * (last - before)):
            t["steps_per_second"] = None  # its steps stopped coming: the rate is not known
    for t in tasks.values():
        if over and t.get("state", "pending") in ("starting", "running", "pending"):
            t["state"] = "unfinished"
    return [Row(**t) for _, t in sorted(tasks.items())]


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: object) -> Any:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


# ---- cells -----------------------------------------------------------------------------
def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f}{unit}" if n < 10 * size else f"{n // size}{unit}"
    return f"{n}B"


def _epoch(r: Row) -> str:
    t = r.trained
    if t.epoch is None:
        return "-"
    return f"{t.epoch + 1}/{t.epochs}" if t.epochs else str(t.epoch + 1)


def _step(r: Row) -> str:
    t = r.trained
    if t.step_in_epoch is not None and t.steps:
        return f"{t.step_in_epoch}/{t.steps}"
    return _dash(t.step)


CELLS: dict[str, Any] = {
    "task": lambda r: r.task,
    "host": lambda r: r.host,
    "pid": lambda r: _dash(r.pid),
    "state": lambda r: r.state,
    "restarts": lambda r: str(r.restarts),
    "up": lambda r: duration(r.uptime),
    "cpu": lambda r: "-" if r.cpu is None else f"{r.cpu:.0f}%",
    "rss": lambda r: _bytes(r.rss),
    "epoch": _epoch,
    "step": _step,
    "steps/s": lambda r: "-" if r.steps_per_second is None else f"{r.steps_per_second:.1f}",
    "loss": lambda r: "-" if r.trained.loss is None else f"{r.trained.loss:.4g}",
    "exit": lambda r: "-" if r.exit is None
    else exited_how(describe_exit(r.exit), r.exit_reason, r.torn_down),
    "last line": lambda r: r.last or "-",
    "last event": lambda r: r.last or "-",
}
LIVE = ("task", "host", "pid", "state", "restarts", "up", "cpu", "rss", "epoch", "step",
        "steps/s", "loss", "last line")
FINAL = ("task", "host", "state", "exit", "restarts", "epoch", "step", "loss")
STATUS = ("task", "host", "state", "restarts", "epoch", "step", "steps/s", "loss", "last event",
          "pid", "exit")
_STYLES = {"running": "green", "succeeded": "green", "failed": "red", "stopped": "yellow"}


# A narrow terminal loses these first, in this order, before the last line gets too short.
NARROW_DROPS = ("pid", "host", "restarts", "rss", "up", "cpu")
MIN_LAST = 20


def _cells(rows: list[Row], columns: tuple[str, ...]) -> tuple[list[list[str]], list[int]]:
    cells = [[printable(CELLS[col](r)) for col in columns] for r in rows]
    return cells, [max([len(col), *(len(c[i]) for c in cells)]) for i, col in enumerate(columns)]


def _room(widths: list[int], width: int) -> int:
    """What a table's last column gets of `width`: each other column takes its padding and
    a separator."""
    return width - sum(w + 3 for w in widths[:-1])


def fit(rows: list[Row], columns: tuple[str, ...], width: int) -> tuple[str, ...]:
    """The columns that leave the last line MIN_LAST characters on a terminal this wide."""
    for drop in NARROW_DROPS:
        if _room(_cells(rows, columns)[1], width) >= MIN_LAST:
            break
        columns = tuple(c for c in columns if c != drop)
    return columns


def table(rows: list[Row], columns: tuple[str, ...], title: str = "",
          width: int | None = None) -> Table:
    """Every cell is Text: a task name, host or line is never read as rich markup. Given the
    width, a last column of lines is cut to what the other columns leave (one line a row)."""
    from rich import box  # here, not at the top: `tfo run` starts its tasks before rich loads
    from rich.table import Table
    from rich.text import Text

    t = Table(title=Text(printable(title)) if title else None, title_justify="left",
              box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    cells, widths = _cells(rows, columns)
    for col in columns:
        t.add_column(col, no_wrap=True)
    if width is not None and columns[-1].startswith("last"):
        room = max(10, _room(widths, width))
        cells = [[*c[:-1], c[-1] if len(c[-1]) <= room else c[-1][:room - 1] + "…"]
                 for c in cells]
    state = columns.index("state") if "state" in columns else -1
    for r, row_cells in zip(rows, cells, strict=True):
        style = _STYLES.get(r.state.split()[0], "")
        t.add_row(*(Text(c, style=style if i == state else "")
                    for i, c in enumerate(row_cells)))
    return t


def render(renderable: Any, width: int, color: bool = False) -> str:
    """A table as text: with colors for a terminal, or plain."""
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=color, color_system="standard" if color
            else None, highlight=False, emoji=False, soft_wrap=False).print(renderable)
    return buf.getvalue()


def size_note(spec: ClusterSpec, workers: int) -> str:
    """An elastic job's size in the live table's title: the workers now, and its bounds."""
    e = spec.elastic
    if e is None:
        return ""
    most = e.max_workers if e.max_workers is not None else len(spec.tasks.worker)
    return f", {workers} workers ({e.min_workers}-{most})"


# While tasks print, the table is redrawn as often as this (the loop's watch alone, once a
# second, left it 9 epochs behind the lines above it in a fit of short epochs) ...
LINES_REFRESH_SECONDS = 0.25
# ... but a redraw may take at most this share of a core (rich takes 5-20 ms for 2 rows,
# 30-100 for 36: a big job's table is refreshed by the loop's watch alone).
RENDER_SHARE = 0.05


class LiveView:
    """The table under the tasks' lines on a terminal, redrawn once a second (the loop's
    `watch`), and while tasks print lines, as they are shown (LINES_REFRESH_SECONDS, where
    a redraw is cheap enough), so the table is about as current as the lines above it. Rows
    that do not fit the terminal's height are left out, and counted."""

    def __init__(self, writer: ConsoleWriter, fd: int) -> None:
        self._writer, self._fd = writer, fd
        self._t0 = time.monotonic()
        self._last: dict[str, str] = {}  # each task's last line that is not TF's chatter
        self._job: Job | None = None
        self._next = 0.0  # when a line may redraw the table next (monotonic)
        self._render_seconds = 0.0  # the last redraw's (the writer's thread sets it)

    def seen(self, task: str, line: str) -> None:
        self._last[task] = line
        if self._job is not None and time.monotonic() >= self._next:
            self(self._job)

    def __call__(self, job: Job) -> None:
        now = time.monotonic()
        self._job = job
        self._next = now + max(LINES_REFRESH_SECONDS, self._render_seconds / RENDER_SHARE)
        rows = [row_from_record(rec, now, self._last.get(rec.name, ""))
                for rec in job.records.values()]
        title = (f"{job.plan.run_id}: {job.state.value}, {duration(now - self._t0)}, "
                 f"restarts {job.restarts}/{job.policy.max_restarts}"
                 # The workers working: a parameter_server job's dropped ones have no record.
                 + size_note(job.plan.spec, sum(r.role == "worker" for r in job.records.values())))
        self._writer.set_footer(lambda: self._render(rows, title))

    def _render(self, rows: list[Row], title: str) -> str:
        t0 = time.perf_counter()
        try:
            return self._rendered(rows, title)
        finally:
            self._render_seconds = time.perf_counter() - t0

    def _rendered(self, rows: list[Row], title: str) -> str:
        try:
            width, height = os.get_terminal_size(self._fd)
        except OSError:
            width, height = 120, 40
        room = max(1, height - 6)  # title, header, rule, the "more" line, a line of output
        shown = rows[:room]
        text = render(table(shown, fit(shown, LIVE, width), title, width), width, color=True)
        if len(rows) > len(shown):
            text += f"… {len(rows) - len(shown)} more tasks (tfo status shows all)\n"
        return text

    def close(self) -> None:
        self._writer.set_footer(None)
