"""The provider-independent part of a VM's lifecycle (``backends/base.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

from distributed.utils_test import gen_test

from transient_nb.backends.base import TransientVM, VMSpec
from transient_nb.catalog.prices import Price


class _SlowVM(TransientVM):
    """A VM whose process never exits by itself after the notice (a stalling nanny)."""

    def __init__(self) -> None:
        spec = VMSpec("w-1", "worker", "t4", "z", True, "n1-standard-8", Price(1.0, 0.3))
        self.events: list[str] = []

        async def post(kind: str, **fields: Any) -> None:
            self.events.append(kind)

        super().__init__(spec=spec, scheduler_address="tcp://127.0.0.1:1", post=post)
        self.notified = asyncio.Event()
        self.killed = False

    async def _notify(self, deadline: float) -> None:
        self.notified.set()

    async def _wait_exit(self, deadline: float) -> None:
        await asyncio.sleep(3600)  # the process lingers past any test's patience

    async def _kill(self) -> None:
        self.killed = True


@gen_test()
async def test_a_drained_vm_counts_as_gone_once_its_worker_has_left() -> None:
    vm = _SlowVM()
    preempting = asyncio.ensure_future(vm.preempt(notice=True, deadline=1e12))
    await asyncio.wait_for(vm.notified.wait(), 5)
    await asyncio.sleep(0.05)
    assert not preempting.done()  # the worker is still draining: the VM is not gone yet
    vm.mark_left()  # the scheduler saw the drained worker leave
    await asyncio.wait_for(preempting, 5)  # not the hour the lingering process would take
    assert vm.killed


@gen_test()
async def test_a_worker_that_left_before_the_notice_is_gone_at_once() -> None:
    vm = _SlowVM()
    vm.mark_left()
    await asyncio.wait_for(vm.preempt(notice=True, deadline=1e12), 5)
    assert vm.killed
