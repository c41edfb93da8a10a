"""The schedulers a cluster file may name (`backend: {KIND: {…}}`) and each one's options
model: the registry the spec reads. The launching side (launch.backends.BACKENDS) names the
same kinds, each with its backend class; tests/test_layout.py keeps the two in step.

Here, on the planning side, so that reading a cluster file never imports a backend. A new
scheduler is one line in each registry: its options model here, its backend class there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.planning.spec import SchedulerOptions


def _slurm() -> type[SchedulerOptions]:
    from orchestrator.planning.slurmspec import SlurmSpec

    return SlurmSpec


# kind → its options model, loaded at first use (only for a job that names a scheduler).
OPTIONS: dict[str, Callable[[], type[SchedulerOptions]]] = {"slurm": _slurm}


def scheduler_options() -> dict[str, type[SchedulerOptions]]:
    """Every scheduler's options model by kind."""
    return {kind: load() for kind, load in OPTIONS.items()}
