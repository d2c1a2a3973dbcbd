"""Detached clusters: start a cluster's head where its backend puts it, and wait for it.

A detached cluster's manager, scheduler (with the event log) and training runs live in a head of
their own, which outlives the notebook: on the local backend a process started with ``setsid``
(:mod:`transient_nb.deploy.head`), on GCE an on-demand VM (:mod:`transient_nb.deploy.head_vm`).
This module is the client's side: it checks the cluster's settings exactly as an attached
cluster does (:class:`~transient_nb.deploy.settings.ClusterSettings`), starts the head, waits
until it has registered, and hands back a :class:`~transient_nb.deploy.remote.RemoteCluster`.

GCE's head VM (:func:`launch_gce`):

1. every setting is checked, against the API too, so that a mistake fails before anything exists;
2. the client makes its own TLS key and a certificate signing request (CSR) for the client role,
   and creates the head VM with the cluster's settings and the CSR in its metadata: both public,
   no secret is ever in metadata;
3. it waits for the head to start the cluster, sign the CSR with the cluster's CA, and publish
   the client certificate, the CA certificate and the scheduler's port as guest attributes of
   its own instance;
4. it writes key (0600), certificate and CA under the registry folder and registers the cluster
   locally, with ``head_vm`` = the VM's project, zone and name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import dask.config

from transient_nb import config
from transient_nb.backends.gce.api import GCEError
from transient_nb.backends.gce.head import (
    CA_ATTRIBUTE,
    CLIENT_CERT_ATTRIBUTE,
    CLIENT_ONLY_KWARGS,
    NO_ROUTE,
    PORT_ATTRIBUTE,
    delete_cluster_resources,
    external_ip,
    head_instance_body,
    head_spec,
    wait_ready,
)
from transient_nb.backends.tls import CLIENT_CN, cert_matches_key, make_csr
from transient_nb.deploy import registry
from transient_nb.deploy.remote import RemoteCluster
from transient_nb.deploy.settings import ClusterSettings, check_name, head_machine_type

#: Prefix of the line a head writes to its log when its settings were refused.
ERROR_PREFIX = "transient-nb head: error: "


def _head_log_dir() -> str:
    folder = os.path.join(os.path.expanduser(config.get("run-dir")), "heads")
    os.makedirs(folder, exist_ok=True)
    return folder


def json_ready(kwargs: Mapping[str, Any]) -> dict[str, Any]:
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
    cluster_json = json_ready(cluster_kwargs)
    # The settings' own checks here (the name's and its freedom in the registry too), as the head
    # will make them: a mistake is answered at once (the panel's form, `transient-nb up`) instead
    # of by a head process started to refuse it.
    name = ClusterSettings.from_arguments(name=name, **cluster_kwargs).name
    spec = {
        "name": name,
        "cluster": cluster_json,
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
            [sys.executable, "-m", "transient_nb.deploy.head", spec_path],
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
    (:func:`launch_gce`).
    """
    if config.get("backend", override_with=cluster_kwargs.get("backend")) == "gce":
        return launch_gce(cluster_kwargs, name=name)
    return launch(cluster_kwargs, name=name)


def start_detached(cluster_kwargs: Mapping[str, Any], *, name: str | None = None) -> Any:
    """Start a detached cluster's head (:func:`launch_head`); a handle connected to it.

    Returns
    -------
    A :class:`~transient_nb.deploy.remote.RemoteCluster`.
    """
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


