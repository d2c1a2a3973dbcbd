"""The ``%transient_cluster`` magic's parsers: every subcommand's options and their types.

The options the magic shares with the ``transient-nb`` command come from the one option table
(:mod:`transient_nb.deploy.options`); the magic's own (``--as``, ``--no-panel``, ...) are here.
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

from transient_nb.deploy import options
from transient_nb.deploy.arg_types import whole


# -- argument types: each error says what to type (the shared ones are the option table's) ------
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


def _options(*option_names: str) -> Callable[[Any], Any]:
    """The options ``option_names`` of the one table (:mod:`transient_nb.deploy.options`), in
    this order, as IPython ``argument`` decorators."""

    def decorate(func: Any) -> Any:
        for name in reversed(option_names):
            flags, kwargs = options.spec(name, "magic")
            func = argument(*flags, **kwargs)(func)
        return func

    return decorate


#: ``--no-panel``, shared by the subcommands that show the control panel.
_NO_PANEL = argument("--no-panel", action="store_true", help="do not show the control panel")


# -- the subcommands' parsers (their help is the magic's help) --------------------------------------
@magic_arguments(name="transient_cluster up")
@_options(*options.CLUSTER)
@_options("detach")
@_bind_as("cluster", "cluster")
@_NO_PANEL
def _up() -> None:
    """Start a cluster, bind it to a variable, show its control panel and return it."""


@magic_arguments(name="transient_cluster scale")
@_options(*options.SCALE)
def _scale() -> None:
    """Keep N GPU workers (the PS host is extra): ``scale 3``, ``scale 3 --gpu v100`` (3 of that
    type, the other types unchanged), or ``scale k80=2,v100=1`` (the whole mix);
    ``--on-demand 1`` runs one of them on demand (never revoked), the rest Spot."""


@magic_arguments(name="transient_cluster scale-ps")
@_options("ps_n")
def _scale_ps() -> None:
    """Keep N PS hosts, one PS shard each: ``scale-ps 2``. Only grows; a run started without
    ``shards=`` splits its PS onto the new hosts (where fast GPUs saturate one PS)."""


@magic_arguments(name="transient_cluster move-ps")
@_options("ps_zone", "reason")
def _move_ps() -> None:
    """Move the PS hosts to ZONE: ``move-ps us-east1-c``. New PS hosts start there, a run moves
    its PS onto them from its own state (a ``ps-moved`` event), and the old hosts are given back."""


@magic_arguments(name="transient_cluster adapt")
@_options("goal", "gpus")
@argument("--max-workers", type=whole("workers", 1), metavar="N", help="largest cluster")
@argument("--interval", metavar="DURATION", help="how often it decides (default 30s)")
@_options("spot_only", "memory", "history")
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
@_options(*options.TRAIN)
@argument("--eval-every", type=whole("steps", 1), help="steps between evaluations")
@argument("--checkpoint-every", type=whole("steps", 1), help="steps between PS checkpoints")
@argument("--checkpoint-url", metavar="URL", help="fsspec URL of the checkpoints")
@_options("seed")
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
@_options(*options.ESTIMATE)
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
