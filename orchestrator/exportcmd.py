"""`tfo export tfjob|jobset`: the job as a file another engine runs (orchestrator/export.py,
orchestrator/jobset.py make the manifests; this module only writes them)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli_common import HELP, fail, made_by
from orchestrator.cli_options import FileArg
from orchestrator.errors import SpecError
from orchestrator.pipeline import load_source
from orchestrator.report import err, labeled

export_app = typer.Typer(**HELP, help="Hand the job to another engine, as a file it runs: a "
                         "Kubeflow TFJob.")


@export_app.command("tfjob")
def export_tfjob(
        file: FileArg,
        image: Annotated[str, typer.Option(
            "--image", help="the container image: TensorFlow, and the project as its working "
            "directory", show_default=False)],
        output: Annotated[Path | None, typer.Option(
            "--output", "-o", help="write the TFJob here [default: stdout]",
            show_default=False)] = None,
        name: Annotated[str | None, typer.Option(
            "--name", help="the TFJob's name [default: the cluster file's name]",
            show_default=False)] = None) -> None:
    """Write a Kubeflow TFJob (kubeflow.org/v1) that runs FILE's tasks as pods: one replica
    spec per role, the restart section as restartPolicy and backoffLimit. What does not carry
    over is a warning on stderr (docs/guide/kubernetes.md)."""
    from orchestrator.export import tfjob

    try:
        spec, _ = load_source(file)
        exported = tfjob(spec, image=image, name=name)
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


