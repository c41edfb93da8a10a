"""The docs cannot go stale: the generated references are what `make docs` makes now, and
every example marked runnable in README.md and docs/ prints the lines it shows.

How an example is marked (README.md's own examples are the model):

    <!-- example: file train.py -->     the next fenced block is written as train.py
    <!-- example: run -->              the next fenced block is a console session: each
    <!-- example: run tf -->           `$ command` runs, and the lines under it must appear in
                                       its output (stdout and stderr), in order; a ```python
                                       block runs as a script, must exit 0, and prints the
                                       text after each `# → ` in it

Every run block of a page runs in a new directory holding that page's files (and the
README's train.py) and a copy of the project's clusters/, with `tfo` on PATH, as a user's
shell would run it. In an expected line `…` stands for anything (a run id, a time), and a
line that is `…` alone only says lines were cut. `run tf` blocks start TensorFlow and are
marked `tf`, as the other TensorFlow tests.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator.cli.docgen import generated
from orchestrator.cli.guide import guide_page

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
MARK = re.compile(r"^<!-- example: (run|run tf|file [\w.\-/]+) -->$")
EXAMPLE_SECONDS = 180  # one command of an example, at most (a TF run takes 15-20 s here)


@dataclass
class Example:
    page: Path
    line: int  # where its marker is, 1-based
    tf: bool
    body: list[str]
    lang: str  # the fence's info string: console, python, yaml
    files: dict[str, str] = field(default_factory=dict)  # the page's `file` blocks

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def _fenced(lines: list[str], start: int, where: str) -> tuple[list[str], int]:
    """The fenced block that starts at lines[start] (indented too, in a list item); its
    lines, without the fence's indent, and the index past it."""
    fence = lines[start] if start < len(lines) else ""
    if not fence.lstrip().startswith("```"):
        raise ValueError(f"{where}: an example marker must be followed by a fenced block")
    indent = fence[:len(fence) - len(fence.lstrip())]
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].lstrip().startswith("```")), None)
    if end is None:
        raise ValueError(f"{where}: the fenced block is not closed")
    return [line.removeprefix(indent) for line in lines[start + 1:end]], end + 1


def _lang(fence: str) -> str:
    return fence.strip().removeprefix("```").strip()


def examples(page: Path) -> list[Example]:
    """The page's runnable examples, each with every file the page defines."""
    lines = page.read_text().splitlines()
    found: list[Example] = []
    files: dict[str, str] = {}
    i = 0
    while i < len(lines):
        m = MARK.match(lines[i].strip())
        if not m:
            i += 1
            continue
        body, after = _fenced(lines, i + 1, f"{page.relative_to(REPO)}:{i + 1}")
        if m.group(1).startswith("file "):
            files[m.group(1)[5:]] = "\n".join(body) + "\n"
        else:
            found.append(Example(page, i + 1, m.group(1) == "run tf", body,
                                 _lang(lines[i + 1]), files))
        i = after
    return found


def _all_examples() -> list[Example]:
    """Every page's examples; a page's run in a directory that holds the README's files
    (its train.py) too, unless the page writes its own."""
    readme = examples(PAGES[0])
    base = readme[0].files if readme else {}
    return readme + [Example(e.page, e.line, e.tf, e.body, e.lang, {**base, **e.files})
                     for page in PAGES[1:] for e in examples(page)]


def _params() -> list:
    return [pytest.param(e, id=e.name, marks=[pytest.mark.tf] if e.tf else [])
            for e in _all_examples()]


def sessions(body: list[str]) -> list[tuple[str, list[str]]]:
    """A console block as (command, the lines it shows) pairs."""
    out: list[tuple[str, list[str]]] = []
    for line in body:
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
        else:
            raise ValueError(f"a console example starts with `$ command`, not {line!r}")
    return out


def missing_line(expected: list[str], output: str) -> str | None:
    """The first expected line not found in the output (in order), or None: `…` is a
    wildcard, trailing spaces do not count."""
    got = [line.rstrip() for line in output.splitlines()]
    at = 0
    for want in expected:
        want = want.rstrip()
        if want.strip() in ("", "…"):
            continue
        parts = want.split("…")  # the space before a `…` may be the end of a wrapped line
        pattern = re.compile(".*".join([re.escape(p.rstrip()) for p in parts[:-1]]
                                       + [re.escape(parts[-1])]))
        hit = next((i for i in range(at, len(got)) if pattern.fullmatch(got[i])), None)
        if hit is None:
            return want
        at = hit + 1
    return None


