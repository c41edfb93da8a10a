"""A cluster file from flags and a command, as torchrun does: no file for the common case.

    spec = spec_from_command(["python", "train.py", "--epochs", "3"], QuickFlags(workers=2))
    # {"name": "train", "strategy": "multi_worker_mirrored",
    #  "job": {"script": "train.py", "args": ["--epochs", "3"]},
    #  "tasks": {"worker": ["localhost:auto", "localhost:auto"]}, ...}
    cluster_yaml(spec, made_by="tfo run --workers 2 -- python train.py --epochs 3")

Pure: the caller reads the hosts file (`read_hosts_file`) and validates the result as any
cluster file (parse_spec). A mistake raises FlagError naming the flag; the CLI exits 2.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, fields, replace
from pathlib import Path, PurePath
from typing import Any

import yaml
from pydantic import ValidationError

from orchestrator.planning.policy import RestartPolicy
from orchestrator.planning.spec import (
    LOCALHOST,
    MAX_TASKS_PER_ROLE,
    HostSpec,
    SpecError,
    format_validation_error,
)
from orchestrator.planning.specfile import SpecFileError, read_data
from worker_entry.markers import Role, Strategy

# What --strategy takes: the cluster file's names, and the short ones people type.
STRATEGIES = {
    "multi_worker_mirrored": Strategy.MULTI_WORKER_MIRRORED,
    "mwms": Strategy.MULTI_WORKER_MIRRORED,
    "parameter_server": Strategy.PARAMETER_SERVER,
    "ps": Strategy.PARAMETER_SERVER,
}
COMMAND_FORMS = ("python script.py ARGS…", "python -m pkg.module ARGS…", "script.py ARGS…",
                 "module:function")
_ENTRY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")  # as ClusterSpec.name
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
# Interpreter options that change nothing tfo has not already set (unbuffered output).
_HARMLESS_PYTHON_OPTIONS = ("-u",)


class FlagError(SpecError):
    """A flag or the command after `--` is wrong; the message names it and what to give."""


@dataclass(frozen=True)
class QuickFlags:
    """`tfo run`'s cluster flags, as given (None: not given)."""

    workers: int | str | None = None  # a count, or MIN:MAX (an elastic job, as torchrun's)
    chief: bool = False
    ps: int | None = None
    evaluator: bool = False
    strategy: str | None = None
    hosts: str | None = None  # "lab1,lab2"
    hosts_file: str | None = None  # its name, for messages
    hosts_data: Any = None  # what read_hosts_file returned
    name: str | None = None
    restart: str | None = None
    max_restarts: int | None = None
    independent: bool = False  # expect_cluster: false

    def given(self) -> list[str]:
        """The flags given (`--workers`): with a FILE, they are a mistake."""
        unset = QuickFlags()
        return [f"--{f.name.replace('_', '-')}" for f in fields(self)
                if f.name != "hosts_data" and getattr(self, f.name) != getattr(unset, f.name)]

    def args(self) -> list[str]:
        """The flags given, as typed: `["--workers", "2", "--chief"]`."""
        unset, out = QuickFlags(), []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "hosts_data" or value == getattr(unset, f.name):
                continue
            out.append(f"--{f.name.replace('_', '-')}")
            if not isinstance(value, bool):
                out.append(str(value))
        return out


