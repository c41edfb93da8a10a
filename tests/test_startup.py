"""`tfo --help` and `tfo plan` answer fast: the CLI imports its heavy modules only in the
commands that use them (orchestrator/cli/commands.py's docstring has the rule)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.startup import NO_PLUGINS
from tests.conftest import REPO

# What `import orchestrator.cli.commands` must not pull in, and what each costs (CPU, this machine):
# fabric+paramiko+invoke 0.16 s, tensorflow seconds, rich 0.05 s (0.2 s with typer's rich
# help), pydantic 0.05 s plus its models, psutil 0.02 s, yaml 0.02 s.
HEAVY = ("fabric", "paramiko", "invoke", "tensorflow", "tf_keras", "keras", "rich", "pydantic",
         "psutil", "yaml")
SSH = ("fabric", "paramiko", "invoke")


def modules_imported_by(*args: str) -> tuple[set[str], subprocess.CompletedProcess]:
    """The modules `python -X importtime -m orchestrator ARGS` imports, by full name."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "orchestrator", *args],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    names = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines()
             if line.startswith("import time:")}
    return names, res


def imported_by(*args: str) -> tuple[set[str], subprocess.CompletedProcess]:
    """The top-level packages `python -X importtime -m orchestrator ARGS` imports."""
    names, res = modules_imported_by(*args)
    return {name.split(".")[0] for name in names}, res


@pytest.mark.timeout(60)
def test_importing_the_cli_imports_nothing_heavy():
    code = ("import json, sys; import orchestrator.cli.commands; "
            "print(json.dumps(sorted(sys.modules)))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    loaded = {m.split(".")[0] for m in json.loads(res.stdout)}
    assert "typer" in loaded  # the check sees third-party packages
    assert sorted(loaded & set(HEAVY)) == []


@pytest.mark.timeout(60)
def test_help_imports_nothing_heavy():
    names, res = imported_by("--help")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "orchestrator" in names
    assert sorted(names & set(HEAVY)) == []
    assert "export" in res.stdout and "plan" in res.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cluster", ["clusters/localhost.yaml", "clusters/lab.yaml"])
def test_plan_imports_no_ssh(cluster):
    """A dry run connects to no host, so even a lab's cluster file needs no SSH library."""
    names, res = imported_by("plan", cluster)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "orchestrator" in names and "pydantic" in names
    assert sorted(names & set(SSH)) == []
    assert not names & {"tensorflow", "tf_keras", "keras"}


# Runs `tfo run` in-process and notes, when its first task starts, which packages are loaded,
# whether garbage is collected, and the task's PYDANTIC_DISABLE_PLUGINS.
_AT_FIRST_START = """
import gc, json, os, subprocess, sys
from orchestrator.cli import commands as cli
seen = {}
real = subprocess.Popen.__init__
def popen(self, args, *a, **kw):
    if not seen and "worker_entry" in args:
        seen.update(loaded=sorted({m.split(".")[0] for m in sys.modules}), gc=gc.isenabled(),
                    modules=sorted(sys.modules),
                    plugins=kw.get("env", os.environ).get("PYDANTIC_DISABLE_PLUGINS"))
    real(self, args, *a, **kw)
subprocess.Popen.__init__ = popen
sys.argv = ["tfo", "run", sys.argv[1], "--run-dir", sys.argv[2]]
try:
    cli.main()
except SystemExit as e:
    print(json.dumps({"code": e.code, **seen}))
"""


def first_start(tmp_path: Path, env: dict[str, str] | None = None) -> tuple[dict, str]:
    """`tfo run` of a 2-worker job that ends at once: what _AT_FIRST_START saw, and stderr."""
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({
        "name": "early", "job": {"script": str(REPO / "bench" / "job.py"),
                                 "args": ["--fake", "--epochs", "1", "--steps_per_epoch", "1"]},
        "tasks": {"worker": ["localhost:auto", "localhost:auto"]}}))
    res = subprocess.run([sys.executable, "-c", _AT_FIRST_START, str(cluster),
                          str(tmp_path / "run")], cwd=REPO, capture_output=True, text=True,
                         timeout=50, env=env)
    got = json.loads(res.stdout.splitlines()[-1])
    assert got["code"] == 0, res.stdout + res.stderr
    return got, res.stderr