def _shell(command: str, cwd: Path) -> str:
    """The command's output (stdout and stderr, as a terminal would interleave them)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=EXAMPLE_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"`{command}` did not finish in {EXAMPLE_SECONDS} s:\n{out[-3000:]}")
    return out


@pytest.mark.parametrize("example", _params())
def test_example(example: Example, tmp_path: Path) -> None:
    """What a reader would see running the example: the lines it shows, in order."""
    shutil.copytree(REPO / "clusters", tmp_path / "clusters")
    for name, text in example.files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for command, expected in steps(example, tmp_path):
        output = _shell(command, tmp_path)
        missing = missing_line(expected, output)
        assert missing is None, (
            f"{example.name}: `{command}` no longer prints the line\n  {missing}\n"
            f"that the example shows; it printed:\n{output[-4000:]}\n"
            "Update the example (or fix what changed).")


def steps(example: Example, where: Path) -> list[tuple[str, list[str]]]:
    """What to run and what it must print: a console block's sessions, or a Python block
    as a script (written into `where`) that exits 0 and prints what its `# → ` comments
    say."""
    if example.lang != "python":
        return sessions(example.body)
    (where / "_example.py").write_text("\n".join(example.body) + "\n")
    shown = [line.split("# → ", 1)[1] for line in example.body if "# → " in line]
    return [("python _example.py && echo '(exit 0)'", [*shown, "(exit 0)"])]


def test_python_example_runs(tmp_path: Path) -> None:
    """A Python block runs as a script, and what its `# → ` comments say must be printed."""
    block = ["import sys", "print(sys.argv[0])  # → _example.py"]
    ok = Example(REPO / "README.md", 0, False, block, "python")
    [(command, expected)] = steps(ok, tmp_path)
    assert missing_line(expected, _shell(command, tmp_path)) is None
    failing = Example(REPO / "README.md", 0, False, ["raise SystemExit(3)"], "python")
    [(command, expected)] = steps(failing, tmp_path)
    assert missing_line(expected, _shell(command, tmp_path)) == "(exit 0)"


def test_every_page_has_its_examples_parsed() -> None:
    """The README is short, has its five checked examples, and every marker is well formed."""
    assert len((REPO / "README.md").read_text().splitlines()) <= 200
    readme = examples(REPO / "README.md")
    assert len(readme) >= 5, [e.name for e in readme]
    # The TensorFlow ones cost 15-20 s each (and the Python one, once orchestrator.run is in).
    assert sum(e.tf for e in readme) <= 3


# Pages another change adds (the test kit's guide); linked from the README already.
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_links_point_at_files() -> None:
    """Every relative link in README.md and docs/ names a file or directory that exists."""
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if "://" in target:
                continue
            path = (page.parent / target).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken


@pytest.mark.parametrize(("expected", "output", "missing"), [
    (["a", "b"], "a\nx\nb\n", None),
    (["b", "a"], "a\nb\n", "a"),  # in order
    (["run …: 2 tasks"], "run train-1: 2 tasks  \n", None),
    (["…", "run …: 2 tasks"], "run train-1: 3 tasks\n", "run …: 2 tasks"),
    (["worker:0"], "worker:0 localhost\n", "worker:0"),  # the whole line, not a part
    (["a; …"], "a; \nb\n", None),  # rich wraps after a space, and trailing spaces go
])
def test_missing_line(expected: list[str], output: str, missing: str | None) -> None:
    assert missing_line(expected, output) == missing


@pytest.mark.parametrize("path", list(generated()))
def test_reference_is_current(path: Path) -> None:
    """docs/reference/ is what `make docs` writes from the code, field descriptions and help
    text included."""
    committed = REPO / path
    want = generated()[path]
    assert committed.exists(), f"{path} is missing: run `make docs` and commit it"
    assert committed.read_text() == want, (
        f"{path} differs from what the code makes (a field's description, a default or a "
        "command's help changed): run `make docs` and commit the result")


def test_reference_names_every_field() -> None:
    """Every key of the cluster file is in the reference, with its description."""
    from orchestrator.planning.spec import ClusterSpec

    text = generated()[Path("docs/reference/cluster-file.md")]
    seen = [m for m in re.findall(r"^\| `(\w+)` \|", text, re.M)]
    assert set(ClusterSpec.model_fields) <= set(seen)
    assert "| `lifeline_seconds` | number ≥ 3 | `30` | silence" in text


@pytest.mark.parametrize(("message", "page"), [
    ("c.yaml: invalid cluster file\nhosts.gpu1.port: Input should be ≤ 65535", "lab.md"),
    ("c.yaml: invalid cluster file\ntasks.worker[0]: host 'gpu9' is neither 'localhost' nor "
     "a name under hosts: (none)", "lab.md"),
    ("cannot start, nothing was started:\n  host gpu1 (gpu1.lab:22): unreachable", "lab.md"),
    ("backend.slurm.partition: no partition 'gpu'", "slurm.md"),
    ("job.yaml: invalid cluster file\ntasks.worker[1]: duplicate address", "cluster-file.md"),
    ("c.yaml: invalid cluster file\nrestart.policy: Input should be 'never'", "faults.md"),
    ("c.yaml: invalid cluster file\njob.collective: nccl needs GPUs", "gpus.md"),
    ("c.yaml: invalid cluster file\njob: give exactly one of entry", "scripts.md"),
    ("--workers 0: at least 1", None),
])
def test_guide_page(message: str, page: str | None) -> None:
    """An error whose field has a guide page names it; the page exists."""
    got = guide_page(message)
    assert got == (None if page is None else f"docs/guide/{page}")
    if got:
        assert (REPO / got).is_file()


def test_help_ends_with_the_guide() -> None:
    out = subprocess.run([sys.executable, "-m", "orchestrator", "--help"], capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0
    tail = " ".join(out.stdout.split()[-30:])
    assert "docs/guide/" in tail and "README.md" in tail, out.stdout
