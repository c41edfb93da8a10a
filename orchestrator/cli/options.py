"""The command line's arguments and options, shared by its commands (typer's Annotated
types): plain help text, no rich markup (cli.py's HELP)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

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
    "--run-dir", metavar="DIR",
    help="where the run's plan, events and logs go [default: runs/<run-id>]")]


_COMMAND = "tfo.command"  # where _CommandAfterDashes leaves the command in ctx.meta
_QUICK = "cluster without a file (with a command after --)"
WorkersOpt = Annotated[str | None, typer.Option(
    "--workers", metavar="N|MIN:MAX",
    help="worker tasks [default: 1]; MIN:MAX (2:4) for an elastic job, as "
    "torchrun's --nnodes: MAX workers, going on with as few as MIN when hosts are lost",
    rich_help_panel=_QUICK, show_default=False)]
ChiefOpt = Annotated[bool, typer.Option(
    "--chief", help="a chief task too (always one under parameter_server)",
    rich_help_panel=_QUICK)]
PsOpt = Annotated[int | None, typer.Option(
    "--ps", metavar="N", help="ps tasks, for --strategy parameter_server [default: 1]",
    rich_help_panel=_QUICK, show_default=False)]
EvaluatorOpt = Annotated[bool, typer.Option(
    "--evaluator", help="an evaluator task, beside the chief", rich_help_panel=_QUICK)]
DataWorkersOpt = Annotated[int | None, typer.Option(
    "--data-workers", help="a tf.data service: a dispatcher and N data workers that run the "
    "trainers' input pipelines (TFO_DATA_SERVICE)", rich_help_panel=_QUICK,
    show_default=False, metavar="N")]
StrategyOpt = Annotated[str | None, typer.Option(
    "--strategy", metavar="NAME", help="multi_worker_mirrored (mwms) or parameter_server (ps) "
    "[default: multi_worker_mirrored]", rich_help_panel=_QUICK,
    show_default=False)]
HostsOpt = Annotated[str | None, typer.Option(
    "--hosts", metavar="HOST,...",
    help="hosts to spread the tasks over, round-robin: localhost or names "
    "from --hosts-file [default: every host of --hosts-file, else localhost]",
    rich_help_panel=_QUICK, show_default=False)]
HostsFileOpt = Annotated[Path | None, typer.Option(
    "--hosts-file", metavar="FILE", help="a YAML file with a hosts: mapping, as in a cluster file",
    rich_help_panel=_QUICK, show_default=False)]
NameOpt = Annotated[str | None, typer.Option(
    "--name", metavar="NAME", help="the job's name [default: the script's or module's]",
    rich_help_panel=_QUICK, show_default=False)]
RestartOpt = Annotated[str | None, typer.Option(
    "--restart", metavar="POLICY",
    help="restart policy: never, on-failure, always, exit-code [default: per "
    "role: on-failure for a parameter_server job's ps and workers and for the evaluator, "
    "never for the rest]",
    rich_help_panel=_QUICK, show_default=False)]
MaxRestartsOpt = Annotated[int | None, typer.Option(
    "--max-restarts", metavar="N", help="restarts over the whole job [default: 3]",
    rich_help_panel=_QUICK, show_default=False)]
IndependentOpt = Annotated[bool, typer.Option(
    "--independent", help="the tasks train independently, on purpose: a task that trains "
    "outside the planned cluster does not fail the job (expect_cluster: false)",
    rich_help_panel=_QUICK)]
_SLURM = "on Slurm (`--on slurm`: one allocation, each task a job step)"
OnOpt = Annotated[str | None, typer.Option(
    "--on", metavar="SCHEDULER",
    help="hand the job to a scheduler: slurm (each role's tasks become a count; Slurm "
    "picks the nodes)", rich_help_panel=_SLURM, show_default=False)]
PartitionOpt = Annotated[str | None, typer.Option(
    "--partition", metavar="NAME", help="Slurm partition [default: the cluster's default]",
    rich_help_panel=_SLURM, show_default=False)]
TimeOpt = Annotated[str | None, typer.Option(
    "--time", metavar="LIMIT",
    help="Slurm time limit: minutes, HH:MM:SS, D-HH:MM:SS", rich_help_panel=_SLURM,
    show_default=False)]
NodesOpt = Annotated[int | None, typer.Option(
    "--nodes", metavar="N", help="nodes to ask for [default: enough for --tasks-per-node]",
    rich_help_panel=_SLURM, show_default=False)]
TasksPerNodeOpt = Annotated[int | None, typer.Option(
    "--tasks-per-node", metavar="N", help="tasks on one node [default: 1]", rich_help_panel=_SLURM,
    show_default=False)]
GpusPerTaskOpt = Annotated[int | None, typer.Option(
    "--gpus-per-task", metavar="N",
    help="GPUs Slurm gives each task [default: 0]", rich_help_panel=_SLURM,
    show_default=False)]
AccountOpt = Annotated[str | None, typer.Option(
    "--account", metavar="NAME",
    help="Slurm account to charge", rich_help_panel=_SLURM, show_default=False)]
SlurmArgOpt = Annotated[list[str] | None, typer.Option(
    "--slurm-arg", metavar="OPTION",
    help="one more salloc option, e.g. --slurm-arg=--qos=debug (repeatable)",
    rich_help_panel=_SLURM, show_default=False)]
VerboseOpt = Annotated[bool, typer.Option(
    "--verbose", "-v", help="also show TensorFlow's C++ INFO/WARNING lines")]
LogsOpt = Annotated[bool, typer.Option(
    "--logs/--no-logs", help="stream the tasks' lines, [role:index] first (the logs in the run "
    "directory have them either way)")]
MetricsPortOpt = Annotated[int | None, typer.Option(
    "--metrics-port", help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics while the "
    "job runs (0: any free port) [default: the cluster file's metrics.port, else none]",
    min=0, max=65535, show_default=False, metavar="PORT")]
MetricsAddressOpt = Annotated[str | None, typer.Option(
    "--metrics-address", help="the address /metrics listens on, e.g. 0.0.0.0 for every network "
    "[default: 127.0.0.1, this machine only]", show_default=False, metavar="ADDRESS")]
JsonOpt = Annotated[bool, typer.Option(
    "--json", help="print it as JSON (docs/reference/state-json.md: versioned, for scripts)")]
ShowOpt = Annotated[str | None, typer.Option(
    "--show", metavar="TASKS", help="stream only these tasks' lines, e.g. worker:0,chief:0 "
    "(the others' go to their logs; tfo's own lines, and a failed task's last lines, "
    "always show)", show_default=False)]


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

    def format_options(self, ctx: typer.Context, formatter: Any) -> None:
        """The options in sections, as their `rich_help_panel` says (typer's plain help puts
        them in one list, Slurm's mixed with the job's): the run's own first, then the
        cluster without a file, then Slurm."""
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            title = "Arguments" if param.param_type_name == "argument" else \
                getattr(param, "rich_help_panel", None) or "Options"
            sections.setdefault(title, []).append(record)
        for title, records in sections.items():
            with formatter.section(title[0].upper() + title[1:]):
                formatter.write_dl(records)


SecondsOpt = Annotated[float, typer.Option(
    "--seconds", help="how long to trace every task [default: 2]", show_default=False,
    metavar="SECONDS")]
TasksOpt = Annotated[str | None, typer.Option(
    "--tasks", help="only these tasks, comma-separated: worker:0,worker:1 [default: every "
    "training task]", show_default=False, metavar="TASK,...")]
