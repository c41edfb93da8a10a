"""Where each attempt began, and what a restart lost: "resumed at epoch 3 (lost 40 steps)",
"started over: 210 steps lost, nothing restored". Said once an attempt trains (its first
`progress` marker), from what tfo itself saw: the steps its restart unit had reached in
earlier attempts (progress markers), the checkpoints the tasks wrote (`checkpoint` markers,
op saved: at which step) and the one this attempt read back before training (op restored).

Steps here are the unit's own count across attempts: an attempt's markers count from 0,
so each attempt has a `base`, the step it began at (a restore's save's step; 0 when it
restored nothing), and its tasks are at `base + step`.

`resumption` decides (pure, tests/test_resumes.py's table); `Ledger` keeps what it needs
(no I/O, no clock): the intake feeds it markers and writes what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# A job that saves every few steps for days: the saves remembered, the oldest forgotten.
SAVES_KEPT = 1000


@dataclass(frozen=True)
class Save:
    """A checkpoint a task wrote: at the unit's step `step`, in `epoch` (its last progress
    marker's, where it tells one)."""

    step: int
    epoch: int | None = None


@dataclass(frozen=True)
class Restored:
    """The checkpoint an attempt read back before it trained: `epoch` its own epoch
    variable, where it has one."""

    path: str
    epoch: int | None = None


@dataclass(frozen=True)
class Resumption:
    """How an attempt began, against what its unit had reached before (`reached` steps)."""

    resumed: bool  # it restored a checkpoint
    reached: int
    step: int | None  # the unit's step it began at (None: a checkpoint tfo did not see saved)
    epoch: int | None  # the epoch it trains in, where known
    lost: int | None  # steps done before that it does again (None: not known)
    restored: str | None = None

    def words(self) -> str:
        if not self.resumed:
            return f"started over: {self.lost} steps lost, nothing restored"
        if self.step is None:
            return (f"restored {self.restored} before training, a checkpoint not saved in "
                    "this run: steps lost not known")
        where = f"epoch {self.epoch}" if self.epoch is not None else f"step {self.step}"
        return f"resumed at {where} (lost {self.lost} steps)"

    def event(self) -> dict[str, Any]:
        return {"how": "resumed" if self.resumed else "started over", "restored": self.restored,
                "step": self.step, "epoch": self.epoch, "lost_steps": self.lost,
                "reached": self.reached, "words": self.words()}


def resumption(reached: int, restored: Restored | None, save: Save | None,
               epoch: int | None) -> Resumption | None:
    """How an attempt began: its unit had reached `reached` steps in earlier attempts; it
    read back `restored` (None: nothing) before training, which tfo saw saved as `save`
    (None: not in this run); `epoch` the epoch its first progress marker says. None where
    there is nothing to say: nothing reached before and nothing restored."""
    if restored is None:
        if reached <= 0:
            return None
        return Resumption(False, reached, 0, epoch, reached)
    start = save.step if save is not None else None
    if epoch is None:
        epoch = restored.epoch if restored.epoch is not None else \
            save.epoch if save is not None else None
    lost = max(0, reached - start) if start is not None else None
    return Resumption(True, reached, start, epoch, lost, restored.path)


@dataclass
class Ledger:
    """What `resumption` needs, kept as the markers come: per unit and attempt the steps
    reached, each checkpoint saved, each task's current attempt's base and restore."""

    reached: dict[tuple[str, int], int] = field(default_factory=dict)  # (unit, attempt)
    saves: dict[str, Save] = field(default_factory=dict)  # by path
    base: dict[str, int] = field(default_factory=dict)  # task → its attempt's first step
    restored: dict[tuple[str, int], Restored] = field(default_factory=dict)  # (task, attempt)
    judged: set[tuple[str, int]] = field(default_factory=set)  # (task, attempt)
    said: list[dict[str, Any]] = field(default_factory=list)  # task_resumed's, in order

    def checkpoint(self, task: str, attempt: int, op: str, path: str, step: int,
                   epoch: int | None, last_epoch: int | None) -> None:
        """A `checkpoint` marker: a save at the task's step `step` (`last_epoch`: its last
        progress marker's), or a restore (`epoch`: the checkpoint's own), which counts only
        before the attempt trains."""
        if op == "saved":
            self.saves.pop(path, None)
            self.saves[path] = Save(self.base.get(task, 0) + step, last_epoch)
            while len(self.saves) > SAVES_KEPT:
                del self.saves[next(iter(self.saves))]
        elif (task, attempt) not in self.judged:
            self.restored[(task, attempt)] = Restored(path, epoch)

    def save_for(self, path: str) -> Save | None:
        """The save a restored checkpoint is: the one at its path, else the latest whose last
        two parts are its own. A worker restores the chief's BackupAndRestore save from the
        copy tfo made in its own directory (backupfill: `<its dir>/chief/ckpt-K`, the chief's
        `<dir>/chief/ckpt-K`), a path no task wrote."""
        if (save := self.saves.get(path)) is not None:
            return save
        tail = path.rstrip("/").split("/")[-2:]
        return next((s for p, s in reversed(self.saves.items())
                     if len(tail) == 2 and p.rstrip("/").split("/")[-2:] == tail), None)

    def progressed(self, task: str, unit: str, attempt: int, step: int, epoch: int | None
                   ) -> Resumption | None:
        """A `progress` marker (`step`: this attempt's count): on the attempt's first, how it
        began (None: nothing to say); and the unit's reach."""
        said = None
        if (task, attempt) not in self.judged:
            self.judged.add((task, attempt))
            before = max((n for (u, a), n in self.reached.items() if u == unit and a < attempt),
                         default=0)
            restored = self.restored.pop((task, attempt), None)
            said = resumption(before, restored, self.save_for(restored.path)
                              if restored is not None else None, epoch)
            self.base[task] = said.step if said is not None and said.step is not None else 0
        key = (unit, attempt)
        self.reached[key] = max(self.reached.get(key, 0), self.base.get(task, 0) + step)
        return said


def lines(resumed: list[dict[str, Any]]) -> list[str]:
    """How each attempt after the first began (task_resumed's fields), a line per attempt
    and what it says: `worker:0, worker:1 attempt 1: resumed at epoch 2 (lost 7 steps)`."""
    said: dict[tuple[Any, str], list[str]] = {}
    for r in resumed:
        said.setdefault((r.get("attempt"), str(r.get("words", ""))), []).append(
            str(r.get("task", "")))
    return [f"{', '.join(sorted(names, key=_by_index))} attempt {attempt}: {words}"
            for (attempt, words), names in said.items()]


def _by_index(name: str) -> tuple[str, int]:
    """`worker:2` before `worker:10`; tasks in the order they said it read as a race."""
    role, _, index = name.rpartition(":")
    return (role, int(index)) if index.isdigit() else (name, -1)
