"""Tests for transient_nb.cli.parser: the command's options, and what they become."""

from __future__ import annotations

import contextlib
import io

import pytest

from transient_nb.cli import commands
from transient_nb.cli.commands import main
from transient_nb.cli.parser import _parser


def test_the_description_is_the_commands_first_line():
    assert _parser().description == (commands.__doc__ or "").splitlines()[0]


def test_ps_hosts_reach_the_cluster_and_set_the_default_shards():
    from transient_nb.cli.parser import _cluster_kwargs, _train_kwargs

    args = _parser().parse_args(["run", "--ps-hosts", "2"])
    assert _cluster_kwargs(args)["ps_hosts"] == 2 and _train_kwargs(args)["shards"] == 2
    args = _parser().parse_args(["run", "--ps-hosts", "2", "--shards", "3"])
    assert _train_kwargs(args)["shards"] == 3
    args = _parser().parse_args(["run"])
    assert _cluster_kwargs(args)["ps_hosts"] is None and _train_kwargs(args)["shards"] == 1


def test_workers_take_a_mix_of_gpu_types_and_refuse_bad_ones(tmp_path, capsys):

    args = _parser().parse_args(["up", "--workers", "k80=2,p100=1,v100=1"])
    assert args.workers == {"k80": 2, "p100": 1, "v100": 1}
    assert _parser().parse_args(["up", "--workers", "3"]).workers == 3
    args = _parser().parse_args(["scale", "demo", "3", "--gpu", "v100"])
    assert (args.name, args.n, args.gpu, args.on_demand) == ("demo", 3, "v100", None)
    # --on-demand: a plain number stays a number; TYPE=N pairs parse as the mix does.
    assert _parser().parse_args(["scale", "demo", "3", "--on-demand", "1"]).on_demand == 1
    args = _parser().parse_args(["scale", "demo", "k80=2,v100=2", "--on-demand", "k80=1,V100=2"])
    assert args.on_demand == {"k80": 1, "v100": 2}
    assert _parser().parse_args(["scale", "demo", "3", "--on-demand", "v100=0"]).on_demand == {}
    for bad, words in [
        ("-1", "'-1' is not a whole number of workers of at least 0"),
        ("one", "'one' is not a whole number of workers"),
        ("v100=-1", "v100=-1 is not a number of workers"),
        ("v100=1,v100=2", "'v100' is given twice"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            _parser().parse_args(["scale", "demo", "3", "--on-demand", bad])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "argument --on-demand" in err and words in err
    args = _parser().parse_args(["move-ps", "demo", "us-east1-c", "--reason", "closer"])
    assert (args.command, args.name, args.zone, args.reason) == (
        "move-ps",
        "demo",
        "us-east1-c",
        "closer",
    )
    for bad, words in [
        ("k80=-1", "k80=-1 is not a number of workers"),
        ("three", "'three' is not a whole number of workers"),
        ("k80=2,k80=1", "'k80' is given twice"),
    ]:
        with pytest.raises(SystemExit):
            _parser().parse_args(["up", "--workers", bad])
        assert words in capsys.readouterr().err
    # A type the catalog has no price for: refused before anything starts.
    out = tmp_path / "o"
    assert main(["run", "--workers", "t4=1,h900=1", "--out", str(out), "--quiet"]) == 2
    assert "Unknown GPU type 'h900'" in capsys.readouterr().err
    assert list(out.glob("*/events.jsonl")) == []


@pytest.mark.slow
def test_spot_only_keeps_the_policy_from_on_demand_workers():
    from transient_nb.cli.parser import _policy_kwargs

    for argv, on_demand in (
        (["adapt", "c", "deadline:1h", "--spot-only"], {"on_demand": False}),
        (["adapt", "c", "deadline:1h"], {}),
        (["run", "--adapt", "cost-per-step", "--spot-only"], {"on_demand": False}),
    ):
        args = _parser().parse_args(argv)
        goal, kwargs = _policy_kwargs(args, args.goal if argv[0] == "adapt" else args.adapt)
        assert goal in ("deadline", "cost-per-step")
        assert {k: v for k, v in kwargs.items() if k == "on_demand"} == on_demand
    # The policy's memory file from the adapt and run commands (default: the configuration's).
    for argv in (["adapt", "c", "deadline:1h", "--memory", "h.json"],
                 ["run", "--adapt", "cost-per-step", "--memory", "h.json"]):  # fmt: skip
        args = _parser().parse_args(argv)
        _, kwargs = _policy_kwargs(args, args.goal if argv[0] == "adapt" else args.adapt)
        assert kwargs["memory"] == "h.json"
    _, kwargs = _policy_kwargs(_parser().parse_args(["adapt", "c", "off", "--memory", "h"]), "off")
    assert "memory" not in kwargs


def test_the_old_history_flag_is_memory_with_a_warning() -> None:
    """--history was --memory's name before 0.2: it still works for one release, warns naming
    --memory, and is left out of the help."""
    from transient_nb.cli.parser import _policy_kwargs

    for argv in (["adapt", "c", "deadline:1h", "--history", "h.json"],
                 ["run", "--adapt", "cost-per-step", "--history", "h.json"]):  # fmt: skip
        with pytest.warns(DeprecationWarning, match="--history is now --memory"):
            args = _parser().parse_args(argv)
        _, kwargs = _policy_kwargs(args, args.goal if argv[0] == "adapt" else args.adapt)
        assert kwargs == {**kwargs, "memory": "h.json"} and "history" not in kwargs
    with pytest.raises(SystemExit), contextlib.redirect_stdout(io.StringIO()) as out:
        _parser().parse_args(["adapt", "--help"])
    assert "--memory" in out.getvalue() and "--history" not in out.getvalue()
