"""Elastic jobs (issue 27): who trains after a host is lost or back, the plan of the new
size, and the backup the group resumes from. The decisions are pure (table-driven here);
the backups are real directories; one TensorFlow test checks the premise: a group started
smaller on the same backups resumes where the bigger one stopped."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.elastic import backups
from orchestrator.elastic import groups as elastic
from orchestrator.elastic.backups import TASK_DIR, told
from orchestrator.elastic.groups import (
    NUM_WORKERS_ENV,
    Act,
    Group,
    NoResize,
    Resize,
    Why,
    backup_dirs,
    first_group,
    lost_why,
    on_answer,
    on_lost,
    plan_for,
    pool,
    previous_dirs,
    ps_on_answer,
    ps_on_lost,
    resume_from,
    to_probe,
)
from orchestrator.launch.ports import free_ports
from orchestrator.planning.plan import Plan, make_plan
from orchestrator.planning.spec import ClusterSpec, ElasticSpec, parse_spec
from tests.conftest import REPO
from tests.fakes import ELASTIC, HOSTS, PLACES, PORTS, elastic_spec, plan0, write_backup
from worker_entry.markers import Role, num_workers

E = ELASTIC.elastic
FULL = Group((0, 1, 2))  # lab4 spare


def test_pool_and_first_group_and_probes() -> None:
    assert [(p.slot, p.host, p.port) for p in PLACES] == [
        (0, "lab1", 2000), (1, "lab2", 2001), (2, "lab3", 2002), (3, "lab4", 2003)]
    assert first_group(E, PLACES) == FULL
    no_max = parse_spec(elastic_spec({"min_workers": 1})).elastic
    assert first_group(no_max, PLACES).members == (0, 1, 2, 3)
    assert to_probe(PLACES, FULL) == ["lab4"]
    assert to_probe(PLACES, Group((0, 2), lost=frozenset({"lab2"}))) == ["lab2", "lab4"]


@pytest.mark.parametrize(("kw", "why"), [
    ({}, None), ({"start_failed": True}, Why.UNREACHABLE), ({"lifeline_cut": True}, Why.LIFELINE),
    ({"failures_in_row": 2}, None), ({"failures_in_row": 3}, Why.FAILURES),
])
def test_when_a_host_counts_as_lost(kw: dict, why: Why | None) -> None:
    assert lost_why(E, **kw) is why  # lost_after_failures: 3 by default


# (case, group, lost hosts, answering, → kind ("policy": the restart policy decides), members,
#  the event's from/to/hosts, parts of its words)
SHRINK = [
    ("a worker's host", FULL, {"lab2": Why.LIFELINE}, (), Resize, (0, 2), (3, 2, ["lab2"]),
     ["lab2 lost: its lifeline went silent"]),
    ("the chief's host: worker 0 moves", FULL, {"lab1": Why.UNREACHABLE}, (), Resize, (1, 2),
     (3, 2, ["lab1"]), ["lab1 lost: did not answer", "worker 0 (the chief) is now on lab2"]),
    ("a spare that answered takes its place", FULL, {"lab3": Why.FAILURES}, ("lab4",), Resize,
     (0, 1, 3), (3, 3, ["lab3", "lab4"]), ["failed 3 times in a row", "lab4 takes its place"]),
    ("a host the group does not use", FULL, {"lab4": Why.UNREACHABLE}, (), NoResize, (0, 1, 2),
     None, ["no worker of the group on it"]),
    ("below min_workers", Group((0, 1), resizes=1), {"lab2": Why.LIFELINE}, (), "policy",
     (0, 1), None, ["1 worker(s) left, fewer than elastic.min_workers 2",
                    "the restart policy decides"]),
    ("two hosts at once, below min", FULL, {"lab1": Why.LIFELINE, "lab3": Why.LIFELINE}, (),
     "policy", (0, 1, 2), None, ["lab1 lost", "lab3 lost", "1 worker(s) left"]),
    ("max_resizes spent", Group((0, 1, 2), resizes=4), {"lab2": Why.LIFELINE}, (), "policy",
     (0, 1, 2), None, ["no resize left (elastic.max_resizes 4)"]),
]


@pytest.mark.parametrize(("group", "lost", "answering", "kind", "members", "event", "parts"),
                         [c[1:] for c in SHRINK], ids=[c[0] for c in SHRINK])
def test_shrink(group, lost, answering, kind, members, event, parts) -> None:  # noqa: ANN001
    d = on_lost(E, PLACES, group, lost, answering)
    assert type(d) is (NoResize if kind == "policy" else kind)
    assert getattr(d, "follow_policy", False) is (kind == "policy")
    assert d.group.members == members
    assert d.group.lost == group.lost | set(lost)  # remembered, to be probed
    text = d.words if isinstance(d, Resize) else d.reason
    for part in parts:
        assert part in text, text
    if isinstance(d, Resize):
        assert d.group.resizes == group.resizes + 1
        assert (d.event["from"], d.event["to"], d.event["hosts"]) == event
        assert set(d.event) == {"from", "to", "reason", "hosts"}
    else:
        assert d.group.resizes == group.resizes


LOST2 = Group((0, 2), lost=frozenset({"lab2"}), resizes=1)
GROW = [
    ("the lost host is back", LOST2, ("lab2",), Resize, (0, 2, 1), frozenset(), (2, 3, ["lab2"])),
    ("a spare answers", LOST2, ("lab4",), Resize, (0, 2, 3), {"lab2"}, (2, 3, ["lab4"])),
    ("both: one fits under max_workers, in listed order", LOST2, ("lab4", "lab2"), Resize,
     (0, 2, 1), frozenset(), (2, 3, ["lab2"])),
    ("full already", FULL, ("lab4",), NoResize, (0, 1, 2), frozenset(), None),
    ("nobody answers", LOST2, (), NoResize, (0, 2), {"lab2"}, None),
    ("max_resizes spent: stays smaller", Group((0, 2), frozenset({"lab2"}), 4), ("lab2",), NoResize,
     (0, 2), frozenset(), None),
]


@pytest.mark.parametrize(("group", "answering", "kind", "members", "lost", "event"),
                         [c[1:] for c in GROW], ids=[c[0] for c in GROW])
def test_grow(group, answering, kind, members, lost, event) -> None:  # noqa: ANN001
    d = on_answer(E, PLACES, group, answering)
    assert type(d) is kind
    assert not getattr(d, "follow_policy", False)  # a host back never ends anything
    assert d.group.members == members
    assert d.group.lost == lost
    if isinstance(d, Resize):
        assert (d.event["from"], d.event["to"], d.event["hosts"]) == event
        assert "worker 0" not in d.words  # growing never moves the chief


def test_a_grow_onto_a_lab_host_waits_for_its_backups_to_be_fillable() -> None:
    """A joining worker whose backup directory the coordinator cannot fill is named (its
    stale backups would make the group start over)."""
    local_only = lambda host: host == "localhost"  # noqa: E731
    assert elastic.unfilled_joiners(PLACES, LOST2, Group((0, 2, 1)), local_only) == ["lab2"]
    assert elastic.unfilled_joiners(PLACES, LOST2, Group((0, 2, 1)), lambda h: True) == []
    assert elastic.unfilled_joiners(PLACES, FULL, Group((0, 1)), local_only) == []  # a shrink
    local = pool(local_spec(3), PORTS)
    assert elastic.unfilled_joiners(local, Group((0, 1)), Group((0, 1, 2)), local_only) == []


def test_grow_by_more_than_one_up_to_max() -> None:
    e = ElasticSpec(min_workers=1, max_workers=4)
    group = Group((1,), lost=frozenset({"lab1", "lab3"}))
    d = on_answer(e, PLACES, group, ("lab1", "lab3", "lab4"))
    assert isinstance(d, Resize) and d.group.members == (1, 0, 2, 3)
    assert d.event == {"from": 1, "to": 4, "reason": "lab1, lab3, lab4 answered again",
                       "hosts": ["lab1", "lab3", "lab4"]}


def test_a_flapping_host_stops_at_max_resizes() -> None:
    group, sizes = FULL, []
    for _ in range(5):
        group = on_lost(E, PLACES, group, {"lab2": Why.LIFELINE}).group
        group = on_answer(E, PLACES, group, ("lab2",)).group
        sizes.append(len(group.members))
    assert group.resizes == 4 and sizes == [3, 3, 3, 3, 3]
    last = on_lost(E, PLACES, group, {"lab2": Why.LIFELINE})
    assert isinstance(last, NoResize) and last.follow_policy


def test_a_host_with_two_places_goes_as_a_whole() -> None:
    spec = parse_spec(elastic_spec({"min_workers": 1}, ["lab1:auto", "lab2:auto", "lab2:auto"]))
    places = pool(spec, PORTS)
    d = on_lost(spec.elastic, places, first_group(spec.elastic, places), {"lab2": Why.LIFELINE})
    assert isinstance(d, Resize) and d.group.members == (0,) and d.event["to"] == 1


# ---- parameter_server: a lost worker dropped where it is, a lost ps restarts the job -------
PS_SPEC = parse_spec({"name": "p", "strategy": "parameter_server", "job": {"entry": "a.b:c"},
                      "hosts": HOSTS, "elastic": {"min_workers": 2, "max_resizes": 4},
                      "tasks": {"chief": ["lab1:auto"],
                                "worker": ["lab1:auto", "lab2:auto", "lab3:auto"],
                                "ps": ["lab4:auto", "lab3:auto"]}})  # lab3: a worker and a ps
PS_PORTS = {"chief:0": 3000, "worker:0": 3001, "worker:1": 3002, "worker:2": 3003,
            "ps:0": 3004, "ps:1": 3005}
PS_WORKERS, PS_PLACES = pool(PS_SPEC, PS_PORTS), pool(PS_SPEC, PS_PORTS, role=Role.PS)
PS_FULL = Group((0, 1, 2), ps=(0, 1))
LAB2_DROPPED = Group((0, 1, 2), lost=frozenset({"lab2"}), resizes=1, ps=(0, 1),
                     dropped=frozenset({1}))


def test_a_ps_job_s_pool_first_group_and_probes() -> None:
    assert [(p.slot, p.host, p.port) for p in PS_PLACES] == [(0, "lab4", 3004), (1, "lab3", 3005)]
    assert first_group(PS_SPEC.elastic, PS_WORKERS, PS_PLACES) == PS_FULL
    assert PS_FULL.size == 3 and LAB2_DROPPED.size == 2
    assert to_probe(PS_WORKERS, LAB2_DROPPED) == ["lab2"]  # the dropped worker's host


# (case, group, lost hosts, answering, → kind ("policy"), act, members, dropped, ps,
#  the event's from/to/hosts, its ps change, parts of its words)
PS_LOST = [
    ("a worker's host: dropped, the others go on", PS_FULL, {"lab2": Why.LIFELINE}, (),
     Resize, Act.DROP, (0, 1, 2), {1}, (0, 1), (3, 2, ["lab2"]), None,
     ["lab2 lost: its lifeline went silent", "the others go on", "3 → 2 workers"]),
    ("a second worker: below min_workers", LAB2_DROPPED, {"lab1": Why.FAILURES}, (),
     "policy", None, (0, 1, 2), {1}, (0, 1), None, None,
     ["1 worker(s) left, fewer than elastic.min_workers 2", "restart policy decides"]),
    ("a ps host: the job restarts with the ps left", PS_FULL, {"lab4": Why.UNREACHABLE}, (),
     Resize, Act.REGROUP, (0, 1, 2), set(), (1,), (3, 3, ["lab4"]), {"from": 2, "to": 1},
     ["lab4 lost: did not answer", "restarting with 1 ps from the chief's backup",
      "3 → 3 workers, 2 → 1 ps"]),
    ("a host with a worker and a ps goes as a whole", PS_FULL, {"lab3": Why.LIFELINE}, (),
     Resize, Act.REGROUP, (0, 1), set(), (0,), (3, 2, ["lab3"]), {"from": 2, "to": 1},
     ["lab3 lost"]),
    ("a ps host, a dropped worker's host answering: back in the new TF_CONFIG",
     LAB2_DROPPED, {"lab4": Why.LIFELINE}, ("lab2",), Resize, Act.REGROUP, (0, 2, 1), set(),
     (1,), (2, 3, ["lab2", "lab4"]), {"from": 2, "to": 1}, ["lab2 back in"]),
    ("the last ps host: the restart policy decides", Group((0, 1, 2), ps=(0,)),
     {"lab4": Why.FAILURES}, (), "policy", None, (0, 1, 2), set(), (0,), None, None,
     ["no ps task left", "the restart policy decides"]),
    ("max_resizes spent", Group((0, 1, 2), resizes=4, ps=(0, 1)), {"lab2": Why.LIFELINE}, (),
     "policy", None, (0, 1, 2), set(), (0, 1), None, None, ["elastic.max_resizes 4"]),
    ("a host with no task of the job left", LAB2_DROPPED, {"lab2": Why.UNREACHABLE}, (),
     NoResize, None, (0, 1, 2), {1}, (0, 1), None, None, ["no task of the job on it"]),

]


@pytest.mark.parametrize(("group", "lost", "answering", "kind", "act", "members", "dropped",
                          "ps", "event", "ps_event", "parts"),
                         [c[1:] for c in PS_LOST], ids=[c[0] for c in PS_LOST])
def test_a_ps_job_s_loss(group, lost, answering, kind, act, members, dropped, ps, event,  # noqa: ANN001
                         ps_event, parts) -> None:  # noqa: ANN001
    d = ps_on_lost(PS_SPEC.elastic, PS_WORKERS, PS_PLACES, group, lost, answering)
    assert type(d) is (NoResize if kind == "policy" else kind)
    assert getattr(d, "follow_policy", False) is (kind == "policy")
    assert (d.group.members, d.group.dropped, d.group.ps) == (members, dropped, ps)
    text = d.words if isinstance(d, Resize) else d.reason
    for part in parts:
        assert part in text, text
    if isinstance(d, Resize):
        assert d.act is act and d.group.resizes == group.resizes + 1
        assert (d.event["from"], d.event["to"], d.event["hosts"]) == event
        assert d.event.get("ps") == ps_event
        assert set(lost) <= d.group.lost  # probed until they answer
    else:
        assert d.group.resizes == group.resizes


def test_a_ps_job_s_worker_lost_before_its_chief_is_up_restarts_the_job_without_it() -> None:
    """A chief not up yet (still connecting, or waiting for the servers) would wait for
    every worker its TF_CONFIG names: the job restarts without the lost one instead."""
    d = ps_on_lost(PS_SPEC.elastic, PS_WORKERS, PS_PLACES, PS_FULL, {"lab2": Why.UNREACHABLE},
                   chief_up=False)
    assert isinstance(d, Resize) and d.act is Act.REGROUP
    assert (d.group.members, d.group.dropped, d.group.ps) == ((0, 2), frozenset(), (0, 1))
    assert (d.event["from"], d.event["to"], d.event["hosts"]) == (3, 2, ["lab2"])
    assert "the chief, not connected yet, would wait for it" in d.words
    below = ps_on_lost(PS_SPEC.elastic, PS_WORKERS, PS_PLACES, LAB2_DROPPED,
                       {"lab1": Why.UNREACHABLE}, chief_up=False)
    assert isinstance(below, NoResize) and below.follow_policy


PS_BACK = [
    ("the dropped worker's host answers: it rejoins alone", LAB2_DROPPED, ("lab2",), Resize,
     set(), frozenset(), (2, 3, ["lab2"])),
    ("nobody answers", LAB2_DROPPED, (), NoResize, {1}, {"lab2"}, None),
    ("a place the chief's TF_CONFIG left out waits for a restart", Group((0, 2), ps=(1,)),
     ("lab2",), NoResize, set(), frozenset(), None),
    ("max_resizes spent: stays smaller", Group((0, 1, 2), frozenset({"lab2"}), 4, (0, 1),
                                               frozenset({1})), ("lab2",), NoResize, {1},
     frozenset(), None),
]


@pytest.mark.parametrize(("group", "answering", "kind", "dropped", "lost", "event"),
                         [c[1:] for c in PS_BACK], ids=[c[0] for c in PS_BACK])
def test_a_ps_job_s_worker_back(group, answering, kind, dropped, lost, event) -> None:  # noqa: ANN001
    d = ps_on_answer(PS_SPEC.elastic, PS_WORKERS, group, answering)
    assert type(d) is kind
    assert not getattr(d, "follow_policy", False)
    assert (d.group.members, d.group.dropped, d.group.lost) == (group.members, dropped, lost)
    if isinstance(d, Resize):
        assert d.act is Act.REJOIN
        assert (d.event["from"], d.event["to"], d.event["hosts"]) == event


def test_plan_for_a_ps_job_with_fewer_ps() -> None:
    """After lab3 (worker 2, ps 1) is lost: TF_CONFIG of 2 workers and 1 ps, each at its
    place's port; the chief as it was."""
    plan = make_plan(PS_SPEC, run_id="r1", run_dir="/runs/r1", workdir="/w", ports=PS_PORTS)
    new = plan_for(plan, PS_WORKERS, Group((0, 1), ps=(0,)), ps_places=PS_PLACES)
    cluster = json.loads(new.tasks[0].env["TF_CONFIG"])["cluster"]
    assert cluster == {"chief": ["10.0.0.1:3000"], "worker": ["10.0.0.1:3001", "10.0.0.2:3002"],
                       "ps": ["10.0.0.4:3004"]}
    assert [t.name for t in new.tasks] == ["ps:0", "worker:0", "worker:1", "chief:0"]
    assert {t.env[NUM_WORKERS_ENV] for t in new.tasks} == {"2"}


