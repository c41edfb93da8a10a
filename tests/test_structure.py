"""The code stays in small pieces (issue 25): every class in orchestrator/ at most MAX_LINES
lines and MAX_METHODS methods, every record at most MAX_FIELDS fields, cli.py at most
MAX_CLI_LINES lines. Read from the source (ast), so it runs nothing."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

MAX_LINES, MAX_METHODS, MAX_FIELDS, MAX_CLI_LINES = 250, 15, 16, 500


def oversized(root: Path) -> list[str]:
    """Each class over a limit, as `path:Class: N lines` (methods, fields)."""
    over = []
    for path in sorted((root / "orchestrator").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            lines = node.end_lineno - node.lineno + 1
            methods = sum(isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef)
                          for b in node.body)
            fields = sum(isinstance(b, ast.AnnAssign) for b in node.body)
            where = f"{path.relative_to(root)}:{node.name}"
            over += [f"{where}: {n} {what}" for n, most, what in (
                (lines, MAX_LINES, "lines"), (methods, MAX_METHODS, "methods"),
                (fields, MAX_FIELDS, "fields")) if n > most]
    return over


def test_every_class_is_small() -> None:
    assert oversized(REPO) == []


def test_the_command_line_module_is_small() -> None:
    lines = len((REPO / "orchestrator" / "cli" / "commands.py").read_text().splitlines())
    assert lines <= MAX_CLI_LINES, f"orchestrator/cli/commands.py: {lines} lines"
