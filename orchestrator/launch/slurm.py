"""Tasks as Slurm job steps (placement kind `slurm`): one allocation for the job, one step
per task, so a task can be stopped and restarted alone inside the allocation.

    slurm = SlurmBackend({})
    nodes = slurm.place(spec, dry_run=False, say=print)   # salloc; task name → node
    ports = slurm.allocate(names, avoid=set())             # free ports, asked on the nodes
    handle = slurm.start(task, attempt=0)                  # srun --jobid J -N1 -n1 -w NODE …
    slurm.standby(task, attempt=1)                         # a warm spare: a step of its own
    slurm.close()                                          # scancel J: nothing stays queued

The allocation is `salloc … sh -c 'echo @tfo-nodes …; exec cat'`, a child of tfo in its own
session: its command reads the pipe we hold, so when tfo dies, even by SIGKILL, the pipe
closes, the command ends and salloc gives the allocation back; Slurm then kills every step.
salloc also gets SIGHUP when we die (PDEATHSIG), which withdraws a request still waiting in
the queue. While the job is
pending, `place` reports squeue's reason; that wait is over before the supervisor starts, so
it never counts against the startup timeout.

Each task's srun holds the task's lifeline the same way: srun forwards its stdin, a pipe we
hold, to the task's wrapper. A step is signalled with `scancel --signal` (proctrack/cgroup,
where the cluster has it, reaches processes that setsid away; the wrapper reaps them too).
srun exits with the task's code, or 128+N when a signal N ended it: poll() reports -N then.
Nodes run the task in tfo's working directory with tfo's python: a Slurm cluster's nodes
share its file system. Each step asks the job's CPUs per task again (`--cpus-per-task`,
from `scontrol show job`): srun has not taken it from the job since Slurm 22.05, and a
task asked 8 CPUs for would otherwise run on 1 where the cluster confines steps.

A standby (a warm spare, `warm_spares: true`; launch/spares.py) is a step of its own on the
task's node, `--overlap` like every CPU step, with STANDBY_ENV=1: its task imports
TensorFlow and waits for GO down srun's stdin. A task with GPUs gets none: its standby's
step would wait for the GPUs the running attempt holds.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping

from orchestrator.launch import BackendError, Say, answered
from orchestrator.launch.gpus import GpuReport
from orchestrator.launch.output import TaskOutput, close_pipes, pipe_output, send_lifeline
from orchestrator.launch.preflight import HostCheck
from orchestrator.launch.spares import DISCARD_SECONDS, Spares
from orchestrator.planning.plan import Plan, TaskPlan, task_name
from orchestrator.planning.slurmspec import SlurmSpec
from orchestrator.planning.spec import ClusterSpec, HostSpec, SpecError
from worker_entry import markers

COMMAND_TIMEOUT = 30.0  # squeue, scontrol, scancel: the controller answers or is down
QUEUE_REPORT_SECONDS = 5.0  # how often a pending job's reason is looked up
_NODES_PREFIX = "@tfo-nodes "
_GRANTED = re.compile(r"(?:Granted|Pending) job allocation (\d+)")

class SlurmError(BackendError):
    """Slurm refused or failed; the message says which command and why."""


def run_slurm(*argv: str, timeout: float = COMMAND_TIMEOUT) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError(f"slurm: {argv[0]} not found: run tfo where Slurm's commands are "
                         "(a login node)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"slurm: `{' '.join(argv)}` gave no answer in {timeout:g} s: is "
                         "slurmctld up?") from None


def node_count(slurm: SlurmSpec, tasks: int) -> int:
    return slurm.nodes or max(1, math.ceil(tasks / slurm.tasks_per_node))


def assign_nodes(names: list[str], nodes: list[str]) -> dict[str, str]:
    """Task i (in start order: ps, worker, chief, evaluator) runs on node i mod N: workers
    spread over every node, and a job's ps and chief land on different nodes when it can."""
    return {name: nodes[i % len(nodes)] for i, name in enumerate(names)}