def local_spec(n: int, job: dict | None = None) -> ClusterSpec:
    return parse_spec({"name": "e", "job": job or {"entry": "a.b:c"},
                       "elastic": {"min_workers": 2}, "tasks": {"worker": ["localhost:auto"] * n}})


def test_plan_for_the_new_size() -> None:
    """TF_CONFIG of 2 workers with contiguous indices, each at its place's port; worker 0,
    now lab2's, is the chief; every task is told the size; the evaluator is unchanged."""
    plan = plan_for(plan0(), PLACES, Group((1, 2)))
    assert [(t.name, t.host, t.port) for t in plan.tasks] == [
        ("worker:0", "lab2", 2001), ("worker:1", "lab3", 2002), ("evaluator:0", "lab1", 2009)]
    cluster = {"worker": ["10.0.0.2:2001", "10.0.0.3:2002"]}
    for t in plan.tasks:
        assert json.loads(t.env["TF_CONFIG"])["cluster"] == cluster == t.tf_config["cluster"]
        assert t.env[NUM_WORKERS_ENV] == "2"
    assert [t.env["TFO_IS_CHIEF"] for t in plan.tasks] == ["1", "0", "0"]
    assert plan.spec is ELASTIC  # the run's pool, for a rerun
    # Each worker's backup directory is its place's, whatever its index: nothing to copy.
    assert backup_dirs(plan) == {"worker:0": ("lab2", "/w2/runs/r1/backup/worker-1"),
                                 "worker:1": ("lab3", "/w3/runs/r1/backup/worker-2")}
    job = json.loads(plan.tasks[0].env["TFO_JOB"])
    assert job["backup_dir"] == "/w2/runs/r1/backup/worker-1"  # what the task reads