def job_from_command(command: list[str]) -> dict[str, Any]:
    """The `job:` of a cluster file from the command after `--`."""
    if not command or not command[0]:
        raise FlagError("no command after --; give one of: " + ", ".join(COMMAND_FORMS))
    first, rest = command[0], command[1:]
    if _PYTHON.match(PurePath(first).name):
        while rest and rest[0] in _HARMLESS_PYTHON_OPTIONS:
            rest = rest[1:]
        if not rest:
            raise FlagError(f"`{first}` without a script: give `{first} train.py ARGS…` or "
                            f"`{first} -m pkg.module ARGS…`")
        if rest[0] == "-m":
            if len(rest) < 2 or not _MODULE.match(rest[1]):
                got = repr(rest[1]) if len(rest) > 1 else "nothing"
                raise FlagError(f"`{first} -m` needs a module name like pkg.train, got {got}")
            return {"module": rest[1], "args": rest[2:]}
        if rest[0].startswith("-"):
            raise FlagError(f"python option {rest[0]} is not passed on: tasks run the host's "
                            f"python; give `{first} train.py ARGS…` or `{first} -m pkg.module`")
        return {"script": rest[0], "args": rest[1:]}
    if _ENTRY.match(first):
        if rest:
            raise FlagError(f"an entry ({first}) takes no command-line arguments, got "
                            f"{' '.join(rest)}; its args are a mapping: put them under job.args "
                            "in a cluster file")
        return {"entry": first}
    if first.endswith(".py"):
        return {"script": first, "args": rest}
    raise FlagError(f"cannot run {first!r} after --: give one of " + ", ".join(COMMAND_FORMS))


def _job_name(job: dict[str, Any]) -> str:
    """The run's name: the script's stem, the module's or entry's last part."""
    if "script" in job:
        base = PurePath(job["script"]).stem
    elif "module" in job:
        base = job["module"].rsplit(".", 1)[-1]
    else:
        base = job["entry"].split(":")[0].rsplit(".", 1)[-1]
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", base).strip(".-") or "job"


def _strategy(flags: QuickFlags) -> Strategy:
    if flags.strategy is None:
        return Strategy.MULTI_WORKER_MIRRORED
    try:
        return STRATEGIES[flags.strategy.strip().lower().replace("-", "_")]
    except KeyError:
        raise FlagError(f"--strategy {flags.strategy}: expected one of "
                        + ", ".join(STRATEGIES)) from None


def worker_range(workers: int | str | None) -> tuple[int | None, int | None]:
    """`--workers`: N (min None), or MIN:MAX as torchrun's `--nnodes`: an elastic job of
    MAX places that trains on as few as MIN. Returns (min, max); N:N is N."""
    if workers is None or isinstance(workers, int):
        return None, workers
    low, sep, high = workers.strip().partition(":")
    if not all(p.strip().isascii() and p.strip().isdigit() for p in (low, high)[:1 + bool(sep)]):
        raise FlagError(f"--workers {workers}: expected a number of workers (2), or MIN:MAX "
                        "(2:4) for an elastic job")
    if not sep:
        return None, int(low)
    least, most = int(low), int(high)
    if least < 1:
        raise FlagError(f"--workers {workers}: at least 1 worker (MIN of MIN:MAX)")
    if least > most:
        raise FlagError(f"--workers {workers}: MIN {least} is more than MAX {most}")
    return (None if least == most else least), most


def _roles(flags: QuickFlags, strategy: Strategy) -> dict[Role, int]:
    """How many tasks of each role: under parameter_server the chief is the coordinator
    (always one) and at least one ps serves the variables. An elastic job (`--workers
    MIN:MAX`) lists MAX workers (under parameter_server, all started; MIN the fewest the
    chief trains on)."""
    least, workers = worker_range(flags.workers)
    if workers is not None and workers < 1:
        raise FlagError(f"--workers {flags.workers}: at least 1")
    if least is not None and flags.chief and strategy is Strategy.MULTI_WORKER_MIRRORED:
        raise FlagError(f"--workers {flags.workers} with --chief: an elastic job has no chief "
                        "task (worker 0 is the chief, and the role moves when its host is "
                        "lost); drop --chief")
    if flags.ps is not None and flags.ps < 1:
        raise FlagError(f"--ps {flags.ps}: at least 1 (or leave it out)")
    for flag, count in (("--workers", workers), ("--ps", flags.ps)):
        if count is not None and count > MAX_TASKS_PER_ROLE:  # before a list of that size
            raise FlagError(f"{flag} {count}: at most {MAX_TASKS_PER_ROLE}")
    ps = strategy is Strategy.PARAMETER_SERVER
    if flags.ps and not ps:
        raise FlagError(f"--ps {flags.ps}: ps tasks are for --strategy parameter_server; "
                        "add it, or drop --ps")
    counts = {Role.CHIEF: int(flags.chief or ps), Role.WORKER: workers or 1,
              Role.PS: (flags.ps or 1) if ps else 0, Role.EVALUATOR: int(flags.evaluator)}
    return {role: n for role, n in counts.items() if n}


