"""The ``%transient_cluster`` magic as one argparse parser, for sphinx-argparse to render.

Each subcommand of the magic has its own IPython ``MagicArgumentParser`` (the ``@argument``
decorators in ``transient_nb/notebook/magics.py``, collected in ``SUBCOMMANDS``); the cell form
has its own too. :func:`parser` joins them under one parser whose subcommands are theirs, so the
reference page is generated from the very parsers the magic runs.
"""

from __future__ import annotations

import argparse
import inspect


def _first_paragraph(text: str | None) -> str:
    return inspect.cleandoc(text or "").split("\n\n", 1)[0].replace("\n", " ")


def parser() -> argparse.ArgumentParser:
    """``%transient_cluster SUBCOMMAND ...``: every subcommand's own parser under one."""
    from transient_nb.notebook import magics

    line = magics.TransientMagics.transient_cluster
    top = argparse.ArgumentParser(
        prog="%transient_cluster",
        description=_first_paragraph(line.__doc__),
        add_help=False,
    )
    sub = top.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    for name, func in magics.SUBCOMMANDS.items():
        own = func.parser
        sub.add_parser(
            name,
            parents=[own],
            add_help=False,
            help=_first_paragraph(own.description),
            description=inspect.cleandoc(own.description or ""),
        )
    return top


def cell_parser() -> argparse.ArgumentParser:
    """``%%transient_cluster [options]`` and its YAML body."""
    from transient_nb.notebook import magics

    own = magics._cell.parser
    return argparse.ArgumentParser(
        prog="%%transient_cluster",
        parents=[own],
        add_help=False,
        description=inspect.cleandoc(own.description or ""),
    )
