"""Is a process still running? One answer for the tests, the labs and the benches.

A zombie counts as gone: its parent has not reaped it yet, but it runs nothing and holds no
port. Asked by /proc, so a process that ends between the two reads is gone, not an error:
`psutil.pid_exists(p) and psutil.Process(p).status()` raises NoSuchProcess there, which ended
a CI run's lab bench (a wrapper exited between the two calls under a load average of 18).
Standard library only: the SSH lab imports it.
"""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False  # ended between the two reads


def gone(pid: int) -> bool:
    return not alive(pid)