def salloc_argv(slurm: SlurmSpec, nodes: int, job_name: str) -> list[str]:
    argv = ["salloc", f"--nodes={nodes}", f"--ntasks-per-node={slurm.tasks_per_node}",
            f"--job-name={job_name}"]
    if slurm.partition:
        argv.append(f"--partition={slurm.partition}")
    if slurm.time:
        argv.append(f"--time={slurm.time}")
    if slurm.account:
        argv.append(f"--account={slurm.account}")
    if slurm.gpus_per_task:
        argv.append(f"--gpus-per-task={slurm.gpus_per_task}")
    # The lifeline: the job and its nodes first (salloc's "Granted" line is on stderr, read
    # by another thread: it may come second), then wait for our end of the pipe to close.
    return [*argv, *slurm.extra_args, "sh", "-c",
            f'echo "{_NODES_PREFIX}$SLURM_JOB_ID $SLURM_JOB_NODELIST"; exec cat >/dev/null']


def _die_with_parent() -> None:
    """In salloc's child before exec: SIGHUP when tfo dies; salloc then withdraws a pending
    request, or gives the allocation back and exits. (Not SIGTERM: measured with Slurm 22.05,
    a granted salloc given SIGTERM revokes the job but then spins in waitpid for good.)"""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGHUP)  # PR_SET_PDEATHSIG


def _fields(text: str) -> dict[str, str]:
    """scontrol -o's `Key=Value Key=Value`."""
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


def partition_info(partition: str | None) -> dict[str, str]:
    """`scontrol show partition` of the named (or the default) partition; SpecError naming
    the field when the cluster has no such partition."""
    cp = run_slurm("scontrol", "-o", "show", "partition", *([partition] if partition else []))
    if cp.returncode != 0 and "not found" not in cp.stderr + cp.stdout:
        raise SlurmError(f"slurm: scontrol show partition failed: {cp.stderr.strip()}")
    rows = [_fields(line) for line in cp.stdout.splitlines() if line.strip()]
    if partition:
        found = [r for r in rows if r.get("PartitionName") == partition]
    else:
        found = [r for r in rows if r.get("Default") == "YES"]
    if not found:
        names = [r.get("PartitionName", "?") for r in _all_partitions()]
        what = f"no partition {partition!r}" if partition else "no default partition"
        raise SpecError(f"backend.slurm.partition: {what} on this Slurm cluster; partitions: "
                        f"{', '.join(names) or 'none'}")
    return found[0]


def _all_partitions() -> list[dict[str, str]]:
    cp = run_slurm("scontrol", "-o", "show", "partition")
    return [_fields(line) for line in cp.stdout.splitlines() if line.strip()]


def node_states(partition: str) -> dict[str, str]:
    """Each node of the partition and its state (`idle`, `mix`, `alloc`, `drain`, …)."""
    cp = run_slurm("sinfo", "-h", "-N", "-p", partition, "-o", "%N %t")
    return dict(line.split(None, 1) for line in cp.stdout.splitlines() if " " in line)


def fit_problems(slurm: SlurmSpec, nodes: int, part: dict[str, str]) -> list[str]:
    """Why the request can never be granted in this partition (pure, on scontrol's fields)."""
    name = part.get("PartitionName", "?")
    problems = []
    total = int(part.get("TotalNodes", "0") or 0)
    if nodes > total:
        problems.append(f"backend.slurm.nodes: {nodes} node(s) asked, partition {name} has "
                        f"{total}")
    max_nodes = part.get("MaxNodes", "UNLIMITED")
    if max_nodes.isdigit() and nodes > int(max_nodes):
        problems.append(f"backend.slurm.nodes: {nodes} node(s) asked, partition {name} allows "
                        f"{max_nodes} per job")
    if part.get("State", "UP") != "UP":
        problems.append(f"backend.slurm.partition: partition {name} is {part['State']}")
    return problems