def _hosts(flags: QuickFlags) -> tuple[list[str], dict[str, Any]]:
    """The hosts to spread tasks over, in order, and the `hosts:` entries they need."""
    known = _hosts_from_file(flags) if flags.hosts_data is not None else {}
    if flags.hosts is None:
        names = list(known) or [LOCALHOST]
    else:
        names = [n.strip() for n in flags.hosts.split(",")]
        if not all(names):
            raise FlagError(f"--hosts {flags.hosts}: expected names separated by commas, "
                            "like lab1,lab2")
    for n in names:
        if n != LOCALHOST and n not in known:
            where = (f"not under hosts: in {flags.hosts_file} ({', '.join(known) or 'none'})"
                     if flags.hosts_file else "and no --hosts-file says how to reach it")
            raise FlagError(f"--hosts: {n!r} is neither localhost nor a known host: {where}")
    names = list(dict.fromkeys(names))
    if LOCALHOST in names and len(names) > 1:
        # TF_CONFIG names each task by its host's address: "localhost" would point a lab
        # machine at itself.
        raise FlagError(f"--hosts {','.join(names)}: localhost cannot be mixed with lab hosts; "
                        "list this machine in the hosts file with an address they can reach")
    return names, {n: known[n] for n in names if n != LOCALHOST}


def _hosts_from_file(flags: QuickFlags) -> dict[str, Any]:
    data = flags.hosts_data
    where = f"--hosts-file {flags.hosts_file}"
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), dict) or not data["hosts"]:
        raise FlagError(f"{where}: expected a `hosts:` mapping of name to host "
                        "(address, user, key, python, workdir, …), as in a cluster file")
    for name, host in data["hosts"].items():
        if name == LOCALHOST:
            raise FlagError(f"{where}: hosts.localhost: localhost is this machine; "
                            "name it differently")
        try:
            HostSpec.model_validate(host)
        except ValidationError as e:
            lines = format_validation_error(e).splitlines()
            raise FlagError(f"{where}: " + "; ".join(
                f"hosts.{name}.{line}" if not line.startswith("(") else f"hosts.{name}: {line}"
                for line in lines)) from None
    return data["hosts"]


def _tasks(roles: dict[Role, int], hosts: list[str]) -> dict[str, list[str]]:
    """Round-robin over the hosts, chief first; the evaluator goes beside the chief (worker 0
    when there is none): it reads the chief's checkpoints from that host's disk."""
    tasks: dict[str, list[str]] = {}
    turn = 0
    for role in (Role.CHIEF, Role.WORKER, Role.PS):
        for _ in range(roles.get(role, 0)):
            tasks.setdefault(role.value, []).append(f"{hosts[turn % len(hosts)]}:auto")
            turn += 1
    if roles.get(Role.EVALUATOR):
        tasks[Role.EVALUATOR.value] = [f"{hosts[0]}:auto"]
    return tasks


