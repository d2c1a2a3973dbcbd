"""The ``%transient_cluster`` magic's parsers: every subcommand's options and their types.

Each argument type's error says what to type instead. The parsers' help is the magic's help
(``%transient_cluster?``) and the reference page's (``docs/reference/magic.md``);
:func:`_parse` turns their errors into IPython ``UsageError`` sentences.
"""

from __future__ import annotations

import argparse
import keyword
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from transient_nb.catalog.mix import parse_mix, zero_mix


# -- argument types: each error says what to type ---------------------------------------------------
def _whole(what: str, minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number of {what} of at least {minimum}; type e.g. "
                f"{max(minimum, 4)}"
            )
        return value

    parse.__name__ = f"whole number of {what}"
    return parse


def _workers(minimum: int) -> Callable[[str], int | dict[str, int]]:
    """A number of workers, or a mix of GPU types such as ``k80=2,p100=1,v100=1``."""

    def parse(text: str) -> int | dict[str, int]:
        if "=" not in text:
            return _whole("workers", minimum)(text)
        try:
            return parse_mix(text, "")
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = "number of workers or TYPE=COUNT,..."
    return parse


def _on_demand(text: str) -> int | dict[str, int]:
    """``scale --on-demand``: a number of workers (of the type N counts) or TYPE=COUNT pairs such
    as ``v100=1``; ``0``, or every type at 0, is none on demand."""
    if zero_mix(text):
        return {}
    return _workers(0)(text)


_on_demand.__name__ = "number of workers or TYPE=COUNT,..."


def _positive(what: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a positive number of {what}; type e.g. 120"
            )
        return value

    parse.__name__ = f"positive number of {what}"
    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in (0, 1]; type e.g. 0.9")
    return value


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _variable(text: str) -> str:
    if not text.isidentifier() or keyword.iskeyword(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Python variable name; type e.g. --as cluster"
        )
    return text


def _bind_as(default: str, what: str) -> argument:
    """The ``--as VAR`` option of the subcommands that bind a variable."""
    return argument(
        "--as",
        dest="var",
        type=_variable,
        default=default,
        metavar="VAR",
        help=f"variable to bind the {what} to (default: {default})",
    )


#: ``--no-panel``, shared by the subcommands that show the control panel.
_NO_PANEL = argument("--no-panel", action="store_true", help="do not show the control panel")


# -- the subcommands' parsers (their help is the magic's help) --------------------------------------
@magic_arguments(name="transient_cluster up")
@argument(
    "--workers",
    type=_workers(1),
    metavar="N|TYPE=N,...",
    help="GPU workers (default: config), or a mix of GPU types such as k80=2,p100=1,v100=1",
)
@argument("--gpu", help="GPU type, a key of the price catalog (t4, l4, v100, k80, ...)")
@argument("--spot", dest="spot", action="store_true", default=None, help="Spot workers")
@argument("--on-demand", dest="spot", action="store_false", help="on-demand workers")
@argument("--zone", help="zone of the workers, e.g. us-central1-a")
@argument("--ps-hosts", type=_whole("PS hosts", 1), metavar="N", help="PS hosts (default 1)")
@argument(
    "--preemption",
    help="none | paper:k80 | paper:v100 | exp:mean=60s | trace:PATH | "
    "'zones:us-central1-a=exp:mean=300s;*=paper' (local backend)",
)
@argument("--name", help="cluster name (lowercase letters, digits, dashes)")
@argument("--backend", help="local (the default) or gce")
@argument(
    "--time-scale",
    type=_positive("simulated seconds per second"),
    metavar="X",
    help="simulated seconds per wall second (120: an hour in 30 s)",
)
@argument("--provisioning-delay", metavar="DURATION", help="'paper' or e.g. 5s (simulated)")
@argument("--notice", metavar="DURATION", help="preemption notice, e.g. 30s (simulated)")
@argument("--prices", metavar="CATALOG", help="gce-2025, paper-2019 or a YAML path")
@argument("--fallback-zones", type=_names, metavar="Z1,Z2", help="zones to try when one runs out")
@argument("--fallback-gpus", type=_names, metavar="G1,G2", help="GPU types to try next")
@argument("--seed", type=_whole("seed", 0), help="seed of the simulator's draws")
@argument(
    "--max-workers", type=_whole("workers", 1), metavar="N", help="refuse more workers than this"
)
@argument(
    "--max-hourly-cost",
    type=_positive("dollars per hour"),
    metavar="USD",
    help="refuse workers that could cost more per hour than this",
)
@argument(
    "--detach",
    action="store_true",
    help="run the cluster and its training in a head process that outlives this kernel",
)
@_bind_as("cluster", "cluster")
@_NO_PANEL
def _up() -> None:
    """Start a cluster, bind it to a variable, show its control panel and return it."""


