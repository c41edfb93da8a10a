"""An elastic job's resizes through the loop (issue 27): scripted handles on a fake clock, no
processes (tests/test_supervise.py's), then TensorFlow for real: a place whose worker keeps
failing is lost, and the job finishes with 2 workers from the backup."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from orchestrator.elastic import groups as elastic
from orchestrator.elastic.groups import Group, first
from orchestrator.loop import resizing
from orchestrator.loop.supervise import JobState, Supervisor
from orchestrator.planning.plan import TaskPlan
from orchestrator.planning.spec import parse_spec
from tests.conftest import events as run_events
from tests.fakes import FakeClock, FakeHandle, FakeWaiter, Script, planned

E = parse_spec({"name": "e", "job": {"entry": "a.b:c"},
                "tasks": {"worker": ["localhost:1", "localhost:2", "localhost:3"]},
                "elastic": {"min_workers": 2, "probe_seconds": 5,
                            "lost_after_failures": 2}}).elastic


# ---- the loop's own decisions, pure ----------------------------------------------------------
# A place's row of failures (issue 37 item 4): only its own count, a success ends the row.
# Each case: the failures seen in order, as (own?, an epoch trained before it this attempt?),
# and the successes (an epoch trained, the attempt then stopped for a peer) between them as
# "ok" → the row after each; lost_after_failures 2 loses the place at 2.
@pytest.mark.parametrize(("seen", "rows"), [
    ([(True, False), (True, False)], [1, 2]),  # two of its own in a row: lost
    # the issue's: its first failure followed its peer's SIGSTOP, then 14 epochs trained
    ([(False, False), "ok", (True, False)], [0, 0, 1]),
    ([(True, False), "ok", (True, False)], [1, 0, 1]),  # a success between: not in a row
    ([(True, False), (True, True)], [1, 1]),  # an epoch trained, then it failed: a new row
    ([(True, False), (False, False), (True, False)], [1, 1, 2]),  # a peer's: the row stays
])
def test_a_place_s_row_counts_its_own_failures_since_its_last_success(seen, rows) -> None:
    row, got = 0, []
    for what in seen:
        if what == "ok":
            row = 0
        else:
            own, trained = what
            row = elastic.failures_in_row(0 if trained else row, own)
        got.append(row)
    assert got == rows
    assert [elastic.lost_why(E, failures_in_row=n) for n in rows][-1] is (
        elastic.Why.FAILURES if rows[-1] >= 2 else None)


@pytest.mark.parametrize(("peers", "own"), [
    ([], True), ([(False, False)], True), ([(False, False), (True, False)], False),
    ([(False, True)], False)])  # (gone, stopped) each
def test_a_failure_is_the_place_s_own_unless_a_peer_was_gone_or_stopped(peers, own) -> None:
    assert elastic.own_failure(peers) is own


@pytest.mark.parametrize(("epoch_known", "epoch_done", "stepped", "ok"), [
    (True, True, True, True), (True, False, True, False), (False, False, True, True),
    (False, False, False, False)])
def test_a_success_is_an_epoch_trained_or_a_step_where_no_epoch_is_told(
        epoch_known, epoch_done, stepped, ok) -> None:
    assert elastic.trained_well(epoch_known, epoch_done, stepped) is ok


@pytest.mark.parametrize(("now", "probed_at", "due"), [
    (100.0, None, True), (104.9, 100.0, False), (105.0, 100.0, True)])
def test_probes_every_probe_seconds(now: float, probed_at: float | None, due: bool) -> None:
    assert elastic.probe_due(now, probed_at, E) is due


@pytest.mark.parametrize(("seen", "epoch", "boundary"), [
    (None, 0, False), (0, 0, False), (0, 1, True), (1, None, False), (3, 2, False)])
def test_an_epoch_boundary_is_worker_0_s_next_epoch(seen: int | None, epoch: int | None,
                                                    boundary: bool) -> None:
    assert elastic.at_epoch_boundary(seen, epoch) is boundary


def test_a_place_on_this_machine_is_lost_alone() -> None:
    places = elastic.pool(parse_spec({"name": "e", "job": {"entry": "a.b:c"}, "tasks": {
        "worker": ["localhost:1", "localhost:2", "localhost:3"]},
        "elastic": {"min_workers": 2}}), {})
    assert [p.where for p in places] == ["localhost:1", "localhost:2", "localhost:3"]
    d = elastic.on_lost(E, places, Group((0, 1, 2)), {"localhost:3": elastic.Why.FAILURES})
    assert isinstance(d, elastic.Resize) and d.group.members == (0, 1)
    assert d.event["hosts"] == ["localhost:3"]
    assert elastic.to_probe(places, d.group) == ["localhost:3"]
    assert resizing.reachable(parse_spec({"name": "e", "job": {"entry": "a.b:c"},
                                          "tasks": {"worker": ["localhost:1"]}}), "localhost:3")


@pytest.mark.parametrize(("elastic", "workers", "note"), [
    (None, 3, ""), ({"min_workers": 2}, 2, ", 2 workers (2-3)"),
    ({"min_workers": 1, "max_workers": 2}, 2, ", 2 workers (1-2)")])
def test_the_live_table_s_title_shows_an_elastic_job_s_size(elastic, workers, note) -> None:
    from orchestrator.cli.liveview import size_note

    spec = parse_spec({"name": "e", "job": {"entry": "a.b:c"}, "tasks": {
        "worker": ["localhost:1", "localhost:2", "localhost:3"]},
        **({"elastic": elastic} if elastic else {})})
    assert size_note(spec, workers) == note


# ---- through the loop, scripted ----------------------------------------------------------
def elastic_spec(**elastic_fields) -> dict:
    return {"name": "t", "job": {"entry": "a.b:c"},
            "tasks": {"worker": ["localhost:1", "localhost:2", "localhost:3"]},
            "elastic": {"min_workers": 2, "lost_after_failures": 2, **elastic_fields},
            "restart": {"policy": "on-failure", "max_restarts": 2, "backoff_seconds": 0},
            "timeouts": {"startup_seconds": 30, "grace_seconds": 0.2,
                         "evaluator_seconds": 0.5}}


def epochs(*at: tuple[float, int]) -> list[tuple[float, str]]:
    return [(t, f'@tfo {{"event": "progress", "step": {i + 1}, "epoch": {e}}}')
            for i, (t, e) in enumerate(at)]


def run_scripted(tmp_path: Path, data: dict, scripts: dict[str, Script]):
    clock = FakeClock()
    started: list[tuple[str, int, dict]] = []

    def start(task: TaskPlan, attempt: int) -> FakeHandle:
        started.append((task.name, attempt, dict(task.env)))
        return FakeHandle(task, attempt, scripts[task.name], clock)

    lines: list[str] = []
    plan = planned(tmp_path, data)
    result = Supervisor(plan, start=start,
                        echo=lambda task, line: lines.append(f"[{task}] {line}"),
                        clock=clock, waiter=FakeWaiter(clock), probe=lambda where: True,
                        elastic=first(plan)).run()
    events = run_events(tmp_path / "run")
    return result, started, events, lines


def test_an_elastic_job_runs_the_first_group_it_is_handed(tmp_path) -> None:
    """Planned once (pipeline.run): the Supervisor runs the first group it is given, and
    refuses an elastic plan without it (it would run the whole pool as a fixed job)."""
    plan = planned(tmp_path, elastic_spec(max_workers=2))
    with pytest.raises(ValueError, match="elastic"):
        Supervisor(plan, start=lambda task, attempt: None)  # type: ignore[arg-type,return-value]
    handed = first(plan)
    sup = Supervisor(plan, start=lambda task, attempt: None,  # type: ignore[arg-type,return-value]
                     elastic=handed)
    assert sup.job.plan is handed.plan
    assert [t.name for t in sup.job.plan.tasks] == ["worker:0", "worker:1"]
    sup.job.events.close()


@pytest.mark.timeout(20)
def test_a_place_failing_twice_in_a_row_is_lost_and_the_job_goes_on_with_2(tmp_path) -> None:
    """worker:2 fails before its first step twice (lost_after_failures 2): one counted
    restart, then the group restarts as 2 workers (not counted), TF_CONFIG and
    TFO_NUM_WORKERS of 2, and the job succeeds; job_resized says 3 → 2 and why."""
    scripts = {"worker:0": Script([(None, 0, True), (None, 0, True), (0, 0.5, True)]),
               "worker:1": Script([(None, 0, True), (None, 0, True), (0, 0.5, True)]),
               "worker:2": Script([(3, 0.1, False)])}
    result, started, events, lines = run_scripted(
        tmp_path, elastic_spec(probe_seconds=3600), scripts)
    assert result.state is JobState.SUCCEEDED, result.reason
    assert result.restarts == 1  # the first failure; the resize is not counted
    assert [t.name for t in result.tasks] == ["worker:0", "worker:1"]
    resized = [e for e in events if e["event"] == "job_resized"]
    assert [(e["from"], e["to"], e["hosts"]) for e in resized] == [(3, 2, ["localhost:3"])]
    assert "failed 2 times in a row" in resized[0]["reason"]
    last = {name: env for name, _, env in started}
    assert last["worker:0"]["TFO_NUM_WORKERS"] == "2"
    assert len(json.loads(last["worker:1"]["TF_CONFIG"])["cluster"]["worker"]) == 2
    assert [a for n, a, _ in started if n == "worker:1"] == [0, 1, 2]
    assert [a for n, a, _ in started if n == "worker:2"] == [0, 1]
    assert any("resized: 3 → 2 workers" in line for line in lines), lines
    restarted = [e for e in events if e["event"] == "task_restarted"]
    assert [e["counted"] for e in restarted] == [True, True, True, False, False]


@pytest.mark.timeout(20)
def test_a_resize_keeps_the_data_service_and_its_address(tmp_path) -> None:
    """Issue 43: an elastic job with a tf.data service (a dispatcher and a data worker, each
    serving until stopped) shrinks 3 → 2 as above: the service's tasks keep their first
    attempt (a resize restarts the training group only), and every start of every trainer,
    before and after the resize, is given the same TFO_DATA_SERVICE, the dispatcher's."""
    scripts = {"worker:0": Script([(None, 0, True), (None, 0, True), (0, 0.5, True)]),
               "worker:1": Script([(None, 0, True), (None, 0, True), (0, 0.5, True)]),
               "worker:2": Script([(3, 0.1, False)]),
               "dispatcher:0": Script([(None, 0, True)]),
               "data_worker:0": Script([(None, 0, True)])}
    data = elastic_spec(probe_seconds=3600)
    data["tasks"] |= {"dispatcher": "localhost:4", "data_worker": ["localhost:5"]}
    result, started, events, _ = run_scripted(tmp_path, data, scripts)
    assert result.state is JobState.SUCCEEDED, result.reason
    assert [(e["from"], e["to"]) for e in events if e["event"] == "job_resized"] == [(3, 2)]
    service = [(n, a) for n, a, _ in started if n in ("dispatcher:0", "data_worker:0")]
    assert service == [("dispatcher:0", 0), ("data_worker:0", 0)]
    assert not [e for e in events if e["event"] == "task_restarted"
                and e["task"] in ("dispatcher:0", "data_worker:0")]
    addresses = {env["TFO_DATA_SERVICE"] for n, _, env in started if n.startswith("worker:")}
    assert addresses == {"grpc://localhost:4"}
    assert [a for n, a, _ in started if n == "worker:0"] == [0, 1, 2]  # after the resize too


