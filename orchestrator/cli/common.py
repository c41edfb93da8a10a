"""What every `tfo` command module shares: typer's settings, the user's-error exit, and the
command line as run (cli.py's import rule holds here: nothing heavy at the top)."""

from __future__ import annotations

import shlex
import sys

import typer

from orchestrator.cli.guide import guide_page
from orchestrator.cli.report import err, labeled

EXIT_BAD_SPEC = 2
# Plain help and errors: typer's rich formatting imports rich's markdown and traceback
# modules (0.16 s of CPU here, more than half of what `tfo --help` may take). So help
# strings are plain text: write `[default: x]`, no markup, no escapes.
HELP = {"rich_markup_mode": None, "add_completion": False, "no_args_is_help": True,
        "pretty_exceptions_enable": False,
        "context_settings": {"help_option_names": ["-h", "--help"]}}  # as kubectl, docker


def fail(message: str) -> typer.Exit:
    """The user's error, said (with the guide's page for it), as exit 2 to raise."""
    err.print(labeled("error:", "bold red", message), soft_wrap=True)
    page = guide_page(message)
    if page:
        err.print(f"see: {page}", soft_wrap=True)
    return typer.Exit(EXIT_BAD_SPEC)


def made_by() -> str:
    return shlex.join(["tfo", *sys.argv[1:]])
