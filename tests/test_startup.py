"""`tfo --help` and `tfo plan` answer fast: the CLI imports its heavy modules only in the
commands that use them (orchestrator/cli.py's docstring has the rule)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

# What `import orchestrator.cli` must not pull in, and what each costs (CPU, this machine):
# fabric+paramiko+invoke 0.16 s, tensorflow seconds, rich 0.05 s (0.2 s with typer's rich
# help), pydantic 0.05 s plus its models, psutil 0.02 s, yaml 0.02 s.
HEAVY = ("fabric", "paramiko", "invoke", "tensorflow", "tf_keras", "keras", "rich", "pydantic",
         "psutil", "yaml")
SSH = ("fabric", "paramiko", "invoke")


def imported_by(*args: str) -> tuple[set[str], subprocess.CompletedProcess]:
    """The top-level packages `python -X importtime -m orchestrator ARGS` imports."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "orchestrator", *args],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    names = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in res.stderr.splitlines()
             if line.startswith("import time:")}
    return names, res


@pytest.mark.timeout(60)
def test_importing_the_cli_imports_nothing_heavy():
    code = "import json, sys; import orchestrator.cli; print(json.dumps(sorted(sys.modules)))"
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
