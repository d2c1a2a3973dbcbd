"""The head of a detached GCE cluster: a VM of its own, ``NAME-head``, that outlives the client.

On GCE a detached cluster's manager, scheduler (with the event log) and training driver run on
an on-demand VM with no GPU, never Spot: the head VM. The client (a notebook on a laptop, the
CLI) only needs to reach that VM's scheduler port; the workers talk to the head inside the VPC.

The client side (here, :func:`launch`):

1. checks every setting exactly as an attached cluster does, against the API too
   (:meth:`TransientCluster.check_settings <transient_nb.cluster.TransientCluster.check_settings>`),
   so that a mistake fails before anything exists;
2. makes its own TLS key and a certificate signing request (CSR) for the client role, and
   creates the head VM with the cluster's settings (:func:`head_spec`) and the CSR in its
   metadata: both public, no secret is ever in metadata;
3. waits for the head (:mod:`~transient_nb.backends.gce_head_serve`, started by the VM's startup
   script) to start the cluster, sign the CSR with the cluster's CA, and publish the client
   certificate, the CA certificate and the scheduler's port as guest attributes of its own
   instance (written from inside the VM only, read with ``instances.getGuestAttributes``);
4. writes key (0600), certificate and CA under the registry folder and registers the cluster
   locally, with ``scheduler_address`` = ``tls://HEAD_EXTERNAL_IP:PORT`` (or ``gce.head-address``,
   a tunnel) and ``head_vm`` = the VM's project, zone and name.

Liveness of such an entry: its owner is a VM, not a local process, so the registry never calls
it stale (:func:`transient_nb.registry.entries`); :func:`transient_nb.connect.connect` asks the API
whether the head VM still runs (:func:`head_gone`), and forgets the entry when it does not.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import stat
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import dask.config

import transient_nb
from transient_nb import config, registry
from transient_nb.backends.gce_api import ComputeAPI, GCEError
from transient_nb.backends.gce_labels import LABEL_ID, firewall_id
from transient_nb.backends.tls import CLIENT_CN, cert_matches_key, make_csr

if TYPE_CHECKING:
    from transient_nb.backends.gce import GCEBackend

logger = logging.getLogger(__name__)

#: Metadata keys of the head VM (both public): the cluster's settings and the client's CSR.
HEAD_SPEC_KEY = "transient-nb-head-spec"
CLIENT_CSR_KEY = "transient-nb-client-csr"
#: Guest attributes the head publishes (all public): the client's certificate, the CA's, the
#: scheduler's port, or why the head refused its settings.
CLIENT_CERT_ATTRIBUTE = "transient-nb/client-cert"
CA_ATTRIBUTE = "transient-nb/ca"
PORT_ATTRIBUTE = "transient-nb/scheduler-port"
ERROR_ATTRIBUTE = "transient-nb/error"
#: The client's own folders: the head's default to the head VM's home.
CLIENT_ONLY_CONFIG = ("registry-dir", "run-dir")
#: Arguments that stay with the client (they are objects, or name the client's folders).
CLIENT_ONLY_KWARGS = ("credentials", "run_dir")
#: Scope of the head's service account: its roles (README) limit what it may do.
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
#: Instance states in which a head VM still runs (or is about to run) its cluster.
HEAD_ALIVE_STATES = frozenset({"PROVISIONING", "STAGING", "RUNNING"})

NO_ROUTE = (
    "A detached GCE cluster's client must reach the head VM's scheduler port, and no way is "
    "set: either set gce.client-cidr to your public address (e.g. client_cidr='203.0.113.7/32'; "
    "`curl -s ifconfig.me` shows it), and a firewall rule opens the port to that address only; "
    "or reach the head through a tunnel and set gce.head-address to its local end, e.g. "
    "head_address='tls://localhost:8786' with `gcloud compute ssh NAME-head "
    "--tunnel-through-iap -- -N -L 8786:localhost:8786` running (the README shows both). "
    "Or pass detached=False to run the scheduler in this process (the VMs must then reach it)."
)


def head_name(cluster: str) -> str:
    """The instance name of cluster ``cluster``'s head VM."""
    return f"{cluster}-head"


