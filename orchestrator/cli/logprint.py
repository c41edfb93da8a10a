"""`tfo logs`: a run's task logs printed from where the last look ended, line by line (memory
does not grow with a log). The CLI decides which run, which task and whether to follow."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.loop.markers import is_marker
from orchestrator.runs.rundir import RunDir, last_lines, read_lines


@dataclass
class LogPrinter:
    """Prints `task`'s log (every task's, `[role:index] ` first, when None) to stdout, each
    line through `shown` (a task's output is untrusted: escaped for a terminal)."""

    rd: RunDir
    task: str | None
    raw: bool  # also the @tfo marker lines tfo itself reads
    shown: Callable[[str], str]
    offsets: dict[str, int] = field(default_factory=dict)
    partial: dict[str, bool] = field(default_factory=dict)  # a line printed in part: shown?

    def keep(self, line: str) -> bool:
        return self.raw or not is_marker(line)

    def show(self, last_n: int, whole: bool) -> None:
        """Each log from where the last look ended; with `last_n`, its last lines only, read
        from its end. Line by line either way: memory does not grow with the log."""
        task, offsets, partial, shown = self.task, self.offsets, self.partial, self.shown
        logs = self.rd.task_logs()  # a task not started yet has no log yet
        for name, path in logs.items() if not task else [(task, logs[task])]:
            prefix = f"[{name}] " if not task else ""
            if last_n:
                new, offsets[name] = last_lines(path, last_n, self.keep, whole)
                for line in new:
                    print(shown(prefix + line))
                continue
            for line, ended, offset in read_lines(path, offsets.get(name, 0), whole):
                start = name not in partial  # a line over LOG_CHUNK comes in pieces
                if start and self.keep(line) or partial.get(name):
                    print(shown(prefix + line if start else line), end="\n" if ended else "")
                if ended:
                    partial.pop(name, None)
                elif start:
                    partial[name] = self.keep(line)  # whether its next pieces are shown
                offsets[name] = offset
        sys.stdout.flush()