def test_a_group_s_tasks_keep_their_places_profiler_ports() -> None:
    """`tfo profile` reaches a group's tasks at the ports plan.json gave their places (the
    group's plans had none: make_plan was given no profiler port, so no task served one)."""
    from orchestrator.elastic.groups import first
    from orchestrator.planning.plan import profiler_key

    ports = PORTS | {profiler_key(n): p + 100 for n, p in PORTS.items() if n != "evaluator:0"}
    pool_plan = make_plan(ELASTIC, run_id="r1", run_dir="/runs/r1", workdir="/w", ports=ports)
    start = first(pool_plan)
    assert [(t.name, t.profiler_port) for t in start.plan.tasks] == [
        ("worker:0", 2100), ("worker:1", 2101), ("worker:2", 2102), ("evaluator:0", None)]
    later = plan_for(start.plan, start.places, Group((1, 3)))
    assert [(t.name, t.port, t.profiler_port, t.env.get("TFO_PROFILER_PORT"))
            for t in later.tasks] == [("worker:0", 2001, 2101, "2101"),
                                      ("worker:1", 2003, 2103, "2103"),
                                      ("evaluator:0", 2009, None, None)]


def test_a_group_plan_gives_gpus_from_what_an_auto_host_reported() -> None:
    """An `auto` host's GPUs are asked once, for the first plan; a group's plan allocates
    from the same list (before: from nvidia-smi's numbering 0, 1, …, as if never asked),
    and plan.json keeps the list for a rerun."""
    from orchestrator.elastic.groups import first
    from orchestrator.planning.plan import Plan

    hosts = {**HOSTS, "lab1": {**HOSTS["lab1"], "gpus": "auto"}}
    spec = parse_spec({**elastic_spec({"min_workers": 1, "max_workers": 2}, ["lab1:auto",
                                                                           "lab1:auto"]),
                       "hosts": hosts, "job": {"entry": "a.b:c", "gpus_per_task": 1}})
    ports = {"worker:0": 2000, "worker:1": 2001, "evaluator:0": 2009}
    pool_plan = make_plan(spec, run_id="r1", run_dir="/runs/r1", workdir="/w", ports=ports,
                          gpus={"lab1": [3, 6, 7]})
    start = first(pool_plan)
    assert {t.name: t.gpus for t in start.plan.tasks} == {
        "worker:0": [3], "worker:1": [6], "evaluator:0": []}
    alone = plan_for(start.plan, start.places, Group((1,)))
    assert {t.name: t.gpus for t in alone.tasks} == {"worker:0": [3], "evaluator:0": []}
    again = Plan.from_json(json.loads(json.dumps(start.plan.to_json())))
    assert again.host_gpus == {"lab1": [3, 6, 7]}
    assert "host_gpus" not in plan0().to_json()  # no `auto` host: plan.json as before


