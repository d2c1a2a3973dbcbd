"""The one option table of both surfaces: the ``transient-nb`` command and the ``%transient_cluster``
magic.

Each option the two share is declared here once: its flags, its type (each error says what to
type instead), its metavar, its help and its default. The CLI's argparse parser
(:mod:`transient_nb.cli.parser`) and the magic's parsers (:mod:`transient_nb.notebook.magic_parsers`,
IPython's ``magic_arguments``, argparse underneath) are both built from :data:`OPTIONS` with
:func:`spec`. Where a surface really differs (the CLI's ``run`` is a demo of minutes on 2 CPU
cores; the magic names the notebook's variables), the option says so in one place: its ``cli``
or ``magic`` entries, which replace the shared keyword arguments on that surface alone.

The types that parse what was typed, each error saying what to type instead, are
:mod:`transient_nb.deploy.arg_types`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from transient_nb.deploy.arg_types import (
    Renamed,
    fraction,
    length,
    money,
    names,
    on_demand,
    positive,
    whole,
    workers,
)
from transient_nb.training.hparams import HParams

#: The two surfaces: the ``transient-nb`` command and the ``%transient_cluster`` magic.
Surface = Literal["cli", "magic"]


# -- the table ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    """One option of both surfaces: ``flags`` and ``add_argument``'s keyword arguments.

    ``cli`` and ``magic`` hold what one surface says otherwise (a default, a help text); they
    are the only place a surface differs. A help text's ``{default}`` names the surface's
    default: its ``shown`` text where the option has one (``"all"`` for None), else the default
    itself, so a surface with a default of its own needs no help text of its own.
    """

    flags: tuple[str, ...]
    kwargs: Mapping[str, Any]
    cli: Mapping[str, Any] = field(default_factory=dict)
    magic: Mapping[str, Any] = field(default_factory=dict)

    def on(self, surface: Surface) -> tuple[tuple[str, ...], dict[str, Any]]:
        """``(flags, kwargs)`` of ``add_argument`` (or IPython's ``argument``) on ``surface``."""
        own = self.cli if surface == "cli" else self.magic
        kwargs = {"default": None, **self.kwargs, **own}
        shown = kwargs.pop("shown", None)
        if "default" in own and "shown" not in own:
            shown = own["default"]  # the surface's own default, not the shared text
        if shown is None:
            shown = kwargs["default"]
        if isinstance(kwargs.get("help"), str):
            kwargs["help"] = kwargs["help"].replace("{default}", str(shown))
        return self.flags, kwargs


def _o(*flags: str, cli: Mapping[str, Any] | None = None, magic: Mapping[str, Any] | None = None,
       **kwargs: Any) -> Option:  # fmt: skip
    return Option(tuple(flags), kwargs, dict(cli or {}), dict(magic or {}))


def _usd(flag: str, what: str, help: str) -> Option:
    """A sum of dollars (metavar ``USD``); ``what`` names it in the error."""
    return _o(flag, type=money(what), metavar="USD", help=help)


def _count(flag: str, what: str, help: str, **kwargs: Any) -> Option:
    """A count of at least one (metavar ``N``); ``what`` names its unit in the error."""
    return _o(flag, type=whole(what, 1), metavar="N", help=help, **kwargs)


#: What the CLI's ``run`` fills in after parsing where an option of :data:`TRAIN` was not typed:
#: a run of minutes on 2 CPU cores (a resumed run keeps its own settings instead, so the parser's
#: default is None). The options' ``cli`` help names these.
CLI_RUN_DEFAULTS: dict[str, Any] = {
    "model": "resnet8",
    "data": "synthetic",
    "steps": 2000,
    "batch_size": 32,
    "shards": 1,
}


#: The paper's run: :class:`~transient_nb.training.hparams.HParams`' defaults, which the magic's
#: ``train`` and both surfaces' ``estimate`` take for a run's size.
PAPER = HParams()


def _run_size(flag: str, what: str, text: str) -> Option:
    """A training run's size (``--steps``, ``--batch-size``): the paper's on the magic, the
    ``run`` demo's on the CLI (None in the parser, filled in from :data:`CLI_RUN_DEFAULTS` after
    parsing: a resumed run keeps its own); the help names each."""
    name = flag.lstrip("-").replace("-", "_")
    return _o(
        flag,
        type=whole(what, 1),
        help=f"{text} (default: {{default}})",
        cli={"default": None, "shown": CLI_RUN_DEFAULTS[name]},
        magic={"default": getattr(PAPER, name)},
    )


#: Every option both surfaces take, by name. A name is the option's ``dest`` unless two options
#: share a flag with different meanings (``scale_gpu``: the type ``scale N`` counts).
OPTIONS: dict[str, Option] = {
    # -- a cluster: `transient-nb run`/`up` and `%transient_cluster up` --
    "workers": _o(
        "--workers",
        type=workers(1),
        metavar="N|TYPE=N,...",
        help="GPU workers (default: the configuration's transient.workers), or a mix of GPU "
        "types such as k80=2,p100=1,v100=1",
    ),
    "gpu": _o("--gpu", help="GPU type, a key of the price catalog (t4, l4, v100, k80, ...)"),
    "spot": _o("--spot", dest="spot", action="store_true", help="Spot workers"),
    "on_demand": _o(
        "--on-demand", dest="spot", action="store_false", help="on-demand workers instead of Spot"
    ),
    "zone": _o("--zone", help="zone of the workers, e.g. us-central1-a"),
    "ps_hosts": _count(
        "--ps-hosts",
        "PS hosts",
        "never-preemptible PS hosts (default 1); shards default to one per host",
    ),
    "preemption": _o(
        "--preemption",
        help="none | paper:k80 | paper:v100 | exp:mean=60s | trace:PATH | "
        "'zones:us-central1-a=exp:mean=300s;*=paper' (local backend; default: {default})",
        shown="the configuration's, none",
        # The CLI's run is a demo of training through revocations: they come every minute.
        cli={"default": "exp:mean=60s"},
    ),
    "name": _o(
        "--name", help="cluster name: lowercase letters, digits, dashes (default: a fresh one)"
    ),
    "backend": _o("--backend", help="local (the default) or gce"),
    "time_scale": _o(
        "--time-scale",
        type=positive("simulated seconds per second"),
        metavar="X",
        help="simulated seconds per wall second (default: the configuration's, 1; 120: an hour "
        "in 30 s)",
    ),
    "provisioning_delay": _o(
        "--provisioning-delay",
        metavar="DURATION",
        help="time from request to running VM: 'paper' or e.g. 5s (simulated; default: {default})",
        shown="the configuration's, paper",
        # The CLI's run is a demo of minutes: a replacement joins in 5 s.
        cli={"default": "5s"},
    ),
    "notice": _o("--notice", metavar="DURATION", help="preemption notice, e.g. 30s (simulated)"),
    "prices": _o(
        "--prices", metavar="CATALOG", help="price catalog: gce-2025, paper-2019 or a YAML path"
    ),
    "fallback_zones": _o(
        "--fallback-zones", type=names, metavar="Z1,Z2", help="zones to try when one runs out"
    ),
    "fallback_gpus": _o(
        "--fallback-gpus", type=names, metavar="G1,G2", help="GPU types to try next"
    ),
    "cluster_seed": _o(
        "--seed",
        type=whole("seed", 0),
        help="seed of the simulator's draws (default: the configuration's)",
        # The CLI's one --seed is the simulator's and the training's: a run of it is repeatable.
        cli={
            "default": 0,
            "help": "seed of the simulator's draws and of the training (default: 0)",
        },
    ),
    "max_workers": _count(
        "--max-workers",
        "workers",
        "refuse more workers than this (default: transient.limits.max-workers, 64)",
    ),
    "max_hourly_cost": _usd(
        "--max-hourly-cost",
        "max_hourly_cost",
        "refuse workers that could cost more dollars per hour than this (with the PS host)",
    ),
    "detach": _o(
        "--detach",
        action="store_true",
        default=False,
        help="run the cluster and its training in a head process that outlives this kernel",
        cli={
            "help": "run in a head process that outlives this command; follow it with "
            "`transient-nb attach NAME`, end it with `transient-nb down NAME`"
        },
    ),
    # -- a training run: `transient-nb run` and `%transient_cluster train` --
    "model": _o(
        "--model",
        cli={
            # None: a resumed run keeps its own; cli.parser.CLI_DEFAULTS fills in the default.
            "default": None,
            "shown": CLI_RUN_DEFAULTS["model"],
            "help": "resnet32 | resnet32-t2t | resnet20 | resnet8 (default: {default}, minutes on "
            "2 CPU cores), or your own: the import path pkg.mod:attr of an nn.Module or its factory",
        },
        magic={
            "default": "resnet32",
            "help": "resnet32 | resnet32-t2t | resnet20 | resnet8, or your own: a variable of the "
            "notebook (an nn.Module or its factory) or an import path pkg.mod:attr",
        },
    ),
    "data": _o(
        "--data",
        cli={
            "default": None,
            "help": "synthetic | digits | cifar10:PATH-OR-URL, or the import path pkg.mod:attr of "
            "a (train, test) pair of Datasets or its factory",
        },
        magic={
            "default": "synthetic",
            "help": "synthetic | digits | cifar10:PATH-OR-URL, or a variable holding a (train, "
            "test) pair of Datasets (or its factory), or an import path",
        },
    ),
    "steps": _run_size("--steps", "steps", "global steps"),
    "batch_size": _run_size("--batch-size", "images", "images per worker step"),
    "lr": _o(
        "--lr",
        type=positive("learning rate"),
        help="base learning rate (default 0.1; a user's optimizer keeps its own)",
    ),
    "shards": _o(
        "--shards",
        type=whole("PS shards", 1),
        help="parameter-server shards (default: one per PS host)",
    ),
    "target_accuracy": _o(
        "--target-accuracy", type=fraction, help="stop at this test accuracy, e.g. 0.9"
    ),
    "budget": _usd("--budget", "budget", "stop when this many dollars are spent"),
    "deadline": _o(
        "--deadline",
        type=length("deadline", "10m"),
        metavar="DURATION",
        help="stop after this long, e.g. 10m",
    ),
    "eval_images": _o(
        "--eval-images",
        type=whole("images", 1),
        help="test images per evaluation (default: {default})",
        shown="all",
        # A short demo: 1000 test images per evaluation on 2 CPU cores.
        cli={"default": 1000},
    ),
    "loss": _o(
        "--loss",
        help="cross_entropy (default) | mse | a variable or import path pkg.mod:fn of a function",
        cli={"help": "cross_entropy (default) | mse | an import path pkg.mod:fn"},
    ),
    "metrics": _o(
        "--metrics",
        metavar="M1,NAME=pkg.mod:fn,...",
        help="metrics: accuracy, mse, or variables or import paths of functions (output, "
        "target) -> float",
        cli={"help": "metrics: accuracy, mse, or import paths of (output, target) -> float"},
    ),
    "optimizer": _o(
        "--optimizer",
        help="sgd (the paper's, default) or a variable or import path of a torch.optim class or "
        "factory",
        cli={
            "help": "sgd (the paper's, default) or the import path of a torch.optim class or factory"
        },
    ),
    "stop_at": _o(
        "--stop-at",
        metavar="METRIC=X,...",
        help="stop when a metric reaches X (mae=0.3: loss-like names go down; f1>=0.8, mae<=0.3)",
    ),
    "collate_fn": _o(
        "--collate-fn",
        help="a variable or import path: the DataLoader's collate_fn",
        cli={"help": "import path of the DataLoader's collate_fn"},
    ),
    "num_workers": _o(
        "--num-workers", type=whole("DataLoader workers", 0), help="DataLoader workers per trainer"
    ),
    "seed": _o(
        "--seed",
        type=whole("seed", 0),
        default=0,
        help="seed of the training (default 0)",
        # The CLI's run takes one --seed, the cluster's (cluster_seed), for both.
    ),
    # -- the policy: `transient-nb adapt`/`run --adapt` and `%transient_cluster adapt` --
    "gpus": _o(
        "--gpus", type=names, metavar="G1,G2", help="GPU types the policy may use, e.g. t4,v100"
    ),
    "spot_only": _o(
        "--spot-only",
        action="store_true",
        default=False,
        help="the policy keeps every worker Spot (by default it may run some on demand where its "
        "goal needs them, e.g. a deadline a storm of revocations makes Spot miss)",
    ),
    "memory": _o(
        "--memory",
        metavar="PATH",
        help="the policy's memory: it plans from what earlier runs saw, kept in PATH (this run "
        "added); default: the configuration's policy.memory",
    ),
    # --memory's old flag (its help hidden), for one release.
    "history": _o(
        "--history", dest="memory", action=Renamed, metavar="PATH", help=argparse.SUPPRESS
    ),
    "goal": _o(
        "goal",
        metavar="GOAL",
        help="deadline:DURATION (e.g. deadline:2h), budget:DOLLARS, cost-per-step, or off",
    ),
    # -- scale, scale-ps, move-ps --
    "n": _o(
        "n",
        type=workers(0),
        metavar="N|TYPE=N,...",
        help="number of GPU workers to keep (of type --gpu), or a whole mix such as k80=2,v100=1",
    ),
    "scale_gpu": _o(
        "--gpu", help="the GPU type that N counts (a mixed cluster needs it); others keep theirs"
    ),
    "scale_on_demand": _o(
        "--on-demand",
        dest="on_demand",
        type=on_demand,
        metavar="N|TYPE=N,...",
        help="how many of the workers run on demand (a Spot cluster): a number of the type N "
        "counts, or per type such as v100=1 (types left out: none)",
    ),
    "ps_n": _count("n", "PS hosts", "number of PS hosts to keep (1-4)"),
    "ps_zone": _o(
        "zone",
        metavar="ZONE",
        help="zone to move the PS hosts to: the cluster's zone or one of its fallback zones",
    ),
    "reason": _o("--reason", default="", help="said in the ps-move event"),
    # -- estimate: `transient-nb estimate` and `%transient_cluster estimate` --
    "estimate_model": _o(
        "--model",
        default="resnet32",
        help="a built-in name, a variable or an import path",
        cli={"help": "a built-in name or pkg.mod:attr"},
    ),
    "estimate_data": _o(
        "--data",
        default="synthetic",
        help="a built-in spec, a variable or an import path",
        cli={"help": "a built-in spec or pkg.mod:attr"},
    ),
    "estimate_workers": _o(
        "--workers",
        type=workers(1),
        metavar="TYPE=N,...",
        help="GPU types and the largest cluster of each, e.g. t4=4,v100=2 (default: the "
        "configuration's gpu=4)",
    ),
    "estimate_steps": _o(
        "--steps",
        type=whole("steps", 1),
        default=PAPER.steps,
        help="global steps (default: {default})",
    ),
    "estimate_batch_size": _o(
        "--batch-size",
        type=whole("items", 1),
        default=PAPER.batch_size,
        help="items per worker step",
    ),
    "estimate_shards": _o("--shards", type=whole("PS shards", 1), default=1, help="PS shards"),
    "measured": _o(
        "--measured",
        metavar="TYPE=STEPS_PER_S,...",
        help="measured steps/s of one worker per GPU type: replaces the estimate",
    ),
}

#: The options of a cluster, in the order both surfaces show them.
CLUSTER = (
    "workers",
    "gpu",
    "spot",
    "on_demand",
    "zone",
    "ps_hosts",
    "preemption",
    "name",
    "backend",
    "time_scale",
    "provisioning_delay",
    "notice",
    "prices",
    "fallback_zones",
    "fallback_gpus",
    "cluster_seed",
    "max_workers",
    "max_hourly_cost",
)
#: The options of a training run (both surfaces add their own: the CLI's ``--resume``, the
#: magic's checkpoints).
TRAIN = (
    "model",
    "data",
    "loss",
    "metrics",
    "optimizer",
    "stop_at",
    "collate_fn",
    "num_workers",
    "steps",
    "batch_size",
    "lr",
    "shards",
    "target_accuracy",
    "budget",
    "deadline",
    "eval_images",
)
#: The policy's options beside its goal.
POLICY = ("gpus", "spot_only", "memory", "history")
#: ``scale``'s.
SCALE = ("n", "scale_gpu", "scale_on_demand")
#: ``estimate``'s.
ESTIMATE = (
    "estimate_model",
    "estimate_data",
    "loss",  # the same --loss as a run's
    "estimate_workers",
    "estimate_steps",
    "estimate_batch_size",
    "estimate_shards",
    "prices",
    "measured",
)


def spec(name: str, surface: Surface) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The option ``name``'s ``(flags, kwargs)`` on ``surface``."""
    return OPTIONS[name].on(surface)


def add(parser: argparse.ArgumentParser, *option_names: str) -> None:
    """Add the options ``option_names`` to the CLI's ``parser``."""
    for name in option_names:
        flags, kwargs = spec(name, "cli")
        parser.add_argument(*flags, **kwargs)


def default(name: str, surface: Surface) -> Any:
    """The option ``name``'s default on ``surface``."""
    return spec(name, surface)[1]["default"]


def dests(*option_names: str) -> tuple[str, ...]:
    """The attributes the options ``option_names`` set on the parsed namespace, in order, each
    once (``--spot`` and ``--on-demand`` both set ``spot``): the keyword arguments they pass on.

    >>> dests("spot", "on_demand", "cluster_seed")
    ('spot', 'seed')
    """
    out: dict[str, None] = {}
    for name in option_names:
        option = OPTIONS[name]
        out[option.kwargs.get("dest") or option.flags[0].lstrip("-").replace("-", "_")] = None
    return tuple(out)
