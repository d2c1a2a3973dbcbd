"""The ``transient-nb`` command."""

from transient_nb.cli.commands import main

__all__ = ["main"]
