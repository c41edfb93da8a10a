"""Example entries for the guide's cluster files (`entry: worker_entry.examples.digits:train`)."""
