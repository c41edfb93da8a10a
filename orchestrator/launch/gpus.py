"""What GPUs a host has, as `nvidia-smi -L` tells: for `gpus: auto` and `tfo check`.

    local_gpus()                         # GpuReport(ids=[0, 1], note='') on this machine
    auto_gpus(spec, remote)              # {"lab1": [0, 1, 2, 3]}: every `auto` host asked
                                         # (lab hosts by `remote`: ssh.backend.remote_gpus)

Not pure (it runs a program), so it stays out of the plan: its answer is make_plan's `gpus`.
A host without nvidia-smi, or where it fails, has no GPUs, with a note saying why.
"""

from __future__ import annotations

import functools
import re
import subprocess
from typing import TYPE_CHECKING

from orchestrator.launch import BackendError, GpuReport
from orchestrator.planning.devices import gpus_field
from orchestrator.planning.spec import LOCALHOST, ClusterSpec

if TYPE_CHECKING:
    from collections.abc import Callable

NVIDIA_SMI = "nvidia-smi -L"
TIMEOUT_SECONDS = 20.0
# "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-…)"; MIG lines below a GPU are not GPUs of their own.
_GPU_LINE = re.compile(r"^GPU (\d{1,4}):", re.M)


def parse(returncode: int, stdout: str, stderr: str) -> GpuReport:
    """nvidia-smi's answer (untrusted text: only `GPU <n>:` lines are read)."""
    if returncode == 127:
        return GpuReport([], "nvidia-smi not found")
    if returncode != 0:
        said = (stderr.strip() or stdout.strip()).splitlines()[-1:] or [""]
        return GpuReport([], f"nvidia-smi -L failed, exit {returncode}: {said[0][:200]}")
    return GpuReport(sorted({int(n) for n in _GPU_LINE.findall(stdout)}))


@functools.cache  # one answer per tfo command: `plan` and `check` both ask for it
def local_gpus() -> GpuReport:
    try:
        res = subprocess.run(NVIDIA_SMI.split(), capture_output=True, text=True,
                             timeout=TIMEOUT_SECONDS, stdin=subprocess.DEVNULL, errors="replace")
    except FileNotFoundError:
        return GpuReport([], "nvidia-smi not found")
    except subprocess.TimeoutExpired:
        return GpuReport([], f"nvidia-smi -L gave no answer in {TIMEOUT_SECONDS:.0f} s")
    except OSError as e:
        return GpuReport([], f"nvidia-smi -L: {e.strerror or e}")
    return parse(res.returncode, res.stdout, res.stderr)


def auto_hosts(spec: ClusterSpec) -> list[str]:
    """The hosts with tasks whose gpus are `auto`."""
    listed = {LOCALHOST: spec.localhost.gpus, **{n: h.gpus for n, h in spec.hosts.items()}}
    used = dict.fromkeys(a.host for _, _, a in spec.tasks.all())
    return [h for h in used if listed.get(h) == "auto"]


def auto_gpus(spec: ClusterSpec, remote: Callable[[str], GpuReport] | None = None,
              ) -> dict[str, GpuReport]:
    """Ask every `auto` host; lab hosts only with `remote` (a dry run leaves them unknown).
    A lab host that cannot be reached stays unknown too: the preflight reports it."""
    reports = {}
    for name in auto_hosts(spec):
        if name == LOCALHOST:
            reports[name] = local_gpus()
        elif remote is not None:
            try:
                reports[name] = remote(name)
            except BackendError:
                continue
    return reports


def gpu_problem(spec: ClusterSpec, host: str, report: GpuReport) -> str | None:
    """A host whose listed GPUs nvidia-smi does not report: a typo, or the wrong machine."""
    listed = spec.localhost.gpus if host == LOCALHOST else spec.hosts[host].gpus
    if listed == "auto" or report.note:
        return None  # no answer is not a contradiction
    missing = [g for g in listed if g not in report.ids]
    if not missing:
        return None
    return (f"host {host}: {gpus_field(host)} lists GPU {', '.join(map(str, missing))}, "
            f"which nvidia-smi -L there does not report (it reports {report})")


def auto_notes(spec: ClusterSpec, reports: dict[str, GpuReport]) -> list[str]:
    """What `tfo plan` says of each `auto` host: what it found, or when it will ask."""
    notes = []
    for name in auto_hosts(spec):
        if name in reports:
            notes.append(f"{name}: gpus auto: nvidia-smi -L reports {reports[name]}")
        else:
            notes.append(f"{name}: gpus auto: nvidia-smi -L on {name} tells when the job runs "
                         "(tfo check asks now); numbered from 0 here")
    return notes