@pytest.mark.parametrize(("env", "size"), [
    ({NUM_WORKERS_ENV: "2", "TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"] * 3}})}, 2),
    ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"] * 3, "chief": ["c:1"]}})}, 4),
    ({NUM_WORKERS_ENV: "x", "TF_CONFIG": "{not json"}, 1),
    ({}, 1),
])
def test_what_a_task_reads_as_the_group_s_size(env: dict, size: int) -> None:
    """ctx.num_workers (an entry's) is markers.num_workers(): the plan's TFO_NUM_WORKERS."""
    assert num_workers(env) == size


def test_plan_for_a_slurm_pool_keeps_each_place_s_node() -> None:
    spec = parse_spec({"name": "e", "job": {"entry": "a.b:c"}, "backend": {"slurm": {}},
                       "tasks": {"worker": 3}, "elastic": {"min_workers": 1}})
    nodes = {"worker:0": "n1", "worker:1": "n2", "worker:2": "n3"}
    ports = {"worker:0": 3000, "worker:1": 3001, "worker:2": 3002}
    places = pool(spec, ports, nodes)
    assert [p.host for p in places] == ["n1", "n2", "n3"]
    first = make_plan(spec, run_id="r", run_dir="/r", workdir="/w", ports=ports, nodes=nodes)
    d = on_lost(spec.elastic, places, first_group(spec.elastic, places), {"n1": Why.UNREACHABLE})
    plan = plan_for(first, places, d.group)
    assert [(t.name, t.host, t.port) for t in plan.tasks] == [("worker:0", "n2", 3001),
                                                                ("worker:1", "n3", 3002)]


