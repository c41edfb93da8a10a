"""The launchers' pure parts: what reaches a remote shell, and exit descriptions."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

from orchestrator.launch import describe_exit
from orchestrator.launch.ssh import remote_command
from orchestrator.plan import make_plan
from orchestrator.spec import parse_spec

PWNED = Path("/tmp/tfo-pwned")
NASTY = "it's $(touch /tmp/tfo-pwned) `id` ; rm -rf / \"quoted\" ~"


def test_spec_values_reach_the_remote_shell_quoted(tmp_path):
    PWNED.unlink(missing_ok=True)
    spec = parse_spec({
        "name": "q", "job": {"entry": "worker_entry.examples.digits:train",
                             "args": {"note": NASTY}},
        "hosts": {"lab": {"address": "10.0.0.1", "workdir": str(tmp_path / "w d"),
                          "python": "/usr/bin/env", "env": {"NOTE": NASTY}}},
        "tasks": {"worker": ["lab:1234"]},
    })
    task = make_plan(spec, run_id="r", run_dir="/r", workdir="/w").tasks[0]
    # Run what the remote shell would run, with `env` instead of python: it prints the env.
    task = task.__class__(**{**task.__dict__, "command": ["/usr/bin/env"]})
    out = subprocess.run(["bash", "-c", remote_command(task, {"TFO_ATTEMPT": "0"})],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    env = dict(line.split("=", 1) for line in out.stdout.splitlines()[1:] if "=" in line)
    assert env["NOTE"] == NASTY
    assert json.loads(env["TFO_JOB"])["args"]["note"] == NASTY
    assert out.stdout.startswith("@tfo-pid ")
    assert not PWNED.exists()
    assert (tmp_path / "w d").is_dir()  # the workdir, made and entered


def test_describe_exit():
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-signal.SIGKILL) == "signal SIGKILL"
    assert describe_exit(None) == "still running"


def test_console_hides_tensorflow_chatter_unless_verbose(capsys):
    from orchestrator.cli import _console_echo

    chatter = ["I0000 00:00:1795304277.398374     655 generator_dataset_op.cc:213] Memory patch",
               "WARNING: All log messages before absl::InitializeLog() is called are written to "
               "STDERR"]
    error = "E0000 00:00:1795305343.269266    8166 cuda_platform.cc:52] failed call to cuInit"
    for verbose in (False, True):
        echo = _console_echo(verbose)
        for line in [*chatter, error, "Epoch 1/5"]:
            echo("worker:1", line)
    shown = capsys.readouterr().out.splitlines()
    quiet = [f"[worker:1] {error}", "[worker:1] Epoch 1/5"]
    assert shown == quiet + [f"[worker:1] {x}" for x in chatter] + quiet
