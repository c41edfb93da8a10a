"""The worker of a synchronous job whose network link is slow (orchestrator/loop/netslow.py)
and the wrapper's read of its task's round-trip times (worker_entry/netrtt.py): the judge
on a fake clock, a recorded real run replayed, the usage marker's fields, and the read on a
real TCP connection across a network namespace. The real job: tests/test_netslow_lab.py."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.loop import netslow
from orchestrator.loop.markers import BadMarker, Usage, read_marker
from worker_entry import netrtt
from worker_entry.markers import MARK

HOLD = netslow.HOLD_SECONDS
W = ("worker:0", "worker:1", "worker:2")


def at(values: list, i: int):
    return values[min(i, len(values) - 1)]


def rounds(table: dict[str, list[float | None]], count: int = 40,
           attempts: dict[str, list[int]] | None = None,
           stepping: dict[str, list[bool]] | None = None) -> list[tuple[float, str]]:
    """A round every 2 s (the usage interval), each task's rtt (ms; None: none) from its
    list (the last repeats); the verdicts said, as (seconds since the first round, task)."""
    memory, said, out = netslow.Memory(), set(), []
    for i in range(count):
        now = 1000.0 + 2.0 * i
        samples = [netslow.Sample(t, at((attempts or {}).get(t, [0]), i),
                                  at((stepping or {}).get(t, [True]), i), at(v, i), now)
                   for t, v in table.items()]
        out += [(now - 1000.0, s.task) for s in netslow.judge(samples, memory, said, now)]
    return out


# The first verdict: the first round whose window is full (MIN_SAMPLES markers: 4 s in) and
# over the line starts the hold; HOLD later it is said.
FIRST = 2.0 * (netslow.MIN_SAMPLES - 1) + HOLD
CASES = [
    ("one worker slow to every peer: named once, after the hold",
     {"worker:0": [0.8], "worker:1": [1.1], "worker:2": [9.0]}, {}, [(FIRST, "worker:2")]),
    ("the chief's link: named too (a link is not extra work)",
     {"worker:0": [12.0], "worker:1": [1.1], "worker:2": [0.9]}, {}, [(FIRST, "worker:0")]),
    ("a balanced job: none", {"worker:0": [0.8], "worker:1": [2.0], "worker:2": [1.3]}, {}, []),
    ("three times its peers, but by under MARGIN ms: none",
     {"worker:0": [0.3], "worker:1": [0.3], "worker:2": [1.5]}, {}, []),
    ("MARGIN ms above, but under three times: none (a crowded host's RTTs all grow)",
     {"worker:0": [6.0], "worker:1": [6.0], "worker:2": [12.0]}, {}, []),
    ("a burst of one marker in five does not lift the window's least",
     {"worker:0": [0.8], "worker:1": [1.0], "worker:2": [1.0, 1.0, 1.0, 1.0, 25.0] * 8}, {}, []),
    ("two tasks: a link between two hosts is both's, no verdict",
     {"worker:0": [0.8], "worker:1": [9.0]}, {}, []),
    ("a task with no connection to another host (one host): nothing judged",
     {"worker:0": [0.8], "worker:1": [None], "worker:2": [9.0]}, {}, []),
    ("slow for under the hold, then back: none",
     {"worker:0": [1.0], "worker:1": [1.0], "worker:2": [9.0] * 15 + [1.0]}, {}, []),
    ("a restart in the group starts the hold over",
     {"worker:0": [1.0], "worker:1": [1.0], "worker:2": [9.0]},
     {"attempts": {"worker:1": [0] * 10 + [1]}}, [(20.0 + FIRST, "worker:2")]),
    ("a task between fits (not stepping) starts the hold over",
     {"worker:0": [1.0], "worker:1": [1.0], "worker:2": [9.0]},
     {"stepping": {"worker:0": [True] * 10 + [False] + [True]}},
     [(22.0 + FIRST, "worker:2")]),
]


@pytest.mark.parametrize("what, table, extra, expected", CASES, ids=[c[0] for c in CASES])
def test_judge(what, table, extra, expected):
    assert rounds(table, **extra) == expected


def test_said_once_whatever_the_signal():
    """A task another signal named (`said` is SlowWatch's) is not named again."""
    memory, said = netslow.Memory(), {"worker:2"}
    for i in range(40):
        samples = [netslow.Sample(t, 0, True, r, 2.0 * i) for t, r in
                   zip(W, (1.0, 1.0, 9.0), strict=True)]
        assert netslow.judge(samples, memory, said, 2.0 * i) == []


def test_a_stale_marker_is_no_new_sample():
    """A usage seen again (the same `at`) adds nothing to the window: a task whose wrapper
    fell silent never fills it."""
    memory, out = netslow.Memory(), []
    for i in range(40):
        now = 2.0 * i
        samples = [netslow.Sample("worker:0", 0, True, 1.0, now),
                   netslow.Sample("worker:1", 0, True, 1.0, now),
                   netslow.Sample("worker:2", 0, True, 9.0, 0.0)]
        out += netslow.judge(samples, memory, set(), now)
    assert out == []


def test_words_and_figures():
    slow = netslow.SlowLink("worker:2", 7.234, 0.71, 10.0)
    assert slow.figures() == {"rtt_ms": 7.23, "peers_rtt_ms": 0.71}
    assert slow.words() == ("worker:2 is slow: its connections to every other host take "
                            "7.2 ms a round trip while its peers' fastest take 0.7: its "
                            "network link, for 30 s and more")


def replay(name: str) -> tuple[list[tuple[int, str]], int]:
    """A real run's `usage` markers (tests/data/netrtt/) through `judge`, a round each:
    the verdicts as (marker index, task), and the marker at which the link was slowed."""
    recorded = json.loads((Path(__file__).parent / "data" / "netrtt" / f"{name}.json")
                          .read_text())
    tasks, every = recorded["tasks"], recorded["interval_seconds"]
    memory, said, out = netslow.Memory(), set(), []
    for i in range(min(len(v) for v in tasks.values())):
        samples = [netslow.Sample(t, 0, v[i][1], v[i][0], i * every) for t, v in tasks.items()]
        out += [(i, s.task) for s in netslow.judge(samples, memory, said, i * every)]
    return out, recorded["slowed_at_marker"]


def test_recorded_run():
    """Recorded on the SSH lab (3 hosts, network namespaces on this 2-core machine at load
    9-16): worker:2's link slowed from marker 53 on (the job from 20-33 steps/s to 7-8) is
    named 46 s after (23 markers; 45 s in the real run), and nobody else, before or after."""
    named, slowed = replay("slowed_worker2")
    assert named == [(slowed + 23, "worker:2")]


# --- the usage marker: the task's word, checked ---------------------------------------------

def test_the_usage_marker_carries_the_rtt():
    line = MARK + '{"event": "usage", "cpu": 20, "rss": 1, "rtt": 7.25, "rtt_hosts": 2}'
    marker = read_marker(line)
    assert isinstance(marker, Usage) and (marker.rtt, marker.rtt_hosts) == (7.25, 2)
    assert read_marker(MARK + '{"event": "usage", "cpu": 20, "rss": 1}').rtt is None


@pytest.mark.parametrize("bad", ['"rtt": -1', '"rtt": "fast"', '"rtt": NaN', '"rtt_hosts": 0'])
def test_a_bad_rtt_is_refused(bad):
    with pytest.raises(BadMarker):
        read_marker(MARK + '{"event": "usage", "cpu": 20, "rss": 1, ' + bad + "}")


# --- the wrapper's read: a real connection to another network namespace --------------------

@contextlib.contextmanager
def other_host():
    """A network namespace on a veth of its own (10.232.N.2), an echo server in it."""
    ns, veth = f"tfonr{os.getpid() % 100000}", f"tfonr{os.getpid() % 100000}a"
    net = f"10.232.{os.getpid() % 250}"
    ip = ["ip"]
    try:
        subprocess.run([*ip, "netns", "add", ns], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"no network namespaces here: {e}")
    server = None
    try:
        for argv in ([*ip, "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                      "netns", ns],
                     [*ip, "addr", "add", f"{net}.1/24", "dev", veth],
                     [*ip, "link", "set", veth, "up"],
                     [*ip, "-n", ns, "addr", "add", f"{net}.2/24", "dev", "eth0"],
                     [*ip, "-n", ns, "link", "set", "eth0", "up"]):
            subprocess.run(argv, check=True, capture_output=True)
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c",
             f"import socket\ns = socket.create_server(('{net}.2', 5599))\n"
             "while True:\n    a, _ = s.accept()\n"
             "    while (d := a.recv(65536)):\n        a.sendall(d)\n"])
        for _ in range(100):
            with contextlib.suppress(OSError), \
                    socket.create_connection((f"{net}.2", 5599), timeout=0.2):
                break
            time.sleep(0.1)
        yield f"{net}.2"
    finally:
        if server:
            server.kill()
            server.wait()
        subprocess.run([*ip, "link", "del", veth], capture_output=True)
        subprocess.run([*ip, "netns", "del", ns], capture_output=True)