def launch_gce(
    cluster_kwargs: Mapping[str, Any], *, name: str | None = None, timeout: float | None = None
) -> dict[str, Any]:
    """Create a detached cluster's head VM and wait until this client may connect to it.

    Parameters
    ----------
    cluster_kwargs
        Arguments of :class:`~transient_nb.TransientCluster` (plain values, but
        ``credentials``, which stay here).
    name
        The cluster's name (a fresh one if not given); the head VM is ``NAME-head``.
    timeout
        Seconds to wait for the head (default ``gce.head-timeout``).

    Returns
    -------
    The cluster's registry entry on this machine (``scheduler_address``, ``tls``, ``head_vm``).

    Raises
    ------
    ValueError
        A setting is wrong (checked before anything is created), or the head refused one.
    RuntimeError, TimeoutError
        The head VM could not be created or did not start; whatever the cluster had created is
        deleted again.

    Examples
    --------
    >>> from transient_nb.deploy.detached import launch_gce
    >>> entry = launch_gce({"workers": 4, "gpu": "t4", "client_cidr": "203.0.113.7/32"},
    ...                name="demo")  # doctest: +SKIP
    >>> entry["scheduler_address"]  # doctest: +SKIP
    'tls://34.123.45.67:8786'
    """
    from transient_nb.backends.gce.backend import GCEBackend

    name = check_name(name or f"transient-{uuid.uuid4().hex[:6]}")
    registry.check_free(name)
    kwargs = dict(cluster_kwargs)
    json_ready({k: v for k, v in kwargs.items() if k not in CLIENT_ONLY_KWARGS})
    # Every check of an attached cluster, API look-ups included: a mistake costs nothing.
    probe = ClusterSettings.from_arguments(name=name, **kwargs)
    backend = probe.check()
    if not isinstance(backend, GCEBackend):
        raise ValueError(f"A head VM is for the gce backend, not {backend.name!r}.")
    if backend.client_cidr is None and backend.head_address is None:
        raise ValueError(NO_ROUTE)
    zone = probe.zone
    machine_type = head_machine_type(backend.head_machine_type, probe.ps_machine_type)
    if machine_type != probe.ps_machine_type:
        probe.catalog.machine_price(machine_type, zone)  # it is billed: the catalog must know it
        try:
            backend.api.get_machine_type(zone, machine_type)
        except GCEError as e:
            raise ValueError(
                f"gce.head-machine-type {machine_type!r} is not available in {zone} ({e}). List "
                f"the machine types with `gcloud compute machine-types list --zones {zone}`."
            ) from e
    # The limits, before the head VM exists: the head hosts the first PS, billed as its own
    # machine type, beside the workers at their dearest placement.
    probe.head_machine_type = machine_type
    probe.check_hourly_cost(probe.replacement_policy(), probe.mix, {})
    timeout = backend.head_timeout_s if timeout is None else timeout
    key_pem, csr_pem = make_csr(CLIENT_CN)
    # The project as resolved here (an argument, the config or this client's gcloud default):
    # the head's own default would be its service account's project. The PS runs on the head
    # VM (backends.gce.head_ps): its bill line is the head's machine type.
    spec = head_spec(
        name,
        {
            **kwargs,
            "project": backend.project,
            "head_machine_type": machine_type,
            # What the head creates is this client's user's (labels carry it, hashed).
            "owner": backend.owner,
        },
        dask.config.get("transient"),
        probe.cluster_id,
    )
    body = head_instance_body(
        backend, zone=zone, machine_type=machine_type, spec=spec, csr_pem=csr_pem
    )
    api = backend.api
    instance = str(body["name"])
    try:
        op = api.insert_instance(zone, body)
    except GCEError as e:
        if e.conflict:
            raise RuntimeError(
                f"GCE instance {instance} already exists in {zone} and is not this cluster's: "
                "pick another cluster name (name=...)."
            ) from e
        raise RuntimeError(f"GCE refused the head VM {instance} in {zone}: {e}") from e
    try:
        api.wait_zone_operation(zone, op, backend.operation_timeout)
        attrs, inst = wait_ready(api, zone, instance, timeout, min(backend.poll_s, 2.0))
        cert, ca = attrs[CLIENT_CERT_ATTRIBUTE], attrs[CA_ATTRIBUTE]
        if not cert_matches_key(cert, key_pem):
            raise RuntimeError(
                f"The head VM {instance} published a client certificate for another key: "
                "someone else may have changed its metadata. It was deleted."
            )
        if backend.head_address is not None:
            address = str(backend.head_address)
        else:
            ip = external_ip(inst)
            if ip is None:
                raise RuntimeError(f"The head VM {instance} has no external IP address.")
            address = f"tls://{ip}:{int(attrs[PORT_ATTRIBUTE])}"
    except BaseException:
        # Nothing of a failed start may stay: the head VM and whatever it created already.
        delete_cluster_resources(api, probe.zones, probe.cluster_id, head=instance)
        raise
    paths = registry.write_client_files(name, key_pem, cert, ca)
    registry.register(
        name,
        {
            "backend": "gce",
            # The owner is a VM: no local pid (see the module's docstring on liveness).
            "pid": None,
            "scheduler_address": address,
            "dashboard_link": None,
            "cluster_id": probe.cluster_id,
            "tls": paths,
            "gpu": probe.gpu,
            "zone": zone,
            "spot": probe.spot,
            "detached": True,
            "head_vm": {
                "project": backend.project,
                "zone": zone,
                "instance": instance,
                "api_endpoint": config.get(
                    "gce.api-endpoint", override_with=kwargs.get("api_endpoint")
                ),
            },
        },
    )
    return registry.lookup(name)
