"""How an exit is told, in one place: the status a task's exit is recorded with and the words a
user reads of it (task_exited's and task_stopped's `returncode` and `how`, a loss's reason, the
tables' exit cell).

    told = exited(rc, lost, torn_down, said)     # Told(returncode, how): task_exited
    told = stopped(rc, lost, said, note)         # task_stopped
    why = lost_why(name, rc, lost, note)         # the restart line, the job's failure
    text = cell(rc, lost, torn_down)             # the tables (a run's, tfo status)

The backends report facts: an exit code (TaskHandle.poll: -N the signal N) and, where the
code says less, a lost contact (`lost contact with lab2: ...`). The rule of a torn-down task
(its exit is the status its code said: `decide.teardown_status`) and the sentences
(`decide.exited_how`, `stopped_how`, `lost_why`) are decide's; here a code gets its own words
(`describe_exit`: a signal's name, which decide, importing no signal module, does not know),
once for each exit.

A task our signal ended in its teardown after its code said 0 is a success either way, told
in each event's terms: task_exited keeps the kill's status and says `teardown: true`
(records.torn_down_ok, RunResult's `torn_down`: the tables show "stopped in teardown"), while
task_stopped, whose task is STOPPED whatever its code said, records the 0.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from orchestrator.loop import decide


def describe_exit(returncode: int | None) -> str:
    """'exit code 3', 'signal SIGKILL', or 'still running'."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


@dataclass(frozen=True)
class Told:
    returncode: int | None  # what the event records
    how: str


def exited(rc: int, lost: str, torn_down: bool, said: int | None) -> Told:
    """A task's exit (task_exited): `torn_down`, our teardown stop ended it (decide.
    stopped_in_teardown); `said`, the status its `exiting` marker said its code ended with."""
    status = decide.teardown_status(rc, said, torn_down)
    code = status or rc  # 0: a success by teardown, the kill's status kept (module doc)
    return Told(code, decide.exited_how(describe_exit(code), lost, torn_down,
                                        describe_exit(code) if status else None))


def stopped(rc: int | None, lost: str, said: int | None, note: str = "") -> Told:
    """A task we stopped (task_stopped): a signal ended it, or it exited meanwhile; `note`,
    why its code's 42 was no preemption."""
    status = decide.teardown_status(rc, said, ours=True)
    how = decide.stopped_how(describe_exit(rc), lost,
                             describe_exit(status) if status is not None else None, note)
    return Told(rc if status is None else status, how)


def lost_why(name: str, rc: int | None, lost: str = "", note: str = "") -> str:
    """A lost task's reason (the restart line, the job's failure)."""
    return decide.lost_why(name, describe_exit(rc), lost, note)


def cell(rc: int | None, lost: str = "", torn_down: bool = False) -> str:
    """A task's exit in a table: its recorded status (a success by teardown: `torn_down`)."""
    return decide.exited_how(describe_exit(rc), lost, torn_down)
