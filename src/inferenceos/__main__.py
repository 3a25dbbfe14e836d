"""`python -m inferenceos` runs the CLI."""

from inferenceos.cli.entry import main

main()
