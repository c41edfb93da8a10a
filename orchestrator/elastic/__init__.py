"""Elastic jobs and backups: places and groups, what a lost place means, and the backup
directories a restart or a resize resumes from.

`groups` decides (pure: a group's members, on a loss or an answer, the plan of a new
group); `backups` reads and fills a BackupAndRestore directory; `backupstore` reaches them on
this host or a lab host. The loop acts on these decisions (loop.resizing, loop.backupfill).

May import: planning, launch, runs, errors, worker_entry.markers. Never the loop or the CLI.

Design: Elastic jobs
====================

Issue 27. TensorFlow cannot resize a running MultiWorkerMirrored group, but a group started
smaller on the same backups resumes where the bigger one stopped (`tests/test_elastic.py`: 3
workers stop at the start of epoch 2; the 2 workers of `plan_for`, on a `copy_backup` of the
backup directory, train epochs 2 and 3, `optimizer.iterations` 20 = 4 × 5). So a resize is a
restart of the whole training group at a new size. `elastic.py` decides (pure),
`resizing.py` carries it out in the loop. ParameterServer jobs resize differently
(ParameterServer, below). Not built yet: the `make bench` figures (the SSH-lab test prints
its two times).

**Spec.** `elastic: {min_workers, max_workers, probe_seconds: 30, max_resizes: 10,
lost_after_failures: 3}` (`ElasticSpec`), or `tfo run --workers 2:4` (as torchrun's
`--nnodes MIN:MAX`: 4 places round-robin over the hosts). `tasks.worker` is the pool of
places (a host twice, `lab1:auto`, for two workers on it; under Slurm a count, nodes of the
allocation); `max_workers` defaults to all of them and may not exceed them. Refused, naming
the field: a chief task under multi_worker_mirrored (worker 0 is the chief, and the role
must be able to move), a parameter_server job's max_workers other than its listed workers
(all start: the chief's TF_CONFIG names them), min above max or the places, min 0,
`lost_after_failures` past what `max_restarts` lets happen under a restarting policy.

**States.** A host is IN USE, LOST or SPARE (listed, not in use); `elastic.Group` holds them
as data: `members` (the slot in `tasks.worker` of worker 0, 1, …), `lost` (hosts),
`resizes`. What is lost as a whole is a place's `where`: its host, but on this machine the
place alone (`localhost:PORT`): the coordinator's own machine is never lost, a place on it
is (its tasks failing in a row).

    IN USE ──lost: a start failed (unreachable or refused), its lifeline cut, or
             lost_after_failures failures of its own in a row (not one that
             followed a peer gone or stopped; an epoch trained ends the row)──▶ LOST
    LOST/SPARE ──answers a probe (every probe_seconds), at the next epoch boundary,
                 below max_workers──▶ IN USE
    a loss that would leave fewer than min_workers, or max_resizes spent ──▶ no resize:
                 the restart policy decides (decide.on_loss), as for a fixed-size job

**Shrink** (`on_lost`): every place on a lost host leaves (a host as a whole); the others
keep their order, re-indexed from 0, so worker 0's role (TFO_IS_CHIEF, the model's save)
passes to the first left when the chief's host is lost; spare places whose hosts answered
the last probe fill in up to max_workers. **Grow** (`on_answer`): at an epoch boundary, the
places of hosts that answered join after the current workers (no index moves, the chief
stays), as many as fit under max_workers. Each resize is one `job_resized` event `{from, to,
reason, hosts}` (`Resize.event`; `Resize.words` for the `[tfo]` line); resizes do not count
against `max_restarts`, and stop at `max_resizes` (a flapping host).

**What a task sees.** `plan_for(plan, places, group)` is `make_plan` of the spec with
`tasks.worker` the group's places (each at its own port and node, whatever its index):
TF_CONFIG of the current size, contiguous indices, `TFO_NUM_WORKERS`
(worker_entry.markers.num_workers, an entry's `ctx.num_workers`), TFO_BACKUP_DIR per place
(below). The plan's `spec` stays the run's (the whole pool; plan.json keeps the first plan,
and `tfo rerun` starts from the pool again).

**Backups.** A worker's backup directory (TFO_BACKUP_DIR) is its place's,
`backup/worker-SLOT` on the place's host, whatever its index (`plan_for`): after a shrink
every remaining worker finds its own backups where it left them, on any host, and nothing is
copied. The group resumes from the newest backup every remaining worker holds
(`resume_from`; save numbers, ckpt-N, as `TaskBackup` agrees on them); a worker whose
directory lacks it (a place joining, its directory stale or empty) gets it copied in from a
peer's, one on its host first, through `launch/backupstore.BackupStore`: on this machine
`backups.copy_backup`; on a lab host through its SSH connection (a listing and the
`checkpoint` file to read it, sftp through the coordinator to fill it, built beside and
renamed). The loop waits for the copy (a backup is a model's size; each remote call is
bounded by the host's connect timeout). A joiner the store cannot reach (a scheduler's node:
`elastic.unfilled_joiners`) is not grown onto: its stale directory would leave the group no
backup in common. With no backup in common the tasks start over together, as `TaskBackup`
already does. A script with its own `BackupAndRestore(backup_dir=…)` (TensorFlow's tutorial,
or on TFO_BACKUP_DIR) keeps the chief's backup alone (Backups across restarts, above): a
resize reads and fills those directories instead (`backup_dirs(plan, script)`), resuming
from the newest backup any remaining worker's directory holds
(`resume_from(chief_keeps=True)`), copied to the others' (`Refill.fill`, the same as a
restart's). With the chief's host the one lost and no other copy, the group starts over.

**In the loop** (`orchestrator/loop/resizing.py`, `Resizing`; the Supervisor makes one where
`spec.elastic` is set):

1. Start: `groups.first(plan)`, once, in pipeline.run: the places (`pool`, each keeping
   the port and node the first plan gave it), `first_group`, and `plan_for` of that group,
   which the Supervisor is handed (`elastic=`) and runs (plan.json keeps the first plan, of
   the whole pool).
2. Shrink: `Exits.lost` asks `Resizing.lost` first (`exits.resize`). A worker's place is
   lost by a failed start (its handle None), a cut lifeline (its handle lost
   contact), or `lost_after_failures` failures of its own in a row
   (`failures_in_row`; the count is the place's): a failure when a peer of its group was
   gone (failed, exited with a failure, contact lost) or stopped (its usage: state T) is not
   its own (`own_failure`), and a success, an epoch trained (a step, for a task that tells
   no epochs: `trained_well`), ends the row, in `lost` for the failing attempt's own and in
   `tick` for a running one. Then `on_lost`: `Resize` → step 4; `NoResize(follow_policy)` →
   `decide.on_loss` as for any job (the reason said in a `[tfo]` line).
3. Grow: `Resizing.tick`, each round: `to_probe`'s places are probed every `probe_seconds`
   in a daemon thread (`resizing.reachable`: this machine yes; an SSH host a TCP connect to
   its SSH port within its connect timeout; a scheduler's node no), the answers taken the
   next round; at worker 0's next epoch (`at_epoch_boundary`: its progress marker's epoch
   moved on since the last round) with some answering and the job RUNNING, `on_answer` →
   `Resize` → step 4, unless the store cannot fill a joiner's backups (`unfilled_joiners`:
   said once in a `[tfo]` line, and the group stays as it is).
4. `Resizing.resize`: the job RESTARTING, the training group stopped (`stopping.stop`:
   SIGTERM, the grace, SIGKILL; for a grow a preemption the tasks save at), then `_regroup`:
   `plan_for` of the new group; the backup (`previous_dirs`, the store's `held` of each
   directory, `resume_from`; the store's `copy` of each fill); `job_resized {from, to,
   reason, hosts, save}` and a `[tfo]` line (the summary and `tfo status` print a line per
   resize, `report.resize_lines`; the live table's title the size and bounds,
   `liveview.size_note`); the records follow the new plan (a name dropped is set aside and
   takes its record back when it returns: its attempts go on counting); each training task
   PENDING at once, `task_restarted` `counted: false`. Resizes never count against
   `max_restarts`; `Group.resizes` against `max_resizes`. A warm spare is handed over only
   to the TaskPlan it was made for (`Spares.take`): the resized plan's worker:1 is not the
   old one's.

Tested: `tests/test_resizing.py`: the loop's decisions as tables (a place's row of failures:
its own only, ended by a success); scripted loops on the fake clock (3 → 2 after two
failures in a row, one counted restart; no loss where the first failure followed a peer's
SIGSTOP and epochs trained before the second; back to 3 at the next epoch; below
`min_workers` the policy ends the job); and TensorFlow: 3 `localhost:auto` workers, worker:2
exits after epoch 1 and then at every start: resized 3 → 2 from backup 2, the 2 workers
begin at epoch 2 and finish, the chief saves once (13-37 s); the same place lost after epoch
0 (`lost_after_failures: 1`) and back at the next epoch, the joiner's directory filled: 3 →
2 → 3, all resuming where the 2 had got to (24 s); TensorFlow's tutorial script unmodified
(its own `BackupAndRestore` on one directory), worker:2 SIGKILLed after epoch 1
(`lost_after_failures: 1`): 3 → 2, resumed from its backup (12 s). The tutorial on the three
lab hosts, a relative `--backup_dir` under each host's workdir (no shared directory), lab3's
link down in epoch ≥ 2: 3 → 2, lab2's `backup/chief` filled from lab1's (the chief's alone),
both resume at the same epoch from it, the chief writes the model, and no backup is left on
any host (27 s). Without the fill, lab2 restored nothing beside lab1's epoch and the
restore's collectives failed ("Collective instance … expected … data_type 9 but got … 1")
until `max_restarts` ran out. `tests/test_elastic_lab.py` (SSH lab, under its lock): three
lab hosts, lab3's (and again lab1's, the chief's: worker 0 moves to lab2) link down after
every worker's backup of epoch 0 (`partition`): its lifeline (5 s) cut, 3 → 2 by `lifeline`,
lab1 and lab2 resume at epoch 1 from the backups in their places' directories and finish (70
s; lost 5 s after the cut, restarted 1.5 s later). Cut during the epoch's save instead, the
workers left hang in the save's collectives (SyncOnRead metrics) and no backup of that epoch
is written: the group starts over. And the link back up: lab3 answers its probe
(`probe_seconds: 2`), 2 → 3 at worker 0's next epoch, lab3's stale directory filled from
lab1's by sftp, all three resume at the grow's backup (49 s). Measured (`bench/run.py --only
elastic`, 3 workers of `faulty:train` on three lab hosts, lifeline 5 s, probe 2 s, cold
restarts; 2 cores at load 9-16, 3 runs, median (min-max)): lab3's link down → the 2 training
again 12.9 s (7.8-22.3; the lifeline's silence and the stop 5.2-6.0 s of it, the rest the
restart: TensorFlow's import, the strategy, the restore); its link up → the 3 training 12.3
s (6.7-13.5; probe, the next epoch and the graceful stop 2.9-6.6 s). Worker 0's loss at each
epoch's end, the same to 3 decimals in every run: 1.770 0.709 0.326 | 3→2 | 0.218 0.147
0.119 | 2→3 | 0.095 0.105 0.092 0.073 0.076 0.052: the epoch count goes on from the backup
and the loss where it was (`bench/elastic-loss.png`). Measured there (2 loaded cores): from
the loss (the lifeline's 5 s after the cut) to the 2 workers' first step 5.6-10.1 s; from
the grow's `job_resized` to the 3 workers' first step 5.9 s.

**ParameterServer.** A parameter_server job's chief (its ClusterCoordinator) reschedules a
lost worker's functions on the others and takes the worker back once it serves again
(`tests/test_ps.py`: a worker server restarting alone), but a ps holds variables: its loss
ends the chief's `fit`. So the two resize differently, both decided in
`elastic.ps_on_lost`/`ps_on_answer` (pure), told to the loop by `Resize.act` and carried out
by `resizing.PsResizing` (a `Resizing` whose decisions, grow and backup are a PS job's;
`resizing.make` picks it). One rule of TensorFlow's shapes them: a chief does not connect
(`ParameterServerStrategy` blocks in its construction, measured: still waiting after 90 s)
while a worker its TF_CONFIG names does not serve.

- The group: `members` every listed worker (all start: `first_group`; the spec refuses a
  `max_workers` below them, as the chief's TF_CONFIG names every worker), `ps` the ps places
  in use (`pool(…, role=Role.PS)`), `dropped` the workers dropped where they are;
  `Group.size` (the event's `from`/`to`) counts the workers working.
- A lost worker (lost as above: a failed start, a cut lifeline, `lost_after_failures`
  failures in a row; a server has no steps, so each of its failures adds to the row) is
  dropped, `Act.DROP`: `PsResizing._drop` stops it if it still runs (a stall's loss) and
  sets its record aside; nothing else stops, the plan stays (the chief's TF_CONFIG still
  names it), `job_resized` 3 → 2. Its host's last answer is forgotten, so only a probe after
  the drop brings it back. Before the chief is up (RUNNING: connected), the same loss is an
  `Act.REGROUP` without the worker instead (`chief_up`): the chief would wait for it.
- A dropped worker's host that answers a probe: `Act.REJOIN`, at once (no epoch boundary:
  the chief never stopped): `PsResizing._rejoin` puts its record back, PENDING, not counted,
  on the same plan, `job_resized` 2 → 3. Chosen over a restart of the chief at the new size
  (which MWMS needs): the coordinator already takes a worker back, and the chief's steps go
  on meanwhile.
- A lost ps (or a host with a ps and a worker, lost as a whole): `Act.REGROUP`, the resize
  of step 4, with `plan_for(…, ps_places=)` of the ps left and the workers working
  (contiguous indices; dropped ones whose hosts answered since back in); `job_resized` with
  `ps: {from, to}` (the summary's and `tfo status`'s line: `3 → 3 workers, 2 → 1 ps`), its
  `save` the newest backup in the chief's directory (`PsResizing._fill_backups`: nothing to
  fill), which the chief's `TaskBackup` restores. With no ps left, below `min_workers`, or
  `max_resizes` spent: `NoResize(follow_policy)`, the restart policy (a ps on-failure
  restarts the group; the chief never).
- Whenever the restart policy restarts the chief (its unit stopped, `Exits.restart` asks
  `Resizing.replan`), dropped workers leave its TF_CONFIG first (`PsResizing.replan`: the
  plan of the workers working, records following it, a `[tfo]` line; no resize counted). A
  lost ps is not grown back, nor a worker left out of a TF_CONFIG: either would restart the
  chief (a later ps loss's restart takes the worker back if its host answers).

Tested: `tests/test_elastic.py` (the PS decisions as tables: drop, below `min_workers`, a ps
lost, a host with both, the last ps, `max_resizes`, a rejoin, a place left out of the
TF_CONFIG; `plan_for` with one ps); `tests/test_resizing.py`, scripted: a worker failing
twice dropped with the chief's one attempt finishing, a rejoin when its place answers, a ps
failing twice restarting the job with one ps, the last ps following the policy, a worker
failing before the chief started leaving its TF_CONFIG, a policy restart of the chief
leaving a dropped worker out; and TensorFlow (`localhost:auto`, chief, 2 workers, 2 ps,
`lost_after_failures: 1`): worker:1 SIGKILLed at the chief's epoch 1, 2 → 1 and back 1 → 2
(its server ready again 9.5 s later) with nothing stopped, the chief training on meanwhile,
then ps:1 SIGKILLed: 2 → 1 ps, the chief resumed at epoch 7 from backup 7 (15 s from the
loss to its restart's ready) and saved once (52-63 s at load 5-17 on the shared 2 cores).
"""
