"""A task's wrapper forked from the host agent (worker_entry.forkstart): when a fork is what
an exec would make, and, run for real by the agent, that the task sees what an exec'd one
sees: its argv, sys.path, directory, environment, temp dir and streams; its exit code, its
atexit handlers, an uncaught exception's traceback. A task whose environment sets a
variable read at an interpreter's start is exec'd instead."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, unframe
from tests.helpers import Agent
from worker_entry import forkstart, frames

PY = sys.executable
HERE = {"PYTHONPATH": "/w", "PYTHONUNBUFFERED": "1", "HOME": "/home/u", "PATH": "/usr/bin"}


@pytest.mark.parametrize(("command", "env", "forks"), [
    ([PY, "-m", "worker_entry"], {**HERE, "TF_CONFIG": "{}", "TFO_JOB": "{}"}, True),
    ([PY, "-m", "worker_entry"], {**HERE, "CUDA_VISIBLE_DEVICES": "1", "PATH": "/x"}, True),
    ([PY, "-m", "worker_entry"], {**HERE, "LD_LIBRARY_PATH": "/cuda/lib64"}, False),
    ([PY, "-m", "worker_entry"], {**HERE, "PYTHONPATH": "/other"}, False),
    ([PY, "-m", "worker_entry"], {**HERE, "PYTHONHASHSEED": "0"}, False),
    ([PY, "-m", "worker_entry"], {**HERE, "LANG": "C.UTF-8"}, False),
    ([PY, "-m", "worker_entry"], {**HERE, "HOME": "/elsewhere"}, False),
    ([PY, "-m", "worker_entry"], {k: v for k, v in HERE.items() if k != "PYTHONPATH"}, False),
    (["/usr/bin/python3.9", "-m", "worker_entry"], HERE, False),
    ([PY, "-u", "-m", "worker_entry"], HERE, False),
    ([PY, "-m", "worker_entry.agent"], HERE, False),
    ([PY, "-c", "pass"], HERE, False),
])
def test_a_fork_only_where_an_exec_would_make_the_same(command, env, forks) -> None:
    assert forkstart.can_fork(command, env, here=HERE, executable=PY) is forks


def test_the_python_is_found_on_the_task_s_path(tmp_path: Path) -> None:
    (tmp_path / "python3").symlink_to(PY)
    env = {**HERE, "PATH": str(tmp_path)}
    assert not forkstart.can_fork(["python3", "-m", "worker_entry"], env, here=HERE,
                                  executable=PY)  # another path: its own prefix, maybe
    assert forkstart.can_fork(["python3", "-m", "worker_entry"], env, here=HERE,
                              executable=str(tmp_path / "python3"))
    assert not forkstart.can_fork(["nopython", "-m", "worker_entry"], env, here=HERE,
                                  executable=PY)


@pytest.mark.parametrize(("envs", "shared"), [
    ([], {}),
    ([{"PYTHONPATH": "/w", "TF_CONFIG": "a"}], {"PYTHONPATH": "/w"}),
    ([{"PYTHONPATH": "/w", "LD_X": "1"}, {"PYTHONPATH": "/w", "LD_X": "2"}], {"PYTHONPATH": "/w"}),
    ([{"PYTHONPATH": "/w"}, {"PYTHONPATH": "/w", "LC_ALL": "C"}], {"PYTHONPATH": "/w"}),
])
def test_an_agent_starts_with_the_startup_variables_its_tasks_share(envs, shared) -> None:
    assert forkstart.shared_startup_env(envs) == shared


@pytest.mark.parametrize(("value", "code"), [(None, 0), (0, 0), (3, 3), (256, 0), (-1, 255),
                                             ("bye", 1)])
def test_exit_codes_as_python_makes_them(value, code) -> None:
    assert forkstart._exit_code(value) == code


PROBE = '''\
import atexit, json, os, sys, tempfile
atexit.register(lambda: print("atexit ran", flush=True))
print(json.dumps({"argv": sys.argv, "orig_argv": sys.orig_argv, "path0": sys.path[1],
                  "cwd": os.getcwd(), "tmp": tempfile.gettempdir(),
                  "probe": os.environ.get("PROBE"), "write_through": sys.stdout.write_through,
                  "pgid_is_pid": os.getpgid(os.getppid()) == os.getppid(),
                  "fds": sorted(int(f) for f in os.listdir("/proc/self/fd"))}))
sys.stdout.flush()
action = sys.argv[1]
if action == "raise":
    raise RuntimeError("boom")
sys.exit(int(action))
'''


def _task_env(tmp: Path, script: Path, action: str, **extra: str) -> dict[str, str]:
    job = {"args": [action], "script": str(script), "model_dir": str(tmp / "model"),
           "run_dir": str(tmp), "tmp_dir": str(tmp / "tmp" / "worker-0"),
           "backup_dir": str(tmp / "backup"), "strategy": "multi_worker_mirrored",
           "serve": False, "collective": "auto", "grace_seconds": 1}
    return {"TFO_JOB": json.dumps(job), "TFO_LIFELINE": "stdin",
            "TF_CONFIG": json.dumps({"cluster": {"worker": ["localhost:1"]},
                                     "task": {"type": "worker", "index": 0}}),
            "TMPDIR": str(tmp / "tmp" / "worker-0"), "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(REPO), "PROBE": "yes", **extra}


def _run(agent: Agent, slot: int, tmp: Path, action: str, **extra: str
         ) -> tuple[bytes, dict, str]:
    script = tmp / "probe.py"
    script.write_text(PROBE)
    work = tmp / "work"
    agent.send(frames.START, slot, json.dumps({
        "command": [PY, "-m", "worker_entry"], "env": _task_env(tmp, script, action, **extra),
        "cwd": str(work)}).encode())
    agent.wait(frames.STARTED, slot)
    code = agent.wait(frames.EXITED, slot)
    text = unframe(agent.output(slot), tmp / f"task-{slot}.log")  # the wrapper's frames
    seen = json.loads(next(line for line in text.splitlines() if line.startswith("{")))
    return code, seen, text


@pytest.mark.timeout(60)
def test_a_forked_task_sees_what_an_exec_d_one_sees_and_exits_as_python(tmp_path) -> None:
    agent = Agent(env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)})
    try:
        code, seen, text = _run(agent, 1, tmp_path, "3")
        # Exec'd (another LD_LIBRARY_PATH): the reference a fork must match.
        ref_code, ref, _ = _run(agent, 2, tmp_path, "3", LD_LIBRARY_PATH="/nonexistent")
        raised, _, raised_text = _run(agent, 3, tmp_path, "raise")
    finally:
        agent.close()
    assert seen["orig_argv"][-2] == "worker_entry.agent"  # forked from the agent
    assert ref["orig_argv"] == [PY, "-m", "worker_entry"]  # exec'd
    assert code == ref_code == b"3"
    # fds: the same descriptors (none of the agent's channel, wake-up pipe or other tasks').
    for key in ("argv", "path0", "cwd", "tmp", "probe", "write_through", "pgid_is_pid", "fds"):
        assert seen[key] == ref[key], key
    assert seen["cwd"] == seen["path0"] == str(tmp_path / "work")
    assert seen["tmp"] == str(tmp_path / "tmp" / "worker-0")
    assert "atexit ran" in text
    assert raised == b"1"
    assert "RuntimeError: boom" in raised_text and 'probe.py", line' in raised_text


@pytest.mark.parametrize(("envs", "env"), [
    ([{"PYTHONPATH": "/w", "TFO_RUN_DIR": "/w/runs/r1", "TF_CONFIG": "a"},
      {"PYTHONPATH": "/w", "TFO_RUN_DIR": "/w/runs/r1", "TF_CONFIG": "b"}],
     {"PYTHONPATH": "/w", "TFO_RUN_DIR": "/w/runs/r1"}),
    ([{"TFO_RUN_DIR": "/a"}, {"TFO_RUN_DIR": "/b"}], {}),
    ([{"PYTHONPATH": "/w"}], {"PYTHONPATH": "/w"}),
])
def test_a_host_s_agent_env_is_what_its_tasks_share_and_their_run_dir(envs, env) -> None:
    from orchestrator.launch.ssh.backend import agent_env

    assert agent_env(envs) == env

