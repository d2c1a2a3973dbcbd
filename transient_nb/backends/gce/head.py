"""The head of a detached GCE cluster: a VM of its own, ``NAME-head``, that outlives the client.

On GCE a detached cluster's manager, scheduler (with the event log) and training driver run on
an on-demand VM with no GPU, never Spot: the head VM. The client (a notebook on a laptop, the
CLI) only needs to reach that VM's scheduler port; the workers talk to the head inside the VPC.

The client side (here, :func:`launch`):

1. checks every setting exactly as an attached cluster does, against the API too
   (:meth:`TransientCluster.check_settings <transient_nb.deploy.cluster.TransientCluster.check_settings>`),
   so that a mistake fails before anything exists;
2. makes its own TLS key and a certificate signing request (CSR) for the client role, and
   creates the head VM with the cluster's settings (:func:`head_spec`) and the CSR in its
   metadata: both public, no secret is ever in metadata;
3. waits for the head (:mod:`~transient_nb.deploy.head_vm`, started by the VM's startup
   script) to start the cluster, sign the CSR with the cluster's CA, and publish the client
   certificate, the CA certificate and the scheduler's port as guest attributes of its own
   instance (written from inside the VM only, read with ``instances.getGuestAttributes``);
4. writes key (0600), certificate and CA under the registry folder and registers the cluster
   locally, with ``scheduler_address`` = ``tls://HEAD_EXTERNAL_IP:PORT`` (or ``gce.head-address``,
   a tunnel) and ``head_vm`` = the VM's project, zone and name.

Liveness of such an entry: its owner is a VM, not a local process, so the registry never calls
it stale (:func:`transient_nb.deploy.registry.entries`); :func:`transient_nb.deploy.remote.connect` asks the API
whether the head VM still runs (:func:`head_gone`), and forgets the entry when it does not.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from transient_nb._version import __version__
from transient_nb.backends.gce.api import ComputeAPI, GCEError
from transient_nb.backends.gce.labels import LABEL_ID, firewall_id

if TYPE_CHECKING:
    from transient_nb.backends.gce.backend import GCEBackend

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
    >>> "-m transient_nb.deploy.head_vm" in head_startup_script("/opt/py/bin/python")
    True
    """
    return f"""#!/bin/bash
# transient_nb {__version__}: the head of a detached cluster (scheduler, manager,
# training driver). Its settings are in the instance metadata ({HEAD_SPEC_KEY}).
set -euo pipefail
trap '${{TRANSIENT_NB_POWEROFF:-poweroff}}' EXIT
{shlex.quote(python)} -m transient_nb.deploy.head_vm || echo "transient_nb: the head exited with status $?" >&2
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


def external_ip(instance: Mapping[str, Any]) -> str | None:
    for interface in instance.get("networkInterfaces") or []:
        for access in interface.get("accessConfigs") or []:
            if access.get("natIP"):
                return str(access["natIP"])
    return None


def wait_ready(
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
