"""`tfo export tfjob|jobset`: the job as a file another engine runs (planning/export.py,
planning/jobset.py make the manifests; this module only writes them)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.common import HELP
from orchestrator.cli.messages import fail, made_by
from orchestrator.cli.options import FileArg
from orchestrator.cli.report import err, labeled
from orchestrator.errors import SpecError
from orchestrator.pipeline import load_source

if TYPE_CHECKING:
    from orchestrator.planning.export import TFJobExport
    from orchestrator.planning.jobset import JobSetExport

export_app = typer.Typer(**HELP, help="Hand the job to another engine, as a file it runs: a "
                         "Kubernetes JobSet (or a Kubeflow TFJob).")
ImageOpt = Annotated[str, typer.Option(
    "--image", help="the container image: TensorFlow, and the project as its working directory",
    show_default=False)]
OutputOpt = Annotated[Path | None, typer.Option(
    "--output", "-o", help="write the manifest here [default: stdout]", show_default=False)]
NameOpt = Annotated[str | None, typer.Option(
    "--name", help="the manifest's name [default: the cluster file's name]",
    show_default=False)]


@export_app.command("tfjob")
def export_tfjob(file: FileArg, image: ImageOpt, output: OutputOpt = None,
                 name: NameOpt = None) -> None:
    """Write a Kubeflow TFJob (kubeflow.org/v1) that runs FILE's tasks as pods: one replica
    spec per role, the restart section as restartPolicy and backoffLimit. What does not carry
    over is a warning on stderr (docs/guide/kubernetes.md). TFJob restarts a lost pod alone,
    where a MultiWorkerMirrored group must restart together: prefer `tfo export jobset`."""
    from orchestrator.planning.export import tfjob

    _export(tfjob, file, image, name, output)


@export_app.command("jobset")
def export_jobset(file: FileArg, image: ImageOpt, output: OutputOpt = None,
                  name: NameOpt = None) -> None:
    """Write a Kubernetes JobSet (jobset.x-k8s.io/v1alpha2) that runs FILE's tasks as pods:
    one Indexed Job per role, each pod's TF_CONFIG from the set's stable pod DNS names, the
    whole set restarted on a failure (as MultiWorkerMirrored needs) up to max_restarts. What
    does not carry over is a warning on stderr (docs/guide/kubernetes.md)."""
    from orchestrator.planning.jobset import jobset

    _export(jobset, file, image, name, output)


def _export(make: Callable[..., JobSetExport | TFJobExport], file: Path, image: str,
            name: str | None, output: Path | None) -> None:
    """FILE's manifest by `make`, its warnings on stderr, written to `output` or stdout."""
    try:
        spec, _ = load_source(file)
        exported = make(spec, image=image, name=name)
    except SpecError as e:
        raise fail(str(e)) from None
    for warning in exported.warnings:
        err.print(labeled("warning:", "yellow", warning), soft_wrap=True)
    text = exported.text(made_by())
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text)
    except OSError as e:
        raise fail(f"--output {output}: cannot write: {e.strerror or e}") from None
    err.print(f"tfo: wrote {output}; run it with kubectl apply -f {output}")


