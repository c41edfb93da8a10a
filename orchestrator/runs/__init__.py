"""A run's directory: its layout, lock, event log, history and logs on disk.

The lowest layer: every other part may import it; it imports nothing of tfo's but
orchestrator.errors.
"""