def head_spec(
    name: str,
    cluster_kwargs: Mapping[str, Any],
    client_config: Mapping[str, Any],
    cluster_id: str,
) -> dict[str, Any]:
    """What the head needs to start the cluster (instance metadata: public, no secrets).

    The client's ``transient`` settings hold in the head, except its own folders
    (:data:`CLIENT_ONLY_CONFIG`: the head's default to the VM's home) and ``detached`` (the head
    runs the cluster itself).

    Examples
    --------
    >>> spec = head_spec("demo", {"workers": 2}, {"run-dir": "/home/me/runs", "gpu": "t4"}, "abc")
    >>> spec["config"]
    {'gpu': 't4', 'detached': False}
    """
    conf = {k: v for k, v in client_config.items() if k not in CLIENT_ONLY_CONFIG}
    conf["detached"] = False
    kwargs = {k: v for k, v in cluster_kwargs.items() if k not in CLIENT_ONLY_KWARGS}
    return {"name": name, "cluster": dict(kwargs), "config": conf, "cluster_id": cluster_id}


def head_startup_script(python: str) -> str:
    """The head VM's startup script: run the head; power off when it ends for any reason.

    The head deletes its own VM once its cluster is closed; the ``poweroff`` is for a head that
    crashed, so that it stops billing (``sweep`` then deletes it and what its cluster left).

    Examples
    --------
    >>> "-m transient_nb.backends.gce_head_serve" in head_startup_script("/opt/py/bin/python")
    True
    """
    return f"""#!/bin/bash
# transient_nb {transient_nb.__version__}: the head of a detached cluster (scheduler, manager,
# training driver). Its settings are in the instance metadata ({HEAD_SPEC_KEY}).
set -euo pipefail
trap '${{TRANSIENT_NB_POWEROFF:-poweroff}}' EXIT
{shlex.quote(python)} -m transient_nb.backends.gce_head_serve || echo "transient_nb: the head exited with status $?" >&2
"""


def head_instance_body(
    backend: GCEBackend,
    *,
    zone: str,
    machine_type: str,
    spec: Mapping[str, Any],
    csr_pem: str,
) -> dict[str, Any]:
    """The ``instances.insert`` body of the head VM: on demand, no GPU, cloud-platform scope."""
    external = backend.external_ip or backend.client_cidr is not None
    return {
        "name": backend.instance_name("head"),
        "machineType": f"zones/{zone}/machineTypes/{machine_type}",
        "disks": [backend.boot_disk(zone)],
        "networkInterfaces": [backend.network_interface(zone, external)],
        # Never Spot. It live-migrates through maintenance; after a host failure it stays down
        # rather than start a second cluster of the same name (sweep cleans up after it).
        "scheduling": {
            "provisioningModel": "STANDARD",
            "onHostMaintenance": "MIGRATE",
            "automaticRestart": False,
        },
        "labels": backend.role_labels("head"),
        # The cluster's tag (the workers reach its scheduler) and its own (the client's rule).
        "tags": {"items": [backend.tag, backend.head_tag]},
        "metadata": {
            "items": [
                {"key": "startup-script", "value": head_startup_script(backend.python)},
                {"key": HEAD_SPEC_KEY, "value": json.dumps(spec, sort_keys=True)},
                {"key": CLIENT_CSR_KEY, "value": csr_pem},
                {"key": "enable-guest-attributes", "value": "TRUE"},
            ]
        },
        "serviceAccounts": [
            {"email": backend.head_service_account or "default", "scopes": [CLOUD_PLATFORM]}
        ],
    }


def _external_ip(instance: Mapping[str, Any]) -> str | None:
    for interface in instance.get("networkInterfaces") or []:
        for access in interface.get("accessConfigs") or []:
            if access.get("natIP"):
                return str(access["natIP"])
    return None


