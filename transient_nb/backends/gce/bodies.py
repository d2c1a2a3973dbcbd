"""The REST bodies the GCE backend sends: instances (Spot or on demand, with their labels,
disks, networks and startup script) and firewall rules."""

from __future__ import annotations

import logging
import os
from typing import Any

from transient_nb.backends.base import VMSpec
from transient_nb.backends.gce.labels import (
    LABEL,
    LABEL_CLUSTER,
    LABEL_HEAD,
    LABEL_HOST,
    LABEL_ID,
    LABEL_LEASE,
    LABEL_OWNER,
    LABEL_PID,
    LABEL_ROLE,
    firewall_description,
    label_value,
    lease_until,
    this_host,
)
from transient_nb.backends.gce.options import (
    BUNDLED_GPUS,
    GPU_TYPES,
    TLS_CA_KEY,
    GCEOptions,
)
from transient_nb.backends.gce.startup import startup_script

logger = logging.getLogger(__name__)


def accelerator_type(gpu: str) -> str:
    """The GCE accelerator type of a catalog GPU name.

    Examples
    --------
    >>> accelerator_type("t4")
    'nvidia-tesla-t4'
    >>> accelerator_type("nvidia-h200-141gb")  # a GCE name passes through
    'nvidia-h200-141gb'
    """
    if gpu in GPU_TYPES:
        return GPU_TYPES[gpu]
    if gpu.startswith("nvidia-"):
        return gpu
    raise ValueError(
        f"Unknown GPU type {gpu!r} for GCE: use one of {', '.join(GPU_TYPES)}, or a GCE "
        "accelerator type name (list them with `gcloud compute accelerator-types list`)."
    )


def bundled_gpu_family(machine_type: str) -> str | None:
    """The accelerator-optimized family prefix (``g2-``) of a machine type, if it is one."""
    return next((p for p in BUNDLED_GPUS if machine_type.startswith(p)), None)


def _host_of(address: str) -> str:
    rest = address.split("://", 1)[-1]
    return rest.rsplit(":", 1)[0].strip("[]")