# --- which backup to resume from ---------------------------------------------------------
A, B, C, D = ("lab1", "/a"), ("lab2", "/b"), ("lab3", "/c"), ("lab4", "/d")
A1, C1 = ("lab1", "/a1"), ("lab3", "/c1")  # the same hosts' directories under new indices
RESUME = [
    ("nobody moved", {"w0": A, "w1": B}, {"w0": A, "w1": B}, {A: {3, 4}, B: {3, 4}}, 4, {}),
    ("one behind: the newest common", {"w0": A, "w1": B}, {"w0": A, "w1": B},
     {A: {3, 4}, B: {3}}, 3, {}),
    ("a moved index: its own old one, on its host", {"w0": A, "w1": C1}, {"w0": A, "w1": C},
     {A: {4}, C: {4}}, 4, {"w1": C}),
    ("a stale new directory is filled", {"w0": A, "w1": C1}, {"w0": A, "w1": C},
     {A: {5}, C: {5}, C1: {1, 2}}, 5, {"w1": C}),
    ("a joining worker: from a peer", {"w0": A, "w1": B, "w2": D}, {"w0": A, "w1": B, "w2": None},
     {A: {6}, B: {6}}, 6, {"w2": A}),
    ("a joining worker: a peer on its own host first", {"w0": A, "w1": C, "w2": A1},
     {"w0": A, "w1": C, "w2": None}, {A: {6}, C: {6}}, 6, {"w2": A}),
    ("the returning host's old backups are too old", {"w0": A, "w1": B}, {"w0": A, "w1": None},
     {A: {7}, B: {2, 3}}, 7, {"w1": A}),
    ("nothing in common: start over", {"w0": A, "w1": B}, {"w0": A, "w1": B},
     {A: {4}, B: set()}, None, {}),
    ("a first start", {"w0": A}, {"w0": None}, {}, None, {}),
]


