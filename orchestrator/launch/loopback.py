"""Keep a job whose tasks are all on this machine off the network.

TensorFlow's gRPC servers have no authentication and run whatever operations a client sends
(TensorFlow's SECURITY.md: trusted networks only), and TF 2.21 gives no way to say where
they listen: `GrpcServer::Init` listens on "0.0.0.0:" (or "[::]:") + the task's port, and
neither ServerDef, ConfigProto nor an environment variable (TF_GRPC_REUSE_PORT and
TF_GRPC_DEFAULT_OPTIONS are all it reads) names an address. gRPC then binds the IPv6
wildcard, dual-stack: every interface, IPv4 and IPv6 (`ss -ltn`: `*:20000`).

So the tasks of an all-local job run with a tiny LD_PRELOAD library (`SHIM_SOURCE`) whose
bind() turns a TCP bind to every interface into one to the loopback: 0.0.0.0 → 127.0.0.1,
[::] → ::ffff:127.0.0.1 on a dual-stack socket (IPv4 loopback, what `localhost` reaches)
or ::1 on an IPv6-only one. TensorFlow calls libc's bind() through the PLT
(libtensorflow_cc.so.2 imports it), so the preload sees it; so do the script's own servers
and any process the task starts (the environment is inherited). Outward connections are
untouched (connect() binds nothing), and so is UDP: a UDP socket bound to every interface is
usually a client's. Nothing needs root. Why not the alternatives: an unprivileged user and
network namespace has no route out (a script could not download its data or write to a
remote store) unless a user-space network stack (slirp4netns, pasta) is installed; a
firewall rule or a cgroup BPF bind hook needs root.

The library is built at first use with the system's C compiler (`cc`, 0.1-0.3 s) into
`$XDG_CACHE_HOME/tfo/` (~/.cache/tfo), named by its source's hash, and reused from then on.
Where it cannot be built (no compiler), the tasks listen on every interface and tfo says
so once, at the start, with what the user can do (`unconfined_warning`).

Design: Who can reach a task's servers
====================

TensorFlow's gRPC servers have no authentication and run the operations any client sends,
and TF 2.21 gives no way to say where they listen: `GrpcServer::Init` listens on
`0.0.0.0:`/`[::]:` plus the port, and neither ServerDef, ConfigProto nor an environment
variable (it reads TF_GRPC_REUSE_PORT and TF_GRPC_DEFAULT_OPTIONS) names an address; gRPC
binds `[::]` dual-stack, every interface. So when a task's whole cluster is on this machine
(`loopback.loopback_only`: every TF_CONFIG address `localhost`, 127.0.0.1 or ::1), the local
backend starts it with `LD_PRELOAD` of a 60-line C library (`launch/loopback.py`) whose
`bind()` turns a TCP bind to every interface into one to the loopback (0.0.0.0 → 127.0.0.1;
`[::]` → `::ffff:127.0.0.1` on a dual-stack socket, `::1` on an IPv6-only one). TensorFlow
calls libc's `bind` through the PLT (libtensorflow_cc.so.2 imports it), and the environment
reaches everything the task starts; `connect()` and UDP are untouched, so the task reaches
out as before. Chosen over an unprivileged user and network namespace (no route out without
slirp4netns or pasta, which a user may not have) and a firewall rule or cgroup BPF bind hook
(root). The library is built at first use with the system's `cc` (0.05-0.08 s) into
`~/.cache/tfo/loopback-<hash of its source>.so` (atomically: a concurrent tfo never loads
half a file) and found there from then on; a task starts in the same time with it (26.3 ms
for `python -m worker_entry.markers`, median of 20, both ways). Where it cannot be built,
`LocalBackend.sync` returns one warning, printed at the start: the ports, that they listen
on every interface, and what to do (install a C compiler, or a trusted network or firewall).
Lab jobs listen on every interface of their hosts: `tfo check` says so with the hosts and
ports, and that the network must be trusted (`listen_note`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.planning.plan import TaskPlan

SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

/* tfo: a TCP bind to every interface binds the loopback instead (orchestrator/launch/
   loopback.py). */
typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real;
    if (!real) real = (bind_fn)dlsym(RTLD_NEXT, "bind");
    int type = 0;
    socklen_t type_len = sizeof type;
    if (addr == NULL || getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0
            || type != SOCK_STREAM)
        return real(fd, addr, len);
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in in4;
        memcpy(&in4, addr, sizeof in4);
        if (in4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real(fd, (const struct sockaddr *)&in4, sizeof in4);
        }
    } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 in6;
        memcpy(&in6, addr, sizeof in6);
        if (IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr)) {
            int v6only = 0;
            socklen_t opt_len = sizeof v6only;
            if (getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &opt_len) != 0)
                v6only = 0;
            if (v6only) {
                in6.sin6_addr = in6addr_loopback;
            } else {  /* ::ffff:127.0.0.1 */
                memset(&in6.sin6_addr, 0, sizeof in6.sin6_addr);
                in6.sin6_addr.s6_addr[10] = 0xff;
                in6.sin6_addr.s6_addr[11] = 0xff;
                in6.sin6_addr.s6_addr[12] = 127;
                in6.sin6_addr.s6_addr[15] = 1;
            }
            return real(fd, (const struct sockaddr *)&in6, sizeof in6);
        }
    }
    return real(fd, addr, len);
}
"""

