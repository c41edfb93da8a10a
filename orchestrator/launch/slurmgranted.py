"""tfo inside a Slurm allocation it did not make: a batch job (`sbatch job.sh`, whose script
calls `tfo run … --on slurm`, as torchrun and horovodrun are called) or an interactive
`salloc` shell. `SLURM_JOB_ID` says so.

    granted = inside_allocation(os.environ)        # None outside one
    nodes = granted.nodes_for(slurm, tasks=4)      # SpecError when the job does not fit
    ...                                            # each task a step: srun --jobid=J …
    granted.release()                              # tfo's own steps only; never the job

Asking for an allocation of our own there (salloc) waited behind the very job that asked
(`PENDING (Resources)`, with `--exclusive`) until its time ran out; so inside one, tfo asks
for none: the tasks are steps of the job that holds the nodes. What the cluster file asks of
an allocation (partition, time, account, extra_args) was the batch script's to ask: it is
said and left. The job must hold the nodes the spec needs (`backend.slurm.nodes`, or enough
for tasks_per_node); fewer is the user's error, named. At the end tfo cancels the steps it
started and leaves the allocation to its owner: the script may go on after tfo.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.errors import SpecError

if TYPE_CHECKING:
    from orchestrator.launch import Say
    from orchestrator.launch.slurm import SlurmSpec

JOB_ID_ENV, NODELIST_ENV = "SLURM_JOB_ID", "SLURM_JOB_NODELIST"


@dataclass
class Granted:
    """The allocation tfo runs in: its id and node list, and the steps tfo started there."""

    job_id: str
    nodelist: str
    steps: set[str] = field(default_factory=set)  # step names (tfo.worker:1.0), tfo's own

    def nodes_for(self, needed: int, tasks: int, tasks_per_node: int,
                  expand: Callable[[str], list[str]]) -> list[str]:
        """The first `needed` of the job's nodes; SpecError when it holds fewer."""
        nodes = expand(self.nodelist)
        if needed > len(nodes):
            raise SpecError(
                f"backend.slurm.nodes: the job needs {needed} node(s) ({tasks} task(s), "
                f"tasks_per_node {tasks_per_node}), but tfo runs inside Slurm job {self.job_id}, "
                f"which holds {len(nodes)} ({self.nodelist}); ask sbatch/salloc for "
                f"--nodes={needed}, or raise backend.slurm.tasks_per_node")
        return nodes[:needed]

    def place(self, slurm: SlurmSpec, names: list[str], count: int, say: Say
              ) -> tuple[dict[str, str], str]:
        """Each task's node among the job's, said, and `scontrol show job -d` of the job."""
        from orchestrator.launch.slurm import assign_nodes, hostnames, run_slurm

        nodes = self.nodes_for(count, len(names), slurm.tasks_per_node, hostnames)
        left = ignored_options(slurm.partition, slurm.time, slurm.account, slurm.extra_args)
        say(f"slurm job {self.job_id}: tfo runs inside it: its steps on {len(nodes)} of its "
            f"node(s), {','.join(nodes)}; no allocation asked"
            + (f" (so not asked: {'; '.join(left)})" if left else ""))
        shown = run_slurm("scontrol", "show", "job", "-d", self.job_id)
        return assign_nodes(names, nodes), shown.stdout if shown.returncode == 0 else ""

    def release(self, run: Callable[..., object] | None = None) -> None:
        """Cancel the steps tfo started that still run; never the job (it is not ours)."""
        from orchestrator.launch.slurm import SlurmError, run_slurm

        run = run or run_slurm
        with contextlib.suppress(SlurmError):
            shown = run("squeue", "-h", "-s", "-j", self.job_id, "-o", "%i %j")
            for line in getattr(shown, "stdout", "").splitlines():
                step, _, name = line.partition(" ")
                if name.strip() in self.steps:
                    run("scancel", step)


def inside_allocation(env: Mapping[str, str]) -> Granted | None:
    """The allocation named by Slurm's environment (sbatch, salloc, srun set it), if any."""
    job_id, nodelist = env.get(JOB_ID_ENV, "").strip(), env.get(NODELIST_ENV, "").strip()
    if not job_id or not nodelist:
        return None
    return Granted(job_id, nodelist)


def ignored_options(partition: str | None, time: str | None, account: str | None,
                    extra_args: list[str]) -> list[str]:
    """What the cluster file asks of an allocation that an allocation already made ignores."""
    return [f"{name} {value}" for name, value in (
        ("partition", partition), ("time", time), ("account", account),
        ("extra_args", " ".join(extra_args) or None)) if value]
