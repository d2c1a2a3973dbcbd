"""The one place where transient_nb talks to Google Compute Engine: a small wrapper over the SDK.

Everything the GCE backend asks of the cloud goes through :class:`ComputeAPI`, a thin, blocking
wrapper over google-cloud-compute's ``compute_v1`` clients (REST transport) that speaks GCE's own
JSON shapes (dicts with camelCase keys, as in the REST reference) and turns the SDK's exceptions
and operation errors into one :class:`GCEError`. The backend calls it off the event loop through
:func:`call_async`.

This class is the seam of the tests: they point it at a fake Compute Engine REST server
(``api_endpoint="http://127.0.0.1:PORT"`` with anonymous credentials) instead of replacing it, so
the real SDK, its URLs and its JSON (de)serialisation run in every test.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import re
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: Operation error codes (and HTTP error reasons) that mean "no room here now, try elsewhere".
CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "RESOURCE_EXHAUSTED",
        "resourceExhausted",
        "STOCKOUT",
    }
)
#: Codes of a quota that is used up: not a stock-out (waiting does not help; raising it does).
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded"})
#: Codes of errors that go away by themselves: asked again after a pause, never a stock-out.
TRANSIENT_CODES = frozenset(
    {
        "backendError",
        "internalError",
        "rateLimitExceeded",
        "userRateLimitExceeded",
        "INTERNAL_ERROR",
        "SERVICE_UNAVAILABLE",
        "timeout",
    }
)
_QUOTA_RE = re.compile(
    r"Quota '([A-Z0-9_]+)' exceeded\.?\s*Limit:\s*([\d.]+)\s*(?:in region ([a-z0-9-]+)|globally)?"
)


async def call_async(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking SDK call in a thread, so that the event loop never waits on the network.

    Examples
    --------
    >>> import asyncio
    >>> asyncio.run(call_async(sum, [1, 2]))
    3
    """
    return await asyncio.to_thread(fn, *args, **kwargs)


