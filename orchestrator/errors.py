"""SpecError: a mistake in what the user gave (the cluster file, a flag); the message names
the field or flag and the value, and the CLI exits 2 with it before anything starts.

In a module of its own so that the CLI can catch it without importing the spec's pydantic
models (`tfo --help` never needs them).
"""


class SpecError(Exception):
    """A mistake in the cluster file; the message names the field and the value."""
