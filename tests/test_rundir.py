"""The run directory: finding a run (`last`, an id, a prefix), and running a plan.json again."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.runs.rundir import RunDir, RunDirError
from tests.conftest import (
    REPO,
    events,
    kill_tree,
    peak_rss,
    run_processes,
    run_tfo,
    tfo_cmd,
    write_spec,
)


def _run(root: Path, name: str, mtime: float) -> Path:
    rd = root / "runs" / name
    rd.mkdir(parents=True)
    (rd / "events.jsonl").write_text("{}\n")
    os.utime(rd / "events.jsonl", (mtime, mtime))
    return rd


def test_find_last_an_id_a_prefix_or_a_path(tmp_path: Path):
    root = tmp_path / "runs"
    with pytest.raises(RunDirError, match="no run found under"):
        RunDir.find("last", root)
    a = _run(tmp_path, "mwms-20250101-120000-aaaa", 2_000_000)
    b = _run(tmp_path, "mwms-20250102-120000-bbbb", 1_000_000)
    c = _run(tmp_path, "ps-20250103-120000-cccc", 1_500_000)
    assert RunDir.find("last", root).path == str(a)  # the latest written, not the last name
    assert RunDir.find(None, root).path == str(a)
    assert RunDir.find("mwms-20250102-120000-bbbb", root).path == str(b)
    assert RunDir.find("ps", root).path == str(c)
    assert RunDir.find(str(b), root).path == str(b)
    with pytest.raises(RunDirError) as err:
        RunDir.find("mwms-2025", root)
    assert str(err.value) == (f"'mwms-2025' names 2 runs under {root}/: "
                              "mwms-20250101-120000-aaaa, mwms-20250102-120000-bbbb; "
                              "give more of the id")
    with pytest.raises(RunDirError, match="no run 'nope' under"):
        RunDir.find("nope", root)


def test_an_ambiguous_prefix_is_exit_2_naming_the_candidates(tmp_path: Path, monkeypatch):
    from typer.testing import CliRunner

    from orchestrator.cli.commands import app

    _run(tmp_path, "job-1", 1_000_000)
    _run(tmp_path, "job-2", 2_000_000)
    monkeypatch.chdir(tmp_path)
    for command in ("status", "logs", "rerun"):
        res = CliRunner().invoke(app, [command, "job-"])
        assert res.exit_code == 2, res.output
        assert "'job-' names 2 runs under runs/: job-1, job-2" in res.output
        assert "Traceback" not in res.output


SPEC = """\
name: rerun-test
job:
  entry: tests.jobs.noisy:main
  args: {lines: 1}
tasks:
  worker: [localhost:auto, localhost:auto]