STOPPED = '@tfo {"event": "usage", "cpu": 0, "rss": 1, "stopped": true}'


@pytest.mark.timeout(20)
def test_a_place_is_not_lost_for_a_peer_s_failure_nor_across_a_success(tmp_path) -> None:
    """Issue 37 item 4, lost_after_failures 2. Attempt 0: worker:1 is SIGSTOPped (its usage
    says so) and worker:2's collective fails, exit 1: its peer's doing, not counted. Attempt
    1: the group trains epochs 0-2, then worker:0 fails (its own: a row of 1 for its place).
    Attempt 2: worker:2 fails before its first step: 1 in its row, not 2, as the epochs
    trained in between ended any row. No place is lost; attempt 3 finishes with 3 workers.
    (Counted the old way, worker:2's place was lost at attempt 2: "failed 2 times in a row".)"""
    trained = {1: epochs((0.1, 0), (0.3, 1), (0.5, 2))}
    scripts = {"worker:0": Script([(None, 0, True), (3, 0.8, True), (None, 0, True),
                                   (0, 0.5, True)], output=trained),
               "worker:1": Script([(None, 0, True), (None, 0, True), (None, 0, True),
                                   (0, 0.5, True)], output={0: [(0.1, STOPPED)], **trained}),
               "worker:2": Script([(1, 0.3, True), (None, 0, True), (1, 0.2, False),
                                   (0, 0.5, True)], output=trained)}
    data = elastic_spec(probe_seconds=3600)
    data["restart"]["max_restarts"] = 3
    result, started, events, lines = run_scripted(tmp_path, data, scripts)
    assert result.state is JobState.SUCCEEDED, result.reason
    assert not [e for e in events if e["event"] == "job_resized"], lines
    assert result.restarts == 3 and [t.name for t in result.tasks] == [
        "worker:0", "worker:1", "worker:2"]
    assert [a for n, a, _ in started if n == "worker:2"] == [0, 1, 2, 3]