@magic_arguments(name="transient_cluster scale")
@argument(
    "n",
    type=_workers(0),
    metavar="N|TYPE=N,...",
    help="number of GPU workers to keep (of type --gpu), or a whole mix such as k80=2,v100=1",
)
@argument("--gpu", help="the GPU type that N counts (a mixed cluster needs it); others keep theirs")
@argument(
    "--on-demand",
    dest="on_demand",
    type=_on_demand,
    metavar="N|TYPE=N,...",
    help="how many of the workers run on demand (a Spot cluster): a number of the type N counts, "
    "or per type such as v100=1 (types left out: none)",
)
def _scale() -> None:
    """Keep N GPU workers (the PS host is extra): ``scale 3``, ``scale 3 --gpu v100`` (3 of that
    type, the other types unchanged), or ``scale k80=2,v100=1`` (the whole mix);
    ``--on-demand 1`` runs one of them on demand (never revoked), the rest Spot."""


@magic_arguments(name="transient_cluster scale-ps")
@argument("n", type=_whole("PS hosts", 1), metavar="N", help="number of PS hosts to keep (1-4)")
def _scale_ps() -> None:
    """Keep N PS hosts, one PS shard each: ``scale-ps 2``. Only grows; a run started without
    ``shards=`` splits its PS onto the new hosts (where fast GPUs saturate one PS)."""


@magic_arguments(name="transient_cluster move-ps")
@argument(
    "zone",
    metavar="ZONE",
    help="zone to move the PS hosts to: the cluster's zone or one of its fallback zones",
)
@argument("--reason", default="", help="said in the ps-move event")
def _move_ps() -> None:
    """Move the PS hosts to ZONE: ``move-ps us-east1-c``. New PS hosts start there, a run moves
    its PS onto them from its own state (a ``ps-moved`` event), and the old hosts are given back."""


@magic_arguments(name="transient_cluster adapt")
@argument(
    "goal",
    metavar="GOAL",
    help="deadline:DURATION (e.g. deadline:2h), budget:DOLLARS, cost-per-step, or off",
)
@argument("--gpus", type=_names, metavar="G1,G2", help="GPU types it may use")
@argument("--max-workers", type=_whole("workers", 1), metavar="N", help="largest cluster")
@argument("--interval", metavar="DURATION", help="how often it decides (default 30s)")
@argument(
    "--spot-only",
    action="store_true",
    help="keep every worker Spot (by default it may run some on demand where the goal needs them)",
)
@argument(
    "--history",
    metavar="PATH",
    help="plan from what earlier runs saw (kept in PATH, and this run added); default: the "
    "configuration's policy.history",
)
def _adapt() -> None:
    """Let the transient-aware policy choose the GPU mix for a goal (``off`` stops it); its
    decisions, with their reasons, are ``policy-decision`` events."""


@magic_arguments(name="transient_cluster preempt")
@argument(
    "target",
    nargs="?",
    default="1",
    metavar="COUNT-OR-NAME",
    help="how many workers (default 1), or a worker name such as w-1",
)
@argument("--no-notice", action="store_true", help="kill at once, without the notice")
def _preempt() -> None:
    """Preempt workers now, as the provider would (they are replaced by themselves)."""


@magic_arguments(name="transient_cluster status")
def _status() -> None:
    """A compact table: workers by state, GPU and zone, $/h now, $ so far, saved."""


@magic_arguments(name="transient_cluster train")
@argument(
    "--model",
    default="resnet32",
    help="resnet32 | resnet32-t2t | resnet20 | resnet8, or your own: a variable of the notebook "
    "(an nn.Module or its factory) or an import path pkg.mod:attr",
)
@argument(
    "--data",
    default="synthetic",
    help="synthetic | digits | cifar10:PATH-OR-URL, or a variable holding a (train, test) pair "
    "of Datasets (or its factory), or an import path",
)
@argument("--loss", help="cross_entropy (default) | mse | a variable or import path of a function")
@argument(
    "--metrics",
    metavar="M1,M2",
    help="accuracy, mse, or variables (functions (output, target) -> float) or import paths",
)
@argument("--optimizer", help="sgd (default) or a variable/import path of a torch.optim factory")
@argument("--stop-at", metavar="METRIC=X", help="stop at a metric's value, e.g. mae=0.3")
@argument("--collate-fn", help="a variable or import path: the DataLoader's collate_fn")
@argument("--num-workers", type=_whole("DataLoader workers", 0), help="DataLoader workers")
@argument("--steps", type=_whole("steps", 1), default=64_000, help="global steps (default 64000)")
@argument("--batch-size", type=_whole("images", 1), default=128, help="images per worker step")
@argument("--lr", type=_positive("learning rate"), default=0.1, help="base learning rate")
@argument(
    "--shards",
    type=_whole("PS shards", 1),
    help="parameter-server shards (default: one per PS host)",
)
@argument("--target-accuracy", type=_fraction, help="stop at this test accuracy, e.g. 0.9")
@argument("--budget", type=_positive("dollars"), help="stop when this many dollars are spent")
@argument("--deadline", metavar="DURATION", help="stop after this long, e.g. 2h")
@argument("--eval-every", type=_whole("steps", 1), help="steps between evaluations")
@argument("--eval-images", type=_whole("images", 1), help="test images per evaluation")
@argument("--checkpoint-every", type=_whole("steps", 1), help="steps between PS checkpoints")
@argument("--checkpoint-url", metavar="URL", help="fsspec URL of the checkpoints")
@argument("--seed", type=_whole("seed", 0), default=0)
@_bind_as("run", "run")
@argument("--no-dashboard", action="store_true", help="do not show the live dashboard")
@argument("--wait", action="store_true", help="block until the run finishes")
def _train() -> None:
    """Start asynchronous PS training in the background, show the live dashboard, return the run."""


