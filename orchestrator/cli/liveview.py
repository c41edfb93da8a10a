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
from orchestrator.cli.slowtasks import marked, verdict
from orchestrator.loop.exitwords import cell as exit_cell
from orchestrator.loop.rate import STALE_INTERVALS, STALE_SECONDS, shown

if TYPE_CHECKING:

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
    slow: bool = False  # named slow (task_slow) in its last attempt


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
    `last`: its last line but TensorFlow's chatter, when known. Its attempt's `slow`: the
    slow watch named it (loop/slowness.py), and a restart's new attempt starts unmarked."""
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
        last=rec.last_line if last is None else last, slow=rec.current.work.slow,
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
    this one); `slow` while a task_slow named its current attempt. `over`: the run ended
    abnormally (its coordinator is gone: so are its tasks), so a task still starting or
    running then is `unfinished`, not running now."""
    tasks: dict[str, dict[str, Any]] = {}
    progressed: dict[str, tuple[float, float]] = {}  # a task's last two progress times
    attempts: dict[str, int | None] = {}  # each task's current attempt (task_started's)
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
                     exit=None, exit_reason="", trained=Trained(), steps_per_second=None,
                     slow=False)
            attempts[name] = _int(e.get("attempt"))
        elif kind == "task_slow":
            t["slow"] = marked(verdict(e), attempts.get(name))
        elif kind == "task_ready":
            t["state"] = "running"
        elif kind == "task_progress":
            t["trained"] = Trained(**{k: _number(e.get(k)) for k in TRAINED})
            t["steps_per_second"] = _number(e.get("steps_per_second"))
            if isinstance(at := _number(e.get("time")), float | int):
                progressed[name] = (progressed.get(name, (at, at))[1], at)
        elif kind == "task_epoch" and _int(e.get("epoch")) is not None:
            t["trained"] = begun(t.get("trained", Trained()), e["epoch"])
        elif kind == "task_restarted":  # its next attempt: a fresh verdict is needed
            t.update(restarts=_int(e.get("restarts")) or 0, state="pending", slow=False)
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


def _loss(loss: float | None) -> str:
    """Four decimals where a loss usually is (0.1300, 0.1088, 0.0943: one width as it
    falls), three significant digits beyond."""
    if loss is None:
        return "-"
    return f"{loss:.4f}" if 1e-3 <= abs(loss) < 100 else f"{loss:.3g}"


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
    "state": lambda r: state_cell(r),
    "restarts": lambda r: str(r.restarts),
    "up": lambda r: duration(r.uptime),
    "cpu": lambda r: "-" if r.cpu is None else f"{r.cpu:.0f}%",
    "rss": lambda r: _bytes(r.rss),
    "epoch": _epoch,
    "step": _step,
    "steps/s": lambda r: "-" if r.steps_per_second is None else f"{r.steps_per_second:.1f}",
    "loss": lambda r: _loss(r.trained.loss),
    "exit": lambda r: "-" if r.exit is None
    else exit_cell(r.exit, r.exit_reason, r.torn_down),
    "last line": lambda r: r.last or "-",
    "last event": lambda r: r.last or "-",
}
LIVE = ("task", "host", "pid", "state", "restarts", "up", "cpu", "rss", "epoch", "step",
        "steps/s", "loss", "last line")
FINAL = ("task", "host", "state", "exit", "restarts", "epoch", "step", "loss")
STATUS = ("task", "host", "state", "restarts", "epoch", "step", "steps/s", "loss", "last event",
          "pid", "exit")
_STYLES = {"running": "green", "succeeded": "green", "failed": "red", "stopped": "yellow",
           "slow": "bold yellow"}
SLOW = "slow"


def state_cell(r: Row) -> str:
    """Its state; a task named slow shows `slow` in place of `running` (no wider: at 80
    columns the table keeps its steps/s), its other states as they are (their attempt is
    over, or ends: the summary's and `tfo status`'s lines keep the verdict)."""
    running = "running"
    return SLOW + r.state[len(running):] if r.slow and r.state.startswith(running) else r.state


# ---- fitting a table to the terminal ----------------------------------------------------
# Every table (live, summary, `tfo status`, `tfo runs`) fits its width the same way: by
# dropping whole columns, in this order, never by cutting a value. These go first ...
DROPS = ("pid", "rss", "name", "cpu", "up", "restarts", "started", "steps/s", "host",
         "duration", "step")
# A job on one host says it on every row: its host column goes first. A job on several keeps
# it longest: there it tells the tasks' machines apart.
ONE_HOST = ("host", *DROPS)
HOSTS = (*(c for c in DROPS if c != "host"), "host")
# ... these never (a value that identifies something, or that the user came for) ...
ESSENTIAL = ("task", "state", "epoch", "loss", "exit", "run", "outcome")
# ... and free text is cut to what is left (a '…' where it is cut), at least MIN_LAST while
# columns can still go, at least LEAST_LAST, else left out.
FREE = ("last line", "last event")
MIN_LAST = 20
LEAST_LAST = 8
SEPARATOR = 3  # between two columns: padding, rule, padding
# The widths a value of these columns reaches as a job goes on (a table whose columns moved
# with each refresh was hard to read).
RESERVED = {"pid": 7, "cpu": 4, "rss": 5, "up": 6, "steps/s": 5, "loss": 6}


def widths(columns: tuple[str, ...], cells: list[list[str]]) -> dict[str, int]:
    """Each column's width: its header, its longest cell, what it reserves."""
    return {col: max([len(col), RESERVED.get(col, 0), *(len(c[i]) for c in cells)])
            for i, col in enumerate(columns)}