def spec_from_command(command: list[str], flags: QuickFlags) -> dict[str, Any]:
    """The cluster file (as data) that `tfo run FLAGS -- COMMAND` runs."""
    job = job_from_command(command)
    if flags.name is not None and not _NAME.match(flags.name):
        raise FlagError(f"--name {flags.name!r}: letters, digits, '_', '.' and '-' only")
    strategy = _strategy(flags)
    roles = _roles(flags, strategy)
    names, hosts = _hosts(flags)
    spec: dict[str, Any] = {"name": flags.name or _job_name(job), "strategy": strategy.value,
                            "job": job, "tasks": _tasks(roles, names)}
    if hosts:
        spec["hosts"] = hosts
    least, most = worker_range(flags.workers)
    if least is not None:
        spec["elastic"] = {"min_workers": least, "max_workers": most}
    restart: dict[str, Any] = {}
    if flags.restart is not None:
        values = [p.value for p in RestartPolicy]
        if flags.restart not in values:
            raise FlagError(f"--restart {flags.restart}: expected one of {', '.join(values)}")
        restart["policy"] = flags.restart
    if flags.max_restarts is not None:
        if flags.max_restarts < 0:
            raise FlagError(f"--max-restarts {flags.max_restarts}: 0 or more")
        restart["max_restarts"] = flags.max_restarts
    if restart:
        spec["restart"] = restart
    if flags.independent:
        spec["expect_cluster"] = False
    return spec


@dataclass(frozen=True)
class SlurmFlags:
    """`--on slurm` and its request: `backend.slurm` of the cluster it runs (None: not given)."""

    on: str | None = None
    partition: str | None = None
    time: str | None = None
    nodes: int | None = None
    tasks_per_node: int | None = None
    gpus_per_task: int | None = None
    account: str | None = None
    extra_args: tuple[str, ...] = ()

    def request(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "on"
                and getattr(self, f.name) not in (None, ())} | (
            {"extra_args": list(self.extra_args)} if self.extra_args else {})

    def given(self) -> list[str]:
        return [f"--{f.name.replace('_', '-')}" for f in fields(self)
                if f.name != "on" and getattr(self, f.name) not in (None, ())]


def on_scheduler(spec: dict[str, Any], flags: SlurmFlags) -> dict[str, Any]:
    """The same job handed to the scheduler `--on` names (a kind with options in
    planning.schedulers): each role's tasks become a count (the scheduler picks the
    hosts; `hosts:` and `localhost:` go), and the flags are its request, `backend.KIND` (over
    the file's own; its options model names a flag it does not take)."""
    if flags.on is None:
        if flags.given():
            raise FlagError(f"{', '.join(flags.given())}: Slurm's request; add --on slurm")
        return spec
    from orchestrator.planning.schedulers import scheduler_options

    kinds = sorted(scheduler_options())
    if flags.on not in kinds:
        said = (f"the one scheduler tfo can hand a job to is {kinds[0]}" if len(kinds) == 1
                else f"the schedulers tfo can hand a job to are {', '.join(kinds)}")
        raise FlagError(f"--on {flags.on}: {said}")
    tasks = spec.get("tasks")
    if not isinstance(tasks, dict):
        return spec  # parse_spec names what is wrong with it
    counts = {role: _count(value) for role, value in tasks.items()}
    old = spec.get("backend") if isinstance(spec.get("backend"), dict) else {}
    request = {**(old.get(flags.on) or {}), **flags.request()}
    out = {k: v for k, v in spec.items() if k not in ("hosts", "localhost", "tasks", "backend")}
    return {**out, "tasks": counts, "backend": {flags.on: request}}


def _count(value: Any) -> Any:
    if value is None:
        return 0
    if isinstance(value, list):
        return len(value)
    if isinstance(value, str | dict):
        return 1
    return value  # a count already (or something parse_spec will name)


def read_hosts_file(path: Path) -> Any:
    """A hosts file, read as safely as a cluster file (`hosts:` is checked by spec_from_command)."""
    try:
        return read_data(path)
    except SpecFileError as e:
        raise FlagError(f"--hosts-file: {e}") from None


