"""typer's settings, shared by every `tfo` command module (cli/commands.py, exportcmd.py):
nothing heavy at the top, as cli/commands.py's import rule says."""

from __future__ import annotations

# Plain help and errors: typer's rich formatting imports rich's markdown and traceback
# modules (0.16 s of CPU here, more than half of what `tfo --help` may take). So help
# strings are plain text: write `[default: x]`, no markup, no escapes.
HELP = {"rich_markup_mode": None, "add_completion": False, "no_args_is_help": True,
        "pretty_exceptions_enable": False,
        "context_settings": {"help_option_names": ["-h", "--help"]}}  # as kubectl, docker
