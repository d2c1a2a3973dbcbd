"""Tests for transient_nb.deploy.monitor: the scheduler plugin that keeps the event log."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from distributed import Worker
from distributed.core import rpc
from distributed.utils_test import gen_cluster

from tests.conftest import kinds, wait_for
from transient_nb.deploy.monitor import TransientMonitor
from transient_nb.eventlog.records import read_run_record
from transient_nb.eventlog.vocabulary import CONTROL_TOPIC, TOPIC, make_event


def as_json(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events as the run record stores them (msgpack's tuples become lists)."""
    return json.loads(json.dumps(events))


async def _install(c: Any, s: Any, path: Path) -> TransientMonitor:
    await c.register_plugin(TransientMonitor(str(path)))
    monitor = s.plugins[TransientMonitor.name]
    assert isinstance(monitor, TransientMonitor)
    return monitor


@gen_cluster(client=True, nthreads=[])
async def test_records_lifecycle_in_order_and_writes_run_record(
    c: Any, s: Any, tmp_path: Path
) -> None:
    path = tmp_path / "run" / "events.jsonl"
    monitor = await _install(c, s, path)
    live: list[Any] = []
    c.subscribe_topic(TOPIC, live.append)
    await wait_for(lambda: c.id in s._broker._topics[TOPIC].subscribers, timeout=30)

    await c.log_event(TOPIC, make_event("started", cluster="demo", time_scale=1.0))
    await c.log_event(
        TOPIC,
        make_event("requested", worker="w-0", role="worker", gpu="t4", zone="z-a", spot=True,
                   machine="n1-standard-8", price=0.22, price_on_demand=0.73, slot=0),
    )  # fmt: skip
    await c.log_event("some-other-topic", {"kind": "noise", "time": time.time()})
    await c.log_event(TOPIC, "not a dict")  # ignored, not recorded

    async with Worker(s.address, name="w-0", nthreads=1) as w:
        await wait_for(lambda: "joined" in kinds(monitor.events), timeout=30)
        joined = monitor.events[-1]
        assert joined["worker"] == "w-0" and joined["address"] == w.address
        # joined/left copy the VM's fields from its requested event.
        assert (joined["gpu"], joined["zone"], joined["price"], joined["slot"]) == (
            "t4", "z-a", 0.22, 0,
        )  # fmt: skip
        # A worker posts under its address; the log names it by its VM name.
        w.log_event(TOPIC, make_event("drained", worker="w-0", hooks=1, errors=[]))
        await wait_for(lambda: "drained" in kinds(monitor.events), timeout=30)
        drained = monitor.events[-1]
        assert drained["worker"] == "w-0" and drained["address"] == w.address
    await wait_for(lambda: "left" in kinds(monitor.events), timeout=30)
    left = monitor.events[-1]
    assert left["worker"] == "w-0" and left["gpu"] == "t4"

    assert kinds(monitor.events) == ["started", "requested", "joined", "drained", "left"]
    # The run record holds exactly the same events, already now (no close needed).
    assert read_run_record(path) == as_json(monitor.events)

    # Readers get the log over the scheduler's RPC, from any index on.
    async with rpc(s.address) as r:
        tail = await r.transient_events(since=3)
    assert as_json(tail) == as_json(monitor.events[3:])
    # ... and live through topic subscriptions.
    await wait_for(lambda: len(live) >= 5, timeout=30)
    assert [m["kind"] for _, m in live if isinstance(m, dict)] == kinds(monitor.events)

    await monitor.close()
    assert monitor._file is None


@gen_cluster(client=True, nthreads=[])
async def test_control_requests_go_to_the_owner_not_the_log(c: Any, s: Any, tmp_path: Path) -> None:
    monitor = await _install(c, s, tmp_path / "events.jsonl")
    # Nobody owns the scheduler yet: the request is dropped quietly.
    await c.log_event(CONTROL_TOPIC, {"action": "scale", "workers": 1})
    requests: list[dict[str, Any]] = []
    monitor.on_control = requests.append
    await c.log_event(CONTROL_TOPIC, {"action": "scale", "workers": 3})
    await c.log_event(CONTROL_TOPIC, "not a dict")
    await wait_for(lambda: requests, timeout=30)
    assert requests == [{"action": "scale", "workers": 3}]
    assert monitor.events == []
    assert read_run_record(tmp_path / "events.jsonl") == []


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_appends_to_an_existing_record(c: Any, s: Any, a: Worker, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    earlier = make_event("started", cluster="before")
    path.write_text(json.dumps(earlier) + "\n")
    monitor = await _install(c, s, path)
    await c.log_event(TOPIC, make_event("scale", workers=2))
    # A worker that joined before the monitor existed keeps its address as its name.
    a.log_event(TOPIC, make_event("metrics", step=1))
    await wait_for(lambda: len(monitor.events) == 2, timeout=30)
    assert monitor.events[1]["worker"] == a.address
    assert kinds(read_run_record(path)) == ["started", "scale", "metrics"]


@gen_cluster(client=True, nthreads=[])
async def test_a_provider_notice_is_honoured_only_from_the_worker_of_the_vm_it_names(
    c: Any, s: Any, tmp_path: Path
) -> None:
    monitor = await _install(c, s, tmp_path / "events.jsonl")
    asked: list[dict[str, Any]] = []
    monitor.on_control = asked.append
    from transient_nb.eventlog.vocabulary import PROVIDER_NOTICE_OP

    async with Worker(s.address, name="w-0", nthreads=1) as w0:
        await wait_for(lambda: "joined" in kinds(monitor.events), timeout=30)
        # Worker w-0 claims that another VM got its notice: refused.
        w0.batched_stream.send({"op": PROVIDER_NOTICE_OP, "vm": "w-1", "source": "gce-metadata"})
        await wait_for(lambda: "control-refused" in kinds(monitor.events), timeout=30)
        assert asked == []
        # A client (or any process with a connection) posting the request: refused too.
        await c.log_event(CONTROL_TOPIC, {"action": "provider-notice", "vm": "w-0"})
        await wait_for(lambda: kinds(monitor.events).count("control-refused") == 2, timeout=30)
        assert asked == []
        # A worker cannot post control requests at all (scale, preempt, stop).
        w0.log_event(CONTROL_TOPIC, {"action": "stop", "id": 9})
        await wait_for(lambda: kinds(monitor.events).count("control-refused") == 3, timeout=30)
        assert asked == []
        # Its own VM: honoured, under the name the scheduler knows the sender by.
        w0.batched_stream.send({"op": PROVIDER_NOTICE_OP, "vm": "w-0", "source": "gce-metadata"})
        await wait_for(lambda: asked, timeout=30)
        assert asked[0]["action"] == "provider-notice" and asked[0]["vm"] == "w-0"
        assert asked[0]["source"] == "gce-metadata"
