"""The schedulers a cluster file may name (`backend: {KIND: {…}}`) and each one's options
model: the registry the spec reads. The schedulers' launching side (launch.backends.BACKENDS)
names the same kinds; tests/test_layout.py's neighbour test keeps the two in step.

Here, on the planning side, so that reading a cluster file never imports a backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.planning.spec import SchedulerOptions


def scheduler_options() -> dict[str, type[SchedulerOptions]]:
    """Every scheduler's options model by kind (imported only for a job that names one)."""
    from orchestrator.planning.slurmspec import SLURM, SlurmSpec

    return {SLURM: SlurmSpec}
