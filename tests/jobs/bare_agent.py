"""A lab host's agent as far as its tasks' names go, on a python without setproctitle:
started as `python -m tests.jobs.bare_agent 15` (the agent's short command line), it forks
one task's wrapper as worker_entry.agent does (forkstart.spawn), with this process's
environment and directory, passes the wrapper's output on, and exits with it."""

import os
import sys

sys.modules["setproctitle"] = None  # not installed on this host: importing it fails

from worker_entry import forkstart  # noqa: E402

forkstart.preload()
pid, stdin, out = forkstart.spawn(os.getcwd(), dict(os.environ))
print(f"wrapper {pid}", flush=True)
while chunk := os.read(out, 65536):
    os.write(1, chunk)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
