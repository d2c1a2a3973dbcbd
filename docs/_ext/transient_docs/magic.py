"""The parsers of the CLI and of the magic, as sphinx-argparse renders them.

Each subcommand of the ``%transient_cluster`` magic has its own IPython ``MagicArgumentParser``
(the ``@argument`` decorators in ``transient_nb/notebook/magic_parsers.py``, collected in
``SUBCOMMANDS``); the cell form has its own too. :func:`parser` joins them under one parser
whose subcommands are theirs, so the reference page is generated from the very parsers the magic
runs. :func:`cli_parser` is the CLI's own parser.

sphinx-argparse parses every help text with plain docutils, where a Sphinx role (a docstring's
``:func:`x```) is an error that stops the build; :func:`plain` writes roles as inline code first.
"""

from __future__ import annotations

import argparse
import inspect
import re

_ROLE = re.compile(r":(?:py:)?[a-z]+:`~?([^`]+)`")


def _text(text: str | None) -> str | None:
    return None if text is None else _ROLE.sub(r"``\1``", text)


def plain(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` and its subparsers with every Sphinx role in their texts as inline code."""
    parser.description = _text(parser.description)
    parser.epilog = _text(parser.epilog)
    for action in parser._actions:
        if isinstance(action.help, str):
            action.help = _text(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                choice.help = _text(choice.help)
            for sub in dict.fromkeys(action.choices.values()):
                plain(sub)
    return parser


def cli_parser() -> argparse.ArgumentParser:
    """``transient-nb``: the command's own parser."""
    from transient_nb.cli.parser import _parser

    return plain(_parser())


def _first_paragraph(text: str | None) -> str:
    return inspect.cleandoc(text or "").split("\n\n", 1)[0].replace("\n", " ")


def parser() -> argparse.ArgumentParser:
    """``%transient_cluster SUBCOMMAND ...``: every subcommand's own parser under one."""
    from transient_nb.notebook import magic_parsers, magics

    line = magics.TransientMagics.transient_cluster
    top = argparse.ArgumentParser(
        prog="%transient_cluster",
        description=_first_paragraph(line.__doc__),
        add_help=False,
    )
    sub = top.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    for name, func in magic_parsers.SUBCOMMANDS.items():
        own = func.parser
        sub.add_parser(
            name,
            parents=[own],
            add_help=False,
            help=_first_paragraph(own.description),
            description=inspect.cleandoc(own.description or ""),
        )
    return plain(top)


def cell_parser() -> argparse.ArgumentParser:
    """``%%transient_cluster [options]`` and its YAML body."""
    from transient_nb.notebook import magic_parsers

    own = magic_parsers._cell.parser
    return plain(
        argparse.ArgumentParser(
            prog="%%transient_cluster",
            parents=[own],
            add_help=False,
            description=inspect.cleandoc(own.description or ""),
        )
    )