class GCEBodies(GCEOptions):
    """The REST bodies of the cluster's instances and firewall rules, and their names and labels."""

    @property
    def tag(self) -> str:
        """The network tag of the cluster's VMs (the firewall rule's target)."""
        return f"{self.cluster_name}-vm"

    def instance_name(self, vm: str) -> str:
        """GCE instance name of the cluster's VM ``vm`` (instance names are per project)."""
        return f"{self.cluster_name}-{vm}"

    @property
    def head_tag(self) -> str:
        """The network tag of the cluster's head VM only (the client rule's target)."""
        return f"{self.cluster_name}-head"

    def firewall_body(self, scheduler_address: str) -> dict[str, Any]:
        """The firewall rule: worker, nanny and data-plane ports, from the cluster's VMs (and the
        scheduler)."""
        sources = list(self.firewall_source_ranges)
        host = _host_of(scheduler_address)
        if host and not host.startswith("127.") and host not in ("localhost", "0.0.0.0"):
            # The local scheduler connects to its workers too.
            sources.append(f"{host}/32")
        ports = [
            p.replace(":", "-") for p in (self.worker_ports, self.nanny_ports, self.data_ports)
        ]
        if self.head:
            # The scheduler runs on the head VM (one of the tagged VMs): the workers dial it.
            ports.append(str(self.scheduler_port))
        body = self._firewall_body(f"{self.cluster_name}-dask", self.tag, ports)
        body["sourceTags"] = [self.tag]
        if sources:
            body["sourceRanges"] = sources
        return body

    def client_firewall_body(self) -> dict[str, Any]:
        """The rule that lets the client (``client_cidr`` only) reach the head's scheduler."""
        assert self.client_cidr is not None
        body = self._firewall_body(
            f"{self.cluster_name}-dask-client",
            self.head_tag,
            [str(self.scheduler_port)],
            what="the head's scheduler port, from the client's address only",
        )
        body["sourceRanges"] = [self.client_cidr]
        return body

    def _firewall_body(
        self, name: str, target_tag: str, ports: list[str], **description: Any
    ) -> dict[str, Any]:
        """A rule of this cluster (its description says whose, and until when) that lets TCP
        into the VMs tagged ``target_tag`` on ``ports``; the caller says from where."""
        return {
            "name": name,
            "description": firewall_description(
                self.cluster_name,
                this_host(),
                os.getpid(),
                self.cluster_id,
                owner=self.owner,
                lease=lease_until(self.lease_duration_s),
                **description,
            ),
            "network": self._network_url(),
            "direction": "INGRESS",
            "priority": 1000,
            "targetTags": [target_tag],
            "allowed": [{"IPProtocol": "tcp", "ports": ports}],
        }

    # -- the request body --------------------------------------------------------------------------
    def _network_url(self) -> str:
        return f"projects/{self.project}/global/networks/{self.network}"

    def labels(self, spec: VMSpec) -> dict[str, str]:
        """Labels that mark the VM as this cluster's (and whose process owns it)."""
        return self.role_labels(spec.role)

    def role_labels(self, role: str) -> dict[str, str]:
        """Labels of one of this cluster's VMs in ``role`` (``worker``, ``ps``, ``head``): whose
        it is, and its first lease (renewed while the cluster runs; a head VM's own state is
        its lease)."""
        labels = {
            LABEL: "true",
            LABEL_CLUSTER: label_value(self.cluster_name),
            LABEL_ROLE: role,
            LABEL_HOST: this_host(),
            LABEL_PID: str(os.getpid()),
            LABEL_ID: self.cluster_id,
            LABEL_OWNER: self.owner,
            LABEL_LEASE: lease_until(self.lease_duration_s),
        }
        if self.head:
            # Created by a head VM: sweep keeps it while that VM runs, and deletes it after.
            labels[LABEL_HEAD] = self.instance_name("head")
        return labels

    def network_interface(self, zone: str, external_ip: bool) -> dict[str, Any]:
        """The ``networkInterfaces`` item of a VM in ``zone`` (REST JSON)."""
        interface: dict[str, Any] = {"network": self._network_url()}
        if self.subnetwork:
            region = zone.rsplit("-", 1)[0]
            interface["subnetwork"] = (
                f"projects/{self.project}/regions/{region}/subnetworks/{self.subnetwork}"
            )
        if external_ip:
            interface["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]
        return interface

    def boot_disk(self, zone: str) -> dict[str, Any]:
        """The boot disk of a VM in ``zone``: the image family, deleted with the VM."""
        return {
            "boot": True,
            "autoDelete": True,
            "initializeParams": {
                "sourceImage": (
                    f"projects/{self.image_project}/global/images/family/{self.image_family}"
                ),
                "diskSizeGb": str(self.disk_size_gb),
                "diskType": f"zones/{zone}/diskTypes/{self.disk_type}",
            },
        }

    def instance_body(self, spec: VMSpec, scheduler_address: str) -> dict[str, Any]:
        """The ``instances.insert`` request body of a VM (GCE's REST JSON), in one place."""
        zone = spec.zone
        gpu = spec.gpu if spec.role == "worker" else None
        if gpu and spec.spot:
            if self.provisioning_model == "spot":
                scheduling: dict[str, Any] = {
                    "provisioningModel": "SPOT",
                    "instanceTerminationAction": self.termination_action,
                    "onHostMaintenance": "TERMINATE",
                    "automaticRestart": False,
                }
            else:
                scheduling = {
                    "preemptible": True,
                    "onHostMaintenance": "TERMINATE",
                    "automaticRestart": False,
                }
        elif gpu:
            # On-demand GPU VMs cannot live-migrate; they restart after host maintenance.
            scheduling = {
                "provisioningModel": "STANDARD",
                "onHostMaintenance": "TERMINATE",
                "automaticRestart": True,
            }
        else:
            # The PS host: never preemptible, live-migrates through maintenance.
            scheduling = {
                "provisioningModel": "STANDARD",
                "onHostMaintenance": "MIGRATE",
                "automaticRestart": True,
            }
        vm = {"name": spec.name, "role": spec.role, "gpu": gpu, "zone": zone, "spot": spec.spot}
        script = startup_script(
            worker=self.worker_command(
                spec.name, spec.resources, python=self.python, scheduler_address=scheduler_address
            ),
            vm=vm,
            data_ports=self.data_ports,
            notice_s=self.notice_s,
            tls_name=self.instance_name(spec.name),
        )
        body: dict[str, Any] = {
            "name": self.instance_name(spec.name),
            "machineType": f"zones/{zone}/machineTypes/{spec.machine_type}",
            "disks": [self.boot_disk(zone)],
            "networkInterfaces": [self.network_interface(zone, self.external_ip)],
            "scheduling": scheduling,
            "labels": self.labels(spec),
            "tags": {"items": [self.tag]},
            "metadata": {
                "items": [
                    {"key": "startup-script", "value": script},
                    # Public: the CA's certificate. The VM's own certificate is added once the
                    # cluster has signed the request the VM publishes as a guest attribute.
                    {"key": TLS_CA_KEY, "value": self.ca.cert_pem},
                    {"key": "enable-guest-attributes", "value": "TRUE"},
                ]
            },
            "serviceAccounts": [{"email": self.service_account, "scopes": self.scopes}],
        }
        if gpu and bundled_gpu_family(spec.machine_type) is None:
            body["guestAccelerators"] = [
                {
                    "acceleratorType": (
                        f"projects/{self.project}/zones/{zone}/acceleratorTypes/"
                        f"{accelerator_type(gpu)}"
                    ),
                    "acceleratorCount": 1,
                }
            ]
        return body
