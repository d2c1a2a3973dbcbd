"""The head of a detached cluster: a process of its own that outlives the notebook.

A training run on Spot GPUs takes hours; kernels restart and laptops close. A *detached* cluster
therefore keeps its manager (VM lifecycle, preemptions, replacements, budget and deadline), its
scheduler with the event log, and its training runs in a head process started with ``setsid``
(``python -m transient_nb.deploy.head SPEC``), not in the kernel. Notebooks, the CLI and the JupyterLab
panel are clients: they find the head in the registry (whose entry names the head's pid) and
reach it through the scheduler's event log and ``transient-control`` topic, as
:class:`~transient_nb.deploy.remote.RemoteCluster` does.

The head understands two requests beyond the cluster's own (``scale``, ``preempt``, ``stop``):
``train`` (start a :func:`~transient_nb.training.run.train` run here; the answer names the run)
and ``run-stop``. A ``train`` request carries the client's own model, data, loss, metrics and
optimizer, when they are objects (a class defined in the client's notebook), cloudpickled under
``by_value``: the head rebuilds them, as a Dask worker rebuilds a function it is sent. Control
requests are honoured only from the cluster's client (over TLS, its certificate; see
:class:`~transient_nb.deploy.monitor.TransientMonitor`), so only the client's code runs here.
The scheduler's ``transient_export`` RPC (same check) hands a client a run's trained model:
:meth:`~transient_nb.deploy.remote_run.RemoteRun.model`. Closing the cluster (``down``, ``stop``, a budget or deadline, SIGTERM) stops
the head's runs first, so every run record ends with its ``train-finished`` event; then the
head exits. When the head itself is killed, its local workers go with it (they watch their
parent) and the run record on disk stays intact for ``train(..., resume=RUN_ID)``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import cloudpickle
import dask.config
from distributed import Scheduler

from transient_nb.deploy.detached import ERROR_PREFIX
from transient_nb.eventlog.vocabulary import EXPORT_RPC
from transient_nb.worker.peers import ROLE_CLIENT, peer_of

logger = logging.getLogger(__name__)


class Head:
    """What a head process runs: one cluster and the training runs started on it.

    Parameters
    ----------
    cluster
        The :class:`~transient_nb.TransientCluster` this head owns (already started).
    """

    def __init__(self, cluster: Any):
        self.cluster = cluster
        self.runs: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        cluster.control_handlers["train"] = self._train
        cluster.control_handlers["run-stop"] = self._run_stop
        cluster.close_hooks.append(self._stop_runs)
        scheduler = getattr(cluster, "scheduler", None)
        if isinstance(scheduler, Scheduler):
            scheduler.handlers[EXPORT_RPC] = self._export

    def _train(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        from transient_nb.training.run import train

        args = dict(msg.get("args") or {})
        args.pop("wait", None)  # the head never blocks its control loop on a run
        blob = args.pop("by_value", None)
        if blob is not None:  # the client's own objects (checked there, and again by train())
            args.update(cloudpickle.loads(blob))
        run = train(self.cluster, **args)
        with self._lock:
            self.runs[run.id] = run
        return {"run": run.id}

    def _run_stop(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        run_id = str(msg.get("run"))
        with self._lock:
            run = self.runs.get(run_id)
        if run is None:
            known = ", ".join(self.runs) or "none"
            raise ValueError(f"No run {run_id!r} on this cluster (runs: {known}).")
        run.stop(wait=False)
        return {"run": run_id}

    def _export(self, comm: Any = None, run: str = "", what: str = "state") -> dict[str, Any]:
        """The ``transient_export`` RPC: a run's trained weights (``what="state"``: the state
        dict as ``.npz`` bytes) or its model (``"model"``: the module, cloudpickled), from the
        PS or, once the run ended, its newest checkpoint. Only for the cluster's client."""
        peer = peer_of(comm)
        if peer is not None and peer.role != ROLE_CLIENT:
            raise PermissionError(f"{EXPORT_RPC} is for the cluster's client, not {peer.name!r}")
        with self._lock:
            found = self.runs.get(str(run))
        if found is None:
            known = ", ".join(self.runs) or "none"
            raise ValueError(f"No run {run!r} on this cluster (runs: {known}).")
        if what == "model":
            return {"run": found.id, "model": cloudpickle.dumps(found.model())}
        # Here, not at the top: a head imports torch (a second of a core) once it trains, and
        # one that only hosts a cluster never does.
        from transient_nb.training.export import state_bytes

        return {"run": found.id, "state": state_bytes(found.state_dict())}

    def _stop_runs(self) -> None:
        """Stop every run before the cluster closes, so each posts its ``train-finished``."""
        with self._lock:
            runs = [r for r in self.runs.values() if not r.done]
        for r in runs:
            r.stop(wait=False)
        for r in runs:
            r.stop(wait=True, timeout=r.hp.call_timeout_s + 10)

    def serve(self, stop: threading.Event) -> None:
        """Block until the cluster closes (``down``, a limit) or ``stop`` is set (a signal)."""
        while not stop.is_set() and self.cluster.status.name not in ("closed", "failed"):
            stop.wait(0.5)
        self._stop_runs()
        if self.cluster.status.name not in ("closed", "failed"):
            self.cluster.close(timeout=120)


def prepare_process(spec: Mapping[str, Any]) -> threading.Event:
    """Set up a head process: the client's ``transient`` config, and an event that SIGTERM and
    SIGINT set (the head then closes its cluster); SIGHUP is ignored."""
    dask.config.update(dask.config.config, {"transient": spec.get("config") or {}}, priority="new")
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        logger.info("Signal %d: closing the cluster", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal or kernel is no reason to go
    return stop


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m transient_nb.deploy.head SPEC_JSON`` (see :func:`launch`)."""
    parser = argparse.ArgumentParser(prog="python -m transient_nb.deploy.head")
    parser.add_argument("spec", help="JSON file written by transient_nb.deploy.detached.launch")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with open(args.spec) as f:
        spec = json.load(f)
    os.remove(args.spec)
    stop = prepare_process(spec)

    from transient_nb.deploy.cluster import TransientCluster

    try:
        cluster = TransientCluster(
            name=spec["name"],
            **spec.get("cluster", {}),
            detached=False,
            _head_info={"detached": True},
        )
    except ValueError as e:
        print(f"{ERROR_PREFIX}{e}", flush=True)
        return 2
    logger.info("Head of cluster %s serving (pid %d)", cluster.name, os.getpid())
    Head(cluster).serve(stop)
    logger.info("Cluster %s closed; the head exits", cluster.name)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
