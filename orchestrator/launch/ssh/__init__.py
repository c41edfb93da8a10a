"""Lab hosts over SSH: the backend, the host agent each host runs, the remote channel,
and the project's code synced there (what is sent: projectfiles).

May import: orchestrator.launch, planning, runs, errors, worker_entry.
"""
