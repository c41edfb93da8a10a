"""The `tfo` command and what it shows: commands and options, the console writer, the live
table, the end-of-run report, `tfo logs`, the guide and the generated reference.

    tfo = orchestrator.cli.commands:main

May import every other part of orchestrator; nothing imports it but `__main__`.
"""


def main() -> None:
    """`tfo`: the console script's entry (pyproject's `orchestrator.cli:main`), importing the
    commands only when called."""
    from orchestrator.cli.commands import main as commands_main

    commands_main()