# Addresses in a TF_CONFIG that are this machine's loopback: a cluster of only these is one
# nobody else needs to reach.
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]", "ip6-localhost"})
PRELOAD = "LD_PRELOAD"
COMPILE_SECONDS = 30.0


class ShimError(Exception):
    """The shim cannot be built here; the message says why."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tfo"


def shim_path(cache: Path | None = None) -> Path:
    digest = hashlib.sha256(SHIM_SOURCE.encode()).hexdigest()[:16]
    return (cache or cache_dir()) / f"loopback-{digest}.so"


def build_shim(cache: Path | None = None) -> Path:
    """The shim's path, built first if it is not in the cache yet. Raises ShimError."""
    path = shim_path(cache)
    if path.is_file():
        return path
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") \
        or shutil.which("clang")
    if not cc:
        raise ShimError("no C compiler found: cc, gcc, clang")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ShimError(f"cannot create {path.parent}: {e.strerror or e}") from None
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".build-") as tmp:
        source, built = Path(tmp, "loopback.c"), Path(tmp, "loopback.so")
        source.write_text(SHIM_SOURCE)
        try:
            done = subprocess.run(
                [cc, "-shared", "-fPIC", "-O2", "-o", str(built), str(source), "-ldl"],
                capture_output=True, text=True, timeout=COMPILE_SECONDS, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ShimError(f"{cc} failed: {e}") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ShimError(f"{cc} failed: {last}")
        os.replace(built, path)  # atomic: a concurrent tfo sees no half-written library
    return path


def loopback_only(addresses: Iterable[str]) -> bool:
    """Are all these `host:port` addresses this machine's loopback? (Then no task of the
    job needs to be reached from elsewhere.)"""
    hosts = [a.rsplit(":", 1)[0] for a in addresses]
    return bool(hosts) and all(h in LOOPBACK_HOSTS for h in hosts)


def with_preload(env: dict[str, str], shim: Path) -> dict[str, str]:
    """`env` with the shim first in LD_PRELOAD, keeping what the user preloads."""
    mine = env.get(PRELOAD, "")
    return {**env, PRELOAD: f"{shim} {mine}".strip()}


def unconfined_warning(why: str, ports: Iterable[int]) -> str:
    return (f"warning: this job's TensorFlow servers ({_ports(ports)}) listen on every "
            f"interface, reachable from other machines, and run whatever a client sends: tfo "
            f"could not build its loopback shim ({why}). Install a C compiler (e.g. `apt "
            f"install gcc`) so tfo keeps them to this machine, or run only where the "
            f"network is trusted or a firewall closes these ports.")


def _ports(ports: Iterable[int]) -> str:
    listed = sorted(ports)
    return f"port{'s' if len(listed) > 1 else ''} {', '.join(map(str, listed))}"


def cluster_addresses(task: TaskPlan) -> list[str]:
    """Every `host:port` of the task's TF_CONFIG cluster."""
    return [a for addresses in task.tf_config.get("cluster", {}).values() for a in addresses]


def listen_note(tasks: list[TaskPlan]) -> str:
    """For `tfo check`: which interfaces the job's TensorFlow servers will listen on."""
    if tasks and loopback_only(cluster_addresses(tasks[0])):
        return local_note(try_build()[1])
    hosts: dict[str, list[int]] = {}
    for t in tasks:
        hosts.setdefault(t.placement.host, []).append(t.port)
    return lab_note(hosts)


def lab_note(hosts: dict[str, list[int]]) -> str:
    """For `tfo check`: where the servers of a job with tasks on other machines listen."""
    where = "; ".join(f"{host}: {_ports(ports)}" for host, ports in sorted(hosts.items()))
    return (f"TensorFlow's servers listen on every interface of their host ({where}): they "
            f"have no authentication and run whatever a client sends, so the network "
            f"between these hosts must be trusted.")


def local_note(shim_error: str | None) -> str:
    if shim_error is None:
        return ("TensorFlow's servers listen on this machine's loopback only "
                "(127.0.0.1): tfo's loopback shim keeps them off the network.")
    return (f"TensorFlow's servers will listen on every interface: tfo cannot build its "
            f"loopback shim ({shim_error}).")


def try_build(cache: Path | None = None) -> tuple[Path | None, str | None]:
    """The shim's path, or None and why there is none."""
    try:
        return build_shim(cache), None
    except ShimError as e:
        return None, str(e)