@pytest.mark.timeout(60)
def test_the_read_sees_its_own_connection_to_another_host():
    """A connection to another host that sent data since the last read: its RTT, as `ss`
    shows it; a loopback connection of the same process, and an idle one: not counted."""
    with other_host() as address:
        meter = netrtt.RttMeter()
        with socket.create_connection((address, 5599), timeout=5) as c:
            server = socket.create_server(("127.0.0.1", 0))
            local = socket.create_connection(server.getsockname())
            peer, _ = server.accept()
            assert meter.measure([os.getpid()]) == {}  # nothing sent since: no figure
            for _ in range(20):
                c.sendall(b"x" * 1000)
                c.recv(65536)
                local.sendall(b"y" * 1000)
                peer.recv(65536)
            got = meter.measure([os.getpid()])
            assert got["rtt_hosts"] == 1 and 0 < got["rtt"] < 50, got
            assert meter.measure([os.getpid()]) == {}  # idle since: no figure
            for s in (local, peer, server):
                s.close()
        assert meter.measure([os.getpid()]) == {}
    assert meter.measure([999_999_999]) == {}  # a process that is gone: nothing


def test_the_watch_names_the_worker_behind_a_slow_link(monkeypatch):
    """SlowWatch in a MultiWorkerMirrored job: each task's last usage (its rtt) in; one
    `task_slow` (cause network, its figures), the console's line and the table's mark out;
    the CPU alike on every worker, so no other cause fires."""
    from orchestrator.loop import slowness, starved
    from orchestrator.planning.strategy import RULES
    from worker_entry.markers import Role, Strategy

    monkeypatch.setattr(slowness, "shown", lambda rate, now: rate)
    rtts = {"worker:0": 0.7, "worker:1": 0.9, "worker:2": 6.5}

    def record(name: str) -> SimpleNamespace:
        work = SimpleNamespace(rate=3.0, usage_at=None, slow=False, usage=Usage(
            event="usage", cpu=20.0, wait=30.0, cpus=2, rss=1, rtt=rtts[name], rtt_hosts=2),
            waits=starved.Waits())
        return SimpleNamespace(name=name, role=Role.WORKER, attempt=0, task=SimpleNamespace(
            index=int(name[-1])), state=SimpleNamespace(live=True),
            current=SimpleNamespace(work=work))

    records = {name: record(name) for name in rtts}
    written, echoed = [], []
    job = SimpleNamespace(
        records=records, rules=RULES[Strategy.MULTI_WORKER_MIRRORED],
        plan=SimpleNamespace(strategy=Strategy.MULTI_WORKER_MIRRORED,
                             cluster={"worker": ["a:1", "b:1", "c:1"]}),
        echo=lambda who, text: echoed.append((who, text)),
        events=SimpleNamespace(write=lambda event, task, **f: written.append((event, task, f))))
    watch = slowness.SlowWatch(job)
    for t in range(0, 60):
        for r in records.values():
            r.current.work.usage_at = float(t - t % 2)  # a usage every 2 s
        watch.tick(float(t))
    assert [(e, task) for e, task, _ in written] == [("task_slow", "worker:2")]
    fields = written[0][2]
    assert (fields["cause"], fields["rtt_ms"], fields["peers_rtt_ms"],
            fields["lagging_seconds"]) == ("network", 6.5, 0.8, 30.0)
    assert echoed == [("tfo", fields["why"])]
    assert [r.current.work.slow for r in records.values()] == [False, False, True]
