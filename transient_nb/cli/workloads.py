"""The CLI's options for your own model and data, and its ``export`` and ``estimate`` commands.

``transient-nb run --model mypkg.nets:make_net --data mypkg.data:make_data --loss mse`` trains
what the import paths name (importable where the command runs and on the workers);
``transient-nb export RUN PATH`` writes a run's trained ``state_dict`` from its checkpoints
(``model.load_state_dict(torch.load(PATH))`` reads it); ``transient-nb estimate`` says what a
cluster would do for a model before anything is rented.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from transient_nb import config
from transient_nb.deploy import options


def workload_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """train()'s keyword arguments from ``run``'s workload options (None: not given)."""
    from transient_nb.training.spec import metrics_from_text, stop_at_from_text

    return {
        "loss": args.loss,
        "metrics": metrics_from_text(args.metrics) if args.metrics else None,
        "optimizer": args.optimizer,
        "stop_at": stop_at_from_text(args.stop_at) if args.stop_at else None,
        "collate_fn": args.collate_fn,
        "num_workers": args.num_workers,
    }


def add_parsers(sub: Any) -> None:
    """The ``export`` and ``estimate`` subcommands."""
    e = sub.add_parser(
        "export",
        help="write a run's trained state_dict (torch.save) from its newest checkpoint",
    )
    e.add_argument("run", metavar="RUN", help="run id (run-1a2b3c4d) or checkpoint URL")
    e.add_argument("path", metavar="PATH", help="file (or fsspec URL) to write")
    e.add_argument(
        "--run-dir",
        default=None,
        help="where the run records are (default: the configuration's run-dir; a `run --out` "
        "folder for runs of `transient-nb run`)",
    )
    e.add_argument(
        "--model",
        default=None,
        help="also check the weights load into this model (a built-in name or pkg.mod:attr)",
    )
    s = sub.add_parser("estimate", help="time and cost of a model on GPU types, before renting")
    options.add(s, *options.ESTIMATE[:-1])
    s.add_argument("--zone", default=None, help="zone priced (default: config's)")
    s.add_argument("--on-demand", action="store_true", help="price on-demand workers")
    options.add(s, "measured")


def export(args: argparse.Namespace) -> int:
    """``export RUN PATH``: the run's state_dict from its checkpoints, no model needed."""
    import dask.config

    from transient_nb.training.export import build, load_state_dict, model_with, save

    run_dir = args.run_dir or config.get("run-dir")
    with dask.config.set({"transient.run-dir": os.path.abspath(os.path.expanduser(run_dir))}):
        state = load_state_dict(args.run)
    if args.model:
        model_with(build(args.model, state), state, args.run)  # raises if they do not fit
    path = save(state, args.path)
    n = sum(int(t.numel()) for t in state.values())
    print(f"{args.run}: {len(state)} tensors ({n:,} values) written to {path}")
    print("Load it with: model.load_state_dict(torch.load(PATH))")
    return 0


def estimate(args: argparse.Namespace) -> int:
    """``estimate``: the table of :func:`transient_nb.estimate`."""
    from transient_nb.training.estimate import estimate as run_estimate
    from transient_nb.training.estimate import measured_from_text

    workers = args.workers
    if isinstance(workers, int):  # a number: of the configuration's GPU type
        workers = {str(config.get("gpu")): workers}
    est = run_estimate(
        args.model,
        args.data,
        workers,
        args.steps,
        batch_size=args.batch_size,
        shards=args.shards,
        loss=args.loss,
        measured=measured_from_text(args.measured),
        prices=args.prices,
        zone=args.zone,
        spot=not args.on_demand,
    )
    print(est.text())
    return 0