@pytest.mark.timeout(20)
def test_a_place_back_joins_at_the_next_epoch_boundary(tmp_path) -> None:
    """Shrunk to 2, the lost place answers its probe (probe_seconds 1): at worker 0's next
    epoch the group is stopped and restarts as 3; worker:2's attempts go on counting."""
    scripts = {"worker:0": Script([(None, 0, True), (None, 0, True), (None, 0, True),
                                   (0, 0.5, True)], output={2: epochs((0.2, 0), (3.0, 1))}),
               "worker:1": Script([(None, 0, True)] * 3 + [(0, 0.5, True)]),
               "worker:2": Script([(3, 0.1, False), (3, 0.1, False), (0, 0.5, True)])}
    result, started, events, _ = run_scripted(tmp_path, elastic_spec(probe_seconds=1),
                                              scripts)
    assert result.state is JobState.SUCCEEDED, result.reason
    resized = [(e["from"], e["to"], e["hosts"]) for e in events if e["event"] == "job_resized"]
    assert resized == [(3, 2, ["localhost:3"]), (2, 3, ["localhost:3"])]
    assert [a for n, a, _ in started if n == "worker:2"] == [0, 1, 2]
    assert [t.name for t in result.tasks] == ["worker:0", "worker:1", "worker:2"]
    assert result.restarts == 1


