"""A stalled task's stacks, asked for: a `?` down its lifeline makes its wrapper signal
faulthandler, and every Python thread's stack lands in its output. The request is a
deadline the loop wakes for (STACKS_WAIT_SECONDS), not a wait inside it.

    ask_stacks(job, stalls, then)   # then({task: its threads}) once the dumps are in"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.launch import TaskHandle
from orchestrator.loop.job import Job
from orchestrator.loop.records import TaskRecord
from orchestrator.loop.stall import Frame, Stall, threads

# How long a stalled task's stacks are waited for before it is killed (faulthandler writes
# them at once; a task whose main thread holds the GIL still answers: it is C code).
STACKS_WAIT_SECONDS = 2.0
STACKS_QUIET_SECONDS = 0.3  # a dump has ended when its task printed nothing more this long
LOOK_SECONDS = 0.05  # how often the dumps are looked at meanwhile

Stacks = dict[str, list[list[Frame]]]


def ask_stacks(job: Job, stalls: list[Stall], then: Callable[[Stacks], None]) -> None:
    """Ask each stalled task that can answer (not stopped) for its stacks; `then` gets each
    one's threads, by task, once their dumps are in (or STACKS_WAIT_SECONDS passed)."""
    request = StacksRequest(job, [job.records[s.task] for s in stalls if not s.stopped], then)
    if request.asked:
        job.hold = request
    else:
        request.answer()


class StacksRequest:
    def __init__(self, job: Job, asked: list[TaskRecord], then: Callable[[Stacks], None]
                 ) -> None:
        self.job, self.asked, self.then = job, asked, then
        for r in asked:
            r.stack_lines = []
            request = getattr(r.handle, "request_stacks", None)  # a backend without: none
            if request is not None:
                request()
        now = job.clock()
        self.until, self.seen, self.quiet_since = now + STACKS_WAIT_SECONDS, -1, now

    def handles(self) -> list[TaskHandle]:
        return []  # exits wait until the stacks are in

    def wake_in(self, now: float) -> float:
        return min(LOOK_SECONDS, self.until - now)

    def step(self, now: float) -> None:
        if now < self.until and self.job.signal_count < 2:
            count = sum(len(r.stack_lines or []) for r in self.asked)
            if count != self.seen:
                self.seen, self.quiet_since = count, now
                return
            if now - self.quiet_since < STACKS_QUIET_SECONDS or not all(
                    threads(r.stack_lines or []) for r in self.asked):
                return
        self.answer()

    def answer(self) -> None:
        if self.job.hold is self:
            self.job.hold = None
        stacks = {r.name: threads(r.stack_lines or []) for r in self.asked}
        for r in self.asked:
            r.stack_lines = None
        self.then(stacks)
