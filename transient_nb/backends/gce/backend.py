"""The Google Compute Engine backend: every VM is a real GCE instance (Spot GPU workers).

How the pieces fit
------------------
- :class:`GCEBackend` (here) holds the settings (``transient.gce`` in the Dask config), checks
  them against the API before anything is created (:meth:`GCEBackend.prepare`), owns the
  cluster's certificate authority (:mod:`~transient_nb.backends.tls`), creates a firewall rule
  scoped to the cluster's network tag (adopted only if it carries the cluster's id), and builds
  the one instance request body of every VM (:meth:`GCEBackend.instance_body`).
- :class:`~transient_nb.backends.gce.vm.GCEVM` is one instance: insert (idempotent retries, a
  409 on someone else's name is refused without deleting it), watch, TLS enrolment, delete.
- :mod:`~transient_nb.backends.gce.startup` writes its startup script (enrol, run the worker,
  power off on any exit); :mod:`~transient_nb.backends.gce.enroll` is the VM's side of TLS.
- :mod:`~transient_nb.backends.gce.labels` marks what a cluster creates (labels with the
  cluster's unique id); :mod:`~transient_nb.deploy.sweep` deletes what gone clusters left.
- Preemption notices come from inside the VM: the worker preload
  :mod:`transient_nb.backends.gce.preload` watches the metadata server's ``instance/preempted`` and,
  30 s before the VM stops, tells the cluster (over its own stream: honoured only for its own
  VM) and drains exactly as on the local backend. Polling the instance's status is only the
  fallback signal, since GCE reports RUNNING for a while after a preemption.
- ``cluster.preempt(worker)`` calls ``instances.simulateMaintenanceEvent``, which preempts a Spot
  VM for real (notice included); ``notice=False`` deletes the VM at once.
- The SDK sits behind :class:`~transient_nb.backends.gce.api.ComputeAPI` (transient errors
  retried with backoff and jitter); everything blocking runs off the event loop through
  :func:`~transient_nb.backends.gce.api.call_async`.
- Policy is not here: limits (:mod:`transient_nb.limits`), zone avoidance after repeated
  preemptions (:class:`~transient_nb.policy.placement.ReplacementPolicy`), and backoff after failed
  starts (:class:`~transient_nb.deploy.cluster.TransientCluster`) are the same for every backend.

Where the scheduler runs
------------------------
Detached (GCE's default, ``transient.detached: null``): on the cluster's head VM ``NAME-head``
(:mod:`~transient_nb.backends.gce.head` creates it from the client; on the VM,
:mod:`~transient_nb.deploy.head_vm` runs this backend with ``head=True``). The
scheduler listens there on a fixed port (``gce.scheduler-port``, :data:`HEAD_PORT` when 0) that the
cluster's firewall rule opens to its VMs, and a second rule (``NAME-dask-client``) to
``gce.client-cidr`` only; or the client dials a tunnel (``gce.head-address``). The workers dial the
head inside the VPC; the client connects over mutual TLS with a certificate the head signed for
its own key. The PS (the ``ps`` worker) runs on the head VM too, as a process
(:mod:`~transient_nb.backends.gce.head_ps`): the paper's non-preemptible PS/scheduler host, one VM
fewer to boot and pay for; its bill line is the head VM's.

Attached (``detached=False``): the Dask scheduler runs in the notebook's Python process, as it
does for the local backend, listening with TLS on ``gce.scheduler-host`` (``0.0.0.0``). The VMs
dial it, so **the notebook machine must be reachable from the VMs**: run the notebook on a GCE VM
(e.g. Vertex AI Workbench) in the same VPC network, or set ``gce.scheduler-address`` to an
address that forwards to it. The dashboard listens on 127.0.0.1 only. The parameter server runs
on an on-demand VM (the ``ps`` worker), never on a Spot one.

Images
------
Workers boot from an image that already holds the GPU driver and the Python environment
(``gce.image-family``, default ``transient-nb`` in your project), so a replacement joins seconds
after it boots instead of spending minutes installing drivers. ``gce_image.md`` beside this file
shows how to bake one.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import re
import uuid
from typing import Any

from distributed.security import Security

from transient_nb.backends.base import Preparation, QuotaError, TransientVM, VMSpec
from transient_nb.backends.gce.api import (
    GCEError,
    call_async,
)
from transient_nb.backends.gce.bodies import GCEBodies, accelerator_type, bundled_gpu_family
from transient_nb.backends.gce.labels import (
    LABEL_ID,
    LABEL_LEASE,
    firewall_id,
    lease_until,
    renewed_description,
)
from transient_nb.backends.gce.options import (
    BUNDLED_GPUS,
    GPU_TYPES,
    N1_GPUS,
)
from transient_nb.backends.gce.vm import GCEVM

logger = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


class GCEBackend(GCEBodies):
    """VMs on Google Compute Engine: Spot (or on-demand) GPU workers and an on-demand PS host.

    Every argument defaults to the ``transient.gce`` configuration (``transient.yaml`` documents
    each key); arguments win over the configuration.

    Parameters
    ----------
    log_dir
        Folder of this run's logs (the cluster passes it).
    project
        Google Cloud project ID; ``None``: the project of the application-default credentials.
    scheduler
        ``"local"``: the scheduler runs in this process and the VMs must be able to reach it.
    scheduler_host, scheduler_port, scheduler_address
        Where the local scheduler listens, and the address VMs dial (``None``: its own).
    image_family, image_project, python
        Boot image (GPU driver and environment baked in) and its Python.
    disk_size_gb, disk_type, network, subnetwork, external_ip
        Disk and network of the VMs.
    service_account, scopes
        The identity VMs act with (never your own credentials).
    provisioning_model
        ``"spot"`` (``scheduling.provisioningModel: SPOT``) or ``"preemptible"`` (legacy).
    termination_action
        What GCE does to a preempted Spot VM: ``"DELETE"`` or ``"STOP"``.
    worker_ports, nanny_ports, data_ports
        Port ranges of the Dask worker and nanny, and of the PS's data plane (the firewall rule
        opens only these).
    firewall, firewall_source_ranges
        Create a firewall rule for the cluster's network tag; extra CIDRs it lets in.
    nthreads, death_timeout
        Dask worker settings.
    poll_interval, operation_timeout
        How often VM states are read; how long one operation may take.
    retries, retry_backoff, retry_backoff_max
        Transient API errors (5xx, 429, time-outs) are asked again this many times, with
        exponential backoff and jitter.
    api_endpoint, credentials
        Another API endpoint (a fake server in tests) and ``google.auth`` credentials.
    head_machine_type, head_service_account, client_cidr, head_address, head_timeout
        The head VM of a detached cluster (:mod:`~transient_nb.backends.gce.head`): its machine
        type and identity, the client address its scheduler port is opened to (or the tunnel
        address dialled instead), and how long a client waits for it.
    allow_wide_client_cidr
        Allow a ``client_cidr`` wider than a /24 (IPv6: a /64), such as ``0.0.0.0/0``; refused
        otherwise, before anything is created.
    owner, lease_interval, lease_duration
        Who owns what the cluster creates (default: the credentials' account; labels carry it
        hashed), how often the cluster renews its lease on it, and how long a lease holds
        unrenewed (``sweep`` deletes nothing whose lease holds).
    tls_lifetime
        Seconds the cluster's CA, and every certificate, lives (the cluster passes its deadline).
    head
        This backend runs on the head VM (set by the head itself): the scheduler listens on a
        fixed port (``scheduler_port``, default :data:`HEAD_PORT`) that the firewall rules open
        to the cluster's VMs and to ``client_cidr``.

    Examples
    --------
    >>> from transient_nb import TransientCluster
    >>> cluster = TransientCluster(workers=4, gpu="t4", backend="gce", project="my-project",
    ...                            zone="us-central1-a", fallback_zones=["us-central1-b"],
    ...                            budget=5.0, deadline="3h")  # doctest: +SKIP
    """

    name = "gce"

    def __init__(self, log_dir: str, **options: Any) -> None:
        # Every option is a GCEOptions setting (its ``_read_options`` names and checks them).
        self._read_options(log_dir, **options)

    # -- settings shared with the cluster ------------------------------------------------------------
    @property
    def security(self) -> Security:
        """The cluster's TLS settings (scheduler, workers and clients)."""
        return self._security

    def client_tls_files(self, folder: str) -> dict[str, str] | None:
        """A client certificate in 0600 files in ``folder`` (for connect() and the panel)."""
        from transient_nb.backends.tls import CLIENT_CN
        from transient_nb.worker.peers import ROLE_CLIENT

        return self.ca.write_files(folder, CLIENT_CN, role=ROLE_CLIENT)

    def describe(self) -> str:
        return (
            f"GCE backend: project {self.project}, image family {self.image_family} "
            f"({self.image_project}), {self.provisioning_model} workers, TLS, "
            + ("scheduler on the head VM" if self.head else "local scheduler")
        )

    def scheduler_options(self) -> dict[str, Any]:
        return {
            "host": self.scheduler_host,
            "port": self.scheduler_port,
            "protocol": "tls",
            "security": self._security,
        }

    # -- checks before anything is created ------------------------------------------------------------
    def prepare(self, cluster_name: str, plan: Preparation) -> None:
        """Check project, zones, machine types, GPU types and image against the API.

        A bad value raises ``ValueError`` naming it and the ``gcloud`` command that lists the
        valid ones; (GPU, zone) pairs that GCE does not offer are skipped by the replacement
        policy, unless none of the preferred GPU's zones has it. These are a handful of quick,
        blocking look-ups, made from ``TransientCluster.__init__`` so that a mistake surfaces
        before the scheduler or any VM exists.
        """
        self.cluster_name = cluster_name
        self.cluster_id = plan.cluster_id or uuid.uuid4().hex[:12]
        self.notice_s = plan.notice_s
        if not _NAME_RE.match(self.instance_name("w-999")):
            raise ValueError(f"Cluster name {cluster_name!r} is too long for GCE instance names.")
        api = self.api
        try:
            api.get_project()
        except GCEError as e:
            raise ValueError(
                f"GCE project {self.project!r} was not found or these credentials cannot use it "
                f"({e.status}: {e}). List your projects with `gcloud projects list`; set "
                "gce.project or pass project=."
            ) from e
        for zone in plan.zones:
            try:
                api.get_zone(zone)
            except GCEError as e:
                raise ValueError(
                    f"Zone {zone!r} does not exist in project {self.project!r} ({e}). List the "
                    "zones with `gcloud compute zones list`."
                ) from e
        # The PS host may go to any of the zones too (its fallback), so both types are checked.
        types = (plan.ps_machine_type, plan.machine_type)
        checks = [(mt, z) for mt in types for z in plan.zones]
        for mt, zone in checks:
            try:
                api.get_machine_type(zone, mt)
            except GCEError as e:
                raise ValueError(
                    f"Machine type {mt!r} is not available in {zone} ({e}). List the machine "
                    f"types with `gcloud compute machine-types list --zones {zone}`."
                ) from e
        family = bundled_gpu_family(plan.machine_type)
        for i, gpu in enumerate(plan.gpus):
            accel = accelerator_type(gpu)
            if family is not None and gpu not in BUNDLED_GPUS[family]:
                raise ValueError(
                    f"Machine type {plan.machine_type!r} comes with {'/'.join(sorted(BUNDLED_GPUS[family]))} "
                    f"GPUs, not {gpu!r}: pick a machine type for {gpu} (N1 for "
                    f"{', '.join(sorted(N1_GPUS))}; g2 for l4; a2 for a100)."
                )
            if family is None and gpu not in N1_GPUS and gpu in GPU_TYPES:
                raise ValueError(
                    f"GPU {gpu!r} does not attach to machine type {plan.machine_type!r}: use a g2 "
                    "machine type for l4, a2 for a100, a3 for h100 (`gcloud compute "
                    "machine-types list --filter=name~'^(g2|a2|a3)'`)."
                )
            offered = []
            for zone in plan.zones:
                try:
                    api.get_accelerator_type(zone, accel)
                    offered.append(zone)
                except GCEError as e:
                    if not e.not_found:
                        raise ValueError(f"Could not look up GPU {accel} in {zone}: {e}") from e
                    self._not_offered.add((gpu, zone))
            if i < plan.asked_gpus and not offered:  # every type of a mix, not only the first
                raise ValueError(
                    f"GPU type {gpu!r} ({accel}) is not offered in {', '.join(plan.zones)}. List the "
                    f"zones that have it with `gcloud compute accelerator-types list "
                    f"--filter=name={accel}`."
                )
        try:
            api.get_image_from_family(self.image_project, self.image_family)
        except GCEError as e:
            raise ValueError(
                f"Image family {self.image_family!r} was not found in project "
                f"{self.image_project!r} ({e}). Bake it as transient_nb/backends/gce_image.md "
                "shows, or set gce.image-family / gce.image-project; list images with "
                f"`gcloud compute images list --project {self.image_project} --no-standard-images`."
            ) from e

    # -- cluster start and close ----------------------------------------------------------------------
    async def start(self, scheduler_address: str) -> None:
        """Create the firewall rule; from here on, VMs left at exit are deleted, and the lease
        on everything the cluster creates is renewed."""
        if not self._atexit_registered:
            atexit.register(self.delete_all_now)
            self._atexit_registered = True
        if self.firewall:
            await self._create_firewall(
                self.firewall_body(self.scheduler_address or scheduler_address)
            )
            if self.head and self.client_cidr:
                await self._create_firewall(self.client_firewall_body())
        self.spawn(self._keep_lease())

    async def _keep_lease(self) -> None:
        """Renew the lease label of every VM this cluster created, and of its firewall rules,
        every ``lease_interval_s``, until the cluster closes (``close`` cancels this).

        While it runs, ``sweep`` keeps them; once it stops (the process is gone: a crashed kernel,
        a killed head), the lease runs out and ``sweep`` may delete them.
        """
        while True:
            await asyncio.sleep(self.lease_interval_s)
            lease = lease_until(self.lease_duration_s)
            for zone, name in list(self.ours):
                try:
                    await call_async(self.api.set_labels, zone, name, {LABEL_LEASE: lease})
                except GCEError as e:  # 412 (a concurrent change), a VM going: next time
                    logger.info("Could not renew the lease of %s: %s", name, e)
            for rule in list(self.firewall_names):
                try:
                    current = await call_async(self.api.get_firewall, rule)
                    if current is not None:
                        text = renewed_description(str(current.get("description", "")), lease)
                        await call_async(self.api.patch_firewall, rule, {"description": text})
                except GCEError as e:
                    logger.info("Could not renew the lease of firewall rule %s: %s", rule, e)

    async def close(self) -> None:
        """Delete what is left: VMs caught mid-creation, then the firewall rule.

        Idempotent, and a second caller waits for the first: a cluster closed twice at once (a
        budget stop and the user) leaves nothing behind either way.
        """
        async with self._close_lock:
            for t in list(self._tasks):
                t.cancel()
            if self.live:
                await asyncio.gather(
                    *(self._delete_and_wait(z, n) for z, n in list(self.live)),
                    return_exceptions=True,
                )
            for rule in list(self.firewall_names):
                try:
                    op = await call_async(self.api.delete_firewall, rule)
                    if op is not None:
                        await call_async(self.api.wait_global_operation, op, self.operation_timeout)
                    self.firewall_names.remove(rule)
                except GCEError as e:
                    logger.warning("Could not delete firewall rule %s: %s", rule, e)
            if not self.live and not self.firewall_names and self._atexit_registered:
                atexit.unregister(self.delete_all_now)
                self._atexit_registered = False

    async def _delete_and_wait(self, zone: str, name: str) -> None:
        if (zone, name) not in self.ours and not await call_async(self.owns, zone, name):
            self.live.discard((zone, name))
            return
        try:
            op = await call_async(self.api.delete_instance, zone, name)
            if op is not None:
                await call_async(self.api.wait_zone_operation, zone, op, self.operation_timeout)
        except GCEError as e:
            if not e.not_found:
                logger.warning("Could not delete %s in %s: %s", name, zone, e)
                return
        self.live.discard((zone, name))
        self.ours.discard((zone, name))

    def delete_all_now(self) -> None:
        """Ask GCE to delete every VM this backend still has (at interpreter exit).

        Blocking and without waiting for the operations, so that a kernel that exits without
        closing its cluster (or whose event loop is gone) still leaves nothing running.
        """
        # No retries with backoff at exit: report and go on rather than hold the exit up.
        self.api.retries = 0
        for zone, name in list(self.live):
            try:
                if (zone, name) in self.ours or self.owns(zone, name):
                    self.api.delete_instance(zone, name)
                    logger.warning("Deleted %s in %s at exit", name, zone)
            except Exception as e:  # at exit, report and go on with the others
                logger.warning("Could not delete %s in %s at exit: %s", name, zone, e)
        self.live.clear()
        for rule in list(self.firewall_names):
            try:
                self.api.delete_firewall(rule)
            except Exception as e:
                logger.warning("Could not delete firewall rule %s: %s", rule, e)

    async def _create_firewall(self, body: dict[str, Any]) -> None:
        try:
            op = await call_async(self.api.insert_firewall, body, str(uuid.uuid4()))
            await call_async(self.api.wait_global_operation, op, self.operation_timeout)
        except GCEError as e:
            if not e.conflict:
                raise RuntimeError(f"Could not create firewall rule {body['name']}: {e}") from e
            # Adopted only if it carries our id (an earlier attempt of ours); someone else's
            # rule of the same name is neither used nor, later, deleted.
            rule = await call_async(self.api.get_firewall, body["name"])
            if rule is None or firewall_id(rule) != self.cluster_id:
                raise RuntimeError(
                    f"Firewall rule {body['name']} already exists and is not this cluster's: "
                    "pick another cluster name (name=...), or set gce.firewall: false and let "
                    "your own rules admit the Dask ports."
                ) from e
        self.firewall_names.append(body["name"])

    def owns(self, zone: str, name: str) -> bool:
        """Whether instance ``name`` carries this cluster's id (blocking; True if gone)."""
        try:
            inst = self.api.get_instance(zone, name)
        except GCEError as e:
            logger.warning("Could not read %s in %s: %s", name, zone, e)
            return False
        if inst is None:
            return True  # nothing there: deleting it is a no-op
        return (inst.get("labels") or {}).get(LABEL_ID) == self.cluster_id

    def quota_error(self, zone: str, gpu: str | None, e: GCEError) -> QuotaError:
        """A :class:`QuotaError` that names the quota, its region and how to raise it."""
        q = e.quota or {}
        metric = str(q.get("metric") or e.code)
        region = str(q.get("region") or zone.rsplit("-", 1)[0])
        limit = q.get("limit")
        console = (
            f"https://console.cloud.google.com/iam-admin/quotas?project={self.project}"
            f"&metric=compute.googleapis.com%2F{metric.lower()}"
        )
        if region == "global":
            show = f"gcloud compute project-info describe --project {self.project}"
        else:
            show = f"gcloud compute regions describe {region} --project {self.project}"
        how = (
            f"See it with `{show}` and ask for more at {console} (IAM & Admin > Quotas; "
            "new projects start with GPUS_ALL_REGIONS = 0)."
        )
        return QuotaError(zone, gpu, metric, region, None if limit is None else float(limit), how)

    # -- what GCE offers ---------------------------------------------------------------------------
    def not_offered(self) -> set[tuple[str, str]]:
        """(GPU type, zone) pairs GCE does not offer, found by :meth:`prepare`. Choosing where to
        go (and what to skip) is the replacement policy's business, not the backend's."""
        return set(self._not_offered)

    # -- helpers of the VMs ------------------------------------------------------------------------
    def hosts_next_ps(self) -> bool:
        """On the head VM, the first PS host (and its successor, if it stops) is a process there:
        the head VM is its bill."""
        on_head = getattr(self, "_head_ps", None)
        return self.head and (on_head is None or on_head.stopped)

    def make_vm(self, spec: VMSpec, **kwargs: Any) -> TransientVM:
        if spec.role == "ps" and self.hosts_next_ps():
            # On the head VM, the (first) PS is a process there (the paper's PS/scheduler
            # host); with ps_hosts > 1 the others are on-demand VMs of their own.
            from transient_nb.backends.gce.head_ps import HeadPSVM

            self._head_ps: TransientVM | None = HeadPSVM(spec, backend=self, **kwargs)
            return self._head_ps
        return GCEVM(spec, backend=self, **kwargs)

    def spawn(self, coro: Any) -> Any:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def sleep_poll(self, short: bool = False) -> None:
        """Wait between two reads of a VM's state."""
        await asyncio.sleep(min(self.poll_s, 0.25) if short else self.poll_s)
