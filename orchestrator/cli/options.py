"""The command line's arguments and options, shared by its commands (typer's Annotated
types): plain help text, no rich markup (cli.py's HELP)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperCommand

from orchestrator.runs.rundir import LAST

FileArg = Annotated[Path, typer.Argument(help="cluster file (YAML or JSON), or a run's plan.json",
                                          show_default=False)]
SourceArg = Annotated[Path | None, typer.Argument(
    help="cluster file (YAML or JSON), or a run's plan.json; or none, and a command after --",
    show_default=False)]
RunArg = Annotated[str | None, typer.Argument(
    help=f"a run directory, a run id, a prefix of one, or {LAST} [default: {LAST}]",
    show_default=False)]
RunDirOpt = Annotated[Path | None, typer.Option(
    "--run-dir", help="where the run's plan, events and logs go [default: runs/<run-id>]")]


_COMMAND = "tfo.command"  # where _CommandAfterDashes leaves the command in ctx.meta
_QUICK = "cluster without a file (with a command after --)"
WorkersOpt = Annotated[str | None, typer.Option(
    "--workers", help="worker tasks [default: 1]; MIN:MAX (2:4) for an elastic job, as "
    "torchrun's --nnodes: MAX workers, going on with as few as MIN when hosts are lost",
    rich_help_panel=_QUICK, show_default=False)]
ChiefOpt = Annotated[bool, typer.Option(
    "--chief", help="a chief task too (always one under parameter_server)",
    rich_help_panel=_QUICK)]
PsOpt = Annotated[int | None, typer.Option(
    "--ps", help="ps tasks, for --strategy parameter_server [default: 1]",
    rich_help_panel=_QUICK, show_default=False)]
EvaluatorOpt = Annotated[bool, typer.Option(
    "--evaluator", help="an evaluator task, beside the chief", rich_help_panel=_QUICK)]
StrategyOpt = Annotated[str | None, typer.Option(
    "--strategy", help="multi_worker_mirrored (mwms) or parameter_server (ps) "
    "[default: multi_worker_mirrored]", rich_help_panel=_QUICK,
    show_default=False)]
HostsOpt = Annotated[str | None, typer.Option(
    "--hosts", help="hosts to spread the tasks over, round-robin: localhost or names "
    "from --hosts-file [default: every host of --hosts-file, else localhost]",
    rich_help_panel=_QUICK, show_default=False)]
HostsFileOpt = Annotated[Path | None, typer.Option(
    "--hosts-file", help="a YAML file with a hosts: mapping, as in a cluster file",
    rich_help_panel=_QUICK, show_default=False)]
NameOpt = Annotated[str | None, typer.Option(
    "--name", help="the job's name [default: the script's or module's]",
    rich_help_panel=_QUICK, show_default=False)]
RestartOpt = Annotated[str | None, typer.Option(
    "--restart", help="restart policy: never, on-failure, always, exit-code [default: per "
    "role: on-failure for a parameter_server job's ps and workers and for the evaluator, "
    "never for the rest]",
    rich_help_panel=_QUICK, show_default=False)]
MaxRestartsOpt = Annotated[int | None, typer.Option(
    "--max-restarts", help="restarts over the whole job [default: 3]",
    rich_help_panel=_QUICK, show_default=False)]
IndependentOpt = Annotated[bool, typer.Option(
    "--independent", help="the tasks train independently, on purpose: a task that trains "
    "outside the planned cluster does not fail the job (expect_cluster: false)",
    rich_help_panel=_QUICK)]
_SLURM = "on Slurm (`--on slurm`: one allocation, each task a job step)"
OnOpt = Annotated[str | None, typer.Option(
    "--on", help="hand the job to a scheduler: slurm (each role's tasks become a count; Slurm "
    "picks the nodes)", rich_help_panel=_SLURM, show_default=False)]
PartitionOpt = Annotated[str | None, typer.Option(
    "--partition", help="Slurm partition [default: the cluster's default]",
    rich_help_panel=_SLURM, show_default=False)]
TimeOpt = Annotated[str | None, typer.Option(
    "--time", help="Slurm time limit: minutes, HH:MM:SS, D-HH:MM:SS", rich_help_panel=_SLURM,
    show_default=False)]
NodesOpt = Annotated[int | None, typer.Option(
    "--nodes", help="nodes to ask for [default: enough for --tasks-per-node]",
    rich_help_panel=_SLURM, show_default=False)]
TasksPerNodeOpt = Annotated[int | None, typer.Option(
    "--tasks-per-node", help="tasks on one node [default: 1]", rich_help_panel=_SLURM,
    show_default=False)]
GpusPerTaskOpt = Annotated[int | None, typer.Option(
    "--gpus-per-task", help="GPUs Slurm gives each task [default: 0]", rich_help_panel=_SLURM,
    show_default=False)]
AccountOpt = Annotated[str | None, typer.Option(
    "--account", help="Slurm account to charge", rich_help_panel=_SLURM, show_default=False)]
SlurmArgOpt = Annotated[list[str] | None, typer.Option(
    "--slurm-arg", help="one more salloc option, e.g. --slurm-arg=--qos=debug (repeatable)",
    rich_help_panel=_SLURM, show_default=False)]
VerboseOpt = Annotated[bool, typer.Option(
    "--verbose", "-v", help="also show TensorFlow's C++ INFO/WARNING lines")]
LogsOpt = Annotated[bool, typer.Option(
    "--logs/--no-logs", help="stream the tasks' lines, [role:index] first (the logs in the run "
    "directory have them either way)")]


class CommandAfterDashes(TyperCommand):
    """`tfo run [FLAGS] -- python train.py --epochs 3`: everything after the first `--` is
    the job's command, kept whole and away from tfo's own options."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta[_COMMAND] = args[cut + 1:]
            args = args[:cut]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "[-- COMMAND ARGS...]"]
