"""Worker preload of GCE VMs: turn the metadata server's preemption notice into a drain.

Loaded after :mod:`transient_nb.worker.preload` (``--preload transient_nb.worker.preload --preload
transient_nb.backends.gce.preload``). It watches ``computeMetadata/v1/instance/preempted`` on the
VM's metadata server with a hanging GET (``wait_for_change=true``); when it turns ``TRUE`` (about
30 s before GCE stops the VM) it

1. tells the cluster (a ``transient-provider-notice`` message on its stream to the scheduler,
   honoured only for this worker's own VM), which posts the
   ``notice`` event and asks for a replacement at once, since a new VM takes 80-100 s to boot;
2. runs the same drain path as the local backend: the ``transient_notice`` handler of
   :mod:`transient_nb.worker.preload` runs the drain hooks (the trainer pushes its last gradient), posts
   ``drained`` and closes the worker with its nanny before the deadline.

The metadata host is ``metadata.google.internal`` unless ``GCE_METADATA_HOST`` says otherwise (the
variable google-auth honours too), so tests point it at a fake metadata server. The notice length
comes from ``TRANSIENT_NB_NOTICE_S`` (30 on GCE; shorter in time-scaled tests).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from transient_nb.eventlog.vocabulary import PROVIDER_NOTICE_OP
from transient_nb.worker.identity import vm_name

logger = logging.getLogger(__name__)

#: GCE's notice before a Spot VM is stopped (seconds).
GCE_NOTICE_S = 30.0
#: Seconds a hanging GET waits before the metadata server answers "unchanged" (GCE allows more;
#: shorter keeps a dead connection from going unnoticed for long).
HANG_S = 60
#: Pause after a failed metadata request before trying again.
RETRY_S = 1.0


def metadata_url(path: str) -> str:
    """URL of ``computeMetadata/v1/<path>`` on this VM's metadata server.

    Examples
    --------
    >>> metadata_url("instance/preempted").endswith("/computeMetadata/v1/instance/preempted")
    True
    """
    host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
    return f"http://{host}/computeMetadata/v1/{path}"


async def _get(url: str, timeout: float) -> tuple[str, str | None]:
    client = AsyncHTTPClient()
    response = await client.fetch(
        HTTPRequest(
            url,
            headers={"Metadata-Flavor": "Google"},
            request_timeout=timeout,
            connect_timeout=10,
        )
    )
    return response.body.decode().strip(), response.headers.get("ETag")


async def wait_for_preemption() -> None:
    """Return when this VM's ``instance/preempted`` metadata value is ``TRUE``.

    The first GET reads the value and its ETag; each next one hangs until the value differs from
    that ETag (``last_etag``), so a notice that arrives between two requests is never missed.
    """
    url = metadata_url("instance/preempted")
    etag: str | None = None
    while True:
        if etag is None:
            query = ""
        else:
            query = f"?wait_for_change=true&last_etag={etag}&timeout_sec={HANG_S}"
        try:
            value, etag = await _get(url + query, timeout=HANG_S + 10)
        except (OSError, HTTPClientError, asyncio.TimeoutError) as e:
            logger.info("Metadata server not answering (%r); asking again", e)
            etag = None
            await asyncio.sleep(RETRY_S)
            continue
        if value.upper() == "TRUE":
            return


async def on_preemption(worker: Any) -> None:
    """What a worker does when GCE announces its preemption."""
    notice_s = float(os.environ.get("TRANSIENT_NB_NOTICE_S", GCE_NOTICE_S))
    deadline = time.time() + notice_s
    logger.warning("GCE preemption notice: this VM stops by %.1f", deadline)
    # Over the worker's own stream: the scheduler knows which worker sent it, and the cluster
    # honours the notice only for that worker's VM (a posted control request could name any).
    worker.batched_stream.send(
        {
            "op": PROVIDER_NOTICE_OP,
            "vm": vm_name(worker),
            "deadline": deadline,
            "source": "gce-metadata",
        }
    )
    handler = worker.handlers.get("transient_notice")
    if (
        handler is None
    ):  # pragma: no cover - the image lacks transient_nb.worker.preload in --preload
        await worker.close(reason="transient-preempted", nanny=True)
        return
    await handler(deadline=deadline)


async def watch(worker: Any) -> None:
    """Wait for the notice, then drain; runs for the worker's whole life."""
    await wait_for_preemption()
    await on_preemption(worker)


def dask_setup(worker: Any) -> None:
    """Dask preload entry point: start watching the metadata server."""
    worker._transient_gce_watch = asyncio.ensure_future(watch(worker))


def dask_teardown(worker: Any) -> None:
    """Stop watching when the worker closes."""
    task = getattr(worker, "_transient_gce_watch", None)
    if task is not None and not task.done():
        task.cancel()
