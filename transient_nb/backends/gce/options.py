"""The GCE backend's settings, read from its arguments and ``transient.gce.*``, checked before
anything is asked of the API."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dask.utils import parse_timedelta

from transient_nb import config
from transient_nb.backends.base import Backend
from transient_nb.backends.gce.api import (
    ComputeAPI,
    default_project,
)
from transient_nb.backends.gce.enroll import CA_KEY
from transient_nb.backends.gce.labels import owner_identity, owner_label
from transient_nb.backends.gce.startup import worker_args
from transient_nb.backends.tls import ClusterCA, tls_lifetime_s

logger = logging.getLogger(__name__)

#: Catalog GPU names and the GCE accelerator types they stand for.
GPU_TYPES: dict[str, str] = {
    "t4": "nvidia-tesla-t4",
    "p4": "nvidia-tesla-p4",
    "l4": "nvidia-l4",
    "p100": "nvidia-tesla-p100",
    "v100": "nvidia-tesla-v100",
    "k80": "nvidia-tesla-k80",
    "a100-40gb": "nvidia-tesla-a100",
    "a100-80gb": "nvidia-a100-80gb",
    "h100-80gb": "nvidia-h100-80gb",
}
#: GPUs that attach to N1 machine types through ``guestAccelerators``.
N1_GPUS = frozenset({"t4", "p4", "p100", "v100", "k80"})
#: Accelerator-optimized machine families come with their GPUs (no ``guestAccelerators``).
BUNDLED_GPUS: dict[str, frozenset[str]] = {
    "a2-": frozenset({"a100-40gb", "a100-80gb"}),
    "a3-": frozenset({"h100-80gb"}),
    "g2-": frozenset({"l4"}),
}

#: Metadata keys of the VM's signed TLS certificate and of the cluster's CA certificate: both
#: public. No private key is ever in metadata (see transient_nb.backends.tls).
TLS_CA_KEY = CA_KEY

#: Scheduler port of a head VM when ``gce.scheduler-port`` is 0 (Dask's usual one).
HEAD_PORT = 8786


#: Widest client network a head's scheduler port is opened to without ``allow_wide_client_cidr``:
#: a /24 (256 addresses) in IPv4, a /64 (one site) in IPv6.
WIDEST_CLIENT_PREFIX = {4: 24, 6: 64}


def check_cidr(cidr: str, allow_wide: bool = False) -> str:
    """``cidr`` as a normalised IPv4/IPv6 network, or a ``ValueError`` saying what to give.

    A network wider than a /24 (IPv6: a /64), such as ``0.0.0.0/0``, opens the head's scheduler
    port to the internet: refused unless ``allow_wide`` (``gce.allow-wide-client-cidr``). Mutual
    TLS still keeps out whoever has no certificate, but every scanner may then knock.

    Examples
    --------
    >>> check_cidr("203.0.113.7/32")
    '203.0.113.7/32'
    >>> check_cidr("203.0.113.7")  # a single address
    '203.0.113.7/32'
    >>> check_cidr("0.0.0.0/0", allow_wide=True)
    '0.0.0.0/0'
    """
    import ipaddress

    try:
        network = ipaddress.ip_network(str(cidr).strip(), strict=True)
    except ValueError as e:
        raise ValueError(
            f"gce.client-cidr={cidr!r} is not a network ({e}): give your own public address "
            "as a CIDR such as '203.0.113.7/32' (`curl -s ifconfig.me` shows the address)."
        ) from None
    widest = WIDEST_CLIENT_PREFIX[network.version]
    if network.prefixlen < widest and not allow_wide:
        raise ValueError(
            f"gce.client-cidr={cidr!r} would open the head's scheduler port to "
            f"{network.num_addresses:,} addresses (wider than a /{widest}): give your own public "
            "address, e.g. '203.0.113.7/32' (`curl -s ifconfig.me` shows it), or reach the head "
            "through a tunnel (gce.head-address). If you mean it, pass "
            "allow_wide_client_cidr=True (gce.allow-wide-client-cidr: true)."
        )
    return str(network)


class GCEOptions(Backend):
    """The GCE backend's settings: each argument, else ``transient.gce.*``, checked."""

    def _read_options(
        self,
        log_dir: str,
        project: str | None = None,
        scheduler: str | None = None,
        scheduler_host: str | None = None,
        scheduler_port: int | None = None,
        scheduler_address: str | None = None,
        image_family: str | None = None,
        image_project: str | None = None,
        python: str | None = None,
        disk_size_gb: int | None = None,
        disk_type: str | None = None,
        network: str | None = None,
        subnetwork: str | None = None,
        external_ip: bool | None = None,
        service_account: str | None = None,
        scopes: Sequence[str] | None = None,
        provisioning_model: str | None = None,
        termination_action: str | None = None,
        worker_ports: str | None = None,
        nanny_ports: str | None = None,
        data_ports: str | None = None,
        firewall: bool | None = None,
        firewall_source_ranges: Sequence[str] | None = None,
        nthreads: int | None = None,
        death_timeout: str | float | None = None,
        poll_interval: str | float | None = None,
        operation_timeout: str | float | None = None,
        retries: int | None = None,
        retry_backoff: str | float | None = None,
        retry_backoff_max: str | float | None = None,
        api_endpoint: str | None = None,
        credentials: Any = None,
        head_machine_type: str | None = None,
        head_service_account: str | None = None,
        client_cidr: str | None = None,
        allow_wide_client_cidr: bool | None = None,
        head_address: str | None = None,
        head_timeout: str | float | None = None,
        head: bool = False,
        tls_lifetime: float | None = None,
        owner: str | None = None,
        lease_interval: str | float | None = None,
        lease_duration: str | float | None = None,
    ):
        """Read and check every setting (called by ``GCEBackend.__init__``)."""

        def get(key: str, value: Any) -> Any:
            return config.get(f"gce.{key}", override_with=value)

        self.log_dir = log_dir
        self.scheduler = get("scheduler", scheduler)
        if self.scheduler != "local":
            raise ValueError(
                f"scheduler={self.scheduler!r} is not supported yet: use scheduler='local' (the "
                "scheduler runs in this process; run the notebook on a VM in the same VPC "
                "network as the workers, or set gce.scheduler-address)."
            )
        self.scheduler_host = str(get("scheduler-host", scheduler_host))
        self.scheduler_port = int(get("scheduler-port", scheduler_port))
        self.head = bool(head)
        if self.head and self.scheduler_port == 0:
            # Clients and the firewall rules must know the port before the scheduler starts.
            self.scheduler_port = HEAD_PORT
        self.head_machine_type: str | None = get("head-machine-type", head_machine_type)
        self.head_service_account: str | None = get("head-service-account", head_service_account)
        self.client_cidr: str | None = get("client-cidr", client_cidr)
        self.allow_wide_client_cidr = bool(get("allow-wide-client-cidr", allow_wide_client_cidr))
        if self.client_cidr is not None:
            self.client_cidr = check_cidr(self.client_cidr, self.allow_wide_client_cidr)
        self.head_address: str | None = get("head-address", head_address)
        self.head_timeout_s = float(
            parse_timedelta(get("head-timeout", head_timeout), default="seconds")
        )
        self.scheduler_address: str | None = get("scheduler-address", scheduler_address)
        self.image_family = str(get("image-family", image_family))
        self.python = str(get("python", python))
        self.disk_size_gb = int(get("disk-size-gb", disk_size_gb))
        self.disk_type = str(get("disk-type", disk_type))
        self.network = str(get("network", network))
        self.subnetwork: str | None = get("subnetwork", subnetwork)
        self.external_ip = bool(get("external-ip", external_ip))
        self.service_account = str(get("service-account", service_account))
        self.scopes = list(get("scopes", scopes))
        self.provisioning_model = str(get("provisioning-model", provisioning_model)).lower()
        if self.provisioning_model not in ("spot", "preemptible"):
            raise ValueError(
                f"provisioning_model={self.provisioning_model!r}: use 'spot' or 'preemptible'."
            )
        self.termination_action = str(get("termination-action", termination_action)).upper()
        if self.termination_action not in ("STOP", "DELETE"):
            raise ValueError(
                f"termination_action={self.termination_action!r}: use 'DELETE' or 'STOP'."
            )
        self.worker_ports = str(get("worker-ports", worker_ports))
        self.nanny_ports = str(get("nanny-ports", nanny_ports))
        self.data_ports = str(get("data-ports", data_ports))
        for what, ports in (
            ("worker_ports", self.worker_ports),
            ("nanny_ports", self.nanny_ports),
            ("data_ports", self.data_ports),
        ):
            if not re.fullmatch(r"\d+(:\d+)?", ports):
                raise ValueError(f"{what}={ports!r}: give a port or a range like '41000:41099'.")
        self.firewall = bool(get("firewall", firewall))
        self.firewall_source_ranges = list(get("firewall-source-ranges", firewall_source_ranges))
        self.nthreads = int(get("nthreads", nthreads))
        self.death_timeout_s = float(parse_timedelta(get("death-timeout", death_timeout)))
        self.poll_s = float(parse_timedelta(get("poll-interval", poll_interval)))
        self.operation_timeout = float(parse_timedelta(get("operation-timeout", operation_timeout)))
        self.retries = int(get("retries", retries))
        if self.retries < 0:
            raise ValueError(f"retries={self.retries} must be 0 or more.")
        self.retry_backoff_s = float(
            parse_timedelta(get("retry-backoff", retry_backoff), default="seconds")
        )
        self.retry_max_s = float(
            parse_timedelta(get("retry-backoff-max", retry_backoff_max), default="seconds")
        )
        api_endpoint = get("api-endpoint", api_endpoint)
        project = get("project", project)
        if project is None:
            project = default_project(credentials)
        self.project = str(project)
        self.image_project = str(get("image-project", image_project) or self.project)
        self.api = ComputeAPI(
            self.project,
            api_endpoint=api_endpoint,
            credentials=credentials,
            retries=self.retries,
            backoff_s=self.retry_backoff_s,
            max_backoff_s=self.retry_max_s,
        )
        # Who owns what this cluster creates, and how long its lease on it holds unrenewed.
        self.owner = owner_label(owner_identity(get("owner", owner), credentials))
        self.lease_interval_s = float(
            parse_timedelta(get("lease-interval", lease_interval), default="seconds")
        )
        self.lease_duration_s = float(
            parse_timedelta(get("lease-duration", lease_duration), default="seconds")
        )
        if not 0 < self.lease_interval_s < self.lease_duration_s:
            raise ValueError(
                f"gce.lease-interval ({self.lease_interval_s:g} s) must be positive and shorter "
                f"than gce.lease-duration ({self.lease_duration_s:g} s): a lease is renewed "
                "before it runs out, e.g. every minute for five."
            )
        # Certificates made for this cluster only, in memory: every connection (workers,
        # scheduler, clients) is TLS with mutual authentication.
        self.ca = ClusterCA.create("gce", tls_lifetime_s(tls_lifetime))
        self._security = self.ca.cluster_security()
        self.cluster_name = "transient"
        self.cluster_id = ""
        self.notice_s = 30.0
        self.live: set[tuple[str, str]] = set()
        #: Instances whose insert GCE took: ours without asking (the rest of ``live`` is
        #: checked for our id label before it is deleted).
        self.ours: set[tuple[str, str]] = set()
        self._not_offered: set[tuple[str, str]] = set()
        self._tasks: set[Any] = set()
        self._atexit_registered = False
        self._close_lock = asyncio.Lock()
        #: Firewall rules this cluster created (or adopted: they carry its id).
        self.firewall_names: list[str] = []

    def worker_command(
        self,
        name: str,
        resources: Mapping[str, float],
        *,
        python: str,
        scheduler_address: str,
        preloads: tuple[str, ...] | None = None,
    ) -> list[str]:
        """The ``dask worker`` command line of the VM ``name``
        (:func:`~transient_nb.backends.gce.startup.worker_args`), with this cluster's worker
        options: threads, death timeout, ports."""
        return worker_args(
            python=python,
            scheduler_address=scheduler_address,
            name=name,
            resources=dict(resources),
            nthreads=self.nthreads,
            death_timeout_s=self.death_timeout_s,
            worker_ports=self.worker_ports,
            nanny_ports=self.nanny_ports,
            preloads=preloads,
        )