@pytest.mark.timeout(20)
def test_the_chief_s_place_lost_worker_0_moves_to_the_first_left(tmp_path) -> None:
    """worker:0's place fails twice in a row: the group restarts as the places 2 and 3,
    worker 0 (the chief) now at localhost:2, in a TF_CONFIG of 2."""
    scripts = {"worker:0": Script([(3, 0.1, False), (3, 0.1, False), (0, 0.5, True)]),
               "worker:1": Script([(None, 0, True), (None, 0, True), (0, 0.5, True)]),
               "worker:2": Script([(None, 0, True)])}
    result, started, events, _ = run_scripted(tmp_path, elastic_spec(probe_seconds=3600),
                                              scripts)
    assert result.state is JobState.SUCCEEDED, result.reason
    resized = [e for e in events if e["event"] == "job_resized"]
    assert [(e["from"], e["to"], e["hosts"]) for e in resized] == [(3, 2, ["localhost:1"])]
    assert "worker 0 (the chief) is now on localhost:2" in resized[0]["reason"]
    tf_config = json.loads([env for n, a, env in started if (n, a) == ("worker:0", 2)][0][
        "TF_CONFIG"])
    assert tf_config["cluster"]["worker"] == ["localhost:2", "localhost:3"]
    assert tf_config["task"] == {"type": "worker", "index": 0}


@pytest.mark.timeout(20)
def test_a_flapping_place_stops_at_max_resizes(tmp_path) -> None:
    """max_resizes 2: lost (1), back at the next epoch (2), lost again: no resize left, the
    restart policy decides, and its restarts run out."""
    scripts = {"worker:0": Script([(None, 0, True)], output={
                   n: epochs((0.2, 0), (3.0, 1)) for n in range(8)}),
               "worker:1": Script([(None, 0, True)]),
               "worker:2": Script([(3, 0.1, False)])}
    result, _, events, lines = run_scripted(
        tmp_path, elastic_spec(probe_seconds=1, max_resizes=2), scripts)
    assert result.state is JobState.FAILED
    assert [(e["from"], e["to"]) for e in events if e["event"] == "job_resized"] == [
        (3, 2), (2, 3)]
    assert any("no resize left (elastic.max_resizes 2)" in line for line in lines), lines


@pytest.mark.timeout(20)
def test_below_min_workers_the_restart_policy_decides(tmp_path) -> None:
    """min_workers 3 of 3: a lost place cannot shrink the group, and the restart policy
    (max_restarts 2) ends the job as for a fixed-size one."""
    scripts = {"worker:0": Script([(None, 0, True)]), "worker:1": Script([(None, 0, True)]),
               "worker:2": Script([(3, 0.1, False)])}
    result, _, events, lines = run_scripted(tmp_path, elastic_spec(min_workers=3), scripts)
    assert result.state is JobState.FAILED
    assert "no restarts left" in result.reason
    assert not [e for e in events if e["event"] == "job_resized"]
    assert any("fewer than elastic.min_workers 3" in line for line in lines), lines


def ps_spec(**elastic_fields) -> dict:
    return {"name": "p", "strategy": "parameter_server", "job": {"entry": "a.b:c"},
            "tasks": {"chief": ["localhost:1"],
                      "worker": ["localhost:2", "localhost:3", "localhost:4"],
                      "ps": ["localhost:5", "localhost:6"]},
            "elastic": {"min_workers": 2, "lost_after_failures": 2, **elastic_fields},
            "restart": {"max_restarts": 2, "backoff_seconds": 0},
            "timeouts": {"startup_seconds": 30, "grace_seconds": 0.2}}


SERVING = Script([(None, 0, True)])


def attempts(started: list, name: str) -> list[int]:
    return [a for n, a, _ in started if n == name]