@pytest.mark.timeout(60)
def test_run_starts_its_tasks_before_loading_rich_or_ssh(tmp_path):
    """Every import before the first task starts delays the job (a hand launch starts at
    once): rich (the live view, the run's line) and SSH come after, or never."""
    got, stderr = first_start(tmp_path)
    assert "typer" in got["loaded"] and "pydantic" in got["loaded"]  # what the run needs
    assert sorted(set(got["loaded"]) & {"rich", *SSH, "tensorflow"}) == []
    assert "tfo: run early-" in stderr  # the run's line, said once the tasks started
    # Nor package metadata (TensorFlow's version: nothing to compare it with here) or a
    # thread pool for the preflight of one kind of host: 0.01-0.02 s on this machine.
    assert "psutil" in got["loaded"]  # (the preflight ran: local memory for warm spares)
    assert sorted(set(got["modules"]) & {"importlib.metadata", "concurrent.futures"}) == []


def users_env(users: str | None) -> dict[str, str]:
    """This environment with the user's PYDANTIC_DISABLE_PLUGINS: unset (None), or `users`."""
    env = {k: v for k, v in os.environ.items() if k != NO_PLUGINS}
    return env if users is None else {**env, NO_PLUGINS: users}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("users", [None, "logfire"])
def test_tasks_start_with_the_users_environment_and_garbage_collection_on(tmp_path, users):
    """tfo starts with the collector off and pydantic's plugin scan off (orchestrator/
    startup.py); by the first task's start both are as they were: the supervisor's loop
    collects, and the task sees the user's PYDANTIC_DISABLE_PLUGINS, or none."""
    got, _ = first_start(tmp_path, users_env(users))
    assert got["gc"] is True
    assert got["plugins"] == users


_STARTING = """
import gc, json, os
from orchestrator.startup import NO_PLUGINS, settled, starting
seen = []
with starting():
    seen.append((gc.isenabled(), os.environ.get(NO_PLUGINS)))
    settled()
    seen.append((gc.isenabled(), os.environ.get(NO_PLUGINS)))
    settled()  # again: nothing more to restore
    seen.append((gc.isenabled(), os.environ.get(NO_PLUGINS)))
seen.append((gc.isenabled(), os.environ.get(NO_PLUGINS), gc.get_freeze_count() > 1000))
print(json.dumps(seen))
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("users", [None, "", "logfire"])
def test_starting_then_settled_gives_the_user_back_their_setting(users):
    """While a command starts: no collection, no plugin scan. Settled: the user's value
    (unset, empty or theirs) back, collection on, and what was made frozen."""
    res = subprocess.run([sys.executable, "-c", _STARTING], cwd=REPO, capture_output=True,
                         text=True, timeout=30, env=users_env(users))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [[False, "1"], [True, users], [True, users],
                                      [True, users, True]]


# A user's pydantic plugin (an entry point in the `pydantic` group, as a package installs
# one): it counts the models whose validator it was asked for.
_PLUGIN = """
class Plugin:
    built = []

    def new_schema_validator(self, schema, schema_type, schema_type_path, schema_kind,
                             config, plugin_settings):
        Plugin.built.append(schema_type_path.name)
        return None, None, None


plugin = Plugin()
"""
_WITH_PLUGIN = """
import json, sys
from pydantic import BaseModel
from orchestrator.startup import settled, starting
with starting():
    class Ours(BaseModel):  # a model of tfo's, built while starting
        x: int
    before = "importlib.metadata" in sys.modules
    settled()
    class Theirs(BaseModel):  # built once settled, in the user's environment
        y: int
import tfo_test_plugin
print(json.dumps({"built": tfo_test_plugin.Plugin.built, "metadata_while_starting": before}))
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("users", [None, "logfire", "1"])
def test_a_users_pydantic_plugin_sees_models_built_once_settled(tmp_path, users):
    """While starting, pydantic's plugin loader is not even imported (it loads
    importlib.metadata, 0.012 s, to find plugins that are off); once settled, a plugin the
    user has installed is found and used as pydantic would, unless the user turned it off."""
    (tmp_path / "tfo_test_plugin.py").write_text(_PLUGIN)
    info = tmp_path / "tfo_test_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tfo-test-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pydantic]\ncounter = tfo_test_plugin:plugin\n")
    env = {**users_env(users), "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    res = subprocess.run([sys.executable, "-c", _WITH_PLUGIN], cwd=REPO, capture_output=True,
                         text=True, timeout=30, env=env)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["metadata_while_starting"] is False
    assert got["built"] == ([] if users == "1" else ["Theirs"])


@pytest.mark.timeout(60)
def test_plan_loads_no_package_metadata():
    """importlib.metadata (0.012 s) is for tfo run's and tfo check's preflight only."""
    loaded, res = modules_imported_by("plan", "clusters/localhost.yaml")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "pydantic.main" in loaded  # the check sees submodules
    assert "importlib.metadata" not in loaded
