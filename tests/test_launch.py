"""The launchers' pure parts: what reaches a remote shell, and exit descriptions."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from orchestrator.launch.ssh.hostagent import agent_command
from orchestrator.loop.exitwords import describe_exit
from orchestrator.planning.spec import parse_spec

PWNED = Path("/tmp/tfo-pwned")
NASTY = "it's $(touch /tmp/tfo-pwned) `id` ; rm -rf / \"quoted\" ~"


def test_host_values_reach_the_remote_shell_quoted(tmp_path):
    """The one shell line tfo sends a lab host starts its agent: the host's python and
    workdir, quoted; a task's command and environment then travel as JSON, past any shell."""
    PWNED.unlink(missing_ok=True)
    spec = parse_spec({
        "name": "q", "job": {"entry": "worker_entry.examples.digits:train"},
        "hosts": {"lab": {"address": "10.0.0.1", "workdir": str(tmp_path / NASTY),
                          "python": "/bin/echo"}},
        "tasks": {"worker": ["lab:1234"]},
    })
    out = subprocess.run(["bash", "-c", agent_command(spec.hosts["lab"])],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "-m worker_entry.agent 30\n"
    assert not PWNED.exists()
    assert (tmp_path / NASTY).is_dir()  # the workdir, made and entered


def test_the_agent_s_startup_variables_reach_it_quoted(tmp_path):
    """The startup variables its tasks share (so that it can fork them): quoted, a leading ~
    expanded there as for the workdir, a name that is no shell name left out."""
    PWNED.unlink(missing_ok=True)
    show = tmp_path / "show"
    show.write_text('#!/bin/sh\nprintf "%s|%s|%s" "$PYTHONPATH" "$LC_X" "$*"\n')
    show.chmod(0o755)
    spec = parse_spec({
        "name": "q", "job": {"entry": "worker_entry.examples.digits:train"},
        "hosts": {"lab": {"address": "10.0.0.1", "workdir": str(tmp_path), "python": str(show)}},
        "tasks": {"worker": ["lab:1234"]},
    })
    env = {"PYTHONPATH": NASTY, "LC_X": "~/lib", "BAD-NAME": "$(touch /tmp/tfo-pwned)"}
    out = subprocess.run(["bash", "-c", agent_command(spec.hosts["lab"], env)],
                         capture_output=True, text=True, timeout=10, env={"HOME": "/h"})
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{NASTY}|/h/lib|-m worker_entry.agent 30"
    assert not PWNED.exists()


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
    from orchestrator.cli.console import console_echo

    for verbose in (False, True):
        shown: list[str] = []
        echo = console_echo(shown.append, verbose)
        for task, line, _ in CHATTER:
            echo(task, line)
        assert shown == [f"[{task}] {line}" for task, line, hidden in CHATTER
                         if verbose or not hidden]


def test_a_batch_the_caller_stops_taking_discards_what_it_did_not_take():
    """A batch backend starts all of a round at once; the supervisor stops taking answers at
    the first failed start: the tasks it never took are killed, not left running."""
    from orchestrator.launch import answered

    class Handle:
        discarded = False

        def discard(self) -> None:
            self.discarded = True

    started = [Handle(), OSError("host lab2 unreachable"), Handle(), Handle()]
    answers = answered(started)
    assert next(answers) is started[0]
    assert isinstance(next(answers), OSError)
    answers.close()
    assert [getattr(h, "discarded", None) for h in started] == [False, None, True, True]
