"""What runs on a detached cluster's head VM: ``python -m transient_nb.deploy.head_vm``.

Started by the head VM's startup script (:func:`~transient_nb.backends.gce.head.head_startup_script`):

1. reads the cluster's settings and the client's CSR from the instance metadata, and who it is
   (project, zone, instance) from the metadata server;
2. starts the cluster as an attached GCE cluster would, in this process: the scheduler listens
   on this VM (a fixed port, opened by the cluster's firewall rule to its VMs and by a second
   rule to ``gce.client-cidr``), the PS worker runs on this VM as a process of its own
   (:mod:`~transient_nb.backends.gce.head_ps`), the Spot workers are VMs of their own, and this
   process owns the cluster's CA;
3. signs the client's CSR for the client role and publishes the client certificate, the CA
   certificate and the scheduler's port as guest attributes (all public; the client's key never
   left the client). A refused setting is published instead (``transient-nb/error``);
4. serves as :class:`transient_nb.deploy.head.Head` does: control requests (``train``, ``stop``, ...)
   and limits (budget, deadline) hold while no client is connected;
5. once the cluster is closed (``down``, ``shutdown()``, a limit, SIGTERM), deletes its own VM,
   so that nothing of the cluster keeps billing.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence

from transient_nb.backends.gce import head as gce_head  # the head VM's metadata keys
from transient_nb.backends.gce.api import ComputeAPI, GCEError
from transient_nb.backends.gce.enroll import _request
from transient_nb.backends.tls import CLIENT_CN
from transient_nb.deploy.head import prepare_process
from transient_nb.worker.peers import ROLE_CLIENT

logger = logging.getLogger(__name__)


def _metadata(path: str) -> str:
    value = _request(path)
    if value is None:
        raise RuntimeError(f"The metadata server has no {path}: is this a head VM?")
    return value


def publish(attribute: str, value: str) -> None:
    """Write one guest attribute (``namespace/key``) of this VM; readable through the API."""
    _request(f"instance/guest-attributes/{attribute}", value.encode())


def error_text(e: BaseException) -> str:
    """How a failed start is told to the client: a refused setting as is, else with its type.

    Examples
    --------
    >>> error_text(ValueError("workers=0 must be ...")), error_text(OSError("port in use"))
    ('workers=0 must be ...', 'OSError: port in use')
    """
    return str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"


def delete_self(api: ComputeAPI, zone: str, instance: str) -> None:
    """Ask GCE to delete this VM (its cluster is closed), so that it stops billing.

    Not waited for: the deletion stops this process too.
    """
    api.retries = 2
    try:
        api.delete_instance(zone, instance)
        logger.info("Asked GCE to delete this head VM (%s)", instance)
    except GCEError as e:  # the trap's poweroff still stops it; sweep deletes it
        logger.error("Could not delete this head VM %s: %s", instance, e)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the head VM's startup script (no arguments: all is in the metadata)."""
    from transient_nb.backends.gce.backend import GCEBackend
    from transient_nb.deploy.cluster import TransientCluster
    from transient_nb.deploy.detached import ERROR_PREFIX
    from transient_nb.deploy.head import Head

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    spec = json.loads(_metadata(f"instance/attributes/{gce_head.HEAD_SPEC_KEY}"))
    csr = _metadata(f"instance/attributes/{gce_head.CLIENT_CSR_KEY}")
    instance = _metadata("instance/name")
    zone = _metadata("instance/zone").rsplit("/", 1)[-1]
    project = _metadata("project/project-id")
    stop = prepare_process(spec)
    try:
        cluster = TransientCluster(
            name=spec["name"],
            **spec.get("cluster", {}),
            detached=False,
            head=True,
            _head_info={
                "detached": True,
                "cluster_id": spec["cluster_id"],
                "head_vm": {"project": project, "zone": zone, "instance": instance},
            },
        )
    except Exception as e:
        # The client is waiting: it reads why, deletes this VM and raises it to the user.
        logger.exception("The cluster did not start")
        print(f"{ERROR_PREFIX}{e}", flush=True)
        publish(gce_head.ERROR_ATTRIBUTE, error_text(e))
        return 2
    backend = cluster.backend
    assert isinstance(backend, GCEBackend)  # ``head=True`` is an option of the GCE backend
    try:
        cert = backend.ca.sign_csr(csr, CLIENT_CN, role=ROLE_CLIENT)
        publish(gce_head.CA_ATTRIBUTE, backend.ca.cert_pem)
        publish(gce_head.PORT_ATTRIBUTE, str(cluster.scheduler_address.rsplit(":", 1)[-1]))
        # Last: the client takes this one as the sign that it may connect.
        publish(gce_head.CLIENT_CERT_ATTRIBUTE, cert)
        logger.info("Head of cluster %s serving on %s", cluster.name, instance)
        Head(cluster).serve(stop)
    except Exception:
        logger.exception("The head of cluster %s failed", spec["name"])
        if cluster.status.name not in ("closed", "failed"):
            cluster.close(timeout=300)
        raise
    finally:
        # Closed (by a client, a limit, a signal, or the failure above): nothing may keep billing.
        if cluster.status.name in ("closed", "failed"):
            delete_self(backend.api, zone, instance)  # the cluster's own API settings
    logger.info("Cluster %s closed; the head VM is being deleted", cluster.name)
    return 0


if __name__ == "__main__":  # pragma: no cover - run by the head VM's startup script
    sys.exit(main(sys.argv[1:]))
