"""TensorFlow's import, with Python's garbage collector paused: a fifth of a task's start.

    tfimport.install()   # in the task, before any of its code runs

The first `import tensorflow` (or `import tf_keras`) in the task, whoever makes it (the job's
script, its entry's module, a warm spare's warm-up, the wrapper for a server), runs with the
collector off. What exists once it returns is frozen, and the collector goes back on.

Why: importing TensorFlow makes some 640,000 objects that live as long as the process. The
collector, run after every 700 new objects, walks the growing heap again and again while they
are made, and finds next to nothing to free: 2.27 s → 1.72 s for the import on this machine
(3 runs each, one core), 3,900 objects (3 MB) of garbage left for later. `gc.freeze()` then
puts them out of every later collection's way (where they would find nothing either), as
Python's documentation does for a server's pre-fork start. This is what `orchestrator/
startup.py` does for tfo's own start.

What stays as it was:
- The job's code runs first, as written: what a script sets before `import tensorflow`
  (TF_CPP_MIN_LOG_LEVEL, thread counts) is set before TensorFlow loads.
- A job that turned the collector off itself keeps it off, and nothing is frozen.
- At exit everything is unfrozen again, so Python's last collection frees and finalizes all
  it would have. Frozen for good, what the script made before its import and dropped later
  in a reference cycle would never be finalized (a file held so would never flush).
"""

from __future__ import annotations

import atexit
import gc
import importlib.util
import sys
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType

NAMES = ("tensorflow", "tf_keras")


class _Watched:
    """A meta-path finder that finds nothing itself: for a watched name it asks the import
    system (the other finders: it answers None for a name while asking for it) and wraps the
    found loader's exec_module (that one loader instance: the module keeps its own loader,
    of its own class): run with the collector paused (`paused`), then the `after` hooks.
    A name stays watched until its module has run, so a mere look-up (TensorFlow's own
    `find_spec("keras")`) disarms nothing; once none is left, the finder goes."""

    def __init__(self) -> None:
        self.paused: set[str] = set()
        self.after: dict[str, list[Callable[[ModuleType], None]]] = {}
        self._asking: set[str] = set()

    def find_spec(self, name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if name in self._asking or (name not in self.paused and name not in self.after):
            return None
        self._asking.add(name)
        try:
            spec = importlib.util.find_spec(name)  # the other finders' answer
        finally:
            self._asking.discard(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            run = spec.loader.exec_module
            if name in self.paused:
                run = _paused(run)
            spec.loader.exec_module = self._done(name, run)  # type: ignore[method-assign]
        return spec

    def _done(self, name: str, exec_module: Callable[[ModuleType], None]
              ) -> Callable[[ModuleType], None]:
        def run(module: ModuleType) -> None:
            self.paused.discard(name)
            hooks = self.after.pop(name, [])
            if not self.paused and not self.after and self in sys.meta_path:
                sys.meta_path.remove(self)
            exec_module(module)
            for hook in hooks:
                hook(module)
        return run


def _paused(exec_module: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def run(module: ModuleType) -> None:
        if not gc.isenabled():  # the job's own choice, or an import already paused
            exec_module(module)
            return
        gc.disable()
        try:
            exec_module(module)
        finally:
            gc.freeze()
            gc.enable()
            atexit.register(gc.unfreeze)  # Python's last collection sees everything
    return run


_watched = _Watched()


def install() -> None:
    """First on sys.meta_path, for what of NAMES is not imported yet."""
    _watched.paused |= {name for name in NAMES if name not in sys.modules}
    _arm()


def after_import(name: str, hook: Callable[[ModuleType], None]) -> None:
    """`hook(module)` once the top-level module `name` has been imported (at once if it is
    already): how the task's automatic progress (worker_entry/progress/auto.py) finds Keras
    and TensorFlow without importing either."""
    if name in sys.modules:
        hook(sys.modules[name])
        return
    _watched.after.setdefault(name, []).append(hook)
    _arm()


def _arm() -> None:
    if (_watched.paused or _watched.after) and _watched not in sys.meta_path:
        sys.meta_path.insert(0, _watched)
