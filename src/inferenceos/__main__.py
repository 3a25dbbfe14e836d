"""`python -m inferenceos` runs the CLI."""

from inferenceos.cli.main import main

main()
