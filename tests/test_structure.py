"""The code stays in small pieces (issue 25): every class in orchestrator/ at most MAX_LINES
lines and MAX_METHODS methods, every record at most MAX_FIELDS fields, cli.py at most
MAX_CLI_LINES lines; every module in orchestrator/ at most 600 lines, in worker_entry/ at
most 350 (issue 38). Read from the source (ast), so it runs nothing."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

MAX_LINES, MAX_METHODS, MAX_FIELDS, MAX_CLI_LINES = 250, 15, 16, 500
MODULE_LINES = {"orchestrator": 600, "worker_entry": 350}  # the most lines of a module
# Modules known to be over MODULE_LINES, by dotted name. Each entry goes once its module is
# split; an entry whose module is within the limit (or gone) fails the test, to be removed.
KNOWN_OVER = {
    "worker_entry.lifeline",  # issue 38: being split
    "worker_entry.context",  # issue 38: being split
    "worker_entry.autoprogress",  # issue 38: being split
}


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


def module_sizes(root: Path) -> dict[str, tuple[int, int]]:
    """Each module of the product by dotted name: (its lines, the most it may have)."""
    sizes = {}
    for package, most in MODULE_LINES.items():
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            sizes[name.removesuffix(".__init__")] = (len(path.read_text().splitlines()), most)
    return sizes


def test_every_module_is_small() -> None:
    sizes = module_sizes(REPO)
    over = [f"{name}: {n} lines (at most {most})" for name, (n, most) in sizes.items()
            if n > most and name not in KNOWN_OVER]
    assert over == [], "split these modules along their seams"
    done = sorted(name for name in KNOWN_OVER
                  if name not in sizes or sizes[name][0] <= sizes[name][1])
    assert done == [], "within the limit (or gone) now: remove from KNOWN_OVER"


def test_the_module_size_check_sees_a_long_module(tmp_path: Path) -> None:
    for package, most in MODULE_LINES.items():
        (tmp_path / package / "sub").mkdir(parents=True)
        (tmp_path / package / "sub" / "long.py").write_text("x = 1\n" * (most + 1))
        (tmp_path / package / "short.py").write_text("x = 1\n" * most)
    sizes = module_sizes(tmp_path)
    assert {n: s for n, (s, most) in sizes.items() if s > most} == {
        "orchestrator.sub.long": 601, "worker_entry.sub.long": 351}


def test_no_test_module_imports_another() -> None:
    """Shared fakes live in tests/fakes.py, shared helpers in tests/helpers.py, fixtures in
    tests/conftest.py: a test module importing another runs (and couples to) its tests."""
    found = []
    for path in sorted((REPO / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):  # `from tests import test_x` too
                module = "." * node.level + (node.module or "")
                names = [module, *(f"{module}.{a.name}" for a in node.names)]
            else:
                continue
            found += [f"{path.name}: {n}" for n in names
                      if (n.startswith(("tests.", ".")) or n.startswith("test_"))
                      and any(part.startswith("test_") for part in n.split("."))]
    assert found == []
