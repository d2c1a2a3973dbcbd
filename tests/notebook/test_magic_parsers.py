"""Tests for transient_nb.notebook.magic_parsers: every subcommand's options and their types.

The magic's own tests (tests/notebook/test_magics.py) type these lines into a shell; here each
parser answers alone, with the sentence the magic raises.
"""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from transient_nb.notebook.magic_parsers import SUBCOMMANDS, _parse


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("up --workers four", "argument --workers: 'four' is not a whole number of workers"),
        ("up --workers 0", "of at least 1; type e.g. 4"),
        ("up --time-scale fast", "'fast' is not a positive number"),
        ("up --as 2x", "'2x' is not a Python variable name; type e.g. --as cluster"),
        ("up --colour red", "unrecognized arguments: --colour red"),
        ('up --name "demo', "No closing quotation; check the quotes"),
        ("scale -1", "%transient_cluster scale"),
        ("scale-ps 0", "'0' is not a whole number of PS hosts of at least 1"),
        ("move-ps", "the following arguments are required: ZONE"),
        ("scale 2 --on-demand -1", "argument --on-demand: '-1' is not a whole number of workers"),
        ("scale 2 --on-demand v100=-1", "v100=-1 is not a number of workers"),
        ("scale 2 --on-demand v100=1,v100=1", "GPU type 'v100' is given twice"),
        ("connect", "the following arguments are required: NAME"),
        ("up --workers k80=-1", "k80=-1 is not a number of workers"),
        ("up --workers k80=2,k80=1", "GPU type 'k80' is given twice"),
    ],
)
def test_mistakes_say_what_to_type(line: str, message: str) -> None:
    command, _, rest = line.partition(" ")
    with pytest.raises(UsageError) as info:
        _parse(SUBCOMMANDS[command], rest, command)
    assert message in str(info.value)


def test_every_subcommand_has_its_parser_and_its_help() -> None:
    for name, func in SUBCOMMANDS.items():
        assert func.parser.prog == f"transient_cluster {name}"
        assert func.parser.description
