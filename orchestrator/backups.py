"""A task's BackupAndRestore directory, read and filled by the coordinator (without
TensorFlow): what an elastic resize needs (orchestrator/elastic.py decides, this acts).

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
import re
import shutil
from pathlib import Path

SUBDIR = "chief"  # tf-keras's name for the directory it keeps
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


def remove_backup(directory: str | Path) -> None:
    """The backups in a backup directory gone (its `chief` directory), on this machine."""
    shutil.rmtree(Path(directory) / SUBDIR, ignore_errors=True)


def copy_backup(source: str | Path, target: str | Path, save: int) -> None:
    """Make `target` a backup directory holding backup `save`, copied from `source`'s: its
    files, and a `checkpoint` file naming it by a relative path (a copied absolute one would
    point back at the source). Built beside the target, which is replaced only once the copy
    is whole. On this machine; raises OSError.

    A lab host's (resize over SSH): orchestrator/launch/backupstore.py, the same steps
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
            shutil.copy2(path, partial / path.name)
        (partial / STATE).write_text(state_text(save))
        shutil.rmtree(dst, ignore_errors=True)
        partial.rename(dst)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
