"""`tfo logs`: a run's task logs printed from where the last look ended, line by line (memory
does not grow with a log). The CLI decides which run, which task and whether to follow.

Every task's log at once (no task named, no `-n`) is interleaved by time: each line when the
coordinator wrote it (runs/logtimes.py's index), `[role:index] ` first, the tasks merged in
time order (a tie in task order; a log without an index, an older run's, keeps its order
ahead of the others). With `-n` each task's last lines come in task order."""

from __future__ import annotations

import heapq
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.loop.markers import is_marker
from orchestrator.runs.logtimes import stamped, times_of
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
        task, offsets, shown = self.task, self.offsets, self.shown
        logs = self.rd.task_logs()  # a task not started yet has no log yet
        if not task and not last_n:
            lines = heapq.merge(*(self._timed(i, name, path, whole)
                                  for i, (name, path) in enumerate(logs.items())))
            for _, name, text, ended, offset in lines:
                self._print(name, f"[{name}] ", text, ended, offset)
            sys.stdout.flush()
            return
        for name, path in logs.items() if not task else [(task, logs[task])]:
            prefix = f"[{name}] " if not task else ""
            if last_n:
                new, offsets[name] = last_lines(path, last_n, self.keep, whole)
                for line in new:
                    print(shown(prefix + line))
                continue
            for line, ended, offset in read_lines(path, offsets.get(name, 0), whole):
                self._print(name, prefix, line, ended, offset)
        sys.stdout.flush()

    def _timed(self, order: int, name: str, path: Path, whole: bool
               ) -> Iterator[tuple[tuple[float, int, int], str, str, bool, int]]:
        """`name`'s new lines keyed for the merge: (its time, the task's order, its place);
        a long line's pieces share its time, so they stay together."""
        start = self.offsets.get(name, 0)
        lines = stamped(read_lines(path, start, whole), start, times_of(path))
        for seq, (when, text, ended, offset) in enumerate(lines):
            yield (when, order, seq), name, text, ended, offset

    def _print(self, name: str, prefix: str, line: str, ended: bool, offset: int) -> None:
        partial = self.partial
        start = name not in partial  # a line over LOG_CHUNK comes in pieces
        if start and self.keep(line) or partial.get(name):
            print(self.shown(prefix + line if start else line), end="\n" if ended else "")
        if ended:
            partial.pop(name, None)
        elif start:
            partial[name] = self.keep(line)  # whether its next pieces are shown
        self.offsets[name] = offset