class Allocation:
    """salloc as our child: the job id at once, the node list once granted."""

    def __init__(self, argv: list[str]) -> None:
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True, preexec_fn=_die_with_parent)
        self.job_id: str | None = None
        self.nodelist: str | None = None
        self.messages: list[str] = []  # salloc's own lines
        self._got = threading.Event()
        for target, stream in ((self._read_err, self._proc.stderr),
                               (self._read_out, self._proc.stdout)):
            threading.Thread(target=target, args=(stream,), daemon=True,
                             name="salloc").start()

    def _read_err(self, stream) -> None:  # noqa: ANN001
        for line in stream:
            self.messages.append(line.rstrip())
            if (m := _GRANTED.search(line)) and self.job_id is None:
                self.job_id = m.group(1)
            self._got.set()

    def _read_out(self, stream) -> None:  # noqa: ANN001
        for line in stream:
            if line.startswith(_NODES_PREFIX) and self.nodelist is None:
                job_id, _, self.nodelist = line[len(_NODES_PREFIX):].strip().partition(" ")
                self.job_id = self.job_id or job_id
                self._got.set()
        self._got.set()

    def wait(self, seconds: float) -> None:
        self._got.wait(seconds)
        self._got.clear()

    def ended(self) -> int | None:
        return self._proc.poll()

    def release(self, timeout: float = 10.0) -> None:
        """Close the lifeline (salloc gives the allocation back), scancel the job all the same
        (every step goes with it), reap salloc."""
        with contextlib.suppress(OSError):
            assert self._proc.stdin is not None
            self._proc.stdin.close()
        if self.job_id is not None:
            with contextlib.suppress(SlurmError):
                run_slurm("scancel", self.job_id, timeout=timeout)
        if self.job_id is None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGHUP)  # no id yet: salloc withdraws the request
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)


def _pending_reason(job_id: str) -> str | None:
    """'PENDING (Resources)' while the job waits; None once it does not."""
    cp = run_slurm("squeue", "-h", "-j", job_id, "-o", "%T %r")
    state, _, reason = cp.stdout.strip().partition(" ")
    return f"{state} ({reason})" if state == "PENDING" else None


def hostnames(nodelist: str) -> list[str]:
    cp = run_slurm("scontrol", "show", "hostnames", nodelist)
    if cp.returncode != 0 or not cp.stdout.split():
        raise SlurmError(f"slurm: scontrol show hostnames {nodelist} failed: "
                         f"{cp.stderr.strip()}")
    return cp.stdout.split()


def count_ids(ids: str) -> int:
    """How many CPUs `scontrol show job -d`'s CPU_IDs names: `0-1,4` is 3."""
    total = 0
    for part in filter(None, ids.split(",")):
        first, _, last = part.partition("-")
        total += int(last or first) - int(first) + 1
    return total


def cpus_per_task(shown: str) -> int:
    """The job's CPUs per task from `scontrol show job [-d]` (`CPUs/Task=3`; 1 if not said)."""
    found = re.search(r"\bCPUs/Task=(\d+)", shown)
    return int(found.group(1)) if found else 1


_ALLOC_LINE = re.compile(r"^\s*Nodes=(\S+) CPU_IDs=(\S+) Mem=(\d+)", re.M)


def allocation_room(detail: str, expand: Callable[[str], list[str]]) -> dict[str, tuple[int, int]]:
    """Each node's share of a job from `scontrol show job -d`: (CPUs, memory in MiB, 0 when
    the cluster does not allot memory). A node list line covers several nodes; `expand`
    names them (hostnames)."""
    return {node: (count_ids(ids), int(mem)) for nodes, ids, mem in _ALLOC_LINE.findall(detail)
            for node in expand(nodes)}


def free_memory(nodes: list[str]) -> dict[str, int]:
    """Each node's free memory in MiB as its slurmd last reported it (sinfo %e; N/A left out)."""
    cp = run_slurm("sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %e")
    return {node: int(free) for node, _, free in
            (line.partition(" ") for line in cp.stdout.splitlines()) if free.strip().isdigit()}


# Runs once on each node (one step, a task per node): that many free ports, held together
# so they differ, and the node's name.
_PORT_PROBE = """
import json, os, socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("", 0))
print("@tfo-ports " + json.dumps([os.environ.get("SLURMD_NODENAME", socket.gethostname()),
                                  [s.getsockname()[1] for s in socks]]))
"""


