from orchestrator.cli.commands import main

main()