@pytest.mark.parametrize(("wanted", "had", "held", "save", "fills"),
                         [c[1:] for c in RESUME], ids=[c[0] for c in RESUME])
def test_resume_from(wanted, had, held, save, fills) -> None:  # noqa: ANN001
    r = resume_from(wanted, had, held)
    assert (r.save, r.fills) == (save, fills)


# tf-keras's own BackupAndRestore (a script's, as the tutorial's): the chief alone keeps it.
CHIEF_KEEPS = [
    ("lab3 lost: lab2 holds none, filled from the chief's", {"w0": A, "w1": B},
     {"w0": A, "w1": B}, {A: {4}, B: set()}, 4, {"w1": A}),
    ("the chief's host lost: lab2, once chief, holds an older one", {"w0": B, "w1": C},
     {"w0": B, "w1": C}, {B: {2}, C: set()}, 2, {"w1": B}),
    ("one directory shared by all: nothing to copy", {"w0": A, "w1": A},
     {"w0": A, "w1": A}, {A: {5}}, 5, {}),
    ("the chief's host lost, nobody else held one: start over", {"w0": B, "w1": C},
     {"w0": B, "w1": C}, {B: set(), C: set()}, None, {}),
    ("a joining host's stale copy: the newest, copied in", {"w0": A, "w1": B, "w2": C},
     {"w0": A, "w1": B, "w2": None}, {A: {7}, B: {4}, C: {4}}, 7, {"w1": A, "w2": A}),
]


@pytest.mark.parametrize(("wanted", "had", "held", "save", "fills"),
                         [c[1:] for c in CHIEF_KEEPS], ids=[c[0] for c in CHIEF_KEEPS])
def test_resume_from_a_script_s_own_backup(wanted, had, held, save, fills) -> None:  # noqa: ANN001
    r = resume_from(wanted, had, held, chief_keeps=True)
    assert (r.save, r.fills) == (save, fills)


def test_a_script_s_backup_directory_in_tfo_backup_dir_is_each_worker_s_own() -> None:
    """`BackupAndRestore(backup_dir=os.environ["TFO_BACKUP_DIR"])`: each worker's own
    directory (its place's), not the path of the worker that told it, for every worker."""
    plan = plan_for(plan0(), PLACES, Group((1, 2)))
    for own in ("/w2/runs/r1/backup/worker-1", "~/w2/runs/r1/backup/worker-1"):
        assert told(own.replace("~", "/home/u"), "/w2", own) == TASK_DIR
    assert told("/w2/runs/r1/backup/worker-1/keras", "/w2",
                "/w2/runs/r1/backup/worker-1") == f"{TASK_DIR}/keras"
    assert backup_dirs(plan, TASK_DIR) == backup_dirs(plan)
    assert backup_dirs(plan, f"{TASK_DIR}/keras") == {
        t: (h, f"{d}/keras") for t, (h, d) in backup_dirs(plan).items()}


def test_a_script_s_backup_directory_is_under_each_host_s_workdir() -> None:
    """The tutorial's relative --backup_dir, reported by a task as an absolute path: the
    same directory under each worker's cwd (its host's workdir); an absolute one outside
    the cwd is that path on every host."""
    plan = plan_for(plan0(), PLACES, Group((1, 2)))
    own = "/w2/runs/r1/backup/worker-1"
    assert told("/w2/backup", "/w2", own) == "backup" and told("/w2/", "/w2", own) == "."
    assert told("/tmp/backup", "/w2", own) == "/tmp/backup" == \
        told("/w22/x/../../tmp/backup", "/w2", own)
    # A lab host's `~/tfo` workdir, which the task saw expanded.
    assert told("/home/u/tfo/bk", "~/tfo", "~/tfo/runs/r1/backup/worker-1") == "bk"
    assert told("/home/u/tfox/bk", "~/tfo", "~/tfo/runs/r1/backup/worker-1") == \
        "/home/u/tfox/bk"
    assert backup_dirs(plan, "backup") == {"worker:0": ("lab2", "/w2/backup"),
                                           "worker:1": ("lab3", "/w3/backup")}
    assert backup_dirs(plan, "/tmp/backup") == {"worker:0": ("lab2", "/tmp/backup"),
                                                "worker:1": ("lab3", "/tmp/backup")}
    old, new = Group((0, 1, 2)), Group((1, 2))
    assert previous_dirs(plan_for(plan0(), PLACES, old), old, plan, new, "b") == {
        "worker:0": ("lab2", "/w2/b"), "worker:1": ("lab3", "/w3/b")}


