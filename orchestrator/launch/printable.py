"""A line from a task or a host, made safe for a terminal: what a task prints is untrusted.

    printable(line)     # control characters written out, \\r and \\b applied first
    overstrike(line)    # \\r and \\b applied, as a terminal would

Here, below the console, because launching reads the tasks' and hosts' output (launch.output,
preflight) and the CLI shows it (cli.console, liveview, report).
"""

from __future__ import annotations

import re

__all__ = ["overstrike", "printable"]


def printable(text: str) -> str:
    """`text` with every control character but tab written out (`\\x1b[31m`): nothing a task
    prints may move the cursor, recolor or retitle the terminal, or set its clipboard.
    Carriage returns and backspaces are applied first, as a terminal would (`overstrike`)."""
    if text.isprintable():
        return text
    text = overstrike(text)
    return "".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in text)


def overstrike(text: str) -> str:
    """The line as a terminal leaves it: `\\r` back to its start, `\\b` back one column,
    later characters written over earlier ones. tf-keras's Progbar redraws its bar so (runs
    of `\\b`, then `\\r`) even into a pipe; escaped, each epoch was a wall of `\\x08`."""
    if "\r" not in text and "\b" not in text:
        return text
    cells: list[str] = []
    col = 0
    # Split on the two, keeping them: the text between is written at `col` in one slice.
    for part in _OVERSTRIKE.split(text):
        if part == "\r":
            col = 0
        elif part == "\b":
            col = max(0, col - 1)
        elif part:
            cells[col:col + len(part)] = part
            col += len(part)
    return "".join(cells)


_OVERSTRIKE = re.compile(r"([\r\b])")
