"""Does `job.entry` name a function that exists? Answered without importing anything.

    check_entry("worker_entry.examples.digits:train", workdir)   # raises EntryError if not

The coordinator never imports user code (it could import TensorFlow, or do anything at all):
each module of `a.b.c` is located with the import system's finders, then the last one's source
is parsed with `ast` for a top-level binding of the function's name. Where the source cannot
be had (an extension module, a sourceless .pyc) or the module binds names dynamically
(`from x import *`, a module `__getattr__`), the entry is accepted and the task decides.
"""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import sys
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

_SHOWN = 10  # at most this many alternatives in a message


class EntryError(Exception):
    """The entry's module or function does not exist; the message says what is there."""


def check_entry(entry: str, workdir: Path) -> None:
    """`entry` is 'a.b.c:function' (shape already checked by the spec); `workdir` is where
    local tasks run, first on their sys.path."""
    module_name, _, func_name = entry.partition(":")
    spec = _find_module(module_name, workdir)
    names = _top_level_names(spec) if spec is not None else None
    if names is not None and func_name not in names:
        defs = sorted(n for n, is_def in names.items() if is_def and not n.startswith("_"))
        there = f" (defined there: {_few(defs)})" if defs else " (it defines no functions)"
        raise EntryError(f"module {module_name!r} has no function {func_name!r}{there}")


def check_module(module_name: str, workdir: Path) -> None:
    """`python -m module_name` would find something to run (a module, or a package with a
    __main__), located without importing it."""
    spec = _find_module(module_name, workdir)
    locations = spec.submodule_search_locations if spec is not None else None
    if locations is not None and PathFinder.find_spec(f"{module_name}.__main__",
                                                      list(locations)) is None:
        raise EntryError(f"{module_name!r} is a package with no __main__ module; name the "
                             "module that runs (pkg.train)")


def check_script(script: str, workdir: Path) -> None:
    """The script is a file (a relative path is under `workdir`, where tasks run)."""
    path = workdir / script
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise EntryError(f"{path} {what}")


def _find_module(module_name: str, workdir: Path) -> ModuleSpec | None:
    """The spec of the entry's module; None when only importing could tell (a submodule of
    a plain module, e.g. `os.path`, exists only once the parent runs)."""
    parts = module_name.split(".")
    sys.path.insert(0, str(workdir))
    try:
        # A top-level name: find_spec imports nothing (meta-path finders, e.g. an editable
        # install, take part as they do in the task).
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path.remove(str(workdir))
    if spec is None:
        raise EntryError(f"no module named {parts[0]!r} in {workdir} or the installed packages; "
                         "run tfo from the directory that holds it")
    for depth in range(1, len(parts)):
        parent, name = ".".join(parts[:depth]), ".".join(parts[:depth + 1])
        locations = spec.submodule_search_locations
        if locations is None:
            return None
        try:
            found = PathFinder.find_spec(name, list(locations))  # the parent's dirs only
        except KeyError:  # a namespace package wants its parent imported: only the task knows
            return None
        if found is None:
            subs = sorted(m.name for m in pkgutil.iter_modules(list(locations)))
            there = f" (modules there: {_few(subs)})" if subs else ""
            raise EntryError(f"module {parent!r} has no module {parts[depth]!r}{there}")
        spec = found
    return spec


def _top_level_names(spec: ModuleSpec) -> dict[str, bool] | None:
    """Names the module binds at top level (True for def/class), or None when unknowable."""
    try:
        source = spec.loader.get_source(spec.name) if spec.loader else None  # type: ignore[attr-defined]
    except (ImportError, OSError, UnicodeDecodeError, AttributeError):
        return None
    if source is None:
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # the task will report it, with its own Python
        return None
    names: dict[str, bool] = {}
    stack: list[ast.AST] = list(tree.body)
    while stack:  # top-level statements, and those nested in if/try/with/for (not in defs)
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = True
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.setdefault(alias.asname or alias.name.split(".")[0], False)
            continue
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt | ast.ExceptHandler | ast.match_case):
                stack.append(child)
            else:  # an expression: assignment targets, `for` targets, `with ... as`, walrus
                names.update((n.id, False) for n in ast.walk(child)
                             if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                             and n.id not in names)
    if "__getattr__" in names:  # PEP 562: any attribute may exist
        return None
    return names


def _few(names: list[str]) -> str:
    more = len(names) - _SHOWN
    return ", ".join(names[:_SHOWN]) + (f", ... ({more} more)" if more > 0 else "")
