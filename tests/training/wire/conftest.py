"""Fixtures of the data plane's tests: an event loop in a thread (the worker's), a real PS shard
on it, and a cluster CA's certificates (a member's, and an outsider's from another CA)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from transient_nb.backends.tls import ClusterCA, security_from_files
from transient_nb.training.hparams import HParams
from transient_nb.training.ps import ParameterServer

N = 1000  # entries of the test shard


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own, as a worker's."""
    lp = asyncio.new_event_loop()
    thread = threading.Thread(target=lp.run_forever, name="test-loop", daemon=True)
    thread.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    thread.join(10)
    lp.close()


def make_ps(tmp_path: Path, wire: str = "float32", **hp: Any) -> ParameterServer:
    """A real PS shard of :data:`N` entries (not on a worker)."""
    w = np.linspace(-1, 1, N).astype(np.float32)
    params = HParams(steps=10**6, warmup_steps=0, wire_dtype=wire, **hp).to_dict()
    return ParameterServer(
        "run", 0, 1, w, np.ones(N, np.uint8), np.zeros(4, np.float32), params, str(tmp_path)
    )


@pytest.fixture
def ps(tmp_path: Path) -> ParameterServer:
    return make_ps(tmp_path)


@pytest.fixture
def certs(tmp_path: Path) -> dict[str, Any]:
    """A cluster CA's files for a member PS and a member trainer, and an outsider's pair."""
    ca = ClusterCA.create("wire")
    outsider = ClusterCA.create("other")
    ps_files = ca.write_files(str(tmp_path / "ps"), "ps-0", role="ps")
    return {
        "ca": ca,
        "ca_file": ps_files["ca"],
        "ps": security_from_files(ps_files, "worker"),
        "trainer": security_from_files(
            ca.write_files(str(tmp_path / "w"), "w-0", role="worker"), "worker"
        ),
        "outsider": outsider.write_files(str(tmp_path / "x"), "w-0", role="worker"),
    }
