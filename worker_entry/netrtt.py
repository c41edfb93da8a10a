"""The round-trip time of a task's TCP connections to other hosts, as its host's kernel
keeps it, read by the task's wrapper (issue 41, item 3: `cause: "network"`).

    rtt = RttMeter()
    fields = rtt.measure(pids)   # {"rtt": 21.4, "rtt_hosts": 2}: the `usage` marker's

The kernel keeps, for every TCP connection, a smoothed round-trip time (tcp_info's
`tcpi_rtt`, us), from the ACKs of the data it sends. The wrapper asks it through netlink's
sock_diag (INET_DIAG: a raw AF_NETLINK socket, the structs packed here: no dependency, no
fork of `ss`) for the established TCP sockets of its host's network namespace, and keeps
only the task's own (the socket inodes in /proc/PID/fd of the task's processes) whose
peer is another host (not loopback, not the socket's own address: a host's link carries
only those) and that sent data acknowledged since the last read (an idle connection's
estimate is as old as its last exchange). Per remote host the median of its connections'
`rtt`; then `rtt` is the *fastest* remote host's, in ms, and `rtt_hosts` how many hosts.

Why the fastest path: a worker whose own link is slow is slow to every peer; each of its
peers is slow only to it and fast to the others. So in a group of three or more, the slow
link's task is the one whose fastest path is slow (orchestrator/loop/netslow.py). Between
two hosts a link is both ends': the two see the same RTT and nothing tells whose link it is.

Cost: one netlink dump of the namespace's established TCP sockets and a readlink per open fd
of the task's processes, every USAGE_SECONDS: 0.6-0.7 ms of the wrapper's CPU a read
(measured: 50 reads for a lab host's MultiWorkerMirrored worker, 120 threads, 13 fds, load
13; 200 in this machine's root namespace, 23 sockets), 0.03 % of a core; `ss` would fork a
process each time. Elsewhere than Linux (no AF_NETLINK), or where sock_diag is refused, it
measures nothing and sends nothing.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import statistics
import struct
from collections.abc import Iterable, Iterator
from typing import Any

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_DONE, _NLMSG_ERROR = 3, 2
_TCP_ESTABLISHED = 1
_INET_DIAG_INFO = 2
_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
# inet_diag_req_v2: family, protocol, ext, pad, states, then inet_diag_sockid (48 bytes)
_REQ = struct.Struct("=BBBBI48x")
# inet_diag_msg: family, state, timer, retrans; sockid (sport, dport big-endian, src[16],
# dst[16], if, cookie[8]); expires, rqueue, wqueue, uid, inode
_MSG = struct.Struct("=BBBB2s2s16s16sI8sIIIII")
_RTA = struct.Struct("=HH")
# tcp_info: 8 bytes of u8 fields, then u32s: tcpi_rtt is the 16th (offset 68); u64
# tcpi_bytes_acked at offset 120 (Linux 4.1+)
_TCPI_RTT, _TCPI_BYTES_ACKED = 68, 120


def socket_inodes(pids: Iterable[int]) -> set[int]:
    """The inodes of the sockets the processes hold open (gone processes: none)."""
    inodes: set[int] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    return inodes


def _dump(family: int) -> Iterator[tuple[int, bytes, bytes, bytes]]:
    """(inode, local address, remote address, tcp_info) of each established TCP socket of
    `family` in this network namespace."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        req = _REQ.pack(family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1), 0,
                        1 << _TCP_ESTABLISHED)
        nl.send(_NLMSG.pack(_NLMSG.size + len(req), _SOCK_DIAG_BY_FAMILY,
                            _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0) + req)
        size = 16 if family == socket.AF_INET6 else 4
        while True:
            data = nl.recv(65536)
            at = 0
            while at + _NLMSG.size <= len(data):
                length, kind = _NLMSG.unpack_from(data, at)[:2]
                if kind in (_NLMSG_DONE, _NLMSG_ERROR) or length < _NLMSG.size:
                    return
                body = data[at + _NLMSG.size:at + length]
                at += (length + 3) & ~3
                if len(body) < _MSG.size:
                    continue
                msg = _MSG.unpack_from(body)
                info, rta = b"", _MSG.size
                while rta + _RTA.size <= len(body):
                    rlen, rtype = _RTA.unpack_from(body, rta)
                    if rlen < _RTA.size:
                        break
                    if rtype == _INET_DIAG_INFO:
                        info = body[rta + _RTA.size:rta + rlen]
                    rta += (rlen + 3) & ~3
                yield msg[-1], msg[6][:size], msg[7][:size], info


def _remote(local: bytes, remote: bytes) -> str | None:
    """The remote host's address, or None for a connection that stays on this host."""
    if local == remote:
        return None
    addr = ipaddress.ip_address(remote)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        addr = addr.ipv4_mapped
    return None if addr.is_loopback else str(addr)


class RttMeter:
    """The task's connections' RTT to other hosts (module doc), over the data each sent
    since the last measure."""

    def __init__(self) -> None:
        self._acked: dict[int, int] = {}  # bytes acknowledged so far, by socket inode
        self.works = hasattr(socket, "AF_NETLINK")

    def measure(self, pids: Iterable[int]) -> dict[str, Any]:
        """{"rtt": ms, "rtt_hosts": n}, or {} when no connection to another host sent data
        since the last read (or the host cannot say)."""
        if not self.works:
            return {}
        mine = socket_inodes(pids)
        acked: dict[int, int] = {}
        by_host: dict[str, list[float]] = {}
        try:
            for family in (socket.AF_INET, socket.AF_INET6):
                for inode, local, remote, info in _dump(family):
                    if inode not in mine or len(info) < _TCPI_BYTES_ACKED + 8:
                        continue
                    host = _remote(local, remote)
                    if host is None:
                        continue
                    rtt_us = struct.unpack_from("=I", info, _TCPI_RTT)[0]
                    acked[inode] = struct.unpack_from("=Q", info, _TCPI_BYTES_ACKED)[0]
                    if acked[inode] > self._acked.get(inode, acked[inode]):
                        by_host.setdefault(host, []).append(rtt_us / 1000)
        except TimeoutError:  # a kernel too busy to answer in a second: next time
            return {}
        except (OSError, struct.error, ValueError):  # no sock_diag here (a container
            self.works = False  # without it), or answers we cannot read: nothing to say
            return {}
        self._acked = acked
        if not by_host:
            return {}
        return {"rtt": round(min(statistics.median(v) for v in by_host.values()), 2),
                "rtt_hosts": len(by_host)}
