"""What the code sync sends of a project (`project_files`): its files, less what `.gitignore`
and `.tfoignore` leave out (git's rules, by pathspec; the ones above the code directory up to
its git work tree's top too), caches and byte code, and what looks like a credential
(`CREDENTIALS` by name, a private key by its PEM header), unless the spec's
`job.code_include` names it. A symlink is followed only where it points inside the project:
one pointing out of it is left out and said (`Listing.notes`), never its target's content.
Each file keeps its mode; a sparse one is copied sparse (codesync)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.runs.rundir import RUNS

_SKIP_DIRS = {"__pycache__", ".git", ".venv", RUNS, ".pytest_cache", ".ruff_cache"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
IGNORE_FILES = (".gitignore", ".tfoignore")  # in this order at each level: ours has the last word

# What looks like a credential by its name (git's pattern syntax): environment files, private
# keys and certificates' keys, SSH/GnuPG/cloud credential directories and files.
CREDENTIALS = (
    ".env*", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore",
    "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk",
    ".ssh/", ".gnupg/", ".aws/", ".azure/", ".config/gcloud/", ".kube/", ".docker/config.json",
    "credentials", "credentials.json", "*-credentials.json", "client_secret*.json",
    "application_default_credentials.json", ".netrc", "_netrc", ".pgpass", ".git-credentials",
    ".pypirc", ".npmrc", "*.tfstate",
)
# A private key whatever its name: PEM's first line (OpenSSH, PKCS#1/#8, EC, PGP's block).
_KEY_HEADER = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
_HEADER_BYTES = 4096  # where a key file's header is, comments before it included
_KEY_MAX = 1 << 20  # bigger files are not read for a header: no key is that big


@dataclass(frozen=True)
class SyncFile:
    """One file to send: where it is here, its path under the host's workdir, its size,
    permission bits, and bytes on disk here (less than its size: sparse)."""

    path: Path
    rel: str
    size: int
    mode: int
    on_disk: int

    @property
    def sparse(self) -> bool:
        return self.on_disk < self.size // 2

    @property
    def written(self) -> int:
        """What the copy writes there: a sparse file's data only."""
        return min(self.size, self.on_disk) if self.sparse else self.size


@dataclass
class Listing:
    """The files to send, and what was left out and why (paths relative to the workdir)."""

    files: list[SyncFile] = field(default_factory=list)
    credentials: list[str] = field(default_factory=list)  # looks like one; not named
    links_out: list[tuple[str, str]] = field(default_factory=list)  # (link, its target)
    ignored: int = 0  # left out by .gitignore / .tfoignore

    def notes(self) -> list[str]:
        """What the console says of what was left out, once per run."""
        said = []
        if self.credentials:
            said.append(f"sync: left out {len(self.credentials)} file(s) that look like "
                        f"credentials: {_listed(self.credentials)} (name them in "
                        "job.code_include to send them)")
        if self.links_out:
            said.append(f"sync: left out {len(self.links_out)} symlink(s) pointing out of the "
                        "job's code directory: " + _listed([f"{rel} -> {target}" for rel, target
                                                             in self.links_out]))
        return said


def _listed(items: list[str], shown: int = 8) -> str:
    more = len(items) - shown
    return ", ".join(items[:shown]) + (f" and {more} more" if more > 0 else "")


def _spec(lines: Iterable[str]):  # -> pathspec.GitIgnoreSpec
    import pathspec  # 5 ms: only when a lab host is synced

    return pathspec.GitIgnoreSpec.from_lines(lines)


def _ignore_rules(directory: Path) -> list:
    rules = []
    for name in IGNORE_FILES:
        path = directory / name
        if path.is_file() and not path.is_symlink():
            try:
                rules.append(_spec(path.read_text(errors="replace").splitlines()))
            except (OSError, ValueError):
                continue  # unreadable, or a pattern pathspec refuses: as if absent
    return rules


def _work_tree_rules(root: Path) -> list[tuple[Path, list]]:
    """The ignore files above `root`, from its git work tree's top down (none outside one)."""
    above = []
    for parent in root.parents:
        above.append(parent)
        if (parent / ".git").exists():
            return [(d, rules) for d in reversed(above) if (rules := _ignore_rules(d))]
    return []