timeouts: {grace_seconds: 3}
"""


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_rerun_last_starts_the_same_tasks_in_a_new_run_directory(tmp_path: Path):
    """`tfo rerun last` after a real run: same tasks and TF_CONFIGs (the `auto` ports it had),
    a new run id and directory, and the paths in it re-derived for the new run."""
    spec = write_spec(tmp_path / "rerun.yaml", SPEC)
    made: list[Path] = []
    try:
        first = run_tfo("run", str(spec), timeout=140)
        made += sorted((REPO / "runs").glob("rerun-test-*"))
        assert first.returncode == 0, first.output[-3000:]
        second = run_tfo("rerun", "last", timeout=140)
        made = sorted((REPO / "runs").glob("rerun-test-*"))
        assert second.returncode == 0, second.output[-3000:]
        assert len(made) == 2
        old, new = (json.loads((rd / "plan.json").read_text()) for rd in made)
        assert new["run_id"] != old["run_id"] and new["run_dir"] == str(made[1])
        assert [t["name"] for t in new["tasks"]] == ["worker:0", "worker:1"]
        assert new["cluster"] == old["cluster"]  # the same TF_CONFIGs
        for o, n in zip(old["tasks"], new["tasks"], strict=True):
            assert n["tf_config"] == o["tf_config"] and n["port"] == o["port"]
            assert n["log_path"] == o["log_path"].replace(old["run_dir"], new["run_dir"])
            assert json.loads(n["env"]["TFO_JOB"])["run_dir"] == new["run_dir"]
        for rd, plan in zip(made, (old, new), strict=True):
            evs = events(rd)
            assert evs[-1]["event"] == "job_finished" and evs[-1]["exit_code"] == 0
            assert {e["task"] for e in evs if e["event"] == "task_exited"} == {"worker:0",
                                                                               "worker:1"}
            assert run_processes(plan["run_id"]) == []
        # The same again, from the plan file itself.
        third = run_tfo("run", str(made[1] / "plan.json"), "--run-dir", str(tmp_path / "r3"),
                        timeout=140)
        assert third.returncode == 0, third.output[-3000:]
        again = json.loads((tmp_path / "r3" / "plan.json").read_text())
        assert again["cluster"] == old["cluster"]
        assert [t["tf_config"] for t in again["tasks"]] == [t["tf_config"] for t in old["tasks"]]
    finally:
        for rd in made:
            shutil.rmtree(rd, ignore_errors=True)


def test_an_ambiguous_prefix_lists_a_few_runs_and_counts_the_rest(tmp_path: Path):
    root = tmp_path / "runs"
    for i in range(5000):
        (root / f"job-{i:05d}").mkdir(parents=True)
    with pytest.raises(RunDirError) as err:
        RunDir.find("job-", root)
    message = str(err.value)
    assert message.startswith(f"'job-' names 5000 runs under {root}/: job-00000, job-00001, ")
    assert message.endswith("job-00009 and 4990 more; give more of the id")
    assert len(message) < 400


# ---- tfo logs in constant memory (issue 31) ------------------------------------------------
LOG = (b"one\n\x1f@tfo {\"event\": \"up\", \"pid\": 1}\ntwo\n\nthree\n"
       b"\x1f@tfo {\"event\": \"done\"}\n")


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1 << 20])
@pytest.mark.parametrize(("data", "n", "whole", "lines", "end"), [
    (LOG, 2, True, ["", "three"], len(LOG)),
    (LOG, 3, False, ["two", "", "three"], len(LOG)),
    (LOG, 9, True, ["one", "two", "", "three"], len(LOG)),
    (LOG + b"four, half", 2, False, ["", "three"], len(LOG)),  # left for -f to read whole
    (LOG + b"four, half", 2, True, ["three", "four, half"], len(LOG) + 10),
    (b"", 3, True, [], 0),
    (b"only", 1, False, [], 0),
    (b"only", 1, True, ["only"], 4),
    (b"\n\n", 5, True, ["", ""], 2),
])
def test_last_lines_are_read_from_the_end(tmp_path: Path, monkeypatch, chunk, data, n, whole,
                                          lines, end):
    from orchestrator.loop.markers import is_marker
    from orchestrator.runs import rundir

    monkeypatch.setattr(rundir, "LOG_CHUNK", chunk)
    path = tmp_path / "w.log"
    path.write_bytes(data)
    assert rundir.last_lines(path, n, lambda s: not is_marker(s), whole) == (lines, end)


@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_read_lines_streams_pieces_and_leaves_an_unended_line(tmp_path: Path, monkeypatch,
                                                              chunk):
    from orchestrator.runs import rundir

    monkeypatch.setattr(rundir, "LOG_CHUNK", chunk)
    path = tmp_path / "w.log"
    path.write_bytes(b"ab\ncdefg\nhalf")
    got = list(rundir.read_lines(path, 0, whole=False))
    end = got[-1][2]
    # Whole lines; of the one still being written, only pieces of LOG_CHUNK bytes.
    assert "".join(t + ("\n" if e else "") for t, e, _ in got) == "ab\ncdefg\nhalf"[:end]
    assert end == 9 + 4 // chunk * chunk
    got = list(rundir.read_lines(path, 9, whole=True))
    assert "".join(t for t, _, _ in got) == "half" and got[-1][2] == 13
    assert got[-1][1] is (4 % chunk != 0)  # ended, unless its last piece is a whole chunk


@pytest.mark.timeout(300)
def test_logs_of_a_big_log_take_constant_memory(tmp_path: Path):
    """A 200 MB log: `tfo logs` read it whole (2.7 GB of memory for a 751 MB log, with -n 5
    and piped to head too); now it reads from the end for -n and streams otherwise."""
    rd = tmp_path / "runs" / "big-1"
    (rd / "logs").mkdir(parents=True)
    (rd / "events.jsonl").write_text("{}\n")
    block = b"".join(b"epoch %d step %d loss 0.%06d %s\n" % (i // 100, i, i, b"x" * 60)
                     + b"\x1f@tfo {\"event\": \"done\"}\n" * (i % 2) for i in range(10_000))
    with (rd / "logs" / "worker-0.log").open("wb") as f:
        for _ in range(200 * 2**20 // len(block)):
            f.write(block)
        f.write(b"the last line\n\x1f@tfo {\"event\": \"done\"}\n")
    size = (rd / "logs" / "worker-0.log").stat().st_size
    assert size > 200e6
    logs = tfo_cmd("logs", str(rd), "worker:0")

    res = subprocess.run([*logs, "-n", "2"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.splitlines() == [
        "epoch 99 step 9999 loss 0.009999 " + "x" * 60, "the last line"]
    shell = f"{shlex.join(logs)} | head -n 1"
    res = subprocess.run(["bash", "-o", "pipefail", "-c", shell], capture_output=True,
                         text=True, timeout=120)
    assert (res.returncode, res.stdout, res.stderr) == (0, "epoch 0 step 0 loss 0.000000 "
                                                           + "x" * 60 + "\n", "")
    peaks = {how: peak_rss(cmd, timeout=240)
             for how, cmd in {"-n 5": [*logs, "-n", "5"], "whole": logs,
                              "| head": ["bash", "-c", shell]}.items()}
    for how, (code, rss, _) in peaks.items():
        # 2 GB or more before (-n 5 too); about 45 MB now, as for a log of a few lines.
        assert code == 0 and rss < 120 * 2**20, (how, rss, peaks)


# ---- one run per run directory (issue 31) --------------------------------------------------
def _wait(what, timeout: float = 60):
    until = time.monotonic() + timeout
    while not (got := what()):
        assert time.monotonic() < until, f"timed out waiting for {what}"
        time.sleep(0.1)
    return got


def _locked(path: Path) -> bool:
    with path.open("rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


@pytest.mark.timeout(180)
def test_two_runs_in_one_run_directory_one_is_refused(run_dir: Path, tmp_path: Path):
    """Two `tfo run --run-dir D` at once: both ran and mixed their events, logs and plan.json.
    Now one runs and holds D's lock; the other exits 2 naming D; the lock goes with its tfo,
    even by SIGKILL; and a directory that holds a run is refused afterwards too."""
    script = tmp_path / "sleepy.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    cmd = tfo_cmd("run", "--run-dir", str(run_dir), "--", "python", str(script))
    both = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, start_new_session=True) for _ in range(2)]
    try:
        loser = _wait(lambda: next((p for p in both if p.poll() is not None), None))
        assert loser.returncode == 2
        said = loser.stderr.read()
        assert str(run_dir) in said and ("holds a run already" in said or "in use by" in said)
        winner = next(p for p in both if p is not loser)
        _wait(lambda: any(e["event"] == "task_started" for e in events(run_dir)))
        assert winner.poll() is None
        assert _locked(run_dir / "lock")
        assert (run_dir / "lock").read_text().strip() == str(winner.pid)
        with pytest.raises(RunDirError, match=f"in use by another tfo \\(pid {winner.pid}\\)"):
            RunDir(str(run_dir)).create({})  # what a second tfo gets, past the first check
        assert [e["event"] for e in events(run_dir)].count("run_started") == 1

        os.kill(winner.pid, signal.SIGKILL)  # the kernel lets go of the lock
        winner.wait(10)
        _wait(lambda: not _locked(run_dir / "lock"), 10)
        plan = json.loads((run_dir / "plan.json").read_text())
        _wait(lambda: run_processes(plan["run_id"]) == [], 30)  # its tasks follow it

        again = run_tfo("run", "--run-dir", str(run_dir), "--", "python", str(script),
                        timeout=60)
        assert again.returncode == 2 and "holds a run already (plan.json, events.jsonl)" \
            in again.stderr and "Traceback" not in again.stderr
        plan_again = run_tfo("plan", "--run-dir", str(run_dir), "--", "python", str(script),
                             timeout=60)
        assert plan_again.returncode == 2 and str(run_dir) in plan_again.stderr
        assert [e["event"] for e in events(run_dir)].count("run_started") == 1
    finally:
        for p in both:
            if p.poll() is None:
                kill_tree(p.pid)


@pytest.mark.timeout(120)
def test_the_run_directory_and_its_plan_are_its_users_alone(run_dir: Path, tmp_path: Path):
    """A spec's `env:` holds an API token: plan.json keeps it, so the run directory is 0700
    and plan.json 0600 (cluster.yaml too, for a command line's run), under the usual umask
    and in a --run-dir that was there already, 0755. Before: 0755 and 0644, the token
    readable by every local user."""
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('token length', len(os.environ['API_TOKEN']))\n")
    spec = write_spec(tmp_path / "secret.yaml", f"""\
name: private-test
job: {{script: {script}}}
env: {{API_TOKEN: tok-1234567890}}
tasks:
  worker: [localhost:auto]
""")
    run_dir.mkdir(mode=0o755)
    os.chmod(run_dir, 0o755)
    res = run_tfo("run", str(spec), "--run-dir", str(run_dir), timeout=100)
    assert res.returncode == 0, res.output[-3000:]
    assert "tok-1234567890" in (run_dir / "plan.json").read_text()
    assert (run_dir.stat().st_mode & 0o777) == 0o700
    assert ((run_dir / "plan.json").stat().st_mode & 0o777) == 0o600
    quick = tmp_path / "quick"
    res = run_tfo("run", "--run-dir", str(quick), "--", "python", str(script),
                  env={**os.environ, "API_TOKEN": "x"}, timeout=100)
    assert res.returncode == 0, res.output[-3000:]
    assert (quick.stat().st_mode & 0o777) == 0o700
    for name in ("plan.json", "cluster.yaml"):
        assert ((quick / name).stat().st_mode & 0o777) == 0o600, name