def test_previous_dirs_follow_the_places() -> None:
    old, new = Group((0, 1, 2)), Group((0, 2, 3))
    before, after = plan_for(plan0(), PLACES, old), plan_for(plan0(), PLACES, new)
    assert previous_dirs(before, old, after, new) == {
        "worker:0": ("lab1", "/w1/runs/r1/backup/worker-0"),
        "worker:1": ("lab3", "/w3/runs/r1/backup/worker-2"),  # lab3's worker moved 2 → 1
        "worker:2": None}  # lab4 joins


def test_held_reads_what_a_backup_directory_holds(tmp_path: Path) -> None:
    write_backup(tmp_path / "w0", [2, 3])
    write_backup(tmp_path / "w1", [2, 3], absolute=True)  # as TaskBackup rewrites it
    write_backup(tmp_path / "w2", [2, 3])
    (tmp_path / "w2" / "chief" / "ckpt-3.index").unlink()  # killed while writing it
    assert backups.held(tmp_path / "w0") == backups.held(tmp_path / "w1") == {2, 3}
    assert backups.held(tmp_path / "w2") == {2}
    assert backups.held(tmp_path / "none") == frozenset()


def test_copy_backup_fills_a_directory_that_reads_back(tmp_path: Path) -> None:
    write_backup(tmp_path / "src", [4, 5], absolute=True)
    write_backup(tmp_path / "dst", [1])  # a stale one, replaced
    backups.copy_backup(tmp_path / "src", tmp_path / "dst", 5)
    chief = tmp_path / "dst" / "chief"
    assert sorted(p.name for p in chief.iterdir()) == [
        "checkpoint", "ckpt-5.data-00000-of-00001", "ckpt-5.index"]
    assert (chief / "ckpt-5.index").read_text() == "index 5"
    assert 'model_checkpoint_path: "ckpt-5"' in (chief / "checkpoint").read_text()
    assert backups.held(tmp_path / "dst") == {5}
    backups.copy_backup(tmp_path / "src", tmp_path / "new" / "worker-2", 4)  # none there yet
    assert backups.held(tmp_path / "new" / "worker-2") == {4}
    with pytest.raises(FileNotFoundError, match="no backup ckpt-9"):
        backups.copy_backup(tmp_path / "src", tmp_path / "dst", 9)
    assert backups.held(tmp_path / "dst") == {5}  # left as it was
    assert not list(tmp_path.rglob("*.tfo-partial"))


def test_a_shrink_end_to_end_on_directories(tmp_path: Path) -> None:
    """Place 1 lost: place 2's worker becomes worker:1 and keeps its place's directory
    (worker-2), which holds the newest backup every remaining worker holds: nothing to copy.
    Place 1 back: it joins as worker:2 with its old directory, one backup behind, and a
    peer's newest is copied in, so every worker holds the same newest backup."""
    local = local_spec(3)
    places = pool(local, PORTS)
    old = first_group(local.elastic, places)
    before = plan_for(make_plan(local, run_id="r", run_dir=tmp_path / "r", workdir=tmp_path,
                                ports=PORTS), places, old)
    for i, saves in enumerate([[3, 4], [3], [3, 4]]):  # place 1's: 3 only
        write_backup(Path(backup_dirs(before)[f"worker:{i}"][1]), saves)
    new = Group((0, 2), resizes=1)
    after = plan_for(before, places, new)
    had = previous_dirs(before, old, after, new)
    held = {d: backups.held(d[1]) for d in {*backup_dirs(after).values(), *had.values()}}
    r = resume_from(backup_dirs(after), had, held)
    assert (r.save, r.fills) == (4, {})
    back = Group((0, 2, 1), resizes=2)
    grown = plan_for(after, places, back)
    had = previous_dirs(after, new, grown, back)
    assert had["worker:2"] is None  # joining
    held = {d: backups.held(d[1]) for d in {*backup_dirs(grown).values(),
                                             *(x for x in had.values() if x)}}
    r = resume_from(backup_dirs(grown), had, held)
    worker_1 = ("localhost", str(tmp_path / "r" / "backup" / "worker-1"))
    assert r.save == 4 and set(r.fills) == {"worker:2"} and backup_dirs(grown)["worker:2"] == \
        worker_1
    for task, (_, source) in r.fills.items():
        backups.copy_backup(source, backup_dirs(grown)[task][1], r.save)
    assert all(4 in backups.held(d) for _, d in backup_dirs(grown).values())