@pytest.mark.timeout(20)
def test_a_ps_job_drops_a_failing_worker_and_the_chief_trains_on(tmp_path) -> None:
    """parameter_server, worker:2 fails twice in a row (lost_after_failures 2): one counted
    restart alone, then it is dropped: nothing else stops (the chief's one attempt
    finishes), job_resized 3 → 2, and the job succeeds without it."""
    scripts = {"chief:0": Script([(0, 5.0, True)]), "worker:0": SERVING, "worker:1": SERVING,
               "worker:2": Script([(3, 1.0, True)]), "ps:0": SERVING, "ps:1": SERVING}
    result, started, events, lines = run_scripted(tmp_path, ps_spec(probe_seconds=3600),
                                                  scripts)
    assert result.state is JobState.SUCCEEDED, result.reason
    assert result.restarts == 1
    resized = [e for e in events if e["event"] == "job_resized"]
    assert [(e["from"], e["to"], e["hosts"]) for e in resized] == [(3, 2, ["localhost:4"])]
    assert "the others go on" in resized[0]["reason"]
    assert attempts(started, "worker:2") == [0, 1]
    assert all(attempts(started, n) == [0] for n in ("chief:0", "worker:0", "ps:0", "ps:1"))
    assert not [e for e in events if e["event"] == "task_stopping" and e["time"]
                < resized[0]["time"]]  # nothing was stopped for it
    assert "worker:2" not in [t.name for t in result.tasks]
    assert any("resized: 3 → 2 workers" in line for line in lines), lines


@pytest.mark.timeout(20)
def test_a_ps_job_s_dropped_worker_rejoins_alone_when_its_place_answers(tmp_path) -> None:
    """Dropped, its place answers the next probe (probe_seconds 1): worker:2 starts again
    alone, on the same plan, not counted; the chief never restarts."""
    scripts = {"chief:0": Script([(0, 8.0, True)]), "worker:0": SERVING, "worker:1": SERVING,
               "worker:2": Script([(3, 1.0, True), (3, 1.0, True), (None, 0, True)]),
               "ps:0": SERVING, "ps:1": SERVING}
    result, started, events, _ = run_scripted(tmp_path, ps_spec(probe_seconds=1), scripts)
    assert result.state is JobState.SUCCEEDED, result.reason
    resized = [(e["from"], e["to"], e["hosts"]) for e in events if e["event"] == "job_resized"]
    assert resized == [(3, 2, ["localhost:4"]), (2, 3, ["localhost:4"])]
    assert attempts(started, "worker:2") == [0, 1, 2]
    assert attempts(started, "chief:0") == [0]
    assert [e["counted"] for e in events if e["event"] == "task_restarted"] == [True, False]
    tf_configs = {json.loads(env["TF_CONFIG"])["task"]["index"] for n, _, env in started
                  if n == "worker:2"}
    assert tf_configs == {2}  # the same place in the chief's TF_CONFIG
    assert [t.name for t in result.tasks][-3:] == ["worker:1", "worker:2", "chief:0"]


@pytest.mark.timeout(20)
def test_a_ps_job_restarts_with_the_ps_left(tmp_path) -> None:
    """ps:1 fails twice in a row: after one counted restart of the job (a ps holds
    variables), the job restarts, not counted, with ps:0 only in every TF_CONFIG."""
    scripts = {"chief:0": Script([(None, 0, True), (None, 0, True), (0, 2.0, True)]),
               "worker:0": SERVING, "worker:1": SERVING, "worker:2": SERVING,
               "ps:0": SERVING, "ps:1": Script([(3, 1.0, True)])}
    result, started, events, _ = run_scripted(tmp_path, ps_spec(probe_seconds=3600), scripts)
    assert result.state is JobState.SUCCEEDED, result.reason
    resized = [e for e in events if e["event"] == "job_resized"]
    assert [(e["from"], e["to"], e["hosts"], e["ps"]) for e in resized] == [
        (3, 3, ["localhost:6"], {"from": 2, "to": 1})]
    assert attempts(started, "chief:0") == [0, 1, 2]
    last = {n: json.loads(env["TF_CONFIG"])["cluster"] for n, _, env in started}
    assert last["chief:0"]["ps"] == ["localhost:5"] and len(last["chief:0"]["worker"]) == 3
    assert "ps:1" not in [t.name for t in result.tasks]
    assert result.restarts == 1
    from orchestrator.cli.report import resize_lines  # the summary's and tfo status's line

    assert resize_lines(result.resizes)[0].startswith("resized: 3 → 3 workers, 2 → 1 ps: ")