def _wait_ready(
    api: ComputeAPI, zone: str, instance: str, timeout: float, poll_s: float
) -> tuple[dict[str, str], dict[str, Any]]:
    """The head's guest attributes and instance, once it has published the client certificate."""
    deadline = time.monotonic() + timeout
    wanted = (CLIENT_CERT_ATTRIBUTE, CA_ATTRIBUTE, PORT_ATTRIBUTE)
    while True:
        # Attributes first: a head that refused its settings says why, then powers off.
        attrs = api.get_guest_attributes(zone, instance, "transient-nb/")
        error = attrs.get(ERROR_ATTRIBUTE)
        if error:
            # A refused setting comes as is (a ValueError); any other failure with its type.
            if re.match(r"^[A-Za-z]+(Error|Exception): ", error):
                raise RuntimeError(f"The head VM {instance} could not start its cluster: {error}")
            raise ValueError(error)
        inst = api.get_instance(zone, instance)
        if inst is None or inst.get("status") not in HEAD_ALIVE_STATES:
            raise RuntimeError(
                f"The head VM {instance} stopped while starting ({'deleted' if inst is None else inst.get('status')}). "
                f"Its log: `gcloud compute instances get-serial-port-output {instance} --zone "
                f"{zone} --project {api.project}`."
            )
        if all(attrs.get(k) for k in wanted):
            return attrs, inst
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"The head VM {instance} did not start its cluster within {timeout:g} s; it was "
                f"deleted. Its log: `gcloud compute instances get-serial-port-output {instance} "
                f"--zone {zone} --project {api.project}`."
            )
        time.sleep(poll_s)


def delete_cluster_resources(
    api: ComputeAPI, zones: Sequence[str], cluster_id: str, head: str | None = None
) -> None:
    """Delete the head VM, then every VM and firewall rule carrying ``cluster_id``.

    For a launch that failed half-way: the head may already have created the PS VM, workers and
    rules. Only what carries this cluster's id is touched (blocking; errors are logged).
    """
    doomed: list[tuple[str, str]] = []
    if head is not None:
        doomed.append((zones[0], head))
    for zone in dict.fromkeys(zones):
        try:
            for inst in api.list_instances(zone, filter=f'labels.{LABEL_ID} = "{cluster_id}"'):
                if (zone, inst["name"]) not in doomed:
                    doomed.append((zone, inst["name"]))
        except GCEError as e:
            logger.warning("Could not list the VMs of cluster id %s in %s: %s", cluster_id, zone, e)
    pending = []
    for zone, name in doomed:
        try:
            op = api.delete_instance(zone, name)
            if op is not None:
                pending.append((zone, op))
        except GCEError as e:
            logger.warning("Could not delete %s in %s: %s", name, zone, e)
    for zone, op in pending:
        try:
            api.wait_zone_operation(zone, op)
        except GCEError as e:
            logger.warning("A delete in %s failed: %s", zone, e)
    try:
        rules = api.list_firewalls(filter='name eq ".*-dask(-client)?"')
    except GCEError as e:
        logger.warning("Could not list firewall rules: %s", e)
        rules = []
    for rule in rules:
        if firewall_id(rule) == cluster_id:
            try:
                api.delete_firewall(rule["name"])
            except GCEError as e:
                logger.warning("Could not delete firewall rule %s: %s", rule["name"], e)


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def write_client_files(name: str, key_pem: str, cert_pem: str, ca_pem: str) -> dict[str, str]:
    """The client's key, certificate and CA as 0600 files in a 0700 folder of the registry."""
    folder = os.path.join(registry.registry_dir(), "tls", name)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(folder), stat.S_IRWXU)
    os.chmod(folder, stat.S_IRWXU)
    paths = {
        "ca": os.path.join(folder, "ca.pem"),
        "cert": os.path.join(folder, f"{CLIENT_CN}.pem"),
        "key": os.path.join(folder, f"{CLIENT_CN}.key"),
    }
    for what, text in (("key", key_pem), ("cert", cert_pem), ("ca", ca_pem)):
        _write_private(paths[what], text)
    return paths


