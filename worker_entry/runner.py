"""Picks the role's work: MWMS training, PS coordinator, TF server, evaluator, or the
user's own script or module (job.script, job.module).

    TF_CONFIG=... TFO_TASK=worker:1 TFO_JOB='{"entry": "pkg.mod:train", ...}' \\
        python -m worker_entry
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import inspect
import io
import json
import os
import socket
import sys
import types
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from typing import Any, NoReturn

from worker_entry import markers, profiler
from worker_entry.markers import Role, Strategy


def resolve_entry(entry: str) -> Callable[[Any], Any]:
    """The entry's function. One that does not exist exits EXIT_PERMANENT; an error raised
    by the user's module while it imports is an ordinary failure (it may be transient)."""
    module_name, _, func_name = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        # Only the entry's own module or a parent: a missing dependency is the module's error.
        if e.name is None or not f"{module_name}.".startswith(f"{e.name}."):
            raise
        _permanent(f"entry {entry}: no module named {e.name!r}")
    func = getattr(module, func_name, None)
    if not callable(func):
        _permanent(f"entry {entry}: module {module_name!r} has no function {func_name!r}")
    return func


def run_script(job: dict[str, Any]) -> None:
    """Run the job's script or module as `python SCRIPT ARGS` or `python -m MODULE ARGS`
    would: as __main__, with its sys.argv, and the script's directory first on sys.path. One
    that cannot be found exits EXIT_PERMANENT."""
    args = [str(a) for a in job.get("args") or []]
    if job.get("script") is not None:
        script = os.path.abspath(os.path.expanduser(job["script"]))
        if not os.path.isfile(script):
            _permanent(f"script {job['script']}: no such file in {os.getcwd()}")
        sys.argv = [script, *args]
        sys.path.insert(0, os.path.dirname(script))
        with io.open_code(script) as f:
            code = compile(f.read(), script, "exec", dont_inherit=True)  # not our __future__s
        exec(code, _main_module(script, None))
        return
    module = job["module"]
    try:
        found = importlib.util.find_spec(module)
        if found is not None and found.submodule_search_locations is not None:
            module = f"{module}.__main__"  # a package runs its __main__, as under `python -m`
            found = importlib.util.find_spec(module)
    except ModuleNotFoundError as e:  # a parent package is missing
        found, module = None, e.name or module
    if found is None or found.loader is None or found.origin is None:
        _permanent(f"module {job['module']}: no module named {module!r}")
    code = found.loader.get_code(found.name)  # type: ignore[attr-defined]
    if code is None:  # built in, say: `python -m` has nothing to run either
        _permanent(f"module {job['module']}: no code to run in {module!r}")
    sys.argv = [found.origin, *args]  # as `python -m`: the module's file in argv[0]
    exec(code, _main_module(found.origin, found))


def _main_module(file: str, spec: ModuleSpec | None) -> dict[str, Any]:
    """The globals of a new `__main__` module for the job's code, left in sys.modules for
    good, as Python leaves a script's: at exit its globals are cleared in order, so what
    they hold is finalized as in a plain run. (runpy's temporary `__main__` leaves them to
    the garbage collector, whose order can close a file under its unflushed buffer, CPython
    bpo-17852: a file the script never closed kept its writes in 0 of 4 runs, against 4 of
    4 under `python`.)"""
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=file, __cached__=spec.cached if spec else None,
                         __loader__=spec.loader if spec else None,
                         __package__=spec.parent if spec else None, __spec__=spec,
                         __builtins__=builtins)
    sys.modules["__main__"] = main
    return main.__dict__


def _permanent(why: str) -> NoReturn:
    print(f"[tfo] {why} (exit code {markers.EXIT_PERMANENT}: permanent, not restarted)",
          file=sys.stderr, flush=True)
    raise SystemExit(markers.EXIT_PERMANENT)


def _serve(tf: Any, role: str, index: int) -> int:
    """A ps or worker of a ParameterServer job: serve until the coordinator stops us."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=role, task_index=index,
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    markers.emit(markers.READY, what="serving", target=server.target)
    server.join()
    return 0


def _communication_options(tf: Any, collective: str) -> Any:
    """The job's `collective` (auto, ring, nccl) as TensorFlow's CommunicationOptions."""
    impl = tf.distribute.experimental.CommunicationImplementation[collective.upper()]
    return tf.distribute.experimental.CommunicationOptions(implementation=impl)


def task_env(role: str, index: int, cluster: dict[str, list[str]]) -> dict[str, str]:
    """TFO_TASK and TFO_IS_CHIEF as TF_CONFIG tells them. tfo's plan sets both; a TFJob's pods
    (`tfo export tfjob`) share one environment per replica type, so there they come from here."""
    return {"TFO_TASK": f"{role}:{index}",
            "TFO_IS_CHIEF": "1" if markers.is_chief(role, index, cluster) else "0"}


_OURS = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _ours(filename: str) -> bool:
    """A frame of tfo's task side or of runpy (`python -m worker_entry`)."""
    return filename.startswith(_OURS) or filename == "<frozen runpy>" \
        or os.path.basename(filename) == "runpy.py"


