"""Tests for transient_nb.agent: drain hooks and the notice handler inside a worker."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import wait_for
from distributed import Worker
from distributed.core import Status, rpc
from distributed.utils_test import gen_cluster, gen_test

from transient_nb import agent
from transient_nb.events import TOPIC


@pytest.fixture(autouse=True)
def _no_leftover_hooks() -> Iterator[None]:
    yield
    agent._hooks.clear()


@gen_test()
async def test_drain_hooks_run_concurrently_and_errors_are_collected() -> None:
    seen: list[tuple[str, float]] = []

    def sync_hook(deadline: float) -> None:
        seen.append(("sync", deadline))

    async def async_hook(deadline: float) -> None:
        await asyncio.sleep(0.1)
        seen.append(("async", deadline))

    def failing_hook(deadline: float) -> None:
        raise RuntimeError("disk full")

    for hook in (sync_hook, async_hook, failing_hook):
        agent.register_drain_hook(hook)
    deadline = time.time() + 10
    errors = await agent.run_drain_hooks(deadline)
    assert sorted(seen) == [("async", deadline), ("sync", deadline)]
    assert len(errors) == 1 and "failing_hook" in errors[0] and "disk full" in errors[0]

    agent.unregister_drain_hook(failing_hook)
    agent.unregister_drain_hook(failing_hook)  # twice is harmless
    seen.clear()
    assert await agent.run_drain_hooks(time.time() + 10) == []
    assert len(seen) == 2


@gen_test()
async def test_slow_hook_is_cut_at_the_deadline() -> None:
    cancelled = asyncio.Event()

    async def slow(deadline: float) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    agent.register_drain_hook(slow)
    t0 = time.monotonic()
    # The hooks get the time up to the deadline minus the margin the worker needs to close.
    errors = await agent.run_drain_hooks(time.time() + agent.CLOSE_MARGIN_S + 0.3)
    assert time.monotonic() - t0 < 5
    assert errors == ["drain hook did not finish before the deadline"]
    await wait_for(cancelled.is_set, timeout=5)
    # No time left at all: the hooks are not waited for.
    assert await agent.run_drain_hooks(time.time() - 1) == [
        "drain hook did not finish before the deadline"
    ]


def test_vm_name_prefers_the_backend_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeWorker:
        name = "dask-name"

    monkeypatch.delenv("TRANSIENT_NB_VM", raising=False)
    assert agent._vm_name(FakeWorker()) == "dask-name"
    monkeypatch.setenv("TRANSIENT_NB_VM", json.dumps({"name": "w-7"}))
    assert agent._vm_name(FakeWorker()) == "w-7"
    monkeypatch.setenv("TRANSIENT_NB_VM", "garbage")
    assert agent._vm_name(FakeWorker()) == "dask-name"


@gen_cluster(client=True, nthreads=[])
async def test_notice_drains_posts_and_closes_the_worker(c: Any, s: Any) -> None:
    ran: list[float] = []

    async def hook(deadline: float) -> None:
        await asyncio.sleep(0.05)
        ran.append(deadline)

    agent.register_drain_hook(hook)
    async with Worker(s.address, name="w-3", nthreads=1) as w:
        agent.dask_setup(w)
        deadline = time.time() + 5
        async with rpc(w.address) as r:
            assert await r.transient_notice(deadline=deadline) == "draining"
            # A second notice does not drain twice.
            assert await r.transient_notice(deadline=deadline) == "draining"
        await wait_for(lambda: w.status in (Status.closing, Status.closed), timeout=30)
        await wait_for(lambda: w.status == Status.closed, timeout=30)
    assert ran == [deadline]
    drained = [m for _, m in s.get_events(TOPIC) if m.get("kind") == "drained"]
    assert len(drained) == 1
    assert drained[0]["hooks"] == 1 and list(drained[0]["errors"]) == []
    assert drained[0]["worker"] == w.address  # the scheduler stamps the sender's address
    assert 0 < drained[0]["seconds"] < 5
    await wait_for(lambda: not s.workers, timeout=30)


@pytest.mark.slow
def test_a_gpu_worker_imports_torch_and_the_trainer_while_it_joins() -> None:
    from conftest import wait_for_sync

    from transient_nb import TransientCluster

    # Defined here: cloudpickle sends it by value (the workers cannot import this test module).
    def _trainer_imported() -> bool:
        import sys

        return "transient_nb.training.trainer" in sys.modules

    with TransientCluster(workers=1, preemption="none", provisioning_delay=0) as cluster:
        cluster.wait_for_workers(1, timeout=120)
        client = cluster.get_client()
        info = client.scheduler_info(n_workers=-1)["workers"]
        gpu = [a for a, w in info.items() if "gpu" in w.get("resources", {})]
        ps = [a for a, w in info.items() if "gpu" not in w.get("resources", {})]
        assert gpu and ps
        # No trainer was ever asked for: only the warm-up can have imported it.
        wait_for_sync(
            lambda: all(client.run(_trainer_imported, workers=gpu).values()),
            120,
            "the GPU worker never warmed up",
        )
        assert not any(client.run(_trainer_imported, workers=ps).values())  # the PS host: no
