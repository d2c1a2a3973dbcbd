"""The startup script of a transient cluster's GCE VM: enrol for TLS, run the worker, power off.

The VM boots from an image that already holds the GPU driver and the Python environment, so the
script installs nothing. It makes the VM's TLS key and has the cluster sign its certificate
(:mod:`~transient_nb.backends.gce.enroll`), runs ``dask worker`` with TLS, and powers the VM off
when it ends for any reason (``trap ... EXIT``), so that a GPU VM whose worker cannot run stops
billing.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

from transient_nb._version import __version__
from transient_nb.backends.base import WORKER_PRE_SPAWN_ENVIRON, dask_environ
from transient_nb.worker.preload import NANNY_PRELOADS, worker_preloads

#: Seconds a booting VM waits for the cluster to sign its certificate request.
ENROLL_TIMEOUT_S = 600.0


def gce_preloads() -> tuple[str, ...]:
    """The preloads of a worker VM's ``dask worker``: the worker's
    (:func:`~transient_nb.worker.preload.worker_preloads`, as ``transient.warm-up`` has them
    now), and GCE's notice watcher."""
    return (*worker_preloads(), "transient_nb.backends.gce.preload")


def worker_args(
    *,
    python: str,
    scheduler_address: str,
    name: str,
    resources: dict[str, float],
    nthreads: int,
    death_timeout_s: float,
    worker_ports: str,
    nanny_ports: str,
    preloads: tuple[str, ...] | None = None,
) -> list[str]:
    """The ``dask worker`` command line of a cluster's VM (TLS options not included).

    Examples
    --------
    >>> worker_args(python="py", scheduler_address="tls://h:8786", name="ps-0",
    ...     resources={"ps": 1}, nthreads=1, death_timeout_s=60, worker_ports="41000:41099",
    ...     nanny_ports="41100:41199", preloads=())[:6]
    ['py', '-m', 'dask', 'worker', 'tls://h:8786', '--name']
    """
    args = [
        python,
        "-m",
        "dask",
        "worker",
        scheduler_address,
        "--name",
        name,
        "--nworkers",
        "1",
        "--nthreads",
        str(nthreads),
        "--death-timeout",
        f"{death_timeout_s:g}s",
        "--worker-port",
        worker_ports,
        "--nanny-port",
        nanny_ports,
        "--no-dashboard",
    ]
    if resources:
        args += ["--resources", ",".join(f"{k}={v:g}" for k, v in resources.items())]
    for preload in gce_preloads() if preloads is None else preloads:
        args += ["--preload", preload]
    for preload in NANNY_PRELOADS:
        args += ["--preload-nanny", preload]
    return args


def worker_env(
    vm: dict[str, Any], notice_s: float, data_ports: str = "41200:41299"
) -> dict[str, str]:
    """Environment of a VM's Dask worker: who the VM is, its notice, TLS only (the PS's data
    plane too: TLS with the worker's certificates, on ``data_ports``, which the firewall opens).
    """
    return {
        # First: a key of transient.cluster-dask never overrides the ones below (TLS required).
        **dask_environ(),
        "TRANSIENT_NB_VM": json.dumps(vm, sort_keys=True),
        "TRANSIENT_NB_NOTICE_S": f"{notice_s:g}",
        "DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON": repr(WORKER_PRE_SPAWN_ENVIRON),
        "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
        "TRANSIENT_NB_DATA_PLANE": "tls",
        "TRANSIENT_NB_DATA_PORTS": data_ports,
    }


def startup_script(
    *,
    worker: Sequence[str],
    vm: dict[str, Any],
    notice_s: float,
    tls_name: str | None = None,
    data_ports: str = "41200:41299",
) -> str:
    """The bash startup script of a VM: fetch the TLS files, run the Dask worker, power off.

    Nothing is installed at boot: the image has the driver and the environment. No credential is
    in the script: the VM makes its own TLS key and has the cluster sign its certificate
    (:mod:`~transient_nb.backends.gce.enroll`). When the script ends for any reason (the worker's exit, or any
    failed step, through ``trap ... EXIT``), the VM powers itself off (``TRANSIENT_NB_POWEROFF``
    overrides the command, for images that manage that themselves and for tests).

    Parameters
    ----------
    worker
        The ``dask worker`` command line (:func:`worker_args`; the script adds the TLS options).
    vm
        ``name``, ``role``, ``gpu``, ``zone``, ``spot``: who this VM is (``TRANSIENT_NB_VM``).
    notice_s
        Seconds between the metadata notice and the VM's stop.
    data_ports
        Ports the PS's data plane may listen on (``gce.data-ports``).
    tls_name
        The name the VM's certificate is issued to (its instance name; default ``vm["name"]``).

    Examples
    --------
    >>> worker = worker_args(python="/opt/transient-nb/bin/python",
    ...     scheduler_address="tls://10.0.0.2:8786", name="w-0", resources={"gpu": 1},
    ...     nthreads=1, death_timeout_s=120, worker_ports="41000:41099", nanny_ports="41100:41199")
    >>> s = startup_script(worker=worker, notice_s=30,
    ...     vm={"name": "w-0", "role": "worker", "gpu": "t4", "zone": "us-central1-a", "spot": True})
    >>> "dask worker tls://10.0.0.2:8786 --name w-0" in s
    True
    """
    command = " ".join(shlex.quote(a) for a in worker)
    python = worker[0]  # the image's Python, the command line's first word, enrols the VM too
    tls = ' --tls-ca-file "$TLS/ca.pem" --tls-cert "$TLS/cert.pem" --tls-key "$TLS/key.pem"'
    env = worker_env(vm, notice_s, data_ports)
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
    gpu_check = ""
    if vm.get("gpu"):
        gpu_check = (
            "# A GPU worker without a driver would train on the CPU: say so in the serial log.\n"
            'command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "transient_nb: no GPU '
            'driver in this image (see transient_nb/backends/gce_image.md)" >&2\n'
        )
    return f"""#!/bin/bash
# transient_nb {__version__}: Dask worker {vm["name"]} ({vm["role"]}, {vm.get("gpu") or "no GPU"}, {vm["zone"]}).
# The image already holds the GPU driver and the Python environment: nothing is installed here,
# so a replacement VM joins seconds after it boots.
set -euo pipefail
# Whatever ends this script (a failed curl, a missing driver, the worker's exit), the VM powers
# off, so that a GPU VM whose worker cannot run stops billing.
trap '${{TRANSIENT_NB_POWEROFF:-poweroff}}' EXIT
# TLS: this VM makes its own key (it never leaves the VM), publishes a certificate request as a
# guest attribute, and waits for the cluster to sign it (the certificate comes in the metadata).
TLS="$(mktemp -d)"
chmod 700 "$TLS"
{shlex.quote(python)} -m transient_nb.backends.gce.enroll "$TLS" {shlex.quote(tls_name or str(vm["name"]))} {ENROLL_TIMEOUT_S:g}
{gpu_check}{exports}
{command}{tls} || echo "transient_nb: the Dask worker exited with status $?" >&2
# The worker is gone (drained after a notice, its scheduler lost for --death-timeout, a crash):
# the EXIT trap powers off, so that a VM whose cluster is gone stops billing its GPU; sweep
# deletes the rest.
"""
