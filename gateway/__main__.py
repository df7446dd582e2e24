"""`python -m gateway` runs the `owngate` command."""

from gateway.cli.main import entrypoint

entrypoint()