@pytest.mark.timeout(20)
def test_a_ps_job_s_worker_lost_before_the_chief_starts_leaves_its_tf_config(tmp_path) -> None:
    """worker:2 fails twice before it serves: the chief, waiting for the servers, has not
    started, and would wait for worker:2 for good; the job restarts without it, and the
    chief's first TF_CONFIG names 2 workers."""
    scripts = {"chief:0": Script([(0, 2.0, True)]), "worker:0": SERVING, "worker:1": SERVING,
               "worker:2": Script([(3, 0.1, False)]), "ps:0": SERVING, "ps:1": SERVING}
    result, started, events, _ = run_scripted(tmp_path, ps_spec(probe_seconds=3600), scripts)
    assert result.state is JobState.SUCCEEDED, result.reason
    resized = [e for e in events if e["event"] == "job_resized"]
    assert [(e["from"], e["to"]) for e in resized] == [(3, 2)]
    assert "not connected yet" in resized[0]["reason"]
    chief = [json.loads(env["TF_CONFIG"])["cluster"] for n, _, env in started if n == "chief:0"]
    assert [len(c["worker"]) for c in chief] == [2]


@pytest.mark.timeout(20)
def test_a_ps_job_restarting_its_chief_leaves_a_dropped_worker_out(tmp_path) -> None:
    """worker:2 dropped while the chief trains; then ps:0 fails once (not lost: its
    restart policy restarts the job, counted): the chief's new TF_CONFIG leaves worker:2's
    place out, as it would wait for it; the job finishes on 2 workers."""
    scripts = {"chief:0": Script([(None, 0, True), (0, 1.0, True)]),
               "worker:0": SERVING, "worker:1": SERVING,
               "worker:2": Script([(3, 1.0, True)]),
               "ps:0": Script([(3, 3.0, True), (None, 0, True)]), "ps:1": SERVING}
    result, started, events, lines = run_scripted(tmp_path, ps_spec(probe_seconds=3600),
                                                  scripts)
    assert result.state is JobState.SUCCEEDED, result.reason
    assert [(e["from"], e["to"]) for e in events if e["event"] == "job_resized"] == [(3, 2)]
    chief = [json.loads(env["TF_CONFIG"])["cluster"] for n, _, env in started if n == "chief:0"]
    assert [c["worker"] for c in chief] == [["localhost:2", "localhost:3", "localhost:4"],
                                            ["localhost:2", "localhost:3"]]
    assert result.restarts == 2  # worker:2's first failure, and ps:0's
    assert [t.name for t in result.tasks] == ["ps:0", "ps:1", "worker:0", "worker:1",
                                              "chief:0"]
    assert any("left out of the chief's TF_CONFIG" in line for line in lines), lines


@pytest.mark.timeout(20)
def test_a_ps_job_losing_its_last_ps_follows_the_restart_policy(tmp_path) -> None:
    data = ps_spec()
    data["tasks"]["ps"] = ["localhost:5"]
    scripts = {"chief:0": Script([(None, 0, True)]), "worker:0": SERVING, "worker:1": SERVING,
               "worker:2": SERVING, "ps:0": Script([(3, 1.0, True)])}
    result, _, events, lines = run_scripted(tmp_path, data, scripts)
    assert result.state is JobState.FAILED
    assert "no restarts left" in result.reason
    assert not [e for e in events if e["event"] == "job_resized"]
    assert any("no ps task left" in line for line in lines), lines


# ---- TensorFlow, for real ----------------------------------------------------------------
@pytest.mark.tf
@pytest.mark.timeout(400)
def test_an_elastic_job_loses_a_failing_place_and_finishes_with_2_workers(tmp_path) -> None:
    """3 workers on this machine (localhost:auto); worker:2 exits 3 after epoch 1 on its first
    attempt, and at its start on every later one (FAULTY_BROKEN_TASK: its place broke).
    lost_after_failures 2: after one counted restart its place is lost, the group restarts
    as 2 workers on the backups, and trains the remaining epochs: the first epoch of the
    2-worker group is past 0, and the chief saves the model once."""
    from orchestrator.pipeline import run

    os.environ["FAULTY_BROKEN_TASK"] = "worker:2"
    try:
        data = {"name": "elastic", "job": {"entry": "tests.jobs.faulty:train",
                                           "args": {"epochs": 4, "fail_task": "worker:2",
                                                    "fail_epoch": 1}},
                "tasks": {"worker": ["localhost:auto"] * 3},
                "elastic": {"min_workers": 2, "lost_after_failures": 2, "probe_seconds": 3600},
                # No warm spares: each would import TensorFlow for an attempt the broken
                # place never trains.
                "restart": {"policy": "on-failure", "max_restarts": 3, "backoff_seconds": 0,
                            "warm_spares": False},
                "timeouts": {"grace_seconds": 10}}
        t0 = time.monotonic()
        result = run(data, tmp_path / "run")
    finally:
        del os.environ["FAULTY_BROKEN_TASK"]
    took = time.monotonic() - t0
    events = run_events(tmp_path / "run")
    assert result.state is JobState.SUCCEEDED, (result.reason, took)
    resized = [e for e in events if e["event"] == "job_resized"]
    assert [(e["from"], e["to"]) for e in resized] == [(3, 2)], resized
    assert [t.name for t in result.tasks] == ["worker:0", "worker:1"]
    after = events.index(resized[0])
    first_epochs = [e["epoch"] for e in events[after:]
                    if e["event"] == "task_progress" and e["task"] == "worker:0"
                    and e.get("epoch") is not None]
    assert first_epochs and first_epochs[0] >= 1, first_epochs  # from the backup, not 0
    assert max(first_epochs) == 3
    saved = [e["task"] for e in events if e["event"] == "task_saved" and e.get("chief")]
    assert saved == ["worker:0"]  # the chief's model, written once


