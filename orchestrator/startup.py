"""A `tfo` command's start: garbage collection and pydantic's plugin scan are off while it
starts, and back on once a long command settles into its loop.

    with starting():    # cli.main(), around the whole command
        ...
        settled()       # tfo run before its first task starts, tfo logs -f before following

Why: a command's imports (typer's and pydantic's schema machinery, our spec's models, rich)
allocate some 40,000 objects that live until exit. The collector walks them again and again
while they are made, and once more at exit: about 0.1 s of a 0.5 s `tfo plan` on a 2-core
machine, for no garbage. pydantic also scans every installed distribution's entry points for
plugins when it builds the first model (0.015 s here, more in a large ML environment); typer
0.29 turns that off for its own adapters the same way, and tfo's models want no plugins.
The environment variable is set only while starting: tasks inherit tfo's environment, and a
user's own pydantic plugins in a task are theirs.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator

NO_PLUGINS = "PYDANTIC_DISABLE_PLUGINS"
_saved: list[str | None] = []  # the user's value, while starting


@contextlib.contextmanager
def starting() -> Iterator[None]:
    gc.disable()
    _saved.append(os.environ.get(NO_PLUGINS))
    os.environ[NO_PLUGINS] = "1"
    try:
        yield
    finally:
        settled()  # frozen, what is alive at exit is not walked once more


def settled() -> None:
    """The command's setup is done: what it imported and built is frozen (never walked by
    the collector again), collection is back on for its loop, and the user's environment
    is as it was. Idempotent."""
    if _saved:
        value = _saved.pop()
        if value is None:
            os.environ.pop(NO_PLUGINS, None)
        else:
            os.environ[NO_PLUGINS] = value
    gc.freeze()
    gc.enable()
