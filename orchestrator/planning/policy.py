"""How a job reacts to a lost task, and its time limits: the plan's `policy`.

    restart_allowed(RestartPolicy.EXIT_CODE, 3)     # False: the program's own verdict
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from worker_entry.markers import EXIT_PERMANENT, Role

# A stall: the least time a task may stand still before it is judged stalled (the spec's
# timeouts.stall_min_seconds; loop.stall decides with it).
FLOOR_SECONDS = 60.0


class RestartPolicy(str, Enum):
    """TFJob's vocabulary. `exit-code`: 1-127 are permanent, 128-255 (signals) are retried."""

    NEVER = "never"
    ON_FAILURE = "on-failure"
    ALWAYS = "always"
    EXIT_CODE = "exit-code"


def restart_allowed(policy: RestartPolicy, returncode: int | None) -> bool:
    """TFJob's rules; `returncode` None means the task never came up (retryable). A task
    that exits EXIT_PERMANENT (its entry does not exist) is never restarted."""
    if returncode == EXIT_PERMANENT:
        return False
    if policy is RestartPolicy.ALWAYS:
        return True
    if policy is RestartPolicy.NEVER:
        return False
    if returncode is None:
        return True
    if policy is RestartPolicy.ON_FAILURE:
        return returncode != 0
    # EXIT_CODE: 1-127 are the program's own verdict (permanent); signals are retried.
    return returncode < 0 or returncode >= 128


@dataclass(frozen=True)
class Policy:
    restart: dict[Role, RestartPolicy]  # for each role the job lists
    max_restarts: int  # job restarts; a sidecar counts its own
    backoff_seconds: float | None  # None: no wait outside a crash loop (decide.restart_wait)
    startup_seconds: float  # from start to the ready marker
    deadline_seconds: float | None  # the whole run
    grace_seconds: float  # from SIGTERM to SIGKILL
    evaluator_seconds: float  # how long sidecars are waited for once the job is done
    evaluator_required: bool  # a sidecar that is lost for good fails the job
    # Training tasks whose steps stopped moving (or that are stopped, or whose group idles)
    # this long have stalled (orchestrator.loop.stall): seconds; "auto", which adapts to the
    # job's steps and is never below `stall_min_seconds`; None: never.
    stall_seconds: float | str | None = None
    stall_min_seconds: float = FLOOR_SECONDS
    warm_spares: bool | str = "auto"  # restart.warm_spares: True, False or "auto"
    # Once the job is done, a sidecar quiet (no output, no CPU) this long has evaluated the
    # last checkpoint and is stopped; None: waited for (an entry's evaluator exits by itself).
    evaluator_idle_seconds: float | None = None
    # A task of a job of more than one task that trains outside the plan's cluster fails
    # the job (orchestrator/loop/joined.py); False: independent tasks on purpose.
    expect_cluster: bool = True

    def to_json(self) -> dict[str, Any]:
        """plan.json's `policy`; pydantic reads it back as this dataclass (plan._PlanFile)."""
        return {**self.__dict__, "restart": {r.value: p.value for r, p in self.restart.items()}}
