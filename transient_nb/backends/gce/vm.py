"""One GCE instance of a transient cluster: create it, watch it, enrol it for TLS, delete it.

``_create`` inserts the instance (its own ``requestId``: retries are idempotent) and waits on the
zone operation. A stock-out raises :class:`~transient_nb.backends.base.CapacityError` and a used-up
quota :class:`~transient_nb.backends.base.QuotaError` (the cluster tries its next placement); a
failed operation for a passing reason is inserted again after a backoff; a 409 on a name that is
not ours is refused without deleting anything. A watch task reads the instance's state (billing
starts at RUNNING; a stop without a notice is reported as lost) and, once it runs, signs the
certificate request the VM publishes (:meth:`GCEVM._enroll`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from distributed.core import rpc

from transient_nb.backends.base import CapacityError, TransientVM, VMSpec
from transient_nb.backends.gce.api import GCEError, OperationError, backoff_delays, call_async
from transient_nb.backends.gce.enroll import CERT_KEY, CSR_ATTRIBUTE

if TYPE_CHECKING:
    from transient_nb.backends.gce.backend import GCEBackend

logger = logging.getLogger(__name__)

#: Metadata key of the VM's signed TLS certificate (public).
TLS_CERT_KEY = CERT_KEY
#: Instance states in which the VM no longer runs our worker.
STOPPED_STATES = frozenset({"STOPPING", "TERMINATED", "SUSPENDING", "SUSPENDED"})


class GCEVM(TransientVM):
    """One Compute Engine instance of a transient cluster (a GPU worker or the PS host)."""

    def __init__(
        self,
        spec: VMSpec,
        *,
        backend: GCEBackend,
        delay_s: float = 0.0,  # the local backend's simulated boot time; GCE has a real one
        connection_args: dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        super().__init__(spec, **kwargs)
        self.backend = backend
        self.connection_args = connection_args or {}
        self.instance = backend.instance_name(spec.name)
        self.zone = spec.zone
        self._watch_task: Any = None
        self._gone = False
        self._was_running = False
        #: GCE took our insert: the instance of this name is ours to delete.
        self._inserted = False

    async def post(self, kind: str, **fields: Any) -> None:
        """Log a lifecycle event; GCE's events also name the instance."""
        await super().post(kind, **{"instance": self.instance, **fields})

    # -- create -----------------------------------------------------------------------------------
    async def _create(self) -> None:
        backend = self.backend
        body = backend.instance_body(self.spec, backend.scheduler_address or self.scheduler_address)
        # Known as ours before the request goes out: whatever happens next (an error, the
        # cluster closing mid-request, the kernel exiting), close() and the exit hook delete it,
        # after checking its cluster-id label (a name clash never deletes someone else's VM).
        backend.live.add((self.zone, self.instance))
        delays = backoff_delays(backend.retries, backend.retry_backoff_s, backend.retry_max_s)
        attempt = 0
        try:
            while True:
                try:
                    await self._insert(body)
                    break
                except GCEError as e:
                    if e.conflict and not self._inserted:
                        # The name is taken and not by this request (its requestId would have
                        # got our own operation back): someone else's VM. Never delete it.
                        backend.live.discard((self.zone, self.instance))
                        raise RuntimeError(
                            f"GCE instance {self.instance} already exists in {self.zone} and "
                            f"is not this cluster's: pick another cluster name (name=...)."
                        ) from e
                    if self._inserted:
                        # Ours, failed: nothing of it may stay (GCE can leave a record behind).
                        await self._remove()
                    if e.quota_exceeded:
                        raise backend.quota_error(self.zone, self.spec.gpu, e) from e
                    if e.capacity:
                        raise CapacityError(self.zone, self.spec.gpu, e.code) from e
                    # ComputeAPI already asked again for HTTP errors; an operation that failed
                    # for a passing reason (INTERNAL_ERROR) needs a new insert.
                    if isinstance(e, OperationError) and e.transient and attempt < len(delays):
                        logger.info("Insert of %s failed (%s); asking again", self.instance, e)
                        await asyncio.sleep(delays[attempt])
                        attempt += 1
                        self._inserted = False
                        backend.live.add((self.zone, self.instance))
                        continue
                    backend.live.discard((self.zone, self.instance))
                    raise RuntimeError(
                        f"GCE refused VM {self.instance} in {self.zone}: {e} ({e.code})"
                    ) from e
        except asyncio.CancelledError:
            await asyncio.shield(self._remove())
            raise
        self._watch_task = backend.spawn(self._watch())

    async def _insert(self, body: dict[str, Any]) -> None:
        """One insert (its own requestId: ComputeAPI's retries of it are idempotent) and wait."""
        api = self.backend.api
        op = await call_async(api.insert_instance, self.zone, body, str(uuid.uuid4()))
        self._inserted = True
        self.backend.ours.add((self.zone, self.instance))
        await call_async(api.wait_zone_operation, self.zone, op, self.backend.operation_timeout)

    async def _watch(self) -> None:
        # Booting: billing starts when GCE says RUNNING. Afterwards this is the fallback signal of
        # a stop that came without a notice (the metadata watcher in the VM is the first one).
        while not self.stopped:
            try:
                info = await call_async(self.backend.api.get_instance, self.zone, self.instance)
            except GCEError as e:
                logger.info("Could not read %s: %s", self.instance, e)
                info = {"status": "UNKNOWN"}
            status = None if info is None else str(info.get("status"))
            if status == "RUNNING" and not self._was_running:
                self._was_running = True
                self.backend.spawn(self._enroll())
                await self.running()
            elif status is None or status in STOPPED_STATES:
                if not self.stopped:
                    self._gone = True
                    await self._remove()  # a STOPped Spot VM keeps billing for its disk
                    self.exited_by_itself()
                return
            await self.backend.sleep_poll()

    async def _enroll(self) -> None:
        """Sign the certificate request this VM publishes, and hand it the certificate.

        Only for instances this cluster created (this object exists for them only), and only
        for the instance's own name: a request for any other name is refused.
        """
        api, backend = self.backend.api, self.backend
        while not self.stopped and not self._gone:
            try:
                attrs = await call_async(
                    api.get_guest_attributes, self.zone, self.instance, "transient-nb/"
                )
            except GCEError as e:
                logger.info("Could not read the guest attributes of %s: %s", self.instance, e)
                attrs = {}
            csr = attrs.get(CSR_ATTRIBUTE)
            if csr:
                try:
                    cert = backend.ca.sign_csr(
                        csr, self.instance, role=self.spec.role, vm=self.name
                    )
                except ValueError as e:
                    # A VM asking to pass for another VM (or the client): refused, and shown.
                    logger.warning("Refused the certificate request of %s: %s", self.instance, e)
                    await self._post_event(
                        "control-refused",
                        action="sign-certificate",
                        vm=self.name,
                        sender=self.instance,
                    )
                    return
                for _ in range(5):  # 412: the metadata changed under us; read it again
                    try:
                        op = await call_async(
                            api.set_metadata_item, self.zone, self.instance, TLS_CERT_KEY, cert
                        )
                        await call_async(
                            api.wait_zone_operation, self.zone, op, backend.operation_timeout
                        )
                        return
                    except GCEError as e:
                        if e.status != 412:
                            logger.warning("Could not hand %s its certificate: %s", self.name, e)
                            return
                return
            await backend.sleep_poll(short=True)

    # -- preemption --------------------------------------------------------------------------------
    async def _notify(self, deadline: float) -> None:
        if self.spec.spot:
            try:
                await call_async(
                    self.backend.api.simulate_maintenance_event, self.zone, self.instance
                )
                return
            except GCEError as e:  # e.g. the VM is still booting
                logger.info("simulateMaintenanceEvent on %s failed: %s", self.instance, e)
        # On-demand workers are not preempted by a maintenance event: tell the worker directly.
        await self._tell_worker(deadline)

    async def _notify_late(self, deadline: float) -> None:
        # A Spot VM's agent reads the notice from its metadata server when its worker starts:
        # a second maintenance event would be wrong. An on-demand worker is told directly.
        if not self.spec.spot:
            await self._tell_worker(deadline)

    async def _tell_worker(self, deadline: float) -> None:
        try:
            addr = await self._worker_address()
            if addr is not None:
                async with rpc(addr, connection_args=self.connection_args) as w:
                    await w.transient_notice(deadline=deadline)
        except OSError as e:
            logger.info("Could not deliver the notice to %s: %r", self.name, e)

    async def _wait_exit(self, deadline: float) -> None:
        # The worker drains and leaves by itself; once it is gone the VM can go at once rather
        # than at the deadline (Spot VMs are billed until they stop).
        while time.time() < deadline and not self._gone:
            try:
                if await self._worker_address() is None:
                    return
            except OSError:
                return
            await self.backend.sleep_poll(short=True)

    async def _kill(self) -> None:
        await self._remove()

    async def _delete(self) -> None:
        await self._remove()

    async def _remove(self) -> None:
        """Delete the instance and wait until GCE has done so (nothing left running).

        Only an instance that is ours: one whose insert GCE took, or, when that is unknown (the
        request was cut off), one that carries this cluster's id label.
        """
        if self._watch_task is not None and self._watch_task is not _current_task():
            self._watch_task.cancel()
        api = self.backend.api
        if not self._inserted and not await call_async(self.backend.owns, self.zone, self.instance):
            self.backend.live.discard((self.zone, self.instance))
            return
        try:
            op = await call_async(api.delete_instance, self.zone, self.instance)
            if op is not None:
                await call_async(
                    api.wait_zone_operation, self.zone, op, self.backend.operation_timeout
                )
        except GCEError as e:
            if not e.not_found:
                logger.warning("Could not delete %s in %s: %s", self.instance, self.zone, e)
                return
        self._gone = True
        self.backend.live.discard((self.zone, self.instance))
        self.backend.ours.discard((self.zone, self.instance))


def _current_task() -> Any:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None
