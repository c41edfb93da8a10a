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


# Real lines from the task logs of a PS and an MWMS job on a machine without a GPU; hidden:
# whether the console hides it (unless --verbose). The logs keep every one.
CHATTER = [
    ("ps:0", "WARNING: All log messages before absl::InitializeLog() is called are written to "
             "STDERR", True),
    ("ps:0", "I0000 00:00:1795370022.290786    3549 cudart_stub.cc:31] Could not find cuda "
             "drivers on your machine, GPU will not be used.", True),
    ("ps:0", "I0000 00:00:1795370022.771718    3549 cpu_feature_guard.cc:227] This TensorFlow "
             "binary is optimized to use available CPU instructions in performance-critical "
             "operations.", True),
    ("ps:0", "To enable the following instructions: AVX2 FMA, in other operations, rebuild "
             "TensorFlow with the appropriate compiler flags.", True),
    # Harmless where TF said there is no GPU (above): hidden; an error otherwise (below).
    ("ps:0", "E0000 00:00:1795370033.766679    3549 cuda_platform.cc:52] failed call to cuInit: "
             "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)", True),
    ("ps:0", "I0000 00:00:1795370046.198802    3747 eager_service_impl.cc:355] SessionOptions: "
             "goo.gle/debugonly  ", True),
    *[("ps:0", line, True) for line in [  # the ConfigProto dump: the same INFO message
        "device_count {", '  key: "CPU"', "  value: 1", "}", "gpu_options {", "  experimental {",
        "  }", "}", "allow_soft_placement: true", "experimental {",
        '  collective_group_leader: "/job:worker/replica:0/task:0"', "}", ""]],
    ("ps:0", "Epoch 1/2", False),
    ("ps:0", "device_count {", False),  # not after an INFO line: the task's own
    ("worker:0", "E0000 00:00:1795370110.707597    5266 cuda_platform.cc:52] failed call to "
                 "cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)", False),
    ("worker:0", "I0000 00:00:1795370110.752647    5395 coordination_service.cc:505] Example "
                 "stragglers:", True),
    ("worker:0", "/job:worker/replica:0/task:1", True),
    ("worker:0", "W0000 00:00:1795370113.661093    5268 dataset.cc:997] Input of "
                 "GeneratorDatasetOp::Dataset will not be optimized", True),
    ("worker:0", "22/22 - 2s - loss: 1.5372 - accuracy: 0.6030 - 2s/epoch - 71ms/step", False),
    ("worker:0", "E0000 00:00:1795305343.269266    8166 collective_ops.cc:123] Collective op "
                 "failed", False),
    ("worker:0", "WARNING:tensorflow:5 out of the last 5 calls to <function> triggered "
                 "tf.function retracing.", False),
]


def test_console_hides_tensorflow_chatter_unless_verbose():
    from orchestrator.console import console_echo

    for verbose in (False, True):
        shown: list[str] = []
        echo = console_echo(shown.append, verbose)
        for task, line, _ in CHATTER:
            echo(task, line)
        assert shown == [f"[{task}] {line}" for task, line, hidden in CHATTER
                         if verbose or not hidden]


def test_an_ssh_task_ends_as_sshd_says():
    """sshd's exit status, or the signal that ended the wrapper (as locally), or nothing: a
    lost connection; the wrapper's EXIT_LIFELINE is lost contact (it heard no heartbeat)."""
    from orchestrator.launch.ssh import exit_of
    from worker_entry.markers import EXIT_LIFELINE

    assert exit_of(0, None, "lab2", 30) == (0, None)
    assert exit_of(3, None, "lab2", 30) == (3, None)
    assert exit_of(-1, "KILL", "lab2", 30) == (-signal.SIGKILL, None)
    assert describe_exit(exit_of(-1, "TERM", "lab2", 30)[0]) == "signal SIGTERM"
    assert exit_of(-1, None, "lab2", 30) == (255, "lost contact with lab2: the connection "
                                                  "dropped")
    assert exit_of(EXIT_LIFELINE, None, "lab2", 5) == (
        EXIT_LIFELINE, "lost contact with lab2: no heartbeat reached the task for 5 s")
    assert exit_of(-1, "WEIRD", "lab2", 30) == (255, "signal SIGWEIRD")