def _only_importlib(tb: types.TracebackType | None) -> bool:
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith("<frozen importlib"):
            return False
        tb = tb.tb_next
    return True


def user_traceback(exc_type: type[BaseException], exc: BaseException,
                   tb: types.TracebackType | None) -> None:
    """sys.excepthook in the task: the traceback starts at the user's own frame, as `python
    train.py` prints it, not with five frames of runpy and this runner. A syntax error in
    the user's file (raised by our compile) has no frame of theirs: it is shown as Python
    shows it, the file, line and caret alone. Any other traceback with no frame of the
    user's (an error of ours) is printed whole."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        first = link.__traceback__
        while first is not None and _ours(first.tb_frame.f_code.co_filename):
            first = first.tb_next
        if isinstance(link, SyntaxError) and link.filename and not _ours(link.filename) \
                and _only_importlib(first):  # our compile, or a `-m` module's loader
            link.__traceback__ = None
        elif first is not None:
            link.__traceback__ = first
        link = link.__cause__ or link.__context__
    sys.__excepthook__(exc_type, exc, exc.__traceback__)


def main() -> int:
    sys.excepthook = user_traceback
    tf_config = json.loads(os.environ["TF_CONFIG"])
    job = json.loads(os.environ["TFO_JOB"])
    # A lab host's workdir may be ~/something.
    for key in ("model_dir", "run_dir", "tmp_dir", "backup_dir"):
        job[key] = os.path.expanduser(job[key])
    role, index = tf_config["task"]["type"], int(tf_config["task"]["index"])
    cluster = tf_config.get("cluster", {})
    for key, value in {**task_env(role, index, cluster),
                       **markers.dtensor_env(job["strategy"], cluster, role, index)}.items():
        os.environ.setdefault(key, value)
    markers.emit(markers.UP, pid=os.getpid(), host=socket.gethostname())
    profiler.serve()  # TensorFlow's profiler service, once the task imports TensorFlow
    ps_job = job["strategy"] == Strategy.PARAMETER_SERVER

    if ps_job:  # TF's PS guide: RPC errors surface to the caller, so lost workers are retried
        os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    if "entry" not in job and not job["serve"]:
        # The user's own script: it builds its strategy from TF_CONFIG. The wrapper reports
        # it ready once its port listens (lifeline.py); the evaluator has no port.
        if role == Role.EVALUATOR:
            markers.emit(markers.READY, what="evaluating")
        run_script(job)
        markers.emit(markers.DONE)
        return 0
    # Import the user's module before TensorFlow's start-up cost, so a typo fails fast.
    # A server (the plan says which roles are) runs no entry: it serves until stopped.
    entry = None if job["serve"] else resolve_entry(job["entry"])
    import tensorflow as tf

    from worker_entry.context import TaskContext

    if entry is None:
        return _serve(tf, role, index)
    markers.emit(markers.CONNECTING)
    if role == Role.EVALUATOR:
        strategy = None
    elif ps_job:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    else:
        # Built first thing: it blocks until every worker has connected.
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=_communication_options(tf, job.get("collective", "auto")))
    ctx = TaskContext(
        role=role, index=index, strategy=strategy, strategy_name=job["strategy"],
        is_chief=markers.is_chief(role, index, tf_config.get("cluster", {})),
        model_dir=job["model_dir"], run_dir=job["run_dir"],
        tmp_dir=job["tmp_dir"], backup_dir=job["backup_dir"],
        attempt=int(os.environ.get("TFO_ATTEMPT", "0")),
        args=dict(job.get("args") or {}),
    )
    markers.emit(markers.READY, what="evaluating" if role == Role.EVALUATOR else "training")
    value = entry(ctx) if _takes_context(entry) else entry()
    markers.emit(markers.DONE, **returned(value))
    return 0


def _takes_context(func: Callable[..., Any]) -> bool:
    """An entry is called with the TaskContext unless it takes no argument at all."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: give it the context
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
               for p in params)


def returned(value: Any) -> dict[str, Any]:
    """The `done` marker's fields for what the entry returned: `value` where it is JSON of
    at most markers.VALUE_BYTES (a number, a string, lists and mappings of them; a numpy or
    TensorFlow scalar as its Python number), else `value_error` saying why not."""
    if value is None:
        return {}
    if hasattr(value, "numpy"):  # an eager tensor
        value = value.numpy()
    if hasattr(value, "tolist"):  # a numpy array or scalar
        value = value.tolist()
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        return {"value_error": f"not JSON: {str(e)[:200]}"}
    if len(text) > markers.VALUE_BYTES:
        return {"value_error": f"{len(text):,} bytes of JSON; at most {markers.VALUE_BYTES:,}"}
    return {"value": json.loads(text)}