class SlurmHandle:
    """One task: `srun` for its step, here; its output and its exit are the task's."""

    def __init__(self, task: TaskPlan, attempt: int, job_id: str, gpus: int, cpus: int = 1,
                 standby: bool = False) -> None:
        self.task, self.attempt, self._job = task, attempt, job_id
        self.warm = False  # a standby that was told to go
        self.step_name = f"tfo.{task.name}.{attempt}"
        self._step: str | None = None
        env = {**os.environ, **task.env, "TFO_ATTEMPT": str(attempt),
               markers.LIFELINE_ENV: markers.lifeline(heartbeat=False)}
        if standby:
            env[markers.STANDBY_ENV] = "1"
        # slurmstepd makes TMPDIR before the wrapper runs, and falls back to /tmp (where the
        # wrapper would not clean up) when it cannot.
        os.makedirs(task.tmp_dir, exist_ok=True)
        share = [f"--gpus-per-task={gpus}"] if gpus else ["--overlap"]
        if cpus > 1:  # srun (22.05 on) does not take the job's --cpus-per-task: say it again
            share.append(f"--cpus-per-task={cpus}")
        if gpus:
            env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm sets the step's own
        argv = ["srun", f"--jobid={job_id}", "--nodes=1", "--ntasks=1",
                f"--nodelist={task.host}", f"--job-name={self.step_name}",
                f"--chdir={task.cwd}", "--export=ALL", "--unbuffered", "--quiet", *share,
                *task.command]
        self._proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True, bufsize=0)
        self._returncode: int | None = None
        # A standby's output waits in the pipe until go(): nobody's attempt yet.
        self._output: TaskOutput | None = None if standby else self._read_output()

    def _read_output(self) -> TaskOutput:
        return pipe_output(self._proc, self.task.log_path, f"srun-{self.task.name}")

    def go(self) -> None:
        """A standby's turn: srun passes GO on to its wrapper (worker_entry.standby)."""
        send_lifeline(self._proc, markers.GO)
        self.warm = True
        self._output = self._read_output()

    def discard(self) -> None:
        """End a standby that was never used: cancel its step, wait for srun, close its
        pipes. The task's temp dir is the running attempt's, not its own to remove."""
        self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(DISCARD_SECONDS)
        close_pipes(self._proc, None)

    @property
    def pid(self) -> int:
        return self._proc.pid  # srun's, here

    def poll(self) -> int | None:
        if self._returncode is not None:
            return self._returncode
        rc = self._proc.poll()
        if rc is None:
            return None
        if rc < 0:  # srun itself was killed: its step may still run
            self._cancel_step("KILL")
        self._returncode = -(rc - 128) if 128 < rc < 128 + 65 else rc
        return self._returncode

    def lines(self) -> list[str]:
        return self._output.lines() if self._output is not None else []

    def _step_id(self) -> str | None:
        """The step's id, looked up by its name once it is needed."""
        if self._step is None:
            with contextlib.suppress(SlurmError):
                cp = run_slurm("squeue", "-h", "-s", "-j", self._job, "-o", "%i %j")
                for line in cp.stdout.splitlines():
                    step, _, name = line.partition(" ")
                    if name.strip() == self.step_name:
                        self._step = step
        return self._step

    def _cancel_step(self, sig: str) -> bool:
        step = self._step_id()
        if step is None:
            return False
        with contextlib.suppress(SlurmError):
            run_slurm("scancel", f"--signal={sig}", step)
        return True

    def terminate(self) -> None:
        if self._proc.poll() is None and not self._cancel_step("TERM"):
            # No step yet (srun still starting): srun cancels its step on SIGTERM.
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)

    def request_stacks(self) -> None:
        send_lifeline(self._proc, markers.STACKS)

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._cancel_step("KILL")
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)  # srun: cancel the step, then exit

    def close(self, timeout: float = 1.0) -> list[str]:
        assert self._output is not None, "a standby that never ran is discarded, not closed"
        rest = self._output.close(timeout)
        close_pipes(self._proc, self._output)
        return rest