@pytest.mark.tf
@pytest.mark.timeout(400)
def test_an_elastic_job_grows_back_at_the_next_epoch_from_the_same_backup(tmp_path) -> None:
    """lost_after_failures 1: worker:2 exits 3 after epoch 1 (first attempt only): its place
    is lost, 2 workers resume from backup 1 or 2; the place answers its probe
    (probe_seconds 1: this machine always answers), and at worker 0's next epoch the group
    is stopped (SIGTERM) and restarts as 3, the joining worker's directory filled from a
    peer's: it resumes where the 2 stopped, and finishes every epoch; the chief saves once."""
    from orchestrator.pipeline import run

    # After epoch 1, not 0: its peers then hold backup 1 for certain (their epoch 1's
    # all-reduces ran after it). Exiting at epoch 0's end raced the peers' first backup, which
    # the group's stop could cut short (a loaded make test: the shrink had no backup, save None).
    data = {"name": "elastic", "job": {"entry": "tests.jobs.faulty:train",
                                       "args": {"epochs": 6, "fail_task": "worker:2",
                                                "fail_epoch": 1}},
            "tasks": {"worker": ["localhost:auto"] * 3},
            "elastic": {"min_workers": 2, "lost_after_failures": 1, "probe_seconds": 1},
            # No warm spares: both resizes discard them (7 of its 8 standbys never served).
            # tests/test_elastic_lab.py's rejoin keeps tfo's default in a real elastic job;
            # test_spares' table, a resized task's standby discarded.
            "restart": {"policy": "on-failure", "max_restarts": 2, "backoff_seconds": 0,
                        "warm_spares": False},
            "timeouts": {"grace_seconds": 10}}
    result = run(data, tmp_path / "run")
    events = run_events(tmp_path / "run")
    assert result.state is JobState.SUCCEEDED, result.reason
    resized = [e for e in events if e["event"] == "job_resized"]
    assert [(e["from"], e["to"]) for e in resized] == [(3, 2), (2, 3)], resized
    assert result.restarts == 0 and [t.name for t in result.tasks] == [
        "worker:0", "worker:1", "worker:2"]
    shrunk, grown = (events.index(e) for e in resized)

    def epochs_of(task: str, since: int) -> list[int]:
        return [e["epoch"] for e in events[since:] if e["event"] == "task_progress"
                and e["task"] == task and e.get("epoch") is not None]

    two, three = epochs_of("worker:0", shrunk)[0], epochs_of("worker:2", grown)[0]
    assert two == resized[0]["save"] >= 1  # backup N is after N epochs: epoch N next
    assert three == resized[1]["save"] > two, (two, three)  # where the 2 had got to
    assert max(epochs_of("worker:2", grown)) == 5
    saved = [e["task"] for e in events if e["event"] == "task_saved" and e.get("chief")]
    assert saved == ["worker:0"]


