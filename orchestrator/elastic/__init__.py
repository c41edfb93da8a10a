"""Elastic jobs and backups: places and groups, what a lost place means, and the backup
directories a restart or a resize resumes from.

`groups` decides (pure: a group's members, on a loss or an answer, the plan of a new
group); `backups` reads and fills a BackupAndRestore directory; `backupstore` reaches them on
this host or a lab host. The loop acts on these decisions (loop.resizing, loop.backupfill).

May import: planning, launch, runs, errors, worker_entry.markers. Never the loop or the CLI.
"""