class _Dumper(yaml.SafeDumper):
    """Mappings as blocks, lists on one line, as our cluster files are written; no YAML
    anchors (a cluster file may not hold them; the same host dict twice would get one)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_Dumper.add_representer(list, lambda d, data: d.represent_sequence(
    "tag:yaml.org,2002:seq", data, flow_style=True))


def cluster_yaml(spec: dict[str, Any], made_by: str) -> str:
    """The spec as a cluster file `tfo run FILE` takes, saying what made it."""
    # A newline in an argument would end the comment and write YAML of its own.
    made_by = "".join(c if c.isprintable() else repr(c)[1:-1] for c in made_by)
    body = yaml.dump(spec, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=100)
    return (f"# made by: {made_by}\n"
            "# run it again: tfo run THIS_FILE (from the same directory); edit it to grow the job\n"
            f"{body}")


USAGE = ("give a cluster file (tfo {0} clusters/localhost.yaml) or a command after -- "
         "(tfo {0} --workers 2 -- python train.py --epochs 3)")


def source_from(command: list[str] | None, file: Path | None, flags: QuickFlags,
                slurm: SlurmFlags | None = None, verb: str = "run") -> Path | dict:
    """What `tfo VERB` runs: FILE, or the cluster file the flags and the command after `--`
    make; with `--on KIND` (`--on slurm`), that job as that scheduler's. Raises SpecError (a
    FlagError where the flags or the command are wrong) with the user's message."""
    source = _file_or_command(command, file, flags, verb)
    if slurm is None or (slurm.on is None and not slurm.given()):
        return source
    try:
        data = source
        if isinstance(source, Path):
            data = read_data(source)
            if isinstance(data, dict) and {"run_id", "spec", "tasks"} <= data.keys():
                raise FlagError(f"--on: {source} is a run's plan.json, already placed; give "
                                "the cluster file")
        return on_scheduler(data, slurm)
    except SpecFileError as e:
        raise SpecError(str(e)) from None


CLUSTER_SUFFIXES = (".yaml", ".yml", ".json")
SCRIPT_SUFFIXES = (".py", ".pyw", ".ipynb", ".sh")


def _not_a_script(file: Path, flags: QuickFlags, verb: str) -> None:
    """A script given where a cluster file goes (`tfo run train.py`) is refused with the
    command that runs it, not with a YAML parser's complaint about line 19. A file of another
    name that does not read as a cluster file gets the hint next to the parser's words."""
    suffix = file.suffix.lower()
    if suffix in CLUSTER_SUFFIXES:
        return
    program = ["python", str(file)] if suffix != ".sh" else ["bash", str(file)]
    hint = shlex.join(["tfo", verb, *(flags.args() or ["--workers", "2"]), "--", *program])
    if suffix in SCRIPT_SUFFIXES:
        raise FlagError(f"{file} is a script, not a cluster file: to run it as a job's "
                        f"tasks, give the command after --: {hint}")
    try:
        data = read_data(file)
    except SpecFileError as e:
        if not file.is_file():
            return  # the cluster file's own message (no such file) says it
        raise FlagError(f"{e}\n(if {file} is a script, not a cluster file, give the command "
                        f"after --: {hint})") from None
    if not isinstance(data, dict):
        raise FlagError(f"{file}: not a cluster file (no mapping at its top level); if it is "
                        f"a script, give the command after --: {hint}")


def _file_or_command(command: list[str] | None, file: Path | None, flags: QuickFlags,
                     verb: str) -> Path | dict:
    usage = USAGE.format(verb)
    if command is not None and file is not None:
        raise FlagError(f"both a file ({file}) and a command after -- ({shlex.join(command)}); "
                        f"{usage}")
    if command is None and file is None:
        raise FlagError(f"nothing to run: {usage}")
    if file is not None:
        _not_a_script(file, flags, verb)
        if flags.given():
            raise FlagError(f"{', '.join(flags.given())}: these flags make a cluster for a "
                            f"command after --; {file} says it all already (edit it instead)")
        return file
    if flags.hosts_file is not None:
        flags = replace(flags, hosts_data=read_hosts_file(Path(flags.hosts_file)))
    return spec_from_command(command, flags)
