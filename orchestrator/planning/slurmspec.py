"""`backend: {slurm: {…}}`: the Slurm request's model and its field checks (the launching
side, launch.slurm, turns it into salloc and srun)."""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field, field_validator

from orchestrator.planning.spec import GPU_ROLES, Int, SchedulerOptions

SLURM = "slurm"  # the kind: `backend: {slurm: …}`, and its tasks' placement

# Slurm's time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; or UNLIMITED.
_SLURM_TIME = re.compile(r"^(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2}|UNLIMITED|INFINITE)$")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


class SlurmSpec(SchedulerOptions):
    """`backend: {slurm: {…}}`: one Slurm allocation for the whole job (`salloc`); each task
    is a job step in it. None: Slurm's default (the default partition, the partition's time
    limit)."""

    title: ClassVar[str] = "Slurm"

    partition: str | None = Field(default=None, description=(
        "default: the cluster's default partition"))
    time: str | None = Field(default=None, description=(
        "--time, in Slurm's formats: minutes, HH:MM:SS or D-HH:MM:SS (30, 1:00:00, 1-12); "
        "default: the partition's limit"))
    nodes: Int | None = Field(default=None, ge=1, description=(
        "nodes to ask for; default: enough for tasks_per_node"))
    tasks_per_node: Int = Field(default=1, ge=1, description="tasks on one node")
    gpus_per_task: Int = Field(default=0, ge=0, description="Slurm's --gpus-per-task")
    account: str | None = Field(default=None, description=(
        "the account to charge; default: yours"))
    extra_args: list[str] = Field(default_factory=list, description=(
        "more salloc options, as given ([--qos=normal, --cpus-per-task=8])"))

    @field_validator("partition", "account")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_NAME.match(value):
            raise ValueError(f"expected a Slurm name (letters, digits, _ . -), got {value!r}")
        return value

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_TIME.match(value):
            raise ValueError(f"expected a Slurm time limit (minutes, HH:MM:SS or D-HH:MM:SS, "
                             f"e.g. 30 or 1:00:00), got {value!r}")
        return value

    @field_validator("extra_args")
    @classmethod
    def _options(cls, args: list[str]) -> list[str]:
        for arg in args:
            if not arg.startswith("-"):
                raise ValueError(f"each is one salloc option starting with - "
                                 f"(['--qos=debug', '--constraint=v100']), got {arg!r}")
        return args

    def gpus_for(self, role: str) -> int:
        return self.gpus_per_task if role in GPU_ROLES else 0

    def job_problem(self, kind: str, tasks: int) -> tuple[str, str] | None:
        if self.nodes is not None and self.nodes * self.tasks_per_node < tasks:
            return (f"backend.{kind}.nodes", (
                f"{self.nodes} node(s) × tasks_per_node {self.tasks_per_node} hold "
                f"{self.nodes * self.tasks_per_node} task(s), the job has {tasks}; "
                "raise nodes or tasks_per_node, or leave nodes out"))
        return None
