"""Hand-made event logs and a fake cluster that the view tests share."""

from __future__ import annotations

from typing import Any

from distributed.core import Status
from tornado.ioloop import IOLoop

T0 = 1_800_000_000.0


def vm(kind: str, name: str, t: float, **fields: Any) -> dict[str, Any]:
    base = {"role": "worker", "gpu": "t4", "zone": "us-central1-a", "spot": True}
    return {"kind": kind, "time": T0 + t, "worker": name, **base, **fields}


LIFE = [
    {"kind": "started", "time": T0, "time_scale": 2.0, "workers": 2},
    vm("requested", "ps-0", 0, role="ps", gpu=None, spot=False, price=0.2, price_on_demand=0.2),
    vm("requested", "w-0", 0, price=0.5, price_on_demand=1.5),
    vm("requested", "w-1", 0, price=0.5, price_on_demand=1.5),
    vm("running", "ps-0", 1, role="ps", gpu=None, spot=False),
    vm("running", "w-0", 1),
    vm("running", "w-1", 1),
    vm("joined", "ps-0", 2, role="ps", gpu=None, spot=False),
    vm("joined", "w-0", 2),
    vm("notice", "w-1", 100),
    vm("preempted", "w-1", 110, notice=True),
]


class FakeCluster:
    """Just what the panel reads: a name, an event list and a loop (never started here)."""

    def __init__(self, events: list[dict[str, Any]]):
        self.name = "fake"
        self.monitor = type("M", (), {"events": events})()
        self.loop = IOLoop.current(instance=False)
        self.status = Status.running
        self.calls: list[tuple[str, Any]] = []

    def scale(self, n: int, gpu: str | None = None) -> None:
        self.calls.append(("scale", n) if gpu is None else ("scale", (n, gpu)))

    def preempt(self, target: Any, notice: bool = True) -> list[str]:
        self.calls.append(("preempt", (target, notice)))
        raise ValueError("No preemptible worker named 'w-9'")
