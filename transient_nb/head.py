"""The head of a detached cluster: a process of its own that outlives the notebook.

A training run on Spot GPUs takes hours; kernels restart and laptops close. A *detached* cluster
therefore keeps its manager (VM lifecycle, preemptions, replacements, budget and deadline), its
scheduler with the event log, and its training runs in a head process started with ``setsid``
(``python -m transient_nb.head SPEC``), not in the kernel. Notebooks, the CLI and the JupyterLab
panel are clients: they find the head in the registry (whose entry names the head's pid) and
reach it through the scheduler's event log and ``transient-control`` topic, as
:class:`~transient_nb.connect.RemoteCluster` does.

The head understands two requests beyond the cluster's own (``scale``, ``preempt``, ``stop``):
``train`` (start a :func:`~transient_nb.training.run.train` run here; the answer names the run)
and ``run-stop``. Closing the cluster (``down``, ``stop``, a budget or deadline, SIGTERM) stops
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
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import dask.config

from transient_nb import config, registry

logger = logging.getLogger(__name__)

#: Prefix of the line a head writes to its log when its settings were refused.
ERROR_PREFIX = "transient-nb head: error: "


def _head_log_dir() -> str:
    folder = os.path.join(os.path.expanduser(config.get("run-dir")), "heads")
    os.makedirs(folder, exist_ok=True)
    return folder


def _json_ready(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The cluster's arguments as JSON, or a ValueError naming the one that is not."""
    out = {}
    for key, value in kwargs.items():
        try:
            json.dumps(value)
        except TypeError:
            raise ValueError(
                f"{key}={value!r} cannot be sent to a detached cluster's head process: pass plain "
                "values (numbers, strings, lists), e.g. prices='gce-2025' rather than a catalog "
                "object."
            ) from None
        out[key] = value
    return out


def _reap(proc: subprocess.Popen[bytes]) -> None:
    # A head that exits while this process lives must not stay a zombie (it would look alive).
    threading.Thread(
        target=proc.wait, name=f"transient-head-reaper-{proc.pid}", daemon=True
    ).start()


def launch(
    cluster_kwargs: Mapping[str, Any], *, name: str | None = None, timeout: float = 180.0
) -> dict[str, Any]:
    """Start the head of a detached cluster and wait until its scheduler is registered.

    Parameters
    ----------
    cluster_kwargs
        Arguments of :class:`~transient_nb.TransientCluster` (plain values only).
    name
        The cluster's name (a fresh one if not given).
    timeout
        Seconds to wait for the head to register its cluster.

    Returns
    -------
    The cluster's registry entry (``name``, ``pid`` of the head, ``scheduler_address``, ...).

    Raises
    ------
    ValueError
        The head refused a setting (its message says which); nothing was started.
    RuntimeError
        The head exited while starting (the message quotes its log).
    """
    from transient_nb.cluster import check_name

    name = check_name(name or f"transient-{uuid.uuid4().hex[:6]}")
    registry.check_free(name)
    spec = {
        "name": name,
        "cluster": _json_ready(cluster_kwargs),
        # The client's transient settings (registry and run folders included) hold in the head.
        "config": dask.config.get("transient"),
    }
    folder = _head_log_dir()
    fd, spec_path = tempfile.mkstemp(dir=folder, prefix=f"{name}-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f, default=str)
    log_path = os.path.join(folder, f"{name}.log")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "transient_nb.head", spec_path],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # setsid: no signal of the kernel's session reaches it
            close_fds=True,
        )
    _reap(proc)
    deadline = time.monotonic() + timeout
    while True:
        entry: dict[str, Any] | None = next(
            (
                e
                for e in registry.entries()
                if e["name"] == name and e.get("pid") == proc.pid and e.get("scheduler_address")
            ),
            None,
        )
        if entry is not None:
            return entry
        code = proc.poll()
        if code is not None:
            raise _start_failure(name, log_path, code)
        if time.monotonic() > deadline:
            _terminate(proc.pid)
            raise TimeoutError(
                f"The head of cluster {name!r} did not register within {timeout:g} s and was "
                f"stopped; its log is {log_path}."
            )
        time.sleep(0.1)


def launch_head(cluster_kwargs: Mapping[str, Any], *, name: str | None = None) -> dict[str, Any]:
    """Start a detached cluster's head where its backend puts it; its registry entry.

    The local backend's head is a process here (:func:`launch`); GCE's is a VM
    (:func:`transient_nb.backends.gce_head.launch`).
    """
    if config.get("backend", override_with=cluster_kwargs.get("backend")) == "gce":
        from transient_nb.backends import gce_head

        return gce_head.launch(cluster_kwargs, name=name)
    return launch(cluster_kwargs, name=name)


def start_detached(cluster_kwargs: Mapping[str, Any], *, name: str | None = None) -> Any:
    """Start a detached cluster's head (:func:`launch_head`); a handle connected to it.

    Returns
    -------
    A :class:`~transient_nb.connect.RemoteCluster`.
    """
    from transient_nb.connect import RemoteCluster

    # A head VM is dialled across the internet: give its first connection more time.
    return RemoteCluster(launch_head(cluster_kwargs, name=name), timeout=60)


def _start_failure(name: str, log_path: str, code: int) -> Exception:
    try:
        with open(log_path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in reversed(lines):
        if line.startswith(ERROR_PREFIX):
            return ValueError(line[len(ERROR_PREFIX) :])
    tail = "\n".join(lines[-15:])
    return RuntimeError(
        f"The head of cluster {name!r} exited with code {code} while starting; its log "
        f"({log_path}) ends with:\n{tail}"
    )


def _terminate(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)  # the head leads its own session and process group
    except ProcessLookupError:
        pass


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

    def _train(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        from transient_nb.training.run import train

        args = dict(msg.get("args") or {})
        args.pop("wait", None)  # the head never blocks its control loop on a run
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
    """Entry point of ``python -m transient_nb.head SPEC_JSON`` (see :func:`launch`)."""
    parser = argparse.ArgumentParser(prog="python -m transient_nb.head")
    parser.add_argument("spec", help="JSON file written by transient_nb.head.launch")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with open(args.spec) as f:
        spec = json.load(f)
    os.remove(args.spec)
    stop = prepare_process(spec)

    from transient_nb.cluster import TransientCluster

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
