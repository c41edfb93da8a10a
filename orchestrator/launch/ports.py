"""Local ports: is one free, who holds it, and a free one for `port: auto` (one no other
live tfo job holds: worker_entry/portlocks.py)."""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Callable


def port_free(port: int) -> bool:
    """True when a TF server could listen on `port` on every interface right now."""
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((addr, port))
            except OSError:
                return False
    return True


def port_holder(port: int) -> str | None:
    """'pid 123 (python3)' for the process listening on `port`, where psutil can tell."""
    import psutil  # only for a port in use: `tfo plan` goes without

    with contextlib.suppress(psutil.Error, OSError):
        for c in psutil.net_connections(kind="tcp"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                try:
                    return f"pid {c.pid} ({psutil.Process(c.pid).name()})"
                except psutil.Error:
                    return f"pid {c.pid}"
    return None


def port_problem(port: int) -> str | None:
    """None when free; otherwise what a user needs to know to free it."""
    if port_free(port):
        return None
    holder = port_holder(port)
    return f"port {port} is in use" + (f" by {holder}" if holder else "")


def free_ports(count: int, avoid: set[int] = frozenset(),
               reserve: Callable[[int], bool] | None = None) -> list[int]:
    """`count` distinct ports the kernel says are free now, none of them in `avoid`; with
    `reserve`, only ports it made this job's (False: another live job holds it, perhaps
    between two attempts of its task)."""
    ports: list[int] = []
    socks = []
    try:
        while len(ports) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)  # held open until all are picked, so they are distinct
            s.bind(("0.0.0.0", 0))
            port = s.getsockname()[1]
            if port not in avoid and _free_on_ipv6(port) \
                    and (reserve is None or reserve(port)):
                ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports


def _free_on_ipv6(port: int) -> bool:
    """Whether no IPv6 listener holds the port (`[::1]:P` or `[::]:P`, v6 only): the kernel's
    IPv4 pick does not see one, and a task's gRPC server, which binds both families, would
    fail on it. True where this machine has no IPv6."""
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:
        return True
    try:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind(("::", port))
    except OSError as e:
        return e.errno != errno.EADDRINUSE
    finally:
        s.close()
    return True
