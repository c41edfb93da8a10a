"""tfo's pytest plugin (the `pytest11` entry point: installing tfo is enough).

    def test_allreduce(tf_cluster):
        result = tf_cluster.run("mypkg.steps:allreduce_ones", workers=2)
        assert result.ok
        assert [t.value for t in result.tasks.values()] == [2.0, 2.0]

`tf_cluster.run(target, ...)` runs a real cluster (orchestrator.api.run) and returns its
Result; a failed `assert result.ok` shows the outcome, each task's exit, the failed task's
last lines and every task's stack where it hung (Result's repr). Ports are `auto` (the
kernel's free ports: no range to share between pytest-xdist workers). A session's warm
pool (orchestrator/launch/pool.py) serves consecutive tests with standbys: processes exec'd
as any task is, that imported TensorFlow ahead of need and wait for their task (tfo's warm
spares, launch/spares.py). Each one taken is replaced at once, so the next test's standbys
import while this test runs (none after a test that no tf_cluster test follows in this
process, pytest's `nextitem`: xdist's too); it and everything it started end with the
session. No task is forked from a process that imported TensorFlow: until issue 37 item 9
the pool forked them from one import, and a user's tests under `pytest -n 2` hung in their
first collective 1 run in 3, for a cause never found (docs/evidence/kit-hang/README.md).
`@pytest.mark.tf_cluster(gpus=2)` skips a test where fewer GPUs exist (nvidia-smi -L).

This module is imported by every pytest run where tfo is installed: nothing heavy at its
top (the rest comes with the first `run`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from orchestrator.api import Result
    from orchestrator.launch.pool import WarmPool

MARKER = "tf_cluster"
DEFAULT_TIMEOUT = 120.0  # seconds: a test's cluster that runs longer fails, with its stacks
# A test's task whose code and atexit handlers are done, its peers' too, is stopped at once in
# Python's teardown (tfo run's 3 s): the last collection of TensorFlow's objects is seconds of
# every test's CPU, and what a test checks (the value, the log, the exit) is in by then.
TEARDOWN_GRACE = 0.0
_ENTRY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_NEXT = pytest.StashKey[Any]()  # the item pytest runs after this one in this process, or None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(gpus=0): a test of a TensorFlow cluster "
                            "(tfo's tf_cluster fixture); skipped where fewer than `gpus` "
                            "GPUs exist")


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return
    wanted = marker.kwargs.get("gpus", 0)
    if wanted:
        found = gpus_here()
        if len(found.ids) < wanted:
            pytest.skip(f"needs {wanted} GPU(s); this machine has {found} (nvidia-smi -L)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    item.stash[_NEXT] = nextitem  # a wrapper: runs whoever else implements the protocol
    yield


def takes_from_pool(item: Any) -> bool:
    """Does this test take the session pool's standbys: it uses tf_cluster, without GPUs."""
    marker = item.get_closest_marker(MARKER) if item is not None else None
    return (item is not None and "tf_cluster" in getattr(item, "fixturenames", ())
            and not (marker is not None and marker.kwargs.get("gpus", 0)))


def gpus_here() -> Any:
    from orchestrator.launch.gpus import local_gpus

    return local_gpus()


class Cluster:
    """The `tf_cluster` fixture: runs clusters for one test, in its own tmp directory."""

    def __init__(self, pool: WarmPool | None, tmp_path: Path, gpus: int) -> None:
        self._pool, self._tmp, self._gpus = pool, tmp_path, gpus
        self._runs = itertools.count(1)
        self.results: list[Result] = []

    def run(self, target: str, *, workers: int = 2, ps: int | None = None, chief: bool = False,
            evaluator: bool = False, strategy: str | None = None,
            args: Sequence[str] | Mapping[str, Any] | None = None,
            timeout: float = DEFAULT_TIMEOUT, env: Mapping[str, str] | None = None,
            restart: str | None = None, max_restarts: int | None = None,
            kill: Mapping[str, Any] | None = None, preempt: Mapping[str, Any] | None = None,
            stall: Mapping[str, Any] | None = None, timeouts: Mapping[str, Any] | None = None,
            echo: bool = False, profile: Mapping[str, Any] | None = None) -> Result:
        """Run `target` (`module:function`, called in each task with its TaskContext if it
        takes an argument; or a script's path) on a local cluster and return its Result. A
        job that is not done in `timeout` s fails, with every task's stack. Faults:
        `kill={"worker:1": {"epoch": 2}}` (or `{"step": n}`), `preempt=` (SIGTERM with the
        grace), `stall=`; each strikes the first attempt only. `profile={"step": 20}`: the
        training tasks captured once each ran 20 steps, as `tfo profile` does
        (`result.profile`: orchestrator.api's module doc)."""
        from orchestrator.api import run, spec_from_flags

        kind = "entry" if _ENTRY.match(target) else "script"
        spec = spec_from_flags(workers=workers, ps=ps, chief=chief, evaluator=evaluator,
                               strategy=strategy, args=args, restart=restart,
                               max_restarts=max_restarts, **{kind: target})
        if self._pool is not None:  # a standby for each task of the next such test too
            self._pool.size = max(self._pool.size, sum(
                len(v) if isinstance(v, list) else 1 for v in spec["tasks"].values()))
        if self._gpus:  # the marker's GPUs, shared out by tfo's allocation
            spec["localhost"] = {"gpus": list(range(self._gpus))}
        result = run(spec, env=env, timeout=timeout, timeouts=timeouts, kill=kill,
                     preempt=preempt, stall=stall, echo=echo, pool=self._pool, profile=profile,
                     teardown_grace=TEARDOWN_GRACE,
                     run_dir=self._tmp / f"tfo-run-{next(self._runs)}")
        self.results.append(result)
        return result


@pytest.fixture(scope="session")
def tf_cluster_pool() -> Iterator[WarmPool]:
    """The session's warm pool; its standbys are killed when the session ends."""
    from orchestrator.launch.pool import WarmPool

    pool = WarmPool(Path.cwd())
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def tf_cluster(request: pytest.FixtureRequest, tmp_path: Path,
               tf_cluster_pool: WarmPool) -> Cluster:
    marker = request.node.get_closest_marker(MARKER)
    gpus = marker.kwargs.get("gpus", 0) if marker is not None else 0
    # Standbys for the next test only where one follows (none would kill them unused); and
    # where one does, they start importing now, not once tfo has planned this test's cluster
    # (its first run imports tfo's modules and plans: 0.7 s before it takes one).
    tf_cluster_pool.refill = takes_from_pool(request.node.stash.get(_NEXT, None))
    if tf_cluster_pool.refill and not gpus:
        tf_cluster_pool.fill()
    return Cluster(None if gpus else tf_cluster_pool, tmp_path, gpus)
