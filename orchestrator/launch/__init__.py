"""Starting tasks: a subprocess here (`local`) or a process on a lab machine (`ssh`).

Both return a TaskHandle with the same small interface, so the supervisor never asks
where a task runs.
"""

from __future__ import annotations

import signal
from typing import Protocol

from orchestrator.plan import TaskPlan


class TaskHandle(Protocol):
    """The coordinator's grip on one running task.

    `returncode` follows subprocess: None while running, >= 0 an exit code, < 0 the
    number of the signal that killed it.
    """

    task: TaskPlan
    attempt: int

    @property
    def pid(self) -> int | None: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def terminate(self) -> None:
        """SIGTERM to the task's whole process group."""

    def kill(self) -> None:
        """SIGKILL to the task's whole process group and any straggler in its tree."""

    def lines(self) -> list[str]:
        """Output lines (stdout and stderr) that arrived since the last call, each cut at
        output.LINE_CAP. The handle itself writes the complete output to task.log_path."""

    def close(self, timeout: float = 1.0) -> list[str]:
        """After exit: wait briefly for the rest of the output, release pipes; the last lines."""


class Launcher(Protocol):
    def __call__(self, task: TaskPlan, attempt: int) -> TaskHandle: ...


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
