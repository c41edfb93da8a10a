"""worker_entry.listen: how a wrapper sees a script task's port listen, on real sockets."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest

from worker_entry import listen


@contextlib.contextmanager
def sockets(count: int, family: int = socket.AF_INET, host: str = "127.0.0.1",
            listen_too: bool = True) -> Iterator[list[int]]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(family, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
            if listen_too:
                s.listen()
        yield [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def both_ways(port: int) -> tuple[bool, bool]:
    return port in listen._listening_ports_netlink(), listen._listening_proc(port)


def test_a_listening_port_is_seen_both_ways_and_gone_once_closed() -> None:
    with sockets(1) as (port,):
        assert listen.listening(port)
        assert both_ways(port) == (True, True)
    assert not listen.listening(port)
    assert both_ways(port) == (False, False)


def test_an_ipv6_listener_is_seen() -> None:
    if not socket.has_ipv6:
        pytest.fail("this machine has no IPv6: the test needs ::1")
    try:
        ctx = sockets(1, socket.AF_INET6, "::1")
        port = ctx.__enter__()[0]
    except OSError as e:
        pytest.fail(f"cannot listen on ::1 here: {e}")
    try:
        assert listen.listening(port)
        assert both_ways(port) == (True, True)
    finally:
        ctx.__exit__(None, None, None)


def test_bound_or_connected_is_not_listening() -> None:
    with sockets(1, listen_too=False) as (bound,):
        assert not listen.listening(bound)
        assert both_ways(bound) == (False, False)
    with sockets(1) as (server,):
        client = socket.create_connection(("127.0.0.1", server))
        try:
            own = client.getsockname()[1]  # an established socket's port
            assert not listen.listening(own)
            assert both_ways(own) == (False, False)
        finally:
            client.close()


def test_replies_over_several_datagrams_are_all_read() -> None:
    """300 listeners: the kernel's dump spans several netlink datagrams."""
    with sockets(300) as ports:
        found = listen._listening_ports_netlink()
        assert set(ports) <= found
        assert listen.listening(ports[0]) and listen.listening(ports[-1])


def test_without_netlink_the_proc_tables_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused() -> set[int]:
        raise OSError("netlink refused")

    monkeypatch.setattr(listen, "_listening_ports_netlink", refused)
    with sockets(1) as (port,):
        assert listen.listening(port)
    assert not listen.listening(port)