class SlurmBackend:
    """The job's one allocation and its steps: a scheduler, so it places the tasks itself."""

    options = SlurmSpec

    def __init__(self, hosts: Mapping[str, HostSpec]) -> None:
        self._spec: ClusterSpec | None = None
        self._alloc: Allocation | None = None
        self._nodes: dict[str, str] = {}
        self._cpus = 1  # the job's CPUs per task, which each step asks again
        self._detail = ""  # `scontrol show job -d` of the granted job: its share of each node
        self._spares = Spares(lambda task, attempt: SlurmHandle(
            task, attempt, self._job_for(task), 0, self._cpus, standby=True))

    @property
    def job_id(self) -> str | None:
        return self._alloc.job_id if self._alloc else None

    def _slurm(self) -> SlurmSpec:
        assert self._spec is not None and self._spec.backend is not None, "place() first"
        options = self._spec.backend.options
        assert isinstance(options, SlurmSpec)
        return options

    def place(self, spec: ClusterSpec, dry_run: bool, say: Say) -> dict[str, str]:
        """Ask Slurm for the job's nodes (salloc; waits while the job is queued, reporting
        why) and map each task to one. A dry run asks nothing: nodes are named node1, …"""
        self._spec = spec
        slurm = self._slurm()
        names = [task_name(r, i) for r, i, _ in spec.tasks.all()]  # every one is ours
        count = node_count(slurm, len(names))
        if dry_run:
            say(f"slurm: {count} node(s) named node1… and ports 20000… stand in for what the "
                "allocation gives when the job runs")
            self._nodes = assign_nodes(names, [f"node{i + 1}" for i in range(count)])
            return self._nodes
        part = partition_info(slurm.partition)
        problems = fit_problems(slurm, count, part)
        if problems:
            raise SpecError("; ".join(problems))
        self._alloc = alloc = Allocation(salloc_argv(slurm, count, f"tfo-{spec.name}"))
        shown = None
        while alloc.nodelist is None:
            alloc.wait(QUEUE_REPORT_SECONDS if alloc.job_id else 1.0)
            if alloc.ended() is not None and alloc.nodelist is None:
                why = "; ".join(m for m in alloc.messages if m) or f"exit {alloc.ended()}"
                raise SlurmError(f"slurm: salloc failed: {why}")
            if alloc.job_id and alloc.nodelist is None:
                reason = _pending_reason(alloc.job_id)
                if reason and reason != shown:
                    say(f"slurm job {alloc.job_id} waits in the queue: {reason} "
                        f"(squeue -j {alloc.job_id}; the startup timeout starts once granted)")
                    shown = reason
        nodes = hostnames(alloc.nodelist)
        say(f"slurm job {alloc.job_id}: {len(nodes)} node(s) {alloc.nodelist}"
            f"{' in partition ' + part['PartitionName'] if 'PartitionName' in part else ''}")
        self._nodes = assign_nodes(names, nodes)
        shown = run_slurm("scontrol", "show", "job", "-d", alloc.job_id)
        self._detail = shown.stdout if shown.returncode == 0 else ""
        self._cpus = cpus_per_task(self._detail)
        return self._nodes

    def gpus(self, hosts: list[str], ask: bool) -> dict[str, GpuReport]:
        return {}  # a task's GPUs are the step's, from gpus_per_task: no host lists `auto`

    def allocate(self, names: list[str], avoid: set[int]) -> dict[str, int]:
        """Free ports on each task's node, asked there (one step over all nodes)."""
        per_node: dict[str, list[str]] = {}
        for name in names:  # a task's, or its profiler's (`worker:0/profiler`): its node
            per_node.setdefault(self._nodes[name.partition("/")[0]], []).append(name)
        if self._alloc is None:  # a dry run: there are no nodes to ask yet
            return {n: 20000 + i for i, n in enumerate(names)}
        want = max(len(v) for v in per_node.values()) + len(avoid)  # some may be in avoid
        cp = run_slurm("srun", f"--jobid={self._alloc.job_id}", f"--nodes={len(per_node)}",
                       f"--ntasks={len(per_node)}", "--ntasks-per-node=1", "--overlap",
                       f"--nodelist={','.join(per_node)}", "--quiet",
                       sys.executable, "-c", _PORT_PROBE, str(want), timeout=60)
        free: dict[str, list[int]] = {}
        for line in cp.stdout.splitlines():
            if line.startswith("@tfo-ports "):
                node, ports = json.loads(line[len("@tfo-ports "):])
                free[node] = [p for p in ports if p not in avoid]
        missing = [n for n in per_node if n not in free]
        if missing:
            raise SlurmError(f"slurm: could not ask {', '.join(missing)} for free ports: "
                             f"{(cp.stderr or cp.stdout).strip()[-300:]}")
        return {name: free[node][i] for node, tasks in per_node.items()
                for i, name in enumerate(tasks)}

    def check(self, tasks: list[TaskPlan]) -> list[HostCheck]:
        """The partition: does it exist, how many of its nodes are idle, can the request ever
        fit. One row, named slurm:<partition>."""
        slurm = self._slurm()
        count = node_count(slurm, len(tasks))
        row = HostCheck(f"slurm:{slurm.partition or '(default)'}", "", python=None)
        try:
            part = partition_info(slurm.partition)
            row.reachable = True
        except (SlurmError, SpecError) as e:
            row.problems.append(str(e))
            return [row]
        name = part.get("PartitionName", "?")
        row.host = f"slurm:{name}"
        states = node_states(name)
        idle = sorted(n for n, s in states.items() if s.startswith("idle"))
        row.address = (f"{len(idle)} of {len(states)} node(s) idle; job asks {count} "
                       f"node(s), {slurm.tasks_per_node} task(s) each")
        row.python = sys.version.split()[0]
        row.problems += fit_problems(slurm, count, part)
        return [row, *self._node_rows()]

    def _node_rows(self) -> list[HostCheck]:
        """Once the job is granted, a row for each of its nodes with the job's share of it:
        the CPUs allotted (a step runs in the job's cgroup where the cluster confines them,
        so a standby competes with its own task, at nice 19) and memory (the job's, else
        the node's free memory: what `warm_spares: auto` weighs)."""
        room = allocation_room(self._detail, hostnames) if self._detail else {}
        free = free_memory(sorted(room)) if room else {}
        rows = []
        for node, (cpus, mem) in sorted(room.items()):
            mib = mem or free.get(node)
            rows.append(HostCheck(node, f"slurm job {self.job_id}", reachable=True, cpus=cpus,
                                  mem_available=None if mib is None else mib * 2**20))
        return rows

    def sync(self, plan: Plan, tasks: list[TaskPlan]) -> list[str]:
        return []  # the nodes share tfo's file system

    def _job_for(self, task: TaskPlan) -> str:
        if self._alloc is None or self._alloc.job_id is None:
            raise SlurmError(f"{task.name}: no Slurm allocation to start it in")
        return self._alloc.job_id

    def start(self, task: TaskPlan, attempt: int) -> SlurmHandle:
        """The task's warm spare for this attempt, if one waits; else a new step."""
        return self._spares.take(task, attempt) or \
            SlurmHandle(task, attempt, self._job_for(task), self._slurm().gpus_per_task,
                        self._cpus)

    def start_batch(self, items: Iterable[tuple[TaskPlan, int]]
                    ) -> Iterator[SlurmHandle | Exception]:
        """A round's steps (a node's tasks, a restarted group) together: every `srun` is
        forked before the first is answered, none waits for another's step; each answered
        in order (launch.BatchLauncher)."""
        started: list[SlurmHandle | Exception] = []
        for task, attempt in items:
            try:
                started.append(self.start(task, attempt))
            except Exception as e:  # noqa: BLE001 - the caller's to judge, task by task
                started.append(e)
        yield from answered(started)

    def standby(self, task: TaskPlan, attempt: int) -> int | None:
        """A warm spare's step for the task's `attempt`; its srun's pid, None if one already
        waits, or for a task with GPUs (its step would wait for the running attempt's)."""
        if self._slurm().gpus_per_task:
            return None
        return self._spares.make(task, attempt)

    def close(self) -> None:
        self._spares.close()
        if self._alloc is not None:
            self._alloc.release()
            self._alloc = None
