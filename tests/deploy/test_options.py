"""Tests for transient_nb.deploy.options: the one option table of the CLI and the magic.

Every option the two surfaces share comes from the table, with the same flags, type, metavar,
help and default on both, unless the table itself names what one surface says otherwise.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from transient_nb.cli.parser import CLI_DEFAULTS, _parser
from transient_nb.deploy import options
from transient_nb.deploy.options import OPTIONS
from transient_nb.notebook.magic_parsers import SUBCOMMANDS

#: (CLI subcommand, magic subcommand, the table's options both take).
SHARED = [
    ("run", "up", (*options.CLUSTER, "detach")),
    ("up", "up", options.CLUSTER),
    ("run", "train", options.TRAIN),
    ("run", "adapt", options.POLICY),
    ("adapt", "adapt", ("goal", *options.POLICY)),
    ("scale", "scale", options.SCALE),
    ("scale-ps", "scale-ps", ("ps_n",)),
    ("move-ps", "move-ps", ("ps_zone", "reason")),
    ("estimate", "estimate", options.ESTIMATE),
]
#: Pairs whose every common flag is one option of the table (``run`` and ``adapt`` share
#: ``--max-workers`` in name only: the cluster's limit, the policy's largest cluster).
SAME = [(c, m) for c, m, _ in SHARED if (c, m) != ("run", "adapt")]


def _cli(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _magic(command: str) -> argparse.ArgumentParser:
    return SUBCOMMANDS[command].parser


def _action(parser: argparse.ArgumentParser, flags: tuple[str, ...]) -> argparse.Action:
    for a in parser._actions:
        if tuple(a.option_strings) == flags or (not a.option_strings and (a.dest,) == flags):
            return a
    raise AssertionError(f"{parser.prog} has no {flags}")


def _matches(action: argparse.Action, kwargs: dict[str, Any]) -> bool:
    want = {k: v for k, v in kwargs.items() if k != "action"}
    return all(getattr(action, k) == v for k, v in want.items())


@pytest.mark.parametrize(("cli", "magic", "names"), SHARED)
def test_the_shared_options_come_from_the_table_on_both_surfaces(cli, magic, names) -> None:
    for name in names:
        option = OPTIONS[name]
        for surface, parser in (("cli", _cli(cli)), ("magic", _magic(magic))):
            flags, kwargs = options.spec(name, surface)
            action = _action(parser, flags)
            assert _matches(action, kwargs), (surface, name, kwargs, action)
        # The defaults differ only where the table says so, per surface, in one place.
        if "default" not in option.cli and "default" not in option.magic:
            assert options.default(name, "cli") == options.default(name, "magic"), name


@pytest.mark.parametrize(("cli", "magic"), SAME)
def test_every_flag_both_surfaces_take_is_declared_once_in_the_table(cli, magic) -> None:
    def table_has(action: argparse.Action, surface: options.Surface) -> bool:
        return any(
            _matches(action, kw)
            for flags, kw in (o.on(surface) for o in OPTIONS.values())
            if flags == tuple(action.option_strings or (action.dest,))
        )

    c, m = _cli(cli), _magic(magic)
    magic_flags = {f for a in m._actions for f in a.option_strings} - {"-h", "--help"}
    for a in c._actions:
        common = set(a.option_strings) & magic_flags
        if not common:
            continue
        assert table_has(a, "cli"), (cli, a.option_strings)
        twin = next(b for b in m._actions if set(b.option_strings) & common)
        assert table_has(twin, "magic"), (magic, twin.option_strings)


def test_the_per_surface_defaults_are_the_ones_the_table_names() -> None:
    differ = {
        name: (options.default(name, "cli"), options.default(name, "magic"))
        for name, o in OPTIONS.items()
        if options.default(name, "cli") != options.default(name, "magic")
    }
    assert differ == {
        "preemption": ("exp:mean=60s", None),
        "provisioning_delay": ("5s", None),
        "cluster_seed": (0, None),
        "model": (None, "resnet32"),
        "data": (None, "synthetic"),
        "steps": (None, 64_000),
        "batch_size": (None, 128),
        "eval_images": (1000, None),
    }
    # The CLI's run fills in its demo's defaults after parsing (a resumed run keeps its own).
    assert CLI_DEFAULTS is options.CLI_RUN_DEFAULTS
    assert CLI_DEFAULTS == {
        "model": "resnet8",
        "data": "synthetic",
        "steps": 2000,
        "batch_size": 32,
        "shards": 1,
    }


def test_each_help_names_its_surfaces_own_default() -> None:
    """A help text's default comes from the default it names (the CLI's demo defaults
    included), so the two cannot drift apart."""
    helps = {
        (name, surface): options.spec(name, surface)[1].get("help") or ""
        for name in OPTIONS
        for surface in ("cli", "magic")
    }
    assert not [key for key, text in helps.items() if "{default}" in text]
    assert helps["steps", "cli"] == f"global steps (default: {CLI_DEFAULTS['steps']})"
    assert helps["steps", "magic"] == "global steps (default: 64000)"
    assert helps["batch_size", "cli"].endswith(f"(default: {CLI_DEFAULTS['batch_size']})")
    assert f"(default: {CLI_DEFAULTS['model']}, " in helps["model", "cli"]
    assert helps["eval_images", "cli"] == "test images per evaluation (default: 1000)"
    assert helps["eval_images", "magic"] == "test images per evaluation (default: all)"
    assert helps["preemption", "cli"].endswith("(local backend; default: exp:mean=60s)")
    assert helps["preemption", "magic"].endswith("default: the configuration's, none)")
    assert helps["provisioning_delay", "cli"].endswith("(simulated; default: 5s)")


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("workers", "0", "'0' is not a whole number of workers of at least 1; type e.g. 4"),
        ("workers", "k80=2,k80=1", "GPU type 'k80' is given twice"),
        ("budget", "-3", "budget=-3.0 must be a positive number of dollars"),
        ("budget", "lots", "budget='lots' must be a positive number of dollars"),
        ("deadline", "soon", "deadline='soon' must be a positive duration such as '10m'"),
        ("target_accuracy", "90", "'90' is not a fraction in (0, 1]"),
        ("time_scale", "0", "'0' is not a positive number"),
    ],
)
def test_each_type_says_what_to_type_on_both_surfaces(name, text, words) -> None:
    parse = options.spec(name, "cli")[1]["type"]
    assert parse is options.spec(name, "magic")[1]["type"]
    with pytest.raises(argparse.ArgumentTypeError, match=None) as info:
        parse(text)
    assert words in str(info.value)


def test_types_keep_what_was_typed_where_the_api_reads_text() -> None:
    assert options.spec("deadline", "cli")[1]["type"]("10m") == "10m"
    assert options.spec("budget", "cli")[1]["type"]("2.5") == 2.5
    assert options.spec("workers", "cli")[1]["type"]("k80=2,v100=1") == {"k80": 2, "v100": 1}
    assert options.spec("scale_on_demand", "cli")[1]["type"]("v100=0") == {}
