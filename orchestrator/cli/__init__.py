"""The `tfo` command and what it shows: commands and options, the console writer, the live
table, the end-of-run report, `tfo logs`, the guide and the generated reference.

    tfo = orchestrator.cli.commands:main

May import every other part of orchestrator; nothing imports it but `__main__`.

Design: What the user sees
====================

Every byte a task prints goes to its log (a `\\x1f` written out as the text `\\x1f`: in a log
that byte starts a marker line); its lines (TF's C++ chatter filtered, control characters
escaped by `printable`: a task's output is untrusted) go to the `ConsoleWriter`, prefixed
`[role:index]` (`--no-logs`: tfo's own lines only). The ConsoleWriter's thread is the only
writer of stdout while the job runs. A task that prints more than `FLOOD_LINES` (1,000)
lines in a second floods (`launch/output.py`): the rest of that second's lines go to the log
only, counted in bulk rather than split one by one, and one line says how many were not
shown; markers are never held back. 2,000,000 lines cost the coordinator 5.9 s of CPU (a
full core while they lasted) before and 0.5 s after. Carriage returns and backspaces are
applied as a terminal would (`overstrike`) before the escaping: a Keras progress bar shows
as its last drawing.

On a terminal (stdout a tty, TERM not dumb) the `LiveView` is the supervisor's `watch`: the
loop calls it, on its own thread, at most once a second (`WATCH_SECONDS`), and it only
copies each record into a `Row` (plain data: state, pid, uptime, the wrapper's `usage` (CPU,
RSS), the last `progress` (epoch, step, loss; the epoch an `epoch` marker said began since,
with none of its steps done: `liveview.begun`), steps/s, the last line that is not chatter)
and hands the writer a footer: a function of those rows; while tasks print, also as their
lines are shown (`LINES_REFRESH_SECONDS`, 0.25 s, where a redraw costs under 5 % of a core:
the once-a-second refresh left the epoch column 9 short epochs behind the lines above it; a
2-worker fit of 200 epochs of 0.1 s, 800 lines, cost the coordinator 1.59-1.62 s of CPU
against 1.32-1.38 s with the once-a-second refresh alone). The writer's thread renders it
(rich), erases the old footer (cursor up, erase to the end), writes the queued lines and
draws the footer again, at most every 0.1 s; a slow terminal costs dropped lines, never the
loop's time. Columns a narrow terminal cannot hold go first (pid, host, ...), rows beyond
its height are counted. At the end the footer is erased and the summary prints the final
table (`FINAL`: task, host, state, exit, restarts, epoch, step, loss) from the `RunResult`.

Piped (CI, `| tee`) or TERM=dumb: no footer and no escape sequences, the lines, then the
same final table and summary as plain text. `tfo status` renders the same rows from
events.jsonl (`rows_from_events`; a task's state after an exit is the one `task_exited`
records, as the supervisor decided it: a server's exit 0 is `failed`), `tfo runs` lists
`RunInfo`s, `tfo logs RUN [TASK] -f` follows the logs until `run_over`. `report.job_line`
tells a damaged record as such, never `running`: an empty events.jsonl, one with no event
(corrupt), one without run_started (running only while a tfo holds the run's lock:
`RunDir.held`), and a run whose coordinator is gone without job_finished, "ended abnormally"
with its last whole event (its live tasks `unfinished`). The verdicts of `task_slow`
(`slowtasks.py`) reach the views after a run from events.jsonl: the summary and `tfo status`
give a `slow:` line each, `tfo status --json` its `slow_tasks`, and `tfo status` marks the
row while the attempt named runs; the live view's rows read `slow` for `running` from the
attempt the slow watch marked (loop/slowness.py), as the coordinator knows it.

**The run directory's own faults** (`orchestrator/loop/rundirwatch.py`, each round, looking
every second). Deleted while the job runs: tfo still holds events.jsonl and the task logs
open, and Linux reads a deleted file back through /proc/self/fd, so the directory is made
again with them written back (`rundir.write_back`; a running attempt's output reader
`TaskOutput.relink` copies and swaps under its log lock, so no byte goes to the deleted file
after the copy), plan.json and cluster.yaml from memory, a new lock; what only the tasks
wrote (backup/, model/, tensorboard/, tmp/) is said lost (`run_dir_restored`, a `[tfo]`
line, the summary's `RunResult.notes`). Cannot be made again: the job fails, saying so.
events.jsonl is written a record per write(2) (O_APPEND); a write that fails (ENOSPC) cuts
the file back to its last whole record (ftruncate needs no space), writes nothing more, and
the job fails naming the file and the error (`rundirwatch.full`), torn down as for any
failure, the summary printed.
"""


def main() -> None:
    """`tfo`: the console script's entry (pyproject's `orchestrator.cli:main`), importing the
    commands only when called."""
    from orchestrator.cli.commands import main as commands_main

    commands_main()


def __getattr__(name: str) -> object:
    """`orchestrator.cli.app` and the commands' other names, from cli/commands.py at first use
    (PEP 562): importing the package alone loads nothing."""
    import importlib
    import importlib.util

    # A submodule not imported yet (`from orchestrator.cli import slowtasks` asks the package
    # first): the import system's to load, not the commands' (whose import would come back
    # to the module asking: report -> commands -> messages -> report).
    if name.startswith("__") or name == "commands" or \
            importlib.util.find_spec(f"{__name__}.{name}") is not None:
        raise AttributeError(name)
    return getattr(importlib.import_module("orchestrator.cli.commands"), name)
