"""Tests for transient_nb.backends.simulator: when the simulator asks the cluster to preempt."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import pytest
from distributed.utils_test import gen_test

from tests.conftest import wait_for
from transient_nb.backends.simulator import PreemptionSimulator
from transient_nb.catalog.lifetimes import Trace, TraceEntry


@dataclass(frozen=True)
class Fixed:
    """Every VM lives exactly ``seconds`` simulated seconds."""

    seconds: float | None
    spec: str = "fixed"

    def lifetime(self, rng: random.Random) -> float | None:
        return self.seconds


@dataclass(frozen=True)
class ByGpu:
    """V100s live 10 simulated seconds; other types are never preempted."""

    spec: str = "by-gpu"

    def for_gpu(self, gpu: str | None) -> Fixed:
        return Fixed(10.0 if gpu == "v100" else None)

    def lifetime(self, rng: random.Random) -> float | None:
        raise AssertionError("a model by GPU type is asked per type")


class Recorder:
    """Stands in for the cluster's ``_preempt_one``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool, str, float]] = []

    async def __call__(self, name: str, notice: bool, source: str) -> None:
        self.calls.append((name, notice, source, time.monotonic()))


@gen_test()
async def test_lifetimes_are_time_scaled() -> None:
    rec = Recorder()
    # 60 simulated seconds at time_scale=120: half a wall second.
    sim = PreemptionSimulator(Fixed(60.0), 120.0, rec, lambda slot: None, random.Random(0))
    sim.start()
    t0 = time.monotonic()
    sim.vm_running("w-0")
    loop = asyncio.get_running_loop()
    assert sim._handles["w-0"].when() - loop.time() == pytest.approx(0.5, abs=0.05)
    await wait_for(lambda: rec.calls, timeout=10)
    name, notice, source, t = rec.calls[0]
    assert (name, notice, source) == ("w-0", True, "simulator")
    assert t - t0 >= 0.45


@gen_test()
async def test_vm_gone_and_stop_cancel_preemptions() -> None:
    rec = Recorder()
    sim = PreemptionSimulator(Fixed(0.3), 1.0, rec, lambda slot: None, random.Random(0))
    sim.vm_running("w-0")
    sim.vm_running("w-1")
    sim.vm_running("w-2")
    sim.vm_gone("w-1")  # scaled away before its time came
    sim.vm_gone("w-7")  # unknown: ignored
    await wait_for(lambda: len(rec.calls) == 2, timeout=10)
    assert sorted(c[0] for c in rec.calls) == ["w-0", "w-2"]

    sim.vm_running("w-3")
    sim.stop()
    sim.vm_running("w-4")  # after stop nothing is scheduled any more
    marker = PreemptionSimulator(Fixed(0.6), 1.0, rec, lambda slot: None, random.Random(0))
    marker.vm_running("marker")  # fires after w-3 and w-4 would have
    await wait_for(lambda: any(c[0] == "marker" for c in rec.calls), timeout=10)
    assert sorted(c[0] for c in rec.calls) == ["marker", "w-0", "w-2"]


@gen_test()
async def test_no_lifetime_means_never() -> None:
    rec = Recorder()
    sim = PreemptionSimulator(Fixed(None), 1.0, rec, lambda slot: None, random.Random(0))
    sim.vm_running("w-0")
    assert sim._handles == {}
    await asyncio.sleep(0)
    assert rec.calls == []


@gen_test()
async def test_trace_replay_resolves_slots_when_it_fires() -> None:
    holders = {0: "w-0"}
    trace = Trace(
        "trace:test",
        (
            TraceEntry(0.2, "slot:0", notice=False),
            TraceEntry(0.4, "w-5", notice=True),
            TraceEntry(0.6, "slot:3", notice=True),  # nobody holds slot 3: skipped
            TraceEntry(0.8, "slot:0", notice=True),
        ),
    )
    rec = Recorder()
    sim = PreemptionSimulator(trace, 2.0, rec, holders.get, random.Random(0))
    sim.vm_running("w-0")  # a trace draws no lifetimes
    assert sim._handles == {}
    sim.start()
    # Trace times are simulated seconds: time_scale=2 halves them.
    now = asyncio.get_running_loop().time()
    delays = [h.when() - now for h in sim._trace_handles]
    assert delays == pytest.approx([0.1, 0.2, 0.3, 0.4], abs=0.05)
    await wait_for(lambda: len(rec.calls) == 1, timeout=10)
    holders[0] = "w-9"  # the slot changed hands after the first preemption
    await wait_for(lambda: len(rec.calls) == 3, timeout=10)
    assert [c[:3] for c in rec.calls] == [
        ("w-0", False, "simulator"),
        ("w-5", True, "simulator"),
        ("w-9", True, "simulator"),
    ]


@gen_test()
async def test_a_model_by_gpu_draws_from_each_workers_type() -> None:
    sim = PreemptionSimulator(ByGpu(), 1.0, Recorder(), lambda slot: None, random.Random(0))
    sim.vm_running("w-0", "k80")
    sim.vm_running("w-1", "v100")
    assert list(sim._handles) == ["w-1"]
    sim.stop()


@gen_test()
async def test_a_model_by_zone_draws_from_each_workers_zone_then_type() -> None:
    from transient_nb.catalog.lifetimes import LifetimesByZone, NoPreemption

    model = LifetimesByZone(
        "zones", (("storm-1a", Fixed(5.0)), ("typed-1b", ByGpu())), NoPreemption()
    )
    sim = PreemptionSimulator(model, 1.0, Recorder(), lambda slot: None, random.Random(0))
    sim.vm_running("w-0", "k80", "storm-1a")
    sim.vm_running("w-1", "k80", "calm-1c")
    sim.vm_running("w-2", "k80", "typed-1b")
    sim.vm_running("w-3", "v100", "typed-1b")
    assert sorted(sim._handles) == ["w-0", "w-3"]
    sim.stop()