class GCEError(RuntimeError):
    """An error answered by Compute Engine: an HTTP error or a failed operation.

    Attributes
    ----------
    status
        HTTP status (404, 403, ...), or the operation's ``httpErrorStatusCode``.
    codes
        Operation error codes (``ZONE_RESOURCE_POOL_EXHAUSTED``) or HTTP error reasons
        (``notFound``, ``quotaExceeded``).
    """

    def __init__(
        self,
        message: str,
        status: int | None = None,
        codes: tuple[str, ...] = (),
        quota: dict[str, Any] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.codes = codes
        #: For quota errors: ``metric`` (``GPUS_ALL_REGIONS``), ``region`` (``global`` or a
        #: region), ``limit``; from the operation's ``quotaInfo`` or the HTTP error's message.
        self.quota = quota if quota is not None else _quota_from_message(message, codes)

    @property
    def not_found(self) -> bool:
        """The resource (or project) does not exist."""
        return self.status == 404 or "notFound" in self.codes

    @property
    def capacity(self) -> bool:
        """No capacity for this request here now (a stock-out): another zone or GPU type may work."""
        return any(c in CAPACITY_CODES for c in self.codes) and not self.quota_exceeded

    @property
    def quota_exceeded(self) -> bool:
        """A quota is used up (``GPUS_ALL_REGIONS``, ``NVIDIA_T4_GPUS``): raising it helps."""
        return any(c in QUOTA_CODES for c in self.codes) or self.quota is not None

    @property
    def conflict(self) -> bool:
        """The name is taken (HTTP 409 ``alreadyExists``), by us or by someone else."""
        return self.status == 409 or "alreadyExists" in self.codes

    @property
    def transient(self) -> bool:
        """An error that goes away by itself (5xx, ``backendError``, 429, a time-out).

        Asked again after a pause (exponential backoff with jitter); never a stock-out.
        """
        if self.capacity or self.quota_exceeded:
            return False
        if any(c in TRANSIENT_CODES for c in self.codes):
            return True
        return self.status is not None and (self.status == 429 or 500 <= self.status < 600)

    @property
    def code(self) -> str:
        """The first error code, for events and messages."""
        return self.codes[0] if self.codes else str(self.status or "ERROR")


class OperationError(GCEError):
    """A request was accepted but its operation failed (stock-out, quota, internal error).

    Not asked again by :class:`ComputeAPI`: the operation stays failed; the caller decides
    whether to send the request again (the backend does, for transient codes).
    """


def _quota_from_message(message: str, codes: tuple[str, ...]) -> dict[str, Any] | None:
    m = _QUOTA_RE.search(message)
    if m is None:
        return None
    return {"metric": m[1], "limit": float(m[2]), "region": m[3] or "global"}


def _from_sdk(e: Exception) -> GCEError:
    status = getattr(e, "code", None)
    errors = getattr(e, "errors", None) or []
    codes = tuple(str(x.get("reason", "")) for x in errors if isinstance(x, dict))
    message = getattr(e, "message", None) or str(e)
    return GCEError(str(message), int(status) if isinstance(status, int) else None, codes)


def backoff_delays(
    attempts: int, base_s: float, max_s: float, rng: random.Random | None = None
) -> list[float]:
    """Pauses before each retry: exponential, capped, with full jitter.

    Jitter spreads the retries of many VMs that failed at once (a zone's hiccup) so that they
    do not come back as one burst and get throttled again.

    Examples
    --------
    >>> d = backoff_delays(4, 1.0, 5.0, random.Random(0))
    >>> len(d), all(0 <= x <= 5.0 for x in d)
    (4, True)
    """
    rng = rng or random.Random()
    return [rng.uniform(0, min(max_s, base_s * 2**i)) for i in range(attempts)]


def _translate(fn: Callable[..., T]) -> Callable[..., T]:
    """Turn the SDK's exceptions into :class:`GCEError`; retry the transient ones.

    Every call of :class:`ComputeAPI` goes through here, so a 503 ``backendError``, a 429 or a
    time-out is asked again ``retries`` times with exponential backoff and jitter before it
    reaches the backend. Inserts and deletes carry a ``requestId``, so a retried request that
    had in fact gone through is not done twice.
    """
    from google.api_core import exceptions

    @functools.wraps(fn)
    def wrapper(self: ComputeAPI, *args: Any, **kwargs: Any) -> T:
        delays = backoff_delays(self.retries, self.backoff_s, self.max_backoff_s, self._rng)
        for attempt in range(self.retries + 1):
            try:
                try:
                    return fn(self, *args, **kwargs)
                except exceptions.GoogleAPIError as e:
                    raise _from_sdk(e) from e
                except (OSError, TimeoutError) as e:  # requests' connection errors and time-outs
                    raise GCEError(f"{type(e).__name__}: {e}", None, ("timeout",)) from e
            except GCEError as e:
                if isinstance(e, OperationError) or not e.transient or attempt == self.retries:
                    raise
                self.retried.append(f"{fn.__name__}: {e.code}")
                self.sleep(delays[attempt])
        raise AssertionError("unreachable")  # pragma: no cover

    return wrapper


def _as_dict(message: Any) -> dict[str, Any]:
    """A compute_v1 message as the REST JSON dict (camelCase keys, enums as names)."""
    out: dict[str, Any] = json.loads(type(message).to_json(message))
    return out


class ComputeAPI:
    """Blocking calls to the Compute Engine API for one project.

    Parameters
    ----------
    project
        Project ID.
    api_endpoint
        Another endpoint than ``https://compute.googleapis.com`` (a fake server in tests).
    credentials
        ``google.auth`` credentials; ``None`` uses application-default credentials
        (``gcloud auth application-default login`` or the VM's service account).

    Examples
    --------
    >>> api = ComputeAPI("my-project")  # doctest: +SKIP
    >>> api.get_instance("us-central1-a", "demo-w-0")["status"]  # doctest: +SKIP
    'RUNNING'
    """

    def __init__(
        self,
        project: str,
        api_endpoint: str | None = None,
        credentials: Any = None,
        *,
        retries: int = 5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        seed: int | None = None,
    ):
        from google.cloud import compute_v1

        self.project = project
        #: Transient errors are asked again this many times, after ``backoff_delays`` pauses.
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.sleep = sleep
        self._rng = random.Random(seed)
        #: ``"method: code"`` of every retried call (for logs and tests).
        self.retried: list[str] = []
        self._compute_v1 = compute_v1
        if credentials is None and api_endpoint and api_endpoint.startswith("http://"):
            # A plain-HTTP endpoint is a local fake: never send real credentials in clear text.
            from google.auth.credentials import AnonymousCredentials

            credentials = AnonymousCredentials()
        kwargs: dict[str, Any] = {"transport": "rest", "credentials": credentials}
        if api_endpoint:
            kwargs["client_options"] = {"api_endpoint": api_endpoint}
        self.instances = compute_v1.InstancesClient(**kwargs)
        self.zone_operations = compute_v1.ZoneOperationsClient(**kwargs)
        self.global_operations = compute_v1.GlobalOperationsClient(**kwargs)
        self.firewalls = compute_v1.FirewallsClient(**kwargs)
        self.zones = compute_v1.ZonesClient(**kwargs)
        self.machine_types = compute_v1.MachineTypesClient(**kwargs)
        self.accelerator_types = compute_v1.AcceleratorTypesClient(**kwargs)
        self.images = compute_v1.ImagesClient(**kwargs)
        self.projects = compute_v1.ProjectsClient(**kwargs)

    # -- operations -------------------------------------------------------------------------------
    def _raise_for_operation(self, op: Any) -> None:
        if op.error and op.error.errors:
            codes = tuple(str(e.code) for e in op.error.errors)
            message = "; ".join(str(e.message) for e in op.error.errors)
            status = int(op.http_error_status_code) if op.http_error_status_code else None
            quota = None
            for err in op.error.errors:
                for detail in err.error_details:
                    if "quota_info" in detail:
                        info = detail.quota_info
                        metric = str(info.metric_name).rsplit("/", 1)[-1].upper()
                        quota = {
                            "metric": metric,
                            "limit": float(info.limit),
                            "region": str(dict(info.dimensions).get("region", "global")),
                        }
            raise OperationError(message, status, codes, quota)

    @_translate
    def wait_zone_operation(self, zone: str, operation: str, timeout: float = 300) -> None:
        """Wait until a zone operation is DONE; :class:`GCEError` if it failed.

        ``ExtendedOperation.result()`` would poll the production endpoint whatever the client's
        endpoint is, so this waits with ``zoneOperations.wait`` (which returns when the operation
        is done or after about two minutes) in a loop.
        """
        done = self._compute_v1.Operation.Status.DONE
        deadline = time.monotonic() + timeout
        while True:
            op = self.zone_operations.wait(project=self.project, zone=zone, operation=operation)
            if op.status == done:
                self._raise_for_operation(op)
                return
            if time.monotonic() > deadline:
                raise GCEError(f"Operation {operation} in {zone} still not done after {timeout}s")

    @_translate
    def wait_global_operation(self, operation: str, timeout: float = 300) -> None:
        """Wait until a global operation (firewall rules) is DONE; :class:`GCEError` if failed."""
        done = self._compute_v1.Operation.Status.DONE
        deadline = time.monotonic() + timeout
        while True:
            op = self.global_operations.wait(project=self.project, operation=operation)
            if op.status == done:
                self._raise_for_operation(op)
                return
            if time.monotonic() > deadline:
                raise GCEError(f"Operation {operation} still not done after {timeout}s")

    # -- instances ------------------------------------------------------------------------------------
    def insert_instance(self, zone: str, body: dict[str, Any], request_id: str = "") -> str:
        """Ask for a VM described by ``body`` (the REST ``Instance`` JSON); the operation's name.

        ``request_id`` (a UUID; one is made if not given) makes retries idempotent: GCE answers
        a repeat of an insert it already took with that insert's operation, so a retry after a
        lost answer neither creates a second VM nor gets a 409 for our own.
        """
        return self._insert_instance(zone, body, request_id or str(uuid.uuid4()))

    @_translate
    def _insert_instance(self, zone: str, body: dict[str, Any], request_id: str) -> str:
        instance = self._compute_v1.Instance.from_json(json.dumps(body))
        request = self._compute_v1.InsertInstanceRequest(
            project=self.project, zone=zone, instance_resource=instance, request_id=request_id
        )
        op = self.instances.insert_unary(request=request)
        self._raise_for_operation(op)
        return str(op.name)

    @_translate
    def get_instance(self, zone: str, name: str) -> dict[str, Any] | None:
        """The instance as REST JSON, or ``None`` when it does not exist (any more)."""
        from google.api_core import exceptions

        try:
            return _as_dict(self.instances.get(project=self.project, zone=zone, instance=name))
        except exceptions.NotFound:
            return None

    @_translate
    def list_instances(self, zone: str, filter: str = "") -> list[dict[str, Any]]:
        """Instances of ``zone`` matching a GCE list ``filter`` (e.g. ``labels.transient-nb=true``)."""
        request = self._compute_v1.ListInstancesRequest(
            project=self.project, zone=zone, filter=filter
        )
        return [_as_dict(i) for i in self.instances.list(request=request)]

    @_translate
    def delete_instance(self, zone: str, name: str) -> str | None:
        """Delete a VM; the operation's name, or ``None`` when it was already gone."""
        from google.api_core import exceptions

        try:
            op = self.instances.delete_unary(project=self.project, zone=zone, instance=name)
        except exceptions.NotFound:
            return None
        return str(op.name)

    @_translate
    def get_guest_attributes(self, zone: str, name: str, query_path: str) -> dict[str, str]:
        """Guest attributes under ``query_path`` (``"transient-nb/"``) as ``{"ns/key": value}``.

        Empty when the VM has written none yet (GCE answers 404 then).
        """
        from google.api_core import exceptions

        try:
            request = self._compute_v1.GetGuestAttributesInstanceRequest(
                project=self.project, zone=zone, instance=name, query_path=query_path
            )
            out = self.instances.get_guest_attributes(request=request)
        except exceptions.NotFound:
            return {}
        return {f"{i.namespace}/{i.key}": str(i.value) for i in out.query_value.items}

    @_translate
    def set_metadata_item(self, zone: str, name: str, key: str, value: str) -> str:
        """Add or replace one metadata item of a VM; the operation's name.

        ``setMetadata`` replaces all items and needs the current fingerprint; a concurrent
        change makes it fail with 412, which the caller asks again.
        """
        inst = self.instances.get(project=self.project, zone=zone, instance=name)
        items = [i for i in inst.metadata.items if i.key != key]
        items.append(self._compute_v1.Items(key=key, value=value))
        metadata = self._compute_v1.Metadata(fingerprint=inst.metadata.fingerprint, items=items)
        op = self.instances.set_metadata_unary(
            project=self.project, zone=zone, instance=name, metadata_resource=metadata
        )
        return str(op.name)

    @_translate
    def set_labels(self, zone: str, name: str, labels: dict[str, str]) -> str | None:
        """Add or replace labels of a VM (the others stay); the operation's name, or ``None``
        when the VM is gone.

        ``setLabels`` replaces all labels and needs the current fingerprint; a concurrent change
        makes it fail with 412, which the caller asks again.
        """
        from google.api_core import exceptions

        try:
            inst = self.instances.get(project=self.project, zone=zone, instance=name)
        except exceptions.NotFound:
            return None
        request = self._compute_v1.InstancesSetLabelsRequest(
            label_fingerprint=inst.label_fingerprint, labels={**dict(inst.labels), **labels}
        )
        op = self.instances.set_labels_unary(
            project=self.project,
            zone=zone,
            instance=name,
            instances_set_labels_request_resource=request,
        )
        return str(op.name)

    @_translate
    def simulate_maintenance_event(self, zone: str, name: str) -> str:
        """Simulate a host maintenance event: it preempts a Spot or preemptible VM for real."""
        op = self.instances.simulate_maintenance_event_unary(
            project=self.project, zone=zone, instance=name
        )
        return str(op.name)

    # -- firewall rules ------------------------------------------------------------------------------
    def insert_firewall(self, body: dict[str, Any], request_id: str = "") -> str:
        """Create a firewall rule from its REST JSON; the (global) operation's name."""
        return self._insert_firewall(body, request_id or str(uuid.uuid4()))

    @_translate
    def _insert_firewall(self, body: dict[str, Any], request_id: str) -> str:
        rule = self._compute_v1.Firewall.from_json(json.dumps(body))
        request = self._compute_v1.InsertFirewallRequest(
            project=self.project, firewall_resource=rule, request_id=request_id
        )
        op = self.firewalls.insert_unary(request=request)
        return str(op.name)

    @_translate
    def get_firewall(self, name: str) -> dict[str, Any] | None:
        """A firewall rule as REST JSON, or ``None``."""
        from google.api_core import exceptions

        try:
            return _as_dict(self.firewalls.get(project=self.project, firewall=name))
        except exceptions.NotFound:
            return None

    @_translate
    def list_firewalls(self, filter: str = "") -> list[dict[str, Any]]:
        """Firewall rules matching a GCE list ``filter``."""
        request = self._compute_v1.ListFirewallsRequest(project=self.project, filter=filter)
        return [_as_dict(f) for f in self.firewalls.list(request=request)]

    @_translate
    def patch_firewall(self, name: str, body: dict[str, Any]) -> str:
        """Change the fields of firewall rule ``name`` that ``body`` names; the operation's name."""
        rule = self._compute_v1.Firewall.from_json(json.dumps(body))
        op = self.firewalls.patch_unary(project=self.project, firewall=name, firewall_resource=rule)
        return str(op.name)

    @_translate
    def delete_firewall(self, name: str) -> str | None:
        """Delete a firewall rule; the operation's name, or ``None`` when it was not there."""
        from google.api_core import exceptions

        try:
            op = self.firewalls.delete_unary(project=self.project, firewall=name)
        except exceptions.NotFound:
            return None
        return str(op.name)

    # -- look-ups that validate settings ----------------------------------------------------------
    @_translate
    def get_project(self) -> dict[str, Any]:
        """The project (name, quotas); :class:`GCEError` 404/403 for a bad or forbidden one."""
        return _as_dict(self.projects.get(project=self.project))

    @_translate
    def get_zone(self, zone: str) -> dict[str, Any]:
        """A zone (status UP/DOWN)."""
        return _as_dict(self.zones.get(project=self.project, zone=zone))

    @_translate
    def get_machine_type(self, zone: str, machine_type: str) -> dict[str, Any]:
        """A machine type offered in ``zone``."""
        return _as_dict(
            self.machine_types.get(project=self.project, zone=zone, machine_type=machine_type)
        )

    @_translate
    def get_accelerator_type(self, zone: str, accelerator: str) -> dict[str, Any]:
        """A GPU type offered in ``zone`` (``nvidia-tesla-t4``)."""
        return _as_dict(
            self.accelerator_types.get(
                project=self.project, zone=zone, accelerator_type=accelerator
            )
        )

    @_translate
    def get_image_from_family(self, project: str, family: str) -> dict[str, Any]:
        """The newest image of an image family."""
        return _as_dict(self.images.get_from_family(project=project, family=family))

    @_translate
    def get_image(self, project: str, image: str) -> dict[str, Any]:
        """One image by name."""
        return _as_dict(self.images.get(project=project, image=image))


def default_project(credentials: Any) -> str:
    """The project of the application-default credentials; a ValueError saying what to do."""
    try:
        import google.auth

        _, project = google.auth.default()
    except Exception as e:
        raise ValueError(
            "No GCE project given and none found in the application-default credentials "
            f"({e}). Pass project='my-project' (or set transient.gce.project); list your projects "
            "with `gcloud projects list`, and log in with `gcloud auth application-default login`."
        ) from e
    if not project:
        raise ValueError(
            "No GCE project given: pass project='my-project' or set transient.gce.project "
            "(`gcloud projects list` shows yours)."
        )
    return str(project)
