"""An entry that does not exist is a permanent error: `plan`/`check`/`run` refuse it without
importing anything, and a task that meets one anyway exits EXIT_PERMANENT (never restarted)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from orchestrator.planning.entry import EntryError, check_entry
from tests.conftest import REPO, run_task, run_tfo, write_spec
from worker_entry.markers import EXIT_PERMANENT

SPEC = """\
name: t
job: {entry: "ENTRY"}
tasks:
  worker: [localhost:auto, localhost:auto]
"""


@pytest.mark.parametrize(("entry", "message"), [
    ("worker_entry.examples.digitz:train",
     "module 'worker_entry.examples' has no module 'digitz' (modules there: digits)"),
    ("worker_entry.examples.digits:trian",
     "module 'worker_entry.examples.digits' has no function 'trian' (defined there: "
     "build_model, load_data, train)"),
    ("no_such_pkg.mod:train", "no module named 'no_such_pkg'"),
])
def test_a_missing_module_or_function_is_named(entry, message):
    with pytest.raises(EntryError) as err:
        check_entry(entry, REPO)
    assert message in str(err.value)


@pytest.mark.parametrize(("entry", "told"), [
    ("worker_entry.examples.digits:train", True), ("tests.jobs.faulty:train", True),
    ("json:loads", True),  # an installed package
    ("math:anything", False),  # an extension module: no source, the task decides
    ("os.path:join", False),  # a submodule only importing makes
])
def test_entries_that_exist_or_cannot_be_told_pass(entry, told):
    """Checked from the source, nothing imported (digits would import TensorFlow); where the
    source tells, a function it does not define is refused."""
    module = entry.partition(":")[0]
    before = set(sys.modules)
    assert check_entry(entry, REPO) is None
    assert not [m for m in set(sys.modules) - before if m == module or m.startswith(module + ".")]
    misspelled = module + ":no_such_function_tfo"
    if told:
        with pytest.raises(EntryError, match="has no function 'no_such_function_tfo'"):
            check_entry(misspelled, REPO)
    else:
        assert check_entry(misspelled, REPO) is None


def test_conditional_and_imported_bindings_count(tmp_path: Path):
    (tmp_path / "userjob.py").write_text(
        "try:\n    from fastlib import train\nexcept ImportError:\n"
        "    def train(ctx): pass\n"
        "if True:\n    evaluate = train\n"
        "with open(__file__) as f:\n    pass\n"
        "def helper():\n    inner = 1\n")
    for fn in ("train", "evaluate", "f", "helper"):
        check_entry(f"userjob:{fn}", tmp_path)
    with pytest.raises(EntryError, match="has no function 'inner'"):
        check_entry("userjob:inner", tmp_path)  # local to a function: not the module's


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("entry", "needle"), [
    ("worker_entry.examples.digitz:train", "job.entry: module 'worker_entry.examples' has no "
                                           "module 'digitz' (modules there: digits)"),
    ("worker_entry.examples.digits:trian", "job.entry: module 'worker_entry.examples.digits' "
                                           "has no function 'trian'"),
])
def test_plan_check_and_run_refuse_a_missing_entry(entry, needle, tmp_path: Path):
    spec = write_spec(tmp_path / "c.yaml", SPEC.replace("ENTRY", entry))
    for command in ("plan", "check", "run"):
        res = run_tfo(command, str(spec), *(["--run-dir", str(tmp_path / "run")]
                                            if command != "check" else []), timeout=30)
        assert res.returncode == 2, res.output
        assert needle in res.stderr
        assert "Traceback" not in res.output
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(120)
def test_a_task_whose_entry_is_missing_exits_permanent(tmp_path: Path):
    res = run_task({"entry": "worker_entry.examples.digitz:train"}, tmp_path, timeout=60)
    assert res.returncode == EXIT_PERMANENT, res.stderr[-2000:]
    assert ("entry worker_entry.examples.digitz:train: no module named "
            "'worker_entry.examples.digitz' (exit code 78: permanent, not restarted)") in res.stderr
    assert "Traceback" not in res.stderr
    res = run_task({"entry": "worker_entry.examples.digits:trian"}, tmp_path, timeout=60)
    assert res.returncode == EXIT_PERMANENT, res.stderr[-2000:]
    assert "module 'worker_entry.examples.digits' has no function 'trian'" in res.stderr


@pytest.mark.timeout(120)
def test_a_missing_dependency_of_the_entry_is_an_ordinary_failure(tmp_path: Path):
    (tmp_path / "userjob.py").write_text("import no_such_dependency_tfo\n\ndef train(ctx): pass\n")
    res = run_task({"entry": "userjob:train"}, tmp_path, timeout=60)
    assert res.returncode == 1, res.stderr[-2000:]
    assert "No module named 'no_such_dependency_tfo'" in res.stderr