def _total(columns: tuple[str, ...], wide: dict[str, int], free: int) -> int:
    return sum(free if c in FREE else wide[c] for c in columns) + \
        SEPARATOR * (len(columns) - 1)


def fit(columns: tuple[str, ...], wide: dict[str, int], width: int,
        drops: tuple[str, ...] = DROPS) -> tuple[str, ...]:
    """The columns of a table `width` wide: `drops` leave, one at a time, until the others
    fit with MIN_LAST for free text; then free text gets what is left, if that is
    LEAST_LAST. ESSENTIAL columns always stay."""
    for drop in drops:
        if _total(columns, wide, MIN_LAST) <= width:
            break
        if drop not in ESSENTIAL:
            columns = tuple(c for c in columns if c != drop)
    if _total(columns, wide, LEAST_LAST) > width:
        columns = tuple(c for c in columns if c not in FREE)
    return columns


def fitted(columns: tuple[str, ...], cells: list[list[str]], width: int | None,
           title: str = "", styles: list[dict[str, str]] | None = None,
           wide: dict[str, int] | None = None, drops: tuple[str, ...] = DROPS) -> Any:
    """A table of `cells` (one list a row, in `columns`' order) that fits `width` (None:
    every column, as is): see `fit`. Every cell is Text: a task name, host or line is never
    read as rich markup. A kept value is never cut by rich either (min_width, and folded
    should the essential columns alone be too wide); free text is cut here, once."""
    from rich import box  # here, not at the top: `tfo run` starts its tasks before rich loads
    from rich.table import Table
    from rich.text import Text

    wide = {**widths(columns, cells), **(wide or {})}
    kept = columns if width is None else fit(columns, wide, width, drops)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    room = None if width is None else width - _total(tuple(c for c in kept if c not in FREE),
                                                      wide, 0) - SEPARATOR
    for col in kept:
        if col in FREE:
            t.add_column(col, no_wrap=True, overflow="ellipsis")
        else:
            t.add_column(col, no_wrap=True, overflow="fold", min_width=wide[col])
    at = [columns.index(col) for col in kept]
    for n, row in enumerate(cells):
        style = (styles or [{}] * len(cells))[n]
        shown = []
        for i in at:
            text = row[i]
            if columns[i] in FREE and room is not None and len(text) > room:
                text = text[:max(1, room - 1)] + "…"
            shown.append(Text(text, style=style.get(columns[i], "")))
        t.add_row(*shown)
    if not title:
        return t
    from rich.console import Group  # the title a line of its own: as wide as the console,
    # not wrapped at a narrow table's width
    return Group(Text(printable(title)), t)


def cells(rows: list[Row], columns: tuple[str, ...]) -> list[list[str]]:
    return [[printable(CELLS[col](r)) for col in columns] for r in rows]


def without_restarts(rows: list[Row], columns: tuple[str, ...]) -> tuple[str, ...]:
    """A finished run's table without its restarts column when nothing restarted (the run
    directory's line says `restarts: 0`)."""
    return columns if any(r.restarts for r in rows) else \
        tuple(c for c in columns if c != "restarts")


def table(rows: list[Row], columns: tuple[str, ...], title: str = "",
          width: int | None = None, wide: dict[str, int] | None = None) -> Any:
    """The tasks' table, fit to `width` (see `fitted`; ONE_HOST, HOSTS)."""
    styles = [{"state": _STYLES.get(state_cell(r).split()[0], "")} for r in rows]
    return fitted(columns, cells(rows, columns), width, title, styles, wide,
                  ONE_HOST if len({r.host for r in rows}) <= 1 else HOSTS)


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


def restarts_possible(job: Job) -> bool:
    """Some role may restart: its policy is not `never`, and max_restarts allows one."""
    return job.policy.max_restarts > 0 and \
        any(p.value != "never" for p in job.policy.restart.values())


def done_share(rows: list[Row]) -> float | None:
    """How much of the job is done, where the epochs are known: its slowest task's share
    (epochs begun and steps done), 0-1; None while no task knows its epochs."""
    shares = []
    for r in rows:
        t = r.trained
        if t.epochs and t.epoch is not None:
            within = t.step_in_epoch / t.steps if t.steps and t.step_in_epoch is not None else 0
            shares.append(min(1.0, (t.epoch + within) / t.epochs))
    return min(shares) if shares else None