@magic_arguments(name="transient_cluster save")
@argument("path", metavar="PATH", help="file (or fsspec URL) to write the state dict to")
@argument("--run", dest="run_var", metavar="VAR", help="the run's variable (default: the latest)")
def _save() -> None:
    """Write the latest run's trained weights (``run.save(PATH)``): the newest of the PS, or of
    its checkpoints once it has ended; ``model.load_state_dict(torch.load(PATH))`` reads them."""


@magic_arguments(name="transient_cluster estimate")
@argument("--model", default="resnet32", help="a built-in name, a variable or an import path")
@argument("--data", default="synthetic", help="a built-in spec, a variable or an import path")
@argument("--loss", help="cross_entropy (default), mse, a variable or an import path")
@argument(
    "--workers",
    type=_workers(1),
    metavar="TYPE=N,...",
    help="GPU types and the largest cluster of each, e.g. t4=4,v100=2",
)
@argument("--steps", type=_whole("steps", 1), default=64_000, help="global steps")
@argument("--batch-size", type=_whole("items", 1), default=128, help="items per worker step")
@argument("--shards", type=_whole("PS shards", 1), default=1, help="PS shards")
@argument("--prices", metavar="CATALOG", help="gce-2025, paper-2019 or a YAML path")
@argument("--measured", metavar="TYPE=STEPS_PER_S", help="measured rates: replace the estimate")
def _estimate() -> None:
    """What a cluster would do for a model before renting anything: time, money and the PS
    bottleneck per GPU type and size (:func:`transient_nb.estimate`)."""


@magic_arguments(name="transient_cluster down")
@argument("name", nargs="?", metavar="NAME", help="cluster to close (default: the current one)")
def _down() -> None:
    """Stop its training runs and close the cluster."""


@magic_arguments(name="transient_cluster list")
def _list() -> None:
    """Every transient cluster this user has running, in this kernel or any other."""


@magic_arguments(name="transient_cluster connect")
@argument("name", metavar="NAME", help="the cluster's name (see %%transient_cluster list)")
@_bind_as("cluster", "handle")
@_NO_PANEL
def _connect() -> None:
    """Attach to a cluster another kernel owns: control (scale, preempt, down) and live views."""


@magic_arguments(name="%transient_cluster")
@argument("--as", dest="var", type=_variable, default="cluster", metavar="VAR")
@argument("--run-as", dest="run_var", type=_variable, default="run", metavar="VAR")
@_NO_PANEL
@argument("--no-dashboard", action="store_true", help="do not show the live dashboard")
def _cell() -> None:
    """Cell form: the body is YAML with a ``cluster:`` mapping (TransientCluster arguments) and an
    optional ``train:`` mapping (train() arguments)."""


SUBCOMMANDS: dict[str, Any] = {
    "up": _up,
    "scale": _scale,
    "scale-ps": _scale_ps,
    "move-ps": _move_ps,
    "adapt": _adapt,
    "preempt": _preempt,
    "status": _status,
    "train": _train,
    "save": _save,
    "estimate": _estimate,
    "down": _down,
    "list": _list,
    "connect": _connect,
}
#: Subcommands that act on the current cluster.
NEEDS_CLUSTER = ("scale", "scale-ps", "move-ps", "adapt", "preempt", "status", "train", "down")


@contextmanager
def _usage_errors(prefix: str = "") -> Iterator[None]:
    """Re-raise the API's input errors as UsageError, with their message."""
    try:
        yield
    except UsageError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise UsageError(f"{prefix}{message}") from None


def _parse(func: Any, argstring: str, command: str) -> argparse.Namespace:
    try:
        return parse_argstring(func, argstring)
    except UsageError as e:
        raise UsageError(
            f"%transient_cluster {command}: {e}; see %transient_cluster? for the options."
        ) from None
    except ValueError as e:  # unbalanced quotes
        raise UsageError(f"%transient_cluster {command}: {e}; check the quotes.") from None


def _kwargs(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}
