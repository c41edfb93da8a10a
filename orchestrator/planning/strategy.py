"""What each distribution strategy means for the supervisor, as data: the one place that
says what a role does.

    rules = RULES[Strategy.PARAMETER_SERVER]
    rules.serve_first        # (Role.PS, Role.WORKER): up before the chief and evaluator start
    rules.restart_unit[Role.WORKER]   # RestartUnit.ALONE

The plan carries its strategy's rules (plan.json shows them); the supervisor reads only those.

Design: strategy rules
====================

- rule: multi_worker_mirrored; parameter_server
- roles a job may list: chief, worker, evaluator; chief, worker, ps, evaluator
- required: at least one chief or worker; exactly one chief, at least one worker and one ps
- serve first (up before the others start): –; ps, worker
- servers (never exit on their own: any exit is a loss): –; ps, worker
- restart unit: chief, worker: the group (collectives need everyone); worker: alone; chief,
  ps: the group
- done when every task of: chief, worker; chief
- sidecars (restart alone, fail the job only if `evaluator_required`): evaluator; evaluator
- restart policy of a role `restart.policy` does not name (`restart_default`): chief,
  worker: never; evaluator: on-failure; ps, worker, evaluator: on-failure (the servers come
  back; the chief's ClusterCoordinator rides out a lost worker); chief: never

A task that exits `EXIT_PERMANENT` (78: its entry, script or module cannot be found) is
never restarted, whatever the policy. `RestartSpec.for_role(role, strategy)` is the one
place a role's policy is decided: the one policy given, the map's entry for the role, else
`restart_default`; `make_policy` writes the result per role into the plan (plan.json's
`policy.restart`), and `tfo plan` prints it (`restart: ps on-failure (with every training
task), worker on-failure (alone), chief never`). A task that finished
(`TaskRecord.finished`: exit 0, or stopped in its teardown after its code ended well) stays
finished: a later loss in its restart unit restarts the others only. A start that fails (a
lab host that cannot be reached: `task_start_failed`, the host and what was tried in its
error) counts as a loss; the unit's next start waits 1, 2, 4 ... up to 60 s
(`START_BACKOFF_MAX`) after each failure in a row, and that task is started first, so its
healthy peers are not started and stopped again while its host is down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from orchestrator.planning.policy import Policy, RestartPolicy
from worker_entry.markers import Role, Strategy

# TF_CONFIG's `cluster` lists these; the evaluator is never part of it.
CLUSTER_ROLES = (Role.CHIEF, Role.WORKER, Role.PS)
# The order tasks are listed and started in: servers first.
START_ORDER = (Role.PS, Role.WORKER, Role.CHIEF, Role.EVALUATOR)


class RestartUnit(str, Enum):
    ALONE = "alone"  # the lost task by itself
    GROUP = "group"  # every training task (all but the sidecars)


@dataclass(frozen=True)
class StrategyRules:
    roles: tuple[Role, ...]  # the roles a job may list
    required: tuple[tuple[Role, str], ...]  # roles a job must list, and how many ("at least one")
    serve_first: tuple[Role, ...]  # every task of these runs before any other role starts
    servers: tuple[Role, ...]  # never exit on their own: any exit is a loss; stopped once done
    restart_unit: dict[Role, RestartUnit]  # what goes down and comes back with a lost task
    done_when: tuple[Role, ...]  # the job succeeded once every task of these roles has
    # Restart alone on their own count, fail the job only if `evaluator_required`, and are
    # waited for (timeouts.evaluator_seconds) once the job is done.
    sidecars: tuple[Role, ...] = (Role.EVALUATOR,)
    # Each role's restart policy where the cluster file's `restart.policy` names none for it
    # (unset, or a map without the role). Empty in a plan.json from before it was carried.
    restart_default: dict[Role, RestartPolicy] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"roles": list(self.roles), "required": [list(r) for r in self.required],
                "serve_first": list(self.serve_first), "servers": list(self.servers),
                "restart_unit": dict(self.restart_unit), "done_when": list(self.done_when),
                "sidecars": list(self.sidecars), "restart_default": {
                    r.value: p.value for r, p in self.restart_default.items()}}


# plan.json's `rules` are read back by pydantic (plan._PlanFile), as this dataclass.
_NEVER, _ON_FAILURE = RestartPolicy.NEVER, RestartPolicy.ON_FAILURE
RULES: dict[Strategy, StrategyRules] = {
    # Collectives need every worker: losing one restarts them all; done when all are.
    Strategy.MULTI_WORKER_MIRRORED: StrategyRules(
        roles=(Role.CHIEF, Role.WORKER, Role.EVALUATOR),
        required=(),
        serve_first=(),
        servers=(),
        restart_unit={Role.CHIEF: RestartUnit.GROUP, Role.WORKER: RestartUnit.GROUP,
                      Role.EVALUATOR: RestartUnit.ALONE},
        done_when=(Role.CHIEF, Role.WORKER),
        # A lost worker fails the job unless the cluster file asks for restarts: a restart
        # costs every worker's progress since the last backup. The evaluator restarts alone.
        restart_default={Role.CHIEF: _NEVER, Role.WORKER: _NEVER, Role.EVALUATOR: _ON_FAILURE},
    ),
    # ps and workers are TF servers the chief drives; the chief's coordinator retries a lost
    # worker's steps, so a worker restarts alone; a lost ps (the variables) restarts the job.
    Strategy.PARAMETER_SERVER: StrategyRules(
        roles=(Role.CHIEF, Role.WORKER, Role.PS, Role.EVALUATOR),
        required=((Role.CHIEF, "exactly one"), (Role.WORKER, "at least one"),
                  (Role.PS, "at least one")),
        serve_first=(Role.PS, Role.WORKER),
        servers=(Role.PS, Role.WORKER),
        restart_unit={Role.CHIEF: RestartUnit.GROUP, Role.WORKER: RestartUnit.ALONE,
                      Role.PS: RestartUnit.GROUP, Role.EVALUATOR: RestartUnit.ALONE},
        done_when=(Role.CHIEF,),
        # The servers come back: the chief's ClusterCoordinator rides out a lost worker (it
        # reschedules its functions), and a lost ps restarts the group from the chief's
        # checkpoints. A failing chief is the job's own failure.
        restart_default={Role.CHIEF: _NEVER, Role.WORKER: _ON_FAILURE, Role.PS: _ON_FAILURE,
                         Role.EVALUATOR: _ON_FAILURE},
    ),
}

def training(role: Role, rules: StrategyRules) -> bool:
    """A training task: not a sidecar (the evaluator), which restarts alone and decides
    nothing about the job."""
    return role not in rules.sidecars


def serving(role: Role, rules: StrategyRules) -> bool:
    """A server (PS: ps, worker): never exits on its own."""
    return role in rules.servers


def restarts_left(role: Role, policy: Policy, rules: StrategyRules, task_restarts: int,
                  job_restarts: int) -> bool:
    """The restart budget: a sidecar counts its own restarts, a training task the job's,
    against max_restarts."""
    used = job_restarts if training(role, rules) else task_restarts
    return used < policy.max_restarts
