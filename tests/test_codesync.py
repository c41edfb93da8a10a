"""What the code sync sends to a lab host: the project, not the user's secrets
(launch/projectfiles.py), each file with its mode, a sparse file sparse; and what it says."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.launch.ssh.projectfiles import project_files
from tests.conftest import SSH_LAB, run_tfo, write_spec
from tests.helpers import host_yaml

KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
       "-----END OPENSSH PRIVATE KEY-----\n")


def secrets_project(root: Path) -> Path:
    """The issue's project: .env and keys (0600), a symlink to a file out of it, a sparse
    100 MiB file; and what belongs to the project: a 0750 script, a 0600 config, ignore
    files and what they leave out."""
    code, outside = root / "code", root / "outside"
    (code / ".ssh").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text("outside the project\n")
    for rel, text, mode in [(".env", "API_TOKEN=tok-123\n", 0o600),
                            ("id_ed25519", KEY, 0o600), (".ssh/id_ed25519", KEY, 0o600),
                            ("notes/deploy_key.txt", "# ours\n" + KEY, 0o644),
                            ("aws/credentials", "[default]\naws_secret_access_key=x\n", 0o600),
                            ("server.pem", KEY, 0o600), ("lab.env.d/.env.lab", "X=1\n", 0o600),
                            ("run.sh", "#!/bin/sh\nexit 0\n", 0o750),
                            ("settings.cfg", "lr = 0.1\n", 0o600),
                            (".gitignore", "*.log\nscratch/\n", 0o644),
                            (".tfoignore", "data/raw/\n", 0o644),
                            ("train.log", "old log\n", 0o644), ("scratch/x.bin", "x", 0o644),
                            ("data/raw/huge.csv", "1,2\n", 0o644),
                            ("data/small.csv", "3,4\n", 0o644)]:
        path = code / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.chmod(path, mode)
    os.symlink("../outside/secret.txt", code / "linkfile.txt")
    os.symlink("settings.cfg", code / "settings-link.cfg")  # inside: followed
    with open(code / "big.img", "wb") as f:
        f.truncate(100 << 20)
        f.seek(50 << 20)
        f.write(b"data in the middle")
    return code


def test_what_the_sync_sends_of_a_project(tmp_path: Path):
    """The listing itself (no host): credentials by name and by a key's header, ignored
    files, a symlink out, and job.code_include sending what is named."""
    code = secrets_project(tmp_path)
    listing = project_files([(code, code)])
    sent = {f.rel: f for f in listing.files}
    assert set(sent) == {".gitignore", ".tfoignore", "big.img", "data/small.csv", "run.sh",
                         "settings.cfg", "settings-link.cfg"}
    assert sorted(listing.credentials) == [".env", ".ssh/id_ed25519", "aws/credentials",
                                           "id_ed25519", "lab.env.d/.env.lab",
                                           "notes/deploy_key.txt", "server.pem"]
    assert listing.links_out == [("linkfile.txt", "../outside/secret.txt")]
    assert sent["run.sh"].mode == 0o750 and sent["settings.cfg"].mode == 0o600
    assert sent["big.img"].sparse and sent["big.img"].written < 1 << 20
    notes = "\n".join(listing.notes())
    assert "7 file(s) that look like credentials" in notes and "job.code_include" in notes
    assert "linkfile.txt -> ../outside/secret.txt" in notes
    named = project_files([(code, code)], [".env.lab", "/train.log"])
    assert {"lab.env.d/.env.lab", "train.log"} <= {f.rel for f in named.files}
    assert "lab.env.d/.env.lab" not in named.credentials


def test_ignore_files_follow_gits_rules(tmp_path: Path):
    """A nested .gitignore, a negation, and the work tree's top .gitignore above the code
    directory."""
    top = tmp_path / "repo"
    (top / ".git").mkdir(parents=True)
    (top / ".gitignore").write_text("*.ckpt\n")
    code = top / "src" / "job"
    (code / "sub").mkdir(parents=True)
    (code / "sub" / ".gitignore").write_text("*.txt\n!keep.txt\n")
    for rel in ("a.ckpt", "train.py", "sub/x.txt", "sub/keep.txt"):
        (code / rel).write_text("x")
    got = {f.rel for f in project_files([(code, code)]).files}
    assert got == {"train.py", "sub/.gitignore", "sub/keep.txt"}


@SSH_LAB
@pytest.mark.ssh
@pytest.mark.timeout(180)
def test_the_secrets_project_synced_to_a_lab_host(loopback_sshd, run_dir: Path,  # noqa: F811
                                                 tmp_path: Path):
    """The issue's project synced to a host over real SSH: no credential, no symlink's
    target from out of the project, nothing ignored arrives; 0600 stays 0600, 0750 stays
    0750; the sparse 100 MiB file takes its data's blocks there, not 100 MiB; the console
    says what was left out, once. Before: all of it arrived, 0644, 100 MiB on disk."""
    code = secrets_project(tmp_path)
    (code / "listen_sleep.py").write_text(
        (Path(__file__).parent / "scripts" / "listen_sleep.py").read_text())
    workdir = tmp_path / "work"
    spec = write_spec(tmp_path / "one.yaml", f"""\
name: secrets
job: {{script: {code}/listen_sleep.py, args: ["0"], code_include: [".env.lab"]}}
hosts:
{host_yaml("box", loopback_sshd, workdir)}
tasks:
  worker: [box:auto]
""")
    res = run_tfo("run", str(spec), "--run-dir", str(run_dir), timeout=150)
    assert res.returncode == 0, res.output[-3000:]
    there = {p.relative_to(workdir).as_posix() for p in workdir.rglob("*")
             if p.is_file() and not {"runs", "worker_entry"} & set(p.relative_to(workdir).parts)}
    assert there == {".gitignore", ".tfoignore", "big.img", "data/small.csv", "run.sh",
                     "settings.cfg", "settings-link.cfg", "listen_sleep.py",
                     "lab.env.d/.env.lab"}, there
    assert not (workdir / "linkfile.txt").exists()
    assert not any("outside the project" in (workdir / rel).read_text(errors="replace")
                   for rel in there if rel != "big.img")
    modes = {rel: (workdir / rel).stat().st_mode & 0o777 for rel in there}
    assert modes["run.sh"] == 0o750 and modes["settings.cfg"] == 0o600, modes
    assert modes["lab.env.d/.env.lab"] == 0o600, modes
    big = (workdir / "big.img").stat()
    assert big.st_size == 100 << 20 and big.st_blocks * 512 < 1 << 20, big
    with open(workdir / "big.img", "rb") as f:
        f.seek(50 << 20)
        assert f.read(18) == b"data in the middle"
    out = res.output
    assert out.count("6 file(s) that look like credentials") == 1, out[-3000:]
    assert out.count("linkfile.txt -> ../outside/secret.txt") == 1, out[-3000:]
    assert "kept sparse there" in out
    run_id = json.loads((run_dir / "plan.json").read_text())["run_id"]
    host_run = workdir / "runs" / run_id
    assert (host_run.stat().st_mode & 0o777) == 0o700
    # Again, with one file's mode changed here: that file alone is copied again.
    os.chmod(code / "data" / "small.csv", 0o600)
    res = run_tfo("run", str(spec), "--run-dir", str(tmp_path / "run2"), timeout=150)
    assert res.returncode == 0, res.output[-3000:]
    assert "box: code synced (1 file(s) copied)" in res.output, res.output[-3000:]
    assert ((workdir / "data" / "small.csv").stat().st_mode & 0o777) == 0o600