@dataclass
class Eta:
    """The job's time to go, from its share done and the time since the first share seen
    (the start-up before training does not count)."""

    first: tuple[float, float] | None = None  # (when, share) first seen

    def __call__(self, share: float | None, now: float) -> float | None:
        if share is None:
            return None
        if self.first is None or share < self.first[1]:  # a restart went back: start again
            self.first = (now, share)
        at, began = self.first
        if share <= began or now <= at:
            return None
        return (1 - share) * (now - at) / (share - began)


def progress_line(share: float | None, eta: float | None, width: int) -> Any:
    """A bar of the job's share done, its percent and ETA (rich's ProgressBar), or None."""
    if share is None:
        return None
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    words = f" {share * 100:3.0f}%" + ("" if eta is None else f"  eta {duration(eta)}")
    grid = Table.grid()
    grid.add_row(ProgressBar(total=1.0, completed=share, width=max(5, min(40, width - 20))),
                 Text(words))
    return grid


class LiveView:
    """The table under the tasks' lines on a terminal, redrawn once a second (the loop's
    `watch`), and while tasks print lines, as they are shown (LINES_REFRESH_SECONDS, where
    a redraw is cheap enough), so the table is about as current as the lines above it. Rows
    that do not fit the terminal's height are left out, and counted. Its columns' widths only
    grow while the terminal's width stays (`fit` then drops the same columns each redraw); a
    new width starts them again. Above the table: the job's elapsed time, and where the
    epochs are known a progress bar and an ETA. A task tfo named slow shows `slow` for
    `running` while that attempt runs."""

    def __init__(self, writer: ConsoleWriter, fd: int) -> None:
        self._writer, self._fd = writer, fd
        self._t0 = time.monotonic()
        self._last: dict[str, str] = {}  # each task's last line that is not TF's chatter
        self._job: Job | None = None
        self._next = 0.0  # when a line may redraw the table next (monotonic)
        self._render_seconds = 0.0  # the last redraw's (the writer's thread sets it)
        self._eta = Eta()
        self._wide: dict[str, int] = {}  # the columns' widths so far (the writer's thread)
        self._width = 0  # the terminal's width they are for

    def seen(self, task: str, line: str) -> None:
        self._last[task] = line
        if self._job is not None and time.monotonic() >= self._next:
            self(self._job)

    def __call__(self, job: Job) -> None:
        now = time.monotonic()
        self._job = job
        self._next = now + max(LINES_REFRESH_SECONDS, self._render_seconds / RENDER_SHARE)
        at = job.clock()  # the loop's (time.monotonic but in a test on a fake clock)
        rows = [row_from_record(rec, at, self._last.get(rec.name, ""))
                for rec in job.records.values()]
        possible = restarts_possible(job)
        title = (f"{job.plan.run_id}: {job.state.value}, {duration(now - self._t0)}"
                 + (f", restarts {job.restarts}/{job.policy.max_restarts}" if possible else "")
                 # The workers working: a parameter_server job's dropped ones have no record.
                 + size_note(job.plan.spec, sum(r.role == "worker" for r in job.records.values())))
        columns = LIVE if possible or any(r.restarts for r in rows) else \
            tuple(c for c in LIVE if c != "restarts")
        share = done_share(rows)
        eta = self._eta(share, now)
        self._writer.set_footer(lambda: self._render(rows, title, columns, share, eta))

    def _render(self, rows: list[Row], title: str, columns: tuple[str, ...],
                share: float | None, eta: float | None) -> str:
        t0 = time.perf_counter()
        try:
            return self.frame(rows, title, columns, share, eta)
        finally:
            self._render_seconds = time.perf_counter() - t0

    def frame(self, rows: list[Row], title: str, columns: tuple[str, ...],
                  share: float | None, eta: float | None) -> str:
        from rich.console import Group
        from rich.text import Text

        try:
            width, height = os.get_terminal_size(self._fd)
        except OSError:
            width, height = 120, 40
        # One column short of the terminal: a line as wide as it leaves the cursor in its
        # last column, and some terminals then wrap the next line's first character.
        width = max(20, width - 1)
        bar = progress_line(share, eta, width)
        room = max(1, height - 6 - (bar is not None))  # title, header, rule, "more", a line
        shown = rows[:room]
        if width != self._width:
            self._wide, self._width = {}, width
        for col, w in widths(columns, cells(shown, columns)).items():
            self._wide[col] = max(w, self._wide.get(col, 0))
        parts: list[Any] = [Text(printable(title), no_wrap=True, overflow="ellipsis")]
        if bar is not None:
            parts.append(bar)
        parts.append(table(shown, columns, width=width, wide=self._wide))
        from orchestrator.cli.report import no_color

        text = render(Group(*parts), width, color=not no_color())
        if len(rows) > len(shown):
            text += f"… {len(rows) - len(shown)} more tasks (tfo status shows all)\n"
        return text

    def close(self) -> None:
        self._writer.set_footer(None)