def launch(
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
    >>> from transient_nb.backends.gce_head import launch
    >>> entry = launch({"workers": 4, "gpu": "t4", "client_cidr": "203.0.113.7/32"},
    ...                name="demo")  # doctest: +SKIP
    >>> entry["scheduler_address"]  # doctest: +SKIP
    'tls://34.123.45.67:8786'
    """
    from transient_nb.backends.gce import GCEBackend
    from transient_nb.cluster import TransientCluster, check_name
    from transient_nb.head import _json_ready

    name = check_name(name or f"transient-{uuid.uuid4().hex[:6]}")
    registry.check_free(name)
    kwargs = dict(cluster_kwargs)
    _json_ready({k: v for k, v in kwargs.items() if k not in CLIENT_ONLY_KWARGS})
    # Every check of an attached cluster, API look-ups included: a mistake costs nothing.
    probe = TransientCluster.check_settings(name=name, **kwargs)
    backend = probe.backend
    if not isinstance(backend, GCEBackend):
        raise ValueError(f"A head VM is for the gce backend, not {backend.name!r}.")
    if backend.client_cidr is None and backend.head_address is None:
        raise ValueError(NO_ROUTE)
    zone = probe.zone
    machine_type = backend.head_machine_type or probe.ps_machine_type
    if machine_type != probe.ps_machine_type:
        probe.catalog.machine_price(machine_type, zone)  # it is billed: the catalog must know it
        try:
            backend.api.get_machine_type(zone, machine_type)
        except GCEError as e:
            raise ValueError(
                f"gce.head-machine-type {machine_type!r} is not available in {zone} ({e}). List "
                f"the machine types with `gcloud compute machine-types list --zones {zone}`."
            ) from e
    timeout = backend.head_timeout_s if timeout is None else timeout
    key_pem, csr_pem = make_csr(CLIENT_CN)
    # The project as resolved here (an argument, the config or this client's gcloud default):
    # the head's own default would be its service account's project.
    # The PS runs on the head VM (gce_head_ps): its bill line is the head's machine type.
    spec = head_spec(
        name,
        {**kwargs, "project": backend.project, "ps_machine_type": machine_type},
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
        attrs, inst = _wait_ready(api, zone, instance, timeout, min(backend.poll_s, 2.0))
        cert, ca = attrs[CLIENT_CERT_ATTRIBUTE], attrs[CA_ATTRIBUTE]
        if not cert_matches_key(cert, key_pem):
            raise RuntimeError(
                f"The head VM {instance} published a client certificate for another key: "
                "someone else may have changed its metadata. It was deleted."
            )
        if backend.head_address is not None:
            address = str(backend.head_address)
        else:
            ip = _external_ip(inst)
            if ip is None:
                raise RuntimeError(f"The head VM {instance} has no external IP address.")
            address = f"tls://{ip}:{int(attrs[PORT_ATTRIBUTE])}"
    except BaseException:
        # Nothing of a failed start may stay: the head VM and whatever it created already.
        delete_cluster_resources(api, probe._zones(), probe.cluster_id, head=instance)
        raise
    paths = write_client_files(name, key_pem, cert, ca)
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


def _api(entry: Mapping[str, Any]) -> ComputeAPI:
    head = entry["head_vm"]
    return ComputeAPI(str(head["project"]), api_endpoint=head.get("api_endpoint"), retries=2)


def head_gone(entry: Mapping[str, Any]) -> bool:
    """Whether the head VM of a registry entry no longer runs (False when it cannot be told)."""
    head = entry["head_vm"]
    try:
        inst = _api(entry).get_instance(str(head["zone"]), str(head["instance"]))
    except GCEError as e:
        logger.info("Could not read the head VM %s: %s", head["instance"], e)
        return False
    return inst is None or inst.get("status") not in HEAD_ALIVE_STATES


def wait_gone(entry: Mapping[str, Any], timeout: float, poll_s: float = 1.0) -> bool:
    """Wait until the head VM no longer runs; False if it still did after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not head_gone(entry):
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def forget(entry: Mapping[str, Any], path: str | None = None) -> None:
    """Remove a head's local registry entry and this client's TLS files for it."""
    registry.unregister(str(entry["name"]), path)
    key = (entry.get("tls") or {}).get("key")
    if key:
        shutil.rmtree(os.path.dirname(key), ignore_errors=True)
