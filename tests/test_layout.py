"""The layout's rules, read from the source (issue 38): imports point one way between
orchestrator's parts, no cycle crosses a subpackage's border or is larger than 4 modules
inside one, and worker_entry never imports the coordinator.

Every import counts, wherever it is written: at the top, inside a function, under
`if TYPE_CHECKING:`. A type-only arrow against the direction is still a tangle a reader must
follow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Lower layers first: a module may import its own layer and those before it.
LAYERS: list[tuple[str, ...]] = [
    ("orchestrator.errors", "orchestrator.runs", "orchestrator.startup"),
    ("orchestrator.planning",),
    ("orchestrator.launch",),
    ("orchestrator.elastic",),
    ("orchestrator.loop",),
    ("orchestrator.pipeline", "orchestrator.api"),
    ("orchestrator.cli",),
    ("orchestrator.pytest_plugin", "orchestrator.__main__", "orchestrator"),
]
MAX_CYCLE = 4


def _modules() -> dict[str, Path]:
    out = {}
    for top in ("orchestrator", "worker_entry"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The modules of ours that `name` imports (a `from P import m` of a submodule counts
    as importing P.m, not P)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            for a in node.names:
                sub = f"{module}.{a.name}"
                found.add(sub if sub in MODULES else module)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(name: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer): the longest prefix wins
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            within = name == p or name.startswith(p + ".")
            if within and (best is None or len(p) > best[0]):
                best = (len(p), i)
    return None if best is None else best[1]


def test_every_module_has_a_layer():
    lost = [m for m in MODULES if m.startswith("orchestrator") and _layer(m) is None]
    assert not lost, f"modules outside LAYERS: {lost}"


def test_imports_point_one_way():
    against = []
    for name, targets in GRAPH.items():
        if not name.startswith("orchestrator"):
            continue
        for t in targets:
            if t.startswith("orchestrator") and _layer(t) > _layer(name):
                against.append(f"{name} -> {t}")
    assert not against, "imports against the layers' direction:\n" + "\n".join(sorted(against))


def test_worker_entry_never_imports_the_coordinator():
    bad = [f"{n} -> {t}" for n, ts in GRAPH.items() if n.startswith("worker_entry")
           for t in ts if t.startswith("orchestrator")]
    assert not bad, bad


def _cycles() -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v]):  # in order: the same cycles, the same ids, everywhere
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return sorted(out, key=sorted)


def _package(name: str) -> str:
    return name if (MODULES[name].name == "__init__.py") else name.rpartition(".")[0]


@pytest.mark.parametrize("cycle", _cycles() or [set()], ids=lambda c: ",".join(sorted(c)) or "none")
def test_no_import_cycle_crosses_a_border_or_is_large(cycle):
    if not cycle:
        return
    packages = {_package(m) for m in cycle}
    assert len(packages) == 1, f"a cycle across packages {sorted(packages)}: {sorted(cycle)}"
    assert len(cycle) <= MAX_CYCLE, f"an import cycle of {len(cycle)} modules: {sorted(cycle)}"


def test_top_of_orchestrator_is_small():
    top = [p.name for p in (ROOT / "orchestrator").glob("*.py")]
    assert len(top) <= 10, sorted(top)


@pytest.mark.parametrize("package", sorted({_package(m) for m in MODULES
                                            if m.startswith("orchestrator.")}))
def test_each_subpackage_says_what_it_holds(package):
    init = MODULES[package]
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc and "import" in doc, f"{init}: the docstring says what it holds and may import"


def test_the_schedulers_registry_matches_the_backends():
    """The spec reads the schedulers' options from planning.schedulers, the launcher starts
    them from launch.backends: the same kinds, the same models."""
    from orchestrator.launch.backends import schedulers
    from orchestrator.planning.schedulers import scheduler_options

    assert {k: b.options for k, b in schedulers().items()} == scheduler_options()


def test_every_cli_module_imports_alone():
    """Each cli module imported first, in an interpreter of its own: the package's lazy
    attributes (cli/__init__.py) once turned `from orchestrator.cli import slowtasks` in
    report.py into an import of the commands, which came back to report half-made."""
    import subprocess
    import sys

    names = sorted(p.stem for p in (ROOT / "orchestrator" / "cli").glob("*.py")
                   if p.stem != "__init__")
    code = ("import subprocess, sys\n"
            "bad = [n for n in sys.argv[1:] if subprocess.run([sys.executable, '-c', "
            "f'import orchestrator.cli.{n}'], capture_output=True).returncode]\n"
            "print(' '.join(bad))")
    done = subprocess.run([sys.executable, "-c", code, *names], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout + done.stderr
