"""A task's BackupAndRestore directory, read and filled by the coordinator (without
TensorFlow): what an elastic resize needs (orchestrator/elastic/groups.py decides, this acts).

Every task keeps its own (TFO_BACKUP_DIR, worker_entry.context._TaskBackup), laid out as
tf-keras lays out the chief's, which a tutorial script's `BackupAndRestore(backup_dir=…)`
writes too:

    BACKUP_DIR/chief/checkpoint                     # text: which backups there are
    BACKUP_DIR/chief/ckpt-3.index                   # one backup: its save number, 3
    BACKUP_DIR/chief/ckpt-3.data-00000-of-00001

The save number is the Checkpoint's save counter: the same on every worker for the same
backup (they save together), and carried by a copy.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
from pathlib import Path

SUBDIR = "chief"  # tf-keras's name for the directory it keeps
# A script's BackupAndRestore directory that is its task's TFO_BACKUP_DIR (or inside it), as
# the coordinator keeps it (`told`): each worker's own, not one path for all.
TASK_DIR = "$TFO_BACKUP_DIR"
STATE = "checkpoint"  # tf.train.CheckpointManager's list of backups
_PATHS = re.compile(r'^(?:all_)?model_checkpoint_paths?: "([^"]*)"', re.M)


def held(backup_dir: str | Path) -> frozenset[int]:
    """The save numbers of the complete backups in a task's backup directory: named by its
    `checkpoint` file (paths relative or absolute, as the tasks write them) and with their
    `.index` file there (written last)."""
    directory = Path(backup_dir) / SUBDIR
    try:
        text = (directory / STATE).read_text(errors="replace")
        names = {p.name for p in directory.iterdir() if p.is_file()}
    except (FileNotFoundError, NotADirectoryError):
        return frozenset()
    return saves_in(text, names)


def saves_in(state: str, names: set[str]) -> frozenset[int]:
    """The save numbers a `checkpoint` file's text names whose `.index` file is among
    `names` (the directory's files): held's reading, for a directory read elsewhere."""
    found = set()
    for path in _PATHS.findall(state):
        name = os.path.basename(path)
        number = name.rpartition("-")[2]
        if name.startswith("ckpt-") and number.isdigit() and f"{name}.index" in names:
            found.add(int(number))
    return frozenset(found)


def state_text(save: int) -> str:
    """The `checkpoint` file of a directory holding backup `save` only."""
    return f'model_checkpoint_path: "ckpt-{save}"\nall_model_checkpoint_paths: "ckpt-{save}"\n'


def told(path: str, cwd: str, own: str) -> str:
    """A script's BackupAndRestore directory, as a task told it (absolute), kept for every
    worker: inside the task's own TFO_BACKUP_DIR `own` as TASK_DIR (each worker's own
    directory then, tf-keras keeping the chief's backup in the chief's alone), else relative
    to the task's `cwd` where it lies inside it (the same directory under each host's
    workdir), else as it is. `cwd` and `own` as the plan has them (a lab host's `~/tfo`,
    which the task saw expanded)."""
    path = posixpath.normpath(path)
    for base, name in ((own, TASK_DIR), (cwd, "")):
        rest = _within(path, posixpath.normpath(base))
        if rest is not None:
            return rest if not name else name if rest == "." else f"{name}/{rest}"
    return path


def _within(path: str, base: str) -> str | None:
    """`path` relative to `base` ("." for itself) where it lies inside it; a base under a
    home directory (`~/x`) found by its tail (the task's home is not known here)."""
    if base.startswith("~/"):
        tail = base[1:]  # "/x"
        at = path.find(f"{tail}/")
        if at < 0 and path.endswith(tail):
            at = len(path) - len(tail)
        if at <= 0:
            return None
        base = path[:at] + tail
    if path == base:
        return "."
    return posixpath.relpath(path, base) if path.startswith(f"{base}/") else None


def script_dir(script: str, cwd: str, own: str) -> str:
    """`told`'s form back to a task's path: its TFO_BACKUP_DIR `own` for TASK_DIR, a relative
    path under its `cwd`."""
    if script == TASK_DIR or script.startswith(f"{TASK_DIR}/"):
        return posixpath.join(own, script[len(TASK_DIR) + 1:]).rstrip("/") or own
    return posixpath.join(cwd, script)


def remove_backup(directory: str | Path) -> None:
    """The backups in a backup directory gone (its `chief` directory), on this machine."""
    shutil.rmtree(Path(directory) / SUBDIR, ignore_errors=True)


def carry_backup(old: str | Path, new: str | Path) -> bool:
    """A whole backup directory copied (a rerun's, into its new run directory), on this
    machine; False: no `old`."""
    if not Path(old).is_dir():
        return False
    shutil.copytree(old, new, symlinks=True, dirs_exist_ok=True)
    return True


def _link_or_copy(source: Path, target: Path) -> None:
    """A backup's file in another directory: a hard link where both are on one filesystem
    (a model's size costs nothing; TensorFlow writes a checkpoint's files once, as new
    files, and never changes them), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def copy_backup(source: str | Path, target: str | Path, save: int) -> None:
    """Make `target` a backup directory holding backup `save`, copied from `source`'s: its
    files, and a `checkpoint` file naming it by a relative path (a copied absolute one would
    point back at the source). Built beside the target, which is replaced only once the copy
    is whole. On this machine; raises OSError.

    A lab host's (resize over SSH): orchestrator/elastic/backupstore.py, the same steps
    through the host's connection."""
    src, dst = Path(source) / SUBDIR, Path(target) / SUBDIR
    files = sorted(p for p in src.glob(f"ckpt-{save}.*") if p.is_file())
    if not any(p.name == f"ckpt-{save}.index" for p in files):
        raise FileNotFoundError(f"{src}: no backup ckpt-{save} to copy")
    partial = dst.with_name(f"{SUBDIR}.tfo-partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        for path in files:
            _link_or_copy(path, partial / path.name)
        (partial / STATE).write_text(state_text(save))
        shutil.rmtree(dst, ignore_errors=True)
        partial.rename(dst)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