class _Walk:
    """One package's walk: the rules in force by directory, the listing filled in."""

    def __init__(self, root: Path, base: Path, include: list[str], out: Listing) -> None:
        self.root, self.base, self.out = root, base, out
        self.real_root = os.path.realpath(root)
        self.include = _spec(include) if include else None
        # A bare name in job.code_include can match at any depth: ignored directories are
        # then walked too (else one is pruned, as git does).
        self.include_anywhere = any("/" not in p.strip("/") or p.startswith("**")
                                    for p in include)
        self.credential = _spec(CREDENTIALS)
        self.rules = _work_tree_rules(root)
        self.seen: set[str] = set()

    def _verdict(self, path: Path, is_dir: bool) -> bool:
        """Left out by the ignore files in force (the deepest with an answer wins)."""
        left_out = False
        for directory, specs in self.rules:
            if directory != path and directory not in path.parents:
                continue
            rel = path.relative_to(directory).as_posix() + ("/" if is_dir else "")
            for spec in specs:
                if (hit := spec.check_file(rel).include) is not None:
                    left_out = hit
        return left_out

    def _named(self, rel: str) -> bool:
        return self.include is not None and self.include.match_file(rel)

    def walk(self, directory: Path, in_credentials: bool = False) -> None:
        real = os.path.realpath(directory)
        if real in self.seen:  # a symlink loop, or a directory linked twice
            return
        self.seen.add(real)
        if rules := _ignore_rules(directory):
            self.rules.append((directory, rules))
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            path = Path(entry.path)
            rel = path.relative_to(self.root).as_posix()
            if entry.is_symlink() and not self._inside(entry.path):
                self.out.links_out.append((path.relative_to(self.base).as_posix(),
                                           os.readlink(entry.path)))
                continue
            try:
                is_dir = entry.is_dir()
                is_file = not is_dir and entry.is_file()
            except OSError:
                continue
            if is_dir:
                if entry.name in _SKIP_DIRS:
                    continue
                if self._verdict(path, True) and not self.include_anywhere:
                    self.out.ignored += 1
                    continue
                self.walk(path, in_credentials or self.credential.match_file(rel + "/"))
            elif is_file and not entry.name.endswith(_SKIP_SUFFIXES):
                self._file(path, rel, in_credentials)

    def _file(self, path: Path, rel: str, in_credentials: bool) -> None:
        named = self._named(rel)
        shown = path.relative_to(self.base).as_posix()
        if not named and self._verdict(path, False):
            self.out.ignored += 1
            return
        try:
            st = path.stat()
        except OSError:
            return
        if not named and (in_credentials or self.credential.match_file(rel)
                          or _key_inside(path, st.st_size)):
            self.out.credentials.append(shown)
            return
        self.out.files.append(SyncFile(path, shown, st.st_size, st.st_mode & 0o777,
                                       st.st_blocks * 512))

    def _inside(self, link: str) -> bool:
        target = os.path.realpath(link)
        return target == self.real_root or target.startswith(self.real_root + os.sep)


def _key_inside(path: Path, size: int) -> bool:
    if size > _KEY_MAX:
        return False
    try:
        with open(path, "rb") as f:
            return _KEY_HEADER.search(f.read(_HEADER_BYTES)) is not None
    except OSError:
        return False


def project_files(packages: list[tuple[Path, Path]], include: Iterable[str] = ()
                  ) -> Listing:
    """What the sync sends of `packages` (job_packages: a file or directory, and the local
    directory that stands for the host's workdir): `include` (job.code_include: git-style
    patterns, relative to each package's directory) names files to send that an ignore file
    or the credential rules would leave out."""
    out = Listing()
    include = list(include)
    for pkg, base in packages:
        if pkg.is_dir():
            _Walk(pkg, base, include, out).walk(pkg)
        else:  # the job's own module (`module: train`): sent as it is
            st = pkg.stat()
            out.files.append(SyncFile(pkg, pkg.relative_to(base).as_posix(), st.st_size,
                                      st.st_mode & 0o777, st.st_blocks * 512))
    return out
