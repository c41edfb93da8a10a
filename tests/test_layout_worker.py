"""worker_entry's layout (issue 38): one home per idea, so no module grows past MAX_LINES
and each says what it holds, and its imports point one way, so no two of its modules import
each other, however indirectly. Every import counts, those inside functions and
`if TYPE_CHECKING:` too: a lazy import is still a dependency, only a later one.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "worker_entry"
MAX_LINES = 350


def _modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports anywhere in its code. `from pkg import x`
    is module pkg.x where there is one, else pkg; importing a submodule runs its parent
    package first, which imports nothing back here, so that is no dependency of ours."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, `level - 1` up
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def _graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = _modules(root)
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_worker_entry_module_is_over_the_size_limit():
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert len(sizes) > 20  # the whole package was read
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert over == {}, f"over {MAX_LINES} lines: {over}: split along a seam"


def test_every_worker_entry_module_says_what_it_holds():
    bare = [name for name, path in _modules().items()
            if not ast.get_docstring(ast.parse(path.read_text()))]
    assert bare == [], f"no module docstring: {bare}"


def test_worker_entry_has_no_import_cycle():
    graph = _graph()
    assert "worker_entry.markers" in graph["worker_entry.context"]  # imports are read
    assert _cycles(graph) == []


def _coordinator_imports(root: Path = ROOT) -> list[tuple[str, str]]:
    """(module, what it imports) for every import of `orchestrator` in the package."""
    found = []
    for name, path in _modules(root).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            found += [(name, n) for n in names if n.split(".")[0] == "orchestrator"]
    return found


def test_worker_entry_never_imports_the_coordinator():
    """The one direction between the two packages: the coordinator imports worker_entry's
    protocol (markers, channel, frames), never the other way: a lab host gets worker_entry
    alone, and a task must not load the coordinator's dependencies."""
    assert _coordinator_imports() == []


def test_the_checks_see_lazy_type_only_and_relative_imports(tmp_path):
    """What the tests above rely on: an import inside a function or a TYPE_CHECKING block,
    relative or absolute, closes a cycle; a lazy import of the coordinator is found."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from worker_entry.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import c\n")
    (pkg / "c.py").write_text("import worker_entry.a\n")
    (pkg / "d.py").write_text("from worker_entry import c\n")  # into the cycle, not of it
    assert _cycles(_graph(tmp_path)) == [
        ["worker_entry.a", "worker_entry.c", "worker_entry.sub.b"]]
    assert _coordinator_imports(tmp_path) == []
    (pkg / "e.py").write_text("def f():\n    import orchestrator.planning.spec\n")
    assert _coordinator_imports(tmp_path) == [("worker_entry.e", "orchestrator.planning.spec")]
