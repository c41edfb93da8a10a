"""tfo's own lines on stderr, in one style: `tfo: …`, `warning: …`, `error: …` (then the
guide's page for it, or where help is). Every command says what it says through these."""

from __future__ import annotations

import contextlib
import shlex
import sys
from typing import Any

import typer

from orchestrator.cli.guide import guide_page
from orchestrator.cli.report import (
    err,
    labeled,
)

EXIT_BAD_SPEC = 2  # a bad cluster file or usage: nothing started


def fail(message: str) -> typer.Exit:
    fail_line(message)
    page = guide_page(message)
    if page:
        err.print(f"see: {page}", soft_wrap=True)
    return typer.Exit(EXIT_BAD_SPEC)


def _usage_error(self: Any, file: Any = None) -> None:
    """A usage error (an unknown option, a missing value) in tfo's one style, as its own
    errors are: `error: …`, then where help is (typer's was `Usage: … Error: …`)."""
    fail_line(self.format_message())
    if getattr(self, "ctx", None) is not None:
        err.print(f"see: {self.ctx.command_path} --help", soft_wrap=True)


def one_error_style() -> None:
    # typer's own click (typer._click, 0.29+); an older typer keeps its style.
    with contextlib.suppress(ImportError, AttributeError):
        from typer._click import exceptions

        exceptions.UsageError.show = _usage_error  # NoArgsIsHelpError keeps its own (help)


def fail_line(message: str) -> None:
    err.print(labeled("error:", "bold red", message), soft_wrap=True)


def say(line: str) -> None:
    err.print(labeled("tfo:", "bold", line), soft_wrap=True)


def warn(line: str) -> None:
    err.print(labeled("warning:", "yellow", line), soft_wrap=True)



def made_by() -> str:
    return shlex.join(["tfo", *sys.argv[1:]])


