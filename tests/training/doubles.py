"""In-process doubles of remote actors, shared by the trainer's and the driver's unit tests."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any

from transient_nb.training.ps import ParameterServer


class Future:
    """What an actor call returns: ``result(timeout)`` and ``done()``."""

    def __init__(self, fut: concurrent.futures.Future):
        self._fut = fut

    def result(self, timeout=None):
        return self._fut.result(timeout)

    def done(self):
        return self._fut.done()


class PSDouble:
    """A real :class:`ParameterServer` on a private event loop, behind calls that can be made
    slow (``frozen``) or failing (``error``), the way a remote actor's are."""

    def __init__(self, ps: ParameterServer, loop: asyncio.AbstractEventLoop):
        self.ps, self.loop = ps, loop
        self.frozen = threading.Event()
        self.error: Exception | None = None
        self.calls = 0
        #: The names of the methods called, in order, and their arguments.
        self.called: list[str] = []
        self.arguments: list[tuple[str, tuple, dict]] = []
        self.staleness: list[int] = []
        self.push_times: list[float] = []
        # What the driver reads of an actor handle: the host it lives on, and its key.
        self._address = f"tls://ps-host-{ps.shard}:1"
        self.key = f"ps-{ps.run}-s{ps.shard}"

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.ps, name)

        async def call(*args, **kwargs):
            self.calls += 1
            self.called.append(name)
            self.arguments.append((name, args, kwargs))
            if self.error is not None:
                raise self.error
            while self.frozen.is_set():
                await asyncio.sleep(0.01)
            if name == "push_pull":
                self.staleness.append(self.ps.version - kwargs["base_version"])
                reply = await method(*args, **kwargs)
                self.push_times.append(time.monotonic())
                return reply
            return await method(*args, **kwargs)

        return lambda *a, **k: Future(asyncio.run_coroutine_threadsafe(call(*a, **k), self.loop))