@pytest.mark.tf
@pytest.mark.timeout(400)
def test_tensorflow_s_tutorial_script_unmodified_goes_on_with_2_workers(tmp_path) -> None:
    """The tutorial's script (its own BackupAndRestore on one directory, num_workers from
    TF_CONFIG), 3 workers on this machine, lost_after_failures 1: worker:2 is SIGKILLed
    after epoch 1; the group restarts as 2 with a TF_CONFIG of 2, resumes from the
    script's own backup, not epoch 0, and the chief saves the model."""
    from tests.conftest import REPO, write_spec
    from tests.helpers import Tfo, kill_task

    out, run_dir = tmp_path / "out", tmp_path / "run"
    spec = write_spec(tmp_path / "c.yaml", f"""\
name: tutorial
job:
  script: {REPO}/tests/scripts/mwms_keras.py
  args: [--epochs, "10", --backup_dir, "{out}/backup", --model_path, "{out}/model"]
tasks:
  worker: [localhost:auto, localhost:auto, localhost:auto]
elastic: {{min_workers: 2, lost_after_failures: 1, probe_seconds: 3600}}
restart: {{policy: on-failure, max_restarts: 2, backoff_seconds: 0, warm_spares: false}}
""")  # no spares: the resize discards them all
    tfo = Tfo(spec, run_dir)
    try:
        tfo.wait_event("task_epoch", "worker:2", epoch=1, timeout=240)
        kill_task(tfo, "worker:2")
        code, err = tfo.finish(timeout=300)
        assert code == 0, err[-4000:]
    finally:
        tfo.close()
    evs = run_events(run_dir)
    resized = [e for e in evs if e["event"] == "job_resized"]
    assert [(e["from"], e["to"]) for e in resized] == [(3, 2)], resized
    after = evs.index(resized[0])
    epochs = [e["epoch"] for e in evs[after:] if e["event"] == "task_epoch"
              and e["task"] == "worker:0"]
    assert epochs and epochs[0] >= 1 and epochs[-1] == 9, epochs  # from its backup
    assert (out / "model" / "saved_model.pb").exists()


@pytest.mark.tf
@pytest.mark.timeout(240)
def test_a_ps_job_drops_a_lost_worker_then_restarts_with_the_ps_left(tmp_path) -> None:
    """parameter_server on this machine (localhost:auto): chief, 2 workers, 2 ps;
    lost_after_failures 1, probe_seconds 1. worker:1 killed when the chief's epoch 1 begins:
    dropped (2 → 1) while the chief trains on; its place answers the next probe and it
    rejoins alone, serving again (1 → 2), the chief never stopped. Then ps:1 killed: the
    job restarts with 1 ps, the chief from its backup (its first epoch after the restart
    past 0), and finishes; the chief's model is written once."""
    from tests.helpers import Tfo, kill_task

    spec = tmp_path / "c.yaml"
    spec.write_text("""\
name: ps-elastic
strategy: parameter_server
job:
  entry: tests.jobs.faulty:train
  args: {epochs: 12, epoch_sleep: 1.0}
tasks:
  chief: [localhost:auto]
  worker: [localhost:auto, localhost:auto]
  ps: [localhost:auto, localhost:auto]
elastic: {min_workers: 1, lost_after_failures: 1, probe_seconds: 1}
timeouts: {grace_seconds: 10}
""")
    run_dir = tmp_path / "run"
    tfo = Tfo(spec, run_dir)
    t0 = time.monotonic()
    try:
        tfo.wait_event("task_epoch", "chief:0", epoch=1, timeout=150)
        kill_task(tfo, "worker:1")
        tfo.wait_event("task_ready", "worker:1", attempt=1, timeout=60)  # back, serving
        ps_killed_at = kill_task(tfo, "ps:1")
        code, err = tfo.finish(timeout=150)
    finally:
        tfo.close()
    took = time.monotonic() - t0
    assert code == 0, err[-4000:]
    events = run_events(run_dir)
    before = [e["epoch"] for e in events if e["event"] == "task_epoch" and e["attempt"] == 0
              and e["time"] < ps_killed_at]
    assert before[-1] < 11, before  # ps:1 was lost while the chief trained
    resized = [e for e in events if e["event"] == "job_resized"]
    assert [(e["from"], e["to"], e.get("ps")) for e in resized] == [
        (2, 1, None), (1, 2, None), (2, 2, {"from": 2, "to": 1})], resized
    assert resized[0]["hosts"] == resized[1]["hosts"]  # worker:1's place, back
    chief_starts = [e for e in events if e["event"] == "task_started" and e["task"] == "chief:0"]
    assert [e["attempt"] for e in chief_starts] == [0, 1]
    assert not [e for e in events if e["event"] == "task_stopping"
                and e["time"] < ps_killed_at]  # dropping and rejoining stopped nothing
    assert resized[2]["save"] is not None  # the chief's backup it resumes from
    epochs_after = [e["epoch"] for e in events if e["event"] == "task_epoch"
                    and e["task"] == "chief:0" and e["attempt"] == 1]
    assert epochs_after and epochs_after[0] >= 1 and epochs_after[-1] == 11, (epochs_after, took)
    saved = [e["task"] for e in events if e["event"] == "task_saved" and e.get("chief")]
    assert saved == ["chief:0"]
    assert len(json.loads((run_dir / "plan.json").read_text())["cluster"]["ps"]) == 2
    print(f"took {took:.1f} s")
