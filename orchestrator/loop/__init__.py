"""The supervision loop: one job's tasks watched, judged and acted on until the job ends.

    Supervisor(plan, launcher, run_dir, clock=…).run() -> records.RunResult

`supervise` is the loop; `job` and `records` its state; `decide` (and the pure modules
beside it: stall, rate, resumes, joined) the decisions, table-tested on a fake clock;
`intake`, `exits`, `starts`, `stopping`, `checks`, `stacks`, `backupfill`, `resizing` and
`rundirwatch` act on them; `markers` reads what a task's side reports.

May import: planning, launch, elastic, runs, errors, worker_entry.markers. Never the CLI.
"""