# --- the premise, with TensorFlow -----------------------------------------------------------
SCRIPT = REPO / "tests" / "scripts" / "elastic_resume.py"


def run_group(plan: Plan, backup: Path, epochs: int, stop_at: int | None, timeout: float
              ) -> list[str]:
    """The tutorial-shaped script as the plan's workers, each with its TF_CONFIG and
    TFO_NUM_WORKERS from the plan (run directly: the premise is TensorFlow's); each killed at
    the end if still running. Their outputs."""
    args = [sys.executable, str(SCRIPT), "--backup_dir", str(backup), "--epochs", str(epochs)]
    if stop_at is not None:
        args += ["--stop_at_epoch", str(stop_at)]
    base = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**base, **{k: t.env[k] for k in ("TF_CONFIG", NUM_WORKERS_ENV)}})
             for t in plan.tasks]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


@pytest.mark.tf
@pytest.mark.timeout(150)
def test_a_smaller_group_resumes_from_the_bigger_one_s_backup(tmp_path: Path) -> None:
    """Issue 27's premise: 3 workers train epochs 0-1 and stop at the start of epoch 2;
    place 1's host is lost, and the same script started as the 2 workers plan_for gives (place
    2's worker now worker:1, on its old port) on a copy of that backup directory starts at
    epoch 2, and its optimizer's iterations continue: 4 epochs of 5 steps, 20 in all."""
    spec = local_spec(3, {"script": str(SCRIPT)})
    places = pool(spec, dict(zip(["worker:0", "worker:1", "worker:2"], free_ports(3),
                                 strict=True)))
    first = make_plan(spec, run_id="r", run_dir=tmp_path / "r", workdir=tmp_path,
                      ports={f"worker:{p.slot}": p.port for p in places})
    three = plan_for(first, places, first_group(spec.elastic, places))
    backup = tmp_path / "backup"
    outs = run_group(three, backup, epochs=4, stop_at=2, timeout=100)
    assert all("stopping at epoch 2" in out for out in outs), outs[0][-3000:]
    assert backups.held(backup) == {2}  # ckpt-2: after epochs 0 and 1
    shrunk = on_lost(spec.elastic, places, first_group(spec.elastic, places),
                     {places[1].where: Why.LIFELINE})
    # On this machine a place is lost alone (localhost:PORT), not the machine.
    assert isinstance(shrunk, Resize) and shrunk.group.members == (0, 2)
    two = plan_for(three, places, shrunk.group)
    assert [t.port for t in two.tasks] == [places[0].port, places[2].port]
    # Restored from a copy, as a worker on a new index restores from its filled directory:
    # TensorFlow reads what copy_backup writes.
    copied = tmp_path / "copied"
    backups.copy_backup(backup, copied, 2)
    for out in run_group(two, copied, epochs=4, stop_at=None, timeout=100):
        assert re.findall(r"^begin epoch (\d+) of 2 workers", out, re.M) == ["2", "3"], \
            out[-3000:]
        assert "iterations=20" in out, out[-3000:]


@pytest.mark.parametrize(("path", "shell", "sftp"), [
    ("~/tfo/runs/r/backup/worker-1", '"$HOME"/tfo/runs/r/backup/worker-1',
     "tfo/runs/r/backup/worker-1"),
    ("/w 1/backup", "'/w 1/backup'", "/w 1/backup"),
    ("~", '"$HOME"', "~"),
])
def test_a_lab_host_s_backup_paths(path: str, shell: str, sftp: str) -> None:
    """A workdir under ~ is the login's home for the shell and for sftp; nothing unquoted."""
    from orchestrator.elastic.backupstore import _sftp, _sh

    assert (_sh(path), _sftp(path)) == (shell, sftp)


def test_the_store_reads_and_fills_this_machine_s_directories(tmp_path: Path) -> None:
    from orchestrator.elastic.backupstore import BackupStore, for_lab

    write_backup(tmp_path / "a", [2, 3])
    store = BackupStore()
    assert store.held(("localhost", str(tmp_path / "a"))) == {2, 3}
    store.copy(("localhost", str(tmp_path / "a")), ("localhost", str(tmp_path / "b")), 3)
    assert backups.held(tmp_path / "b") == {3}
    store.remove(("localhost", str(tmp_path / "b")))  # a script's copy, once it restored
    assert backups.held(tmp_path / "b") == frozenset() and (tmp_path / "b").exists()
    assert store.reaches("localhost") and not store.reaches("lab1")
    with pytest.raises(OSError, match="lab1: no connection"):
        store.held(("lab1", "/w1/backup/worker-0"))
    lab = for_lab(ELASTIC.hosts, lambda: None)
    assert lab.reaches("lab1") and not lab.reaches("node7")  # a scheduler's node: no
