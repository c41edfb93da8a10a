"""`tfo submit FILE`: the job as a Slurm batch job, the way HPC users run long jobs: a batch
script that asks for what `backend.slurm` says (`#SBATCH` lines) and calls `tfo run`, which
then runs inside the allocation (launch/slurmgranted.py: the tasks as the job's steps, no
allocation of its own). It survives the user's logging out, as a `tfo run` on the login node
does not.

    script = batch_script(spec, cluster_file, run_dir, python, workdir, made_by)   # pure
    job_id = sbatch(script_path)                                                    # sbatch

The run directory is chosen here (runs/<name>-sbatch-<time>-<hex>), so the submitting side
can follow it on the shared file system: `tfo status RUN_DIR`, `tfo logs RUN_DIR -f`,
`tfo status --wait RUN_DIR`. The batch script, the job's id and Slurm's own output go
beside it (RUN_DIR.sbatch, RUN_DIR.slurm-job, RUN_DIR.out): the run directory itself is made
new by `tfo run`, once the job starts. Until then the run is `pending` (`pending(rd)`, from the
id and squeue): `tfo status` says so, and `tfo status --wait` waits for the start
(`wait_started`), or fails naming RUN_DIR.out where the job ended without starting tfo.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import SpecError

if TYPE_CHECKING:
    from orchestrator.planning.quick import SlurmFlags
    from orchestrator.planning.spec import ClusterSpec

COMMAND_TIMEOUT = 60.0


def batch_script(spec: ClusterSpec, cluster_file: Path, run_dir: Path, python: str,
                 workdir: Path, made_by: str) -> str:
    """The batch script: the request from spec.backend.slurm, then `tfo run` inside it."""
    from orchestrator.launch.slurm import SlurmSpec, node_count

    slurm = spec.backend.options if spec.backend is not None else None
    if not isinstance(slurm, SlurmSpec):
        raise SpecError("backend.slurm: tfo submit needs the Slurm request: a cluster file with "
                        "`backend: {slurm: {...}}`, or --partition/--nodes/--time flags")
    tasks = sum(1 for _ in spec.tasks.all())
    request = [f"--job-name=tfo-{spec.name}", f"--nodes={node_count(slurm, tasks)}",
               f"--ntasks-per-node={slurm.tasks_per_node}", f"--output={run_dir}.out"]
    request += [f"--{k}={v}" for k, v in (("partition", slurm.partition), ("time", slurm.time),
                                          ("account", slurm.account)) if v]
    if slurm.gpus_per_task:
        request.append(f"--gpus-per-task={slurm.gpus_per_task}")
    request += slurm.extra_args
    run = [python, "-m", "orchestrator", "run", str(cluster_file), "--run-dir", str(run_dir)]
    return "\n".join([
        "#!/bin/sh", f"# made by: {made_by}",
        *(f"#SBATCH {shlex.quote(r)}" for r in request),
        "# tfo runs inside this job: each task a step on its nodes (docs/guide/slurm.md).",
        f"cd {shlex.quote(str(workdir))}", f"exec {shlex.join(run)}", ""])


def new_run_dir(spec: ClusterSpec, root: Path) -> Path:
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}"
    return (root / f"{spec.name}-sbatch-{stamp}").resolve()


def sbatch(script: Path) -> str:
    """Submit; the job id. SpecError with sbatch's own words when it refuses."""
    import subprocess

    try:
        cp = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                            text=True, timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SpecError("sbatch: not found; tfo submit runs where Slurm's commands are (a "
                        "login node)") from None
    except subprocess.TimeoutExpired:
        raise SpecError(f"sbatch did not answer in {COMMAND_TIMEOUT:.0f} s (is slurmctld "
                        "up?)") from None
    if cp.returncode != 0:
        raise SpecError(f"sbatch refused {script}: {cp.stderr.strip() or cp.stdout.strip()}")
    return cp.stdout.strip().split(";")[0]


def submit(file: Path, flags: SlurmFlags, made_by: str, python: str,
           root: Path) -> tuple[str, Path, Path]:
    """Write the batch script for FILE (with `--partition` and the rest, FILE's roles become
    counts, as `--on slurm` does) and submit it: (job id, run directory, script)."""
    from orchestrator.pipeline import load_source
    from orchestrator.planning.quick import QuickFlags, source_from

    source = source_from(None, file, QuickFlags(), flags if flags.given() else None, "submit")
    spec, _ = load_source(source)
    run_dir = new_run_dir(spec, root)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cluster = file.resolve()
    if isinstance(source, dict):  # the cluster file the flags made, kept beside the run
        import yaml

        cluster = Path(f"{run_dir}.cluster.yaml")
        cluster.write_text(f"# made by: {made_by}\n" + yaml.safe_dump(source, sort_keys=False))
    script = Path(f"{run_dir}.sbatch")
    script.write_text(batch_script(spec, cluster, run_dir, python, Path.cwd(), made_by))
    job_id = sbatch(script)
    Path(f"{run_dir}{JOB_SUFFIX}").write_text(job_id + "\n")
    return job_id, run_dir, script


JOB_SUFFIX = ".slurm-job"  # beside the run directory: the batch job's id, for `pending`
START_POLL_SECONDS = 2.0  # how often `wait_started` asks squeue


def pending(run_dir: Path) -> tuple[str, str | None] | None:
    """A submitted run that has not started: (its job id, squeue's state and reason, None
    where the job left the queue); None for any other directory (started, or not
    submitted)."""
    from orchestrator.launch.slurm import SlurmError, run_slurm

    job_file = Path(f"{run_dir}{JOB_SUFFIX}")
    if (run_dir / "events.jsonl").exists() or not job_file.is_file():
        return None
    job_id = job_file.read_text().strip()
    try:
        cp = run_slurm("squeue", "-h", "-j", job_id, "-o", "%T %r")
    except SlurmError as e:
        raise SpecError(str(e)) from None
    state, _, reason = cp.stdout.strip().partition(" ")
    if cp.returncode != 0 or not state:
        return job_id, None
    return job_id, f"{state} ({reason})" if reason and reason != "None" else state


def wait_started(run_dir: Path, sleep=time.sleep) -> None:
    """Until a submitted run's tfo has written its first event; SpecError naming Slurm's
    output where the job left the queue without that (cancelled, failed before tfo ran).
    Returns at once for a directory that was not submitted."""
    while (waiting := pending(run_dir)) is not None:
        job_id, state = waiting
        if state is None:
            if (run_dir / "events.jsonl").exists():  # started between the two looks
                return
            raise SpecError(f"{run_dir}: slurm job {job_id} ended without starting the run; "
                            f"Slurm's output: {run_dir}.out (sacct -j {job_id})")
        sleep(START_POLL_SECONDS)


def not_started(run_dir: Path, wait: bool) -> None:
    """`tfo status [--wait]` on a submitted run: with `wait`, until it started; without, a
    SpecError saying it is pending (squeue's word) or gone without starting."""
    if wait:
        wait_started(run_dir)
    elif (waiting := pending(run_dir)) is not None:
        job_id, state = waiting
        if state is None:  # wait_started's error: the job is gone
            wait_started(run_dir)
        raise SpecError(f"{run_dir}: submitted as slurm job {job_id}, not started yet "
                        f"({state}); `tfo status --wait {run_dir}` waits for it")
