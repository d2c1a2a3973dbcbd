"""A fake Compute Engine for the GCE backend's tests: a REST server and per-VM metadata servers.

The real google-cloud-compute client (REST transport) talks to :class:`FakeGCE` through
``client_options={"api_endpoint": fake.url}``; nothing of the SDK is replaced. The fake answers
with GCE's JSON shapes: instances (insert, get, list, delete, simulateMaintenanceEvent, setMetadata,
setLabels), zone and global operations (get, wait), firewalls (insert, get, list, patch, delete), and the look-ups the backend
validates settings with (project, zone, machine type, accelerator type, image family). Errors come
as GCE sends them: HTTP error bodies (404 notFound, 403 quotaExceeded, 409 alreadyExists, 400
invalid) and failed operations (ZONE_RESOURCE_POOL_EXHAUSTED, QUOTA_EXCEEDED).

When ``run_vms`` is on, a VM that boots really runs: the fake starts a metadata server for it and
runs the startup script the backend generated with bash, with ``GCE_METADATA_HOST`` pointing at
that metadata server, so the script fetches its TLS files and runs its ``dask worker ...`` line;
the worker joins the scheduler over TLS. A script that ends powers its VM off (TERMINATED).
Inserted instances get their addresses as GCE gives them (``networkIP``, and ``natIP`` for an
external access config): 127.0.0.1, since every VM runs on this machine. A preemption flips the VM's
``instance/preempted`` to TRUE and kills the VM's process group ``notice_s`` later, as GCE does
after its 30 s notice.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

BASE = "https://www.googleapis.com/compute/v1"

#: Seconds a ``wait`` call blocks before answering with a not-yet-done operation (GCE: ~2 min).
WAIT_S = 2.0
#: The statuses of a booting instance, in the order GCE reports them.
BOOT_ORDER = ("PROVISIONING", "STAGING", "RUNNING")

DEFAULT_ZONES: dict[str, set[str]] = {
    "us-central1-a": {"nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-l4"},
    "us-central1-b": {"nvidia-tesla-t4", "nvidia-l4"},
    "us-central1-c": {"nvidia-tesla-t4", "nvidia-tesla-v100"},
    "us-central1-f": {"nvidia-tesla-v100"},
}
DEFAULT_MACHINES = {"n1-standard-4", "n1-standard-8", "g2-standard-4"}


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up (a worker killed mid long-poll) is not a test failure.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class FakeMetadata:
    """The metadata server of one VM (``GCE_METADATA_HOST`` points here)."""

    def __init__(self, instance: dict[str, Any], project: str):
        self.instance = instance
        self.project = project
        self.preempted = False
        self.version = 0
        self.cond = threading.Condition()
        self.closed = False
        self.requests: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake._get(self)

            def do_PUT(self) -> None:
                fake._put(self)

        self.server = _Quiet(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def etag(self) -> str:
        return hashlib.md5(f"{self.preempted}-{self.version}".encode()).hexdigest()[:16]

    def preempt(self) -> None:
        with self.cond:
            self.preempted = True
            self.version += 1
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, h: BaseHTTPRequestHandler, code: int, text: str, etag: str = "") -> None:
        data = text.encode()
        h.send_response(code)
        h.send_header("Metadata-Flavor", "Google")
        h.send_header("Content-Type", "application/text")
        if etag:
            h.send_header("ETag", etag)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _put(self, h: BaseHTTPRequestHandler) -> None:
        # Guest attributes: written from inside the VM only, read through the API.
        n = int(h.headers.get("Content-Length") or 0)
        data = h.rfile.read(n).decode() if n else ""
        self.requests.append(f"PUT {h.path}")
        if h.headers.get("Metadata-Flavor") != "Google":
            self._answer(h, 403, "Missing Metadata-Flavor:Google header.")
            return
        path = urlparse(h.path).path.removeprefix("/computeMetadata/v1/")
        items = {i["key"]: i["value"] for i in self.instance["metadata"]["items"]}
        if not path.startswith("instance/guest-attributes/") or path.count("/") != 3:
            self._answer(h, 404, "Not Found")
        elif str(items.get("enable-guest-attributes", "")).upper() != "TRUE":
            self._answer(h, 403, "Guest attributes endpoint access is disabled.")
        else:
            self.instance.setdefault("_guest", {})[
                path.removeprefix("instance/guest-attributes/")
            ] = data
            self._answer(h, 200, "")

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        url = urlparse(h.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.requests.append(h.path)
        if h.headers.get("Metadata-Flavor") != "Google":
            # As GCE: a request without the header is refused (it could come from a redirect).
            self._answer(h, 403, "Missing Metadata-Flavor:Google header.")
            return
        path = url.path.removeprefix("/computeMetadata/v1/")
        if path == "instance/preempted":
            with self.cond:
                if query.get("wait_for_change") == "true":
                    last = query.get("last_etag")
                    timeout = float(query.get("timeout_sec", 60))
                    end = time.monotonic() + timeout
                    start_tag = self.etag() if last is None else last
                    while self.etag() == start_tag and not self.closed:
                        left = end - time.monotonic()
                        if left <= 0:
                            break
                        self.cond.wait(min(left, 0.5))
                value, tag = ("TRUE" if self.preempted else "FALSE"), self.etag()
            self._answer(h, 200, value, tag)
        elif path.startswith("instance/attributes/"):
            key = path.removeprefix("instance/attributes/")
            items = {i["key"]: i["value"] for i in self.instance["metadata"]["items"]}
            if key in items:
                self._answer(h, 200, items[key])
            else:
                self._answer(h, 404, "Not Found")
        elif path == "instance/name":
            self._answer(h, 200, self.instance["name"])
        elif path == "instance/zone":
            self._answer(h, 200, f"projects/123456/zones/{self.instance['_zone']}")
        elif path == "project/project-id":
            self._answer(h, 200, self.project)
        else:
            self._answer(h, 404, "Not Found")


class FakeGCE:
    """A fake Compute Engine REST endpoint for one project.

    Parameters
    ----------
    workdir
        Where booted VMs keep their files (startup script, console log, home).
    project
        The only project that exists.
    zones
        Zone -> GCE accelerator types offered there.
    machine_types
        Machine types offered in every zone.
    images
        ``(project, family)`` pairs that exist.
    boot_s
        Seconds from insert to RUNNING.
    notice_s
        Seconds between a preemption notice and the VM's stop (GCE: 30).
    run_vms
        Run each booted VM's startup script (real Dask workers); off: VMs only exist in the API.
    polls_to_done
        Reads (``get`` or ``wait``) an operation needs before it can be DONE: it is PENDING, then
        RUNNING, and ``wait`` answers at once while polls are left (GCE's ``wait`` may return
        before DONE too).
    page_size
        Items per page of list calls (``nextPageToken`` beyond).
    """

    def __init__(
        self,
        workdir: str,
        project: str = "test-project",
        zones: dict[str, set[str]] | None = None,
        machine_types: Iterable[str] = DEFAULT_MACHINES,
        images: Iterable[tuple[str, str]] = (("test-project", "transient-nb"),),
        boot_s: float = 0.1,
        notice_s: float = 2.0,
        run_vms: bool = False,
        polls_to_done: int = 3,
        page_size: int = 2,
    ):
        self.workdir = workdir
        self.project = project
        self.zones = {z: set(a) for z, a in (zones or DEFAULT_ZONES).items()}
        self.machine_types = set(machine_types)
        self.images = set(images)
        self.boot_s = boot_s
        self.notice_s = notice_s
        self.run_vms = run_vms
        #: The ``natIP`` of every external access config (the VMs run here).
        self.external_ip = "127.0.0.1"
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        #: (zone, name) -> instance JSON (with private "_" keys).
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.firewalls: dict[str, dict[str, Any]] = {}
        #: Every request: (method, path, JSON body or None).
        self.requests: list[tuple[str, str, Any]] = []
        #: (zone, accelerator or None for any GPU, spot only) that have no capacity.
        self.exhausted: set[tuple[str, str | None, bool]] = set()
        #: zone -> "operation" or "http": how a GPU quota error is answered there.
        self.quota: dict[str, str] = {}
        #: zone -> quota metric of the operation quota error (GCE's most common first one).
        self.quota_metric: dict[str, str] = {}
        #: Injected HTTP errors: [method, path regex, status, reason, times left].
        self.faults: list[list[Any]] = []
        #: requestId -> operation: a repeated insert or delete gets the first one's operation.
        self.request_ids: dict[str, dict[str, Any]] = {}
        #: Polls (get or wait) an operation needs to go PENDING -> RUNNING -> DONE.
        self.polls_to_done = polls_to_done
        #: Items per page of list calls (GCE pages at 500; small here so paging is exercised).
        self.page_size = page_size
        self.procs: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self.metadata: dict[tuple[str, str], FakeMetadata] = {}
        self._timers: list[threading.Timer] = []
        self._ids = itertools.count(1000)
        self.closed = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake._handle(self, "GET")

            def do_POST(self) -> None:
                fake._handle(self, "POST")

            def do_DELETE(self) -> None:
                fake._handle(self, "DELETE")

            def do_PATCH(self) -> None:
                fake._handle(self, "PATCH")

        self.server = _Quiet(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    # -- test controls ------------------------------------------------------------------------------
    def exhaust(self, zone: str, accelerator: str | None = None, spot_only: bool = False) -> None:
        """No capacity for ``accelerator`` (None: any GPU; ``"cpu"``: VMs without a GPU, such
        as the PS host) VMs in ``zone`` from now on."""
        with self.lock:
            self.exhausted.add((zone, accelerator, spot_only))

    def quota_exceeded(
        self, zone: str, how: str = "operation", metric: str = "GPUS_ALL_REGIONS"
    ) -> None:
        """GPU quota is used up for ``zone``'s region: an operation error or an HTTP 403.

        The operation error carries GCE's ``errorDetails[].quotaInfo`` (``metric``); the HTTP
        403 names ``NVIDIA_T4_GPUS`` in its message, as GCE does.
        """
        with self.lock:
            self.quota[zone] = how
            self.quota_metric[zone] = metric

    def fail(self, method: str, path: str, status: int = 503, times: int = 1) -> None:
        """Answer the next ``times`` ``method`` requests whose path matches regex ``path`` with
        an HTTP error: 503 ``backendError``, 429 ``rateLimitExceeded``, 500 ``internalError``."""
        reason = {429: "rateLimitExceeded", 500: "internalError"}.get(status, "backendError")
        with self.lock:
            self.faults.append([method, re.compile(path), status, reason, times])

    def add_foreign_instance(self, zone: str, name: str, labels: dict[str, str]) -> None:
        """An instance someone else created (a colleague's cluster, another tool)."""
        with self.lock:
            self.instances[(zone, name)] = {
                "kind": "compute#instance",
                "id": str(next(self._ids)),
                "name": name,
                "status": "RUNNING",
                "labels": dict(labels),
                "machineType": f"zones/{zone}/machineTypes/n1-standard-4",
                "zone": f"{BASE}/projects/{self.project}/zones/{zone}",
                "selfLink": f"{BASE}/projects/{self.project}/zones/{zone}/instances/{name}",
                "metadata": {"items": []},
                "_zone": zone,
                "_spot": False,
            }

    def add_foreign_firewall(self, name: str, description: str = "someone else's") -> None:
        """A firewall rule someone else created."""
        with self.lock:
            self.firewalls[name] = {
                "kind": "compute#firewall",
                "name": name,
                "description": description,
                "selfLink": f"{BASE}/projects/{self.project}/global/firewalls/{name}",
            }

    def preempt(self, name: str) -> None:
        """Preempt a Spot VM as GCE does: notice in the metadata, stop ``notice_s`` later."""
        with self.lock:
            key = self._find(name)
            self._start_preemption(key)

    def _find(self, name: str) -> tuple[str, str]:
        for key in self.instances:
            if key[1] == name:
                return key
        raise KeyError(f"no instance {name!r} in the fake (has {self.instance_names()})")

    def instance_names(self) -> list[str]:
        with self.lock:
            return sorted(n for _, n in self.instances)

    def instance(self, name: str) -> dict[str, Any]:
        with self.lock:
            return self.instances[self._find(name)]

    def inserted(self) -> list[dict[str, Any]]:
        """Bodies of every ``instances.insert`` request, in order, as they came over the wire."""
        return [b for m, p, b in self.requests if m == "POST" and p.endswith("/instances")]

    def calls(self, suffix: str) -> list[str]:
        """Paths of the requests whose path ends with ``suffix``."""
        return [f"{m} {p}" for m, p, _ in self.requests if p.endswith(suffix)]

    def pids(self) -> set[int]:
        with self.lock:
            return {p.pid for p in self.procs.values()}

    def close(self) -> None:
        with self.lock:
            self.closed = True
            for t in self._timers:
                t.cancel()
            keys = list(self.procs)
            self.cond.notify_all()
        for key in keys:
            self._kill(key)
        for md in list(self.metadata.values()):
            md.close()
        self.server.shutdown()
        self.server.server_close()

    # -- HTTP ------------------------------------------------------------------------------------------
    def _send(self, h: BaseHTTPRequestHandler, code: int, body: dict[str, Any]) -> None:
        # Keys starting with "_" are the fake's own bookkeeping, never on the wire.
        data = json.dumps({k: v for k, v in body.items() if not k.startswith("_")}).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json; charset=UTF-8")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    @staticmethod
    def _error(code: int, message: str, reason: str) -> dict[str, Any]:
        return {
            "error": {
                "code": code,
                "message": message,
                "errors": [{"message": message, "domain": "global", "reason": reason}],
            }
        }

    def _not_found(self, what: str) -> tuple[int, dict[str, Any]]:
        return 404, self._error(404, f"The resource '{what}' was not found", "notFound")

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(h.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        n = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(n) if n else b""
        body = json.loads(raw) if raw.strip() else None
        with self.lock:
            self.requests.append((method, url.path, body))
            fault = next(
                (f for f in self.faults if f[0] == method and f[1].search(url.path) and f[4] > 0),
                None,
            )
            if fault is not None:
                fault[4] -= 1
        if fault is not None:
            status, reason = fault[2], fault[3]
            self._send(h, status, self._error(status, f"injected {reason}", reason))
            return
        rid = query.get("requestId")
        with self.lock:
            if rid and rid in self.request_ids:
                # GCE: a request it already took, sent again, gets the first one's operation.
                self._send(h, 200, dict(self.request_ids[rid]))
                return
        try:
            code, out = self._route(method, url.path, query, body)
            if rid and code == 200 and out.get("kind") == "compute#operation":
                with self.lock:
                    self.request_ids[rid] = out
        except Exception as e:  # a bug in the fake shows up as a 500 the test will see
            code, out = 500, self._error(500, f"fake GCE: {e!r}", "backendError")
        self._send(h, code, out)

    def _route(
        self, method: str, path: str, query: dict[str, str], body: Any
    ) -> tuple[int, dict[str, Any]]:
        m = re.fullmatch(r"/compute/v1/projects/([^/]+)(/.*)?", path)
        if not m:
            return 404, self._error(404, f"Not found: {path}", "notFound")
        project, rest = m[1], m[2] or ""
        if rest.startswith("/global/images/"):
            return self._image(project, rest)
        if project != self.project:
            return self._not_found(f"projects/{project}")
        if rest == "" and method == "GET":
            return 200, {"kind": "compute#project", "name": project, "id": "123456"}
        if m := re.fullmatch(r"/zones/([^/]+)(/.*)?", rest):
            zone, sub = m[1], m[2] or ""
            if zone not in self.zones:
                # GCE answers 400 (not 404) for a zone it does not know.
                return self._invalid("zone", f"'{zone}'. Unknown zone.")
            return self._zone(method, zone, sub, query, body)
        if m := re.fullmatch(r"/global/firewalls(?:/([^/]+))?", rest):
            return self._firewall(method, m[1], query, body)
        if m := re.fullmatch(r"/global/operations/([^/]+)(/wait)?", rest):
            return self._operation(m[1], wait=bool(m[2]))
        return 404, self._error(404, f"Not found: {path}", "notFound")

    def _image(self, project: str, rest: str) -> tuple[int, dict[str, Any]]:
        m = re.fullmatch(r"/global/images/family/([^/]+)", rest)
        if m and (project, m[1]) in self.images:
            return 200, {
                "kind": "compute#image",
                "name": f"{m[1]}-v20250601",
                "family": m[1],
                "status": "READY",
                "selfLink": f"{BASE}/projects/{project}/global/images/{m[1]}-v20250601",
            }
        return self._not_found(f"projects/{project}{rest}")

    def _zone(
        self, method: str, zone: str, sub: str, query: dict[str, str], body: Any
    ) -> tuple[int, dict[str, Any]]:
        zurl = f"{BASE}/projects/{self.project}/zones/{zone}"
        if sub == "":
            return 200, {"kind": "compute#zone", "name": zone, "status": "UP", "selfLink": zurl}
        if m := re.fullmatch(r"/machineTypes/([^/]+)", sub):
            if m[1] not in self.machine_types:
                return self._not_found(f"projects/{self.project}/zones/{zone}/machineTypes/{m[1]}")
            return 200, {"kind": "compute#machineType", "name": m[1], "zone": zone}
        if m := re.fullmatch(r"/acceleratorTypes/([^/]+)", sub):
            if m[1] not in self.zones[zone]:
                return self._not_found(
                    f"projects/{self.project}/zones/{zone}/acceleratorTypes/{m[1]}"
                )
            return 200, {"kind": "compute#acceleratorType", "name": m[1], "zone": zurl}
        if m := re.fullmatch(r"/operations/([^/]+)(/wait)?", sub):
            return self._operation(m[1], wait=bool(m[2]))
        if sub == "/instances":
            if method == "POST":
                return self._insert(zone, body)
            return 200, self._list(zone, query.get("filter", ""), query)
        if m := re.fullmatch(
            r"/instances/([^/]+)"
            r"(/simulateMaintenanceEvent|/getGuestAttributes|/setMetadata|/setLabels)?",
            sub,
        ):
            key = (zone, m[1])
            with self.lock:
                inst = self.instances.get(key)
                if inst is None:
                    return self._not_found(f"projects/{self.project}/zones/{zone}/instances/{m[1]}")
                if m[2] == "/simulateMaintenanceEvent" and method == "POST":
                    return self._simulate_maintenance(key)
                if m[2] == "/getGuestAttributes":
                    return self._guest_attributes(inst, query.get("queryPath", ""))
                if m[2] == "/setMetadata" and method == "POST":
                    return self._set_metadata(key, body)
                if m[2] == "/setLabels" and method == "POST":
                    return self._set_labels(key, body)
                if method == "DELETE":
                    return self._delete(key)
                return 200, self._public(inst)
        return 404, self._error(404, f"Not found: {sub}", "notFound")

    # -- operations ----------------------------------------------------------------------------------
    def _new_operation(
        self,
        kind: str,
        target: str,
        zone: str | None,
        error: tuple[Any, ...] | None = None,
        done_after: float = 0.05,
    ) -> dict[str, Any]:
        name = f"operation-{next(self._ids)}-{os.urandom(4).hex()}"
        where = (
            f"projects/{self.project}/zones/{zone}" if zone else f"projects/{self.project}/global"
        )
        op: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(next(self._ids)),
            "name": name,
            "operationType": kind,
            "targetLink": target,
            "status": "PENDING",
            "progress": 0,
            "insertTime": time.strftime("%Y-%m-%dT%H:%M:%S.000-00:00", time.gmtime()),
            "selfLink": f"{BASE}/{where}/operations/{name}",
            "user": "someone@example.com",
            "_polls": 0,
            "_time_done": False,
        }
        if zone:
            op["zone"] = f"{BASE}/projects/{self.project}/zones/{zone}"
        if error is not None:
            code, message, http = error[:3]
            err: dict[str, Any] = {"code": code, "message": message}
            if len(error) > 3:
                err["errorDetails"] = error[3]
            # As on GCE, the error shows once the operation is DONE.
            op["_error"] = {"errors": [err]}
            op["_http"] = http
        with self.lock:
            self.operations[name] = op
        # Operations finish a moment later, as on GCE, so that clients must wait on them.
        self._later(done_after, self._finish_operation, name)
        return op

    def _update_operation(self, op: dict[str, Any]) -> None:
        if op["status"] == "DONE":
            return
        if op["_polls"] > 0:
            op["status"] = "RUNNING"
        if op["_time_done"] and op["_polls"] >= self.polls_to_done:
            op["status"] = "DONE"
            op["progress"] = 100
            op["endTime"] = time.strftime("%Y-%m-%dT%H:%M:%S.000-00:00", time.gmtime())
            if "_error" in op:
                op["error"] = op["_error"]
                op["httpErrorStatusCode"] = op["_http"]
                op["httpErrorMessage"] = {503: "SERVICE UNAVAILABLE", 500: "INTERNAL"}.get(
                    op["_http"], "FORBIDDEN"
                )

    def _finish_operation(self, name: str) -> None:
        with self.lock:
            op = self.operations[name]
            op["_time_done"] = True
            self._update_operation(op)
            self.cond.notify_all()

    def _operation(self, name: str, wait: bool) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if name not in self.operations:
                return self._not_found(f"projects/{self.project}/operations/{name}")
            op = self.operations[name]
            op["_polls"] += 1
            self._update_operation(op)
            if op["_polls"] < self.polls_to_done:
                # GCE's wait may answer before DONE: clients must poll again.
                return 200, dict(op)
            end = time.monotonic() + WAIT_S
            while wait and op["status"] != "DONE" and not self.closed:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
                self._update_operation(op)
            return 200, dict(op)

    # -- instances -----------------------------------------------------------------------------------
    def _public(self, inst: dict[str, Any]) -> dict[str, Any]:
        # As GCE reads back an instance: full URLs where the request had partial ones, and
        # fields the request never had.
        out = {k: v for k, v in inst.items() if not k.startswith("_")}
        mt = str(out.get("machineType", ""))
        if mt and not mt.startswith("https://"):
            out["machineType"] = f"{BASE}/projects/{self.project}/{mt}"
        out.setdefault("cpuPlatform", "Intel Broadwell")
        out.setdefault("fingerprint", "a1b2c3d4e5f6=")
        out.setdefault("labelFingerprint", "42WmSpB8rSM=")
        out.setdefault("startRestricted", False)
        out.setdefault("deletionProtection", False)
        return out

    def _page(self, kind: str, items: list[Any], query: dict[str, str]) -> dict[str, Any]:
        start = int(query.get("pageToken") or 0)
        size = min(int(query.get("maxResults") or self.page_size), self.page_size)
        out: dict[str, Any] = {"kind": kind, "items": items[start : start + size]}
        if start + size < len(items):
            out["nextPageToken"] = str(start + size)
        return out

    def _list(self, zone: str, filter: str, query: dict[str, str]) -> dict[str, Any]:
        wanted = dict(re.findall(r'labels\.([\w-]+)\s*=\s*"?([\w-]+)"?', filter))
        with self.lock:
            items = [
                self._public(i)
                for (z, _), i in sorted(self.instances.items())
                if z == zone and all(i.get("labels", {}).get(k) == v for k, v in wanted.items())
            ]
        return self._page("compute#instanceList", items, query)

    def _invalid(self, field: str, message: str) -> tuple[int, dict[str, Any]]:
        text = f"Invalid value for field '{field}': {message}"
        return 400, self._error(400, text, "invalid")

    def _insert(self, zone: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = body.get("name", "")
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
            return self._invalid("resource.name", f"'{name}'. Must be a match of regex.")
        mt = str(body.get("machineType", "")).rsplit("/", 1)[-1]
        if not body.get("machineType", "").startswith(f"zones/{zone}/machineTypes/"):
            return self._invalid("resource.machineType", f"'{body.get('machineType')}'.")
        if mt not in self.machine_types:
            return self._invalid(
                "resource.machineType",
                f"Machine type with name '{mt}' does not exist in zone '{zone}'.",
            )
        disks = body.get("disks") or []
        image = (disks[0].get("initializeParams") or {}).get("sourceImage", "") if disks else ""
        m = re.fullmatch(r"projects/([^/]+)/global/images/family/([^/]+)", image)
        if not m or (m[1], m[2]) not in self.images:
            return self._invalid("resource.disks[0].initializeParams.sourceImage", f"'{image}'.")
        sched = body.get("scheduling") or {}
        accels = body.get("guestAccelerators") or []
        accel = None
        for a in accels:
            am = re.fullmatch(
                rf"projects/{self.project}/zones/{zone}/acceleratorTypes/([^/]+)",
                str(a.get("acceleratorType")),
            )
            if not am or am[1] not in self.zones[zone]:
                return self._invalid(
                    "resource.guestAccelerators[0].acceleratorType",
                    f"'{a.get('acceleratorType')}'. Accelerator type not found in {zone}.",
                )
            accel = am[1]
        gpu_vm = accel is not None or mt.startswith(("g2-", "a2-", "a3-"))
        if gpu_vm and sched.get("onHostMaintenance") != "TERMINATE":
            return 400, self._error(
                400,
                "Instances with guest accelerators do not support live migration.",
                "badRequest",
            )
        spot = sched.get("provisioningModel") == "SPOT" or bool(sched.get("preemptible"))
        if spot and sched.get("automaticRestart") is not False:
            return self._invalid(
                "resource.scheduling.automaticRestart",
                "Spot and preemptible instances cannot be automatically restarted.",
            )
        with self.lock:
            if (zone, name) in self.instances:
                text = f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' already exists"
                return 409, self._error(409, text, "alreadyExists")
            target = f"{BASE}/projects/{self.project}/zones/{zone}/instances/{name}"
            region = zone.rsplit("-", 1)[0]
            quota = self.quota.get(zone) if gpu_vm else None
            if quota == "http":
                text = f"Quota 'NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region {region}."
                return 403, self._error(403, text, "quotaExceeded")
            if quota == "operation":
                metric = self.quota_metric.get(zone, "GPUS_ALL_REGIONS")
                where = "global" if metric == "GPUS_ALL_REGIONS" else region
                text = f"Quota '{metric}' exceeded.  Limit: 0.0 " + (
                    "globally." if where == "global" else f"in region {region}."
                )
                details = [
                    {
                        "quotaInfo": {
                            "metricName": f"compute.googleapis.com/{metric.lower()}",
                            "limitName": f"{metric.replace('_', '-')}-per-project",
                            "dimensions": {"region": where},
                            "limit": 0,
                        }
                    }
                ]
                op = self._new_operation(
                    "insert", target, zone, ("QUOTA_EXCEEDED", text, 403, details)
                )
                return 200, op
            if any(
                z == zone
                and (a == accel if a not in (None, "cpu") else (gpu_vm == (a is None)))
                and (spot or not spot_only)
                for z, a, spot_only in self.exhausted
            ):
                message = (
                    f"The zone 'projects/{self.project}/zones/{zone}' does not have enough "
                    "resources available to fulfill the request.  Try a different zone, or try "
                    "again later."
                )
                op = self._new_operation(
                    "insert", target, zone, ("ZONE_RESOURCE_POOL_EXHAUSTED", message, 503)
                )
                return 200, op
            inst = json.loads(json.dumps(body))
            inst.setdefault("metadata", {"items": []})["fingerprint"] = os.urandom(6).hex()
            inst["labelFingerprint"] = os.urandom(6).hex()
            # GCE assigns the addresses: an internal one per interface, and an ephemeral
            # external one per ONE_TO_ONE_NAT access config. Here every VM runs on this
            # machine, so both are 127.0.0.1 (the head's clients dial its natIP).
            for interface in inst.get("networkInterfaces") or []:
                interface.setdefault("networkIP", "127.0.0.1")
                interface.setdefault("name", "nic0")
                for access in interface.get("accessConfigs") or []:
                    access.setdefault("natIP", self.external_ip)
                    access.setdefault("kind", "compute#accessConfig")
            inst.update(
                {
                    "kind": "compute#instance",
                    "id": str(next(self._ids)),
                    "status": "PROVISIONING",
                    "zone": f"{BASE}/projects/{self.project}/zones/{zone}",
                    "selfLink": target,
                    "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%S.000-07:00"),
                    "_zone": zone,
                    "_spot": spot,
                }
            )
            self.instances[(zone, name)] = inst
            op = self._new_operation("insert", target, zone)
            self._later(self.boot_s / 2, self._set_status, (zone, name), "STAGING")
            self._later(self.boot_s, self._boot, (zone, name))
            return 200, op

    def _guest_attributes(
        self, inst: dict[str, Any], query_path: str
    ) -> tuple[int, dict[str, Any]]:
        found = [
            {"namespace": k.split("/", 1)[0], "key": k.split("/", 1)[1], "value": v}
            for k, v in sorted(inst.get("_guest", {}).items())
            if k.startswith(query_path)
        ]
        if not found:
            return self._not_found(f"guest attributes {query_path} of {inst['name']}")
        return 200, {
            "kind": "compute#guestAttributes",
            "queryPath": query_path,
            "queryValue": {"items": found},
            "selfLink": f"{inst['selfLink']}/getGuestAttributes",
        }

    def _set_metadata(self, key: tuple[str, str], body: Any) -> tuple[int, dict[str, Any]]:
        inst = self.instances[key]
        md = inst.setdefault("metadata", {"items": []})
        current = md.get("fingerprint", "")
        if (body or {}).get("fingerprint", "") != current:
            text = "Supplied fingerprint does not match current metadata fingerprint."
            return 412, self._error(412, text, "conditionNotMet")
        md["items"] = list((body or {}).get("items") or [])
        md["fingerprint"] = os.urandom(6).hex()
        return 200, self._new_operation("setMetadata", inst["selfLink"], key[0])

    def _set_labels(self, key: tuple[str, str], body: Any) -> tuple[int, dict[str, Any]]:
        inst = self.instances[key]
        if (body or {}).get("labelFingerprint", "") != inst.get("labelFingerprint", ""):
            text = "Labels fingerprint either invalid or resource labels have changed"
            return 412, self._error(412, text, "conditionNotMet")
        inst["labels"] = dict((body or {}).get("labels") or {})
        inst["labelFingerprint"] = os.urandom(6).hex()
        return 200, self._new_operation("setLabels", inst["selfLink"], key[0])

    def _set_status(self, key: tuple[str, str], status: str) -> None:
        """Move a booting instance on to ``status``, never back.

        The STAGING and boot timers are two threads: on a loaded machine the STAGING one can
        fire after the boot, and a VM set back from RUNNING to STAGING would never run. One
        stopped or being deleted before its timer fired (preempted, given back) stays so.
        """
        with self.lock:
            inst = self.instances.get(key)
            if inst is None or inst["status"] not in BOOT_ORDER:
                return
            if BOOT_ORDER.index(status) > BOOT_ORDER.index(inst["status"]):
                inst["status"] = status

    def _boot(self, key: tuple[str, str]) -> None:
        with self.lock:
            inst = self.instances.get(key)
            if inst is None or self.closed:
                return
            if inst["status"] not in BOOT_ORDER:
                return  # stopped or deleting before its boot timer fired
            inst["status"] = "RUNNING"
            if not self.run_vms:
                return
            md = FakeMetadata(inst, self.project)
            self.metadata[key] = md
            folder = os.path.join(self.workdir, key[1])
            os.makedirs(os.path.join(folder, "tmp"), exist_ok=True)
            script = next(
                i["value"] for i in inst["metadata"]["items"] if i["key"] == "startup-script"
            )
            path = os.path.join(folder, "startup-script.sh")
            with open(path, "w") as f:
                f.write(script)
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": folder,
                "TMPDIR": os.path.join(folder, "tmp"),
                "LANG": "C.UTF-8",
                "GCE_METADATA_HOST": md.host,
                # The script powers the VM off when its worker ends: here the fake notices the
                # script's end instead (see _reap); never power off the test machine.
                "TRANSIENT_NB_POWEROFF": "true",
            }
            # The image holds the test's Python environment: the same package path too (a
            # source checkout that is not the installed one).
            if os.environ.get("PYTHONPATH"):
                env["PYTHONPATH"] = os.environ["PYTHONPATH"]
            log = open(os.path.join(folder, "console.log"), "ab")
            # A VM is a process group: killing the group stops bash, the nanny and the worker.
            self.procs[key] = subprocess.Popen(
                ["bash", path],
                cwd=folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
            threading.Thread(target=self._reap, args=(key, self.procs[key]), daemon=True).start()

    def _reap(self, key: tuple[str, str], proc: subprocess.Popen[bytes]) -> None:
        # The startup script ended by itself (it powers the VM off): the VM is TERMINATED.
        proc.wait()
        with self.lock:
            if self.procs.get(key) is not proc:
                return  # killed by the fake (deletion, preemption): handled there
            del self.procs[key]
            md = self.metadata.pop(key, None)
            if key in self.instances:
                self.instances[key]["status"] = "TERMINATED"
        if md is not None:
            md.close()

    def _kill(self, key: tuple[str, str]) -> None:
        with self.lock:
            proc = self.procs.pop(key, None)
            md = self.metadata.pop(key, None)
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        if md is not None:
            md.close()

    def _start_preemption(self, key: tuple[str, str]) -> None:
        with self.lock:
            inst = self.instances[key]
            if inst.get("_preempting"):
                return
            inst["_preempting"] = True
            md = self.metadata.get(key)
        if md is not None:
            md.preempt()
        self._later(self.notice_s, self._stop_preempted, key)

    def _stop_preempted(self, key: tuple[str, str]) -> None:
        self._kill(key)
        with self.lock:
            inst = self.instances.get(key)
            if inst is None:
                return
            action = (inst.get("scheduling") or {}).get("instanceTerminationAction", "STOP")
            if action == "DELETE":
                del self.instances[key]
            else:
                inst["status"] = "TERMINATED"

    def _simulate_maintenance(self, key: tuple[str, str]) -> tuple[int, dict[str, Any]]:
        inst = self.instances[key]
        op = self._new_operation("simulateMaintenanceEvent", inst["selfLink"], key[0])
        if inst["_spot"] and inst["status"] == "RUNNING":
            # A maintenance event preempts Spot and preemptible VMs, notice included.
            self._start_preemption(key)
        return 200, op

    def _delete(self, key: tuple[str, str]) -> tuple[int, dict[str, Any]]:
        inst = self.instances[key]
        inst["status"] = "STOPPING"
        op = self._new_operation("delete", inst["selfLink"], key[0], done_after=10.0)
        threading.Thread(target=self._finish_delete, args=(key, op["name"]), daemon=True).start()
        return 200, op

    def _finish_delete(self, key: tuple[str, str], op: str) -> None:
        self._kill(key)
        with self.lock:
            self.instances.pop(key, None)
        self._finish_operation(op)

    # -- firewalls -----------------------------------------------------------------------------------
    def _firewall(
        self, method: str, name: str | None, query: dict[str, str], body: Any
    ) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if name is None and method == "POST":
                fname = body.get("name", "")
                if fname in self.firewalls:
                    text = f"The resource 'projects/{self.project}/global/firewalls/{fname}' already exists"
                    return 409, self._error(409, text, "alreadyExists")
                target = f"{BASE}/projects/{self.project}/global/firewalls/{fname}"
                self.firewalls[fname] = {**body, "kind": "compute#firewall", "selfLink": target}
                return 200, self._new_operation("insert", target, None)
            if name is None:
                # The API's regular-expression form: name eq "RE2" (the whole name must match).
                m = re.fullmatch(r'name eq "?([^"]*)"?', query.get("filter", ""))
                pattern = m[1] if m else ".*"
                items = [f for n, f in sorted(self.firewalls.items()) if re.fullmatch(pattern, n)]
                return 200, self._page("compute#firewallList", items, query)
            if name not in self.firewalls:
                return self._not_found(f"projects/{self.project}/global/firewalls/{name}")
            if method == "DELETE":
                rule = self.firewalls.pop(name)
                return 200, self._new_operation("delete", rule["selfLink"], None)
            if method == "PATCH":
                # GCE's patch: the fields the body names change, the others stay.
                self.firewalls[name].update({k: v for k, v in (body or {}).items() if k != "name"})
                return 200, self._new_operation("patch", self.firewalls[name]["selfLink"], None)
            return 200, self.firewalls[name]

    # -- timers --------------------------------------------------------------------------------------
    def _later(self, delay: float, fn: Any, *args: Any) -> None:
        with self.lock:
            if self.closed:
                return
            t = threading.Timer(delay, fn, args)
            t.daemon = True
            self._timers.append(t)
            t.start()
