"""The cluster model the panel shows, from hand-made event logs (no server, no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from transient_nb.eventlog import format
from transient_nb.eventlog.vocabulary import make_event
from transient_nb.server.model import MAX_GONE_ROWS, fingerprint, make_cluster_model


def event(kind: str, t: float, **fields: Any) -> dict[str, Any]:
    e = make_event(kind, **fields)
    e["time"] = t
    return e


def vm(name: str, t: float, role: str = "worker", spot: bool = True) -> list[dict[str, Any]]:
    fields = {"worker": name, "role": role, "gpu": "t4" if role == "worker" else None,
              "zone": "us-central1-a", "spot": spot, "price": 0.22 if spot else 0.57,
              "price_on_demand": 0.73}  # fmt: skip
    return [event(k, t, **fields) for k in ("requested", "provisioning", "running", "joined")]


ENTRY = {"name": "demo", "backend": "local", "scheduler_address": "tcp://127.0.0.1:1", "pid": 1}


def run(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        event("started", 0.0, cluster="demo", workers=2, time_scale=1.0, catalog="gce-2025"),
        *vm("ps-0", 0.0, role="ps", spot=False),
        *vm("w-0", 0.0),
        *vm("w-1", 0.0),
        *extra,
    ]


def test_workers_counts_costs_and_preemptions() -> None:
    events = run(
        event("notice", 50.0, worker="w-0"),
        event("preempted", 51.0, worker="w-0", notice=True),
        event("replacement-requested", 51.0, worker="w-0"),
        *vm("w-2", 52.0),
        event("scale", 60.0, workers=3),
        event(
            "requested",
            60.0,
            worker="w-3",
            role="worker",
            gpu="t4",
            zone="us-central1-a",
            spot=True,
            price=0.22,
            price_on_demand=0.73,
        ),
    )
    m = make_cluster_model(ENTRY, events, now=3600.0)
    assert [w["name"] for w in m["workers"]] == ["ps-0", "w-1", "w-2", "w-3", "w-0"]
    assert m["workers"][-1]["state"] == "preempted"
    assert m["counts"] == {"joined": 2, "requested": 1}
    assert m["target_workers"] == 3
    assert m["preemptions"] == 1
    cost = m["cost"]
    assert cost["cost"] < cost["cost_on_demand"]
    assert cost["saved"] == pytest.approx(cost["cost_on_demand"] - cost["cost"])
    assert cost["rate_per_hour"] == pytest.approx(0.57 + 0.22 + 0.22)  # ps-0, w-1, w-2 run now
    # Each figure written by the one formatter every surface uses: the panel shows these strings.
    assert cost["text"] == {
        "cost": format.money(cost["cost"]),
        "cost_on_demand": format.money(cost["cost_on_demand"]),
        "saved": format.money(cost["saved"]),
        "saved_fraction": format.percent(cost["saved_fraction"]),
        "rate_per_hour": format.rate(cost["rate_per_hour"]),
        "rate_on_demand_per_hour": format.rate(cost["rate_on_demand_per_hour"]),
    }
    assert cost["text"]["rate_per_hour"] == "$1.010/h"
    assert m["training"] is None
    assert m["status"] == "running"


def test_training_step_accuracy_and_eta() -> None:
    events = run(
        event("train-started", 10.0, run="r1", model="resnet32", steps=1000),
        event("metrics", 20.0, run="r1", step=100, loss=2.0, img_per_s=500.0, active_workers=2),
        event("eval", 25.0, run="r1", step=150, accuracy=0.42),
        event("metrics", 30.0, run="r1", step=200, loss=1.5, img_per_s=520.0, active_workers=2),
    )
    t = make_cluster_model(ENTRY, events, now=31.0)["training"]
    assert t["step"] == 200 and t["steps"] == 1000
    assert t["accuracy"] == 0.42
    assert t["eta_s"] == pytest.approx(80.0)  # 800 steps left at 10 steps/s
    assert t["finished"] is False
    assert t["text"] == format.training_text(t)
    assert t["text"] == (
        f"Training: resnet32 · step 200/1,000 · accuracy 42.0% · ETA {format.duration(80.0)}"
    )

    events.append(event("train-finished", 40.0, run="r1", reason="steps", step=1000, accuracy=0.9))
    t = make_cluster_model(ENTRY, events, now=41.0)["training"]
    assert t["finished"] and t["eta_s"] == 0 and t["accuracy"] == 0.9 and t["step"] == 1000
    assert t["text"].endswith("· finished (steps)")


def test_training_shows_the_model_its_size_and_each_metric() -> None:
    events = run(
        event("train-started", 10.0, run="r1", model="Net", parameters=385, steps=100),
        event("eval", 25.0, run="r1", step=50, accuracy=None, metrics={"mae": 0.3, "mse": 0.2}),
    )
    t = make_cluster_model(ENTRY, events, now=31.0)["training"]
    assert (t["model"], t["parameters"]) == ("Net", 385)
    assert t["metrics"] == {"mae": 0.3, "mse": 0.2} and t["accuracy"] is None
    assert t["text"].startswith(
        f"Training: {format.model_text('Net', 385)} · step 0/100 · "
        f"{format.metrics_text({'mae': 0.3, 'mse': 0.2})}"
    )


def test_gone_vms_are_bounded() -> None:
    extra = []
    for i in range(2, 2 + 3 * MAX_GONE_ROWS):
        extra += [*vm(f"w-{i}", float(i)), event("preempted", i + 0.5, worker=f"w-{i}")]
    m = make_cluster_model(ENTRY, run(*extra), now=100.0)
    gone = [w for w in m["workers"] if w["state"] == "preempted"]
    assert len(gone) == MAX_GONE_ROWS
    assert gone[0]["name"] == f"w-{1 + 3 * MAX_GONE_ROWS}"  # the latest first
    assert m["preemptions"] == 3 * MAX_GONE_ROWS
    # The line that stands for all of them, not only the rows kept: counts and money.
    spent = sum(w["cost"] for w in m["workers"] if w["state"] == "preempted")
    assert m["gone"]["preempted"] == 3 * MAX_GONE_ROWS and m["gone"]["given_back"] == 0
    assert m["gone"]["cost"] > spent > 0
    assert m["gone"]["text"] == f"{3 * MAX_GONE_ROWS} preempted, ${m['gone']['cost']:,.3f}"
    assert m["gone"]["text"] == format.gone_text(m["gone"])
    assert make_cluster_model(ENTRY, run(), now=100.0)["gone"] is None


def test_stale_cluster_stops_billing_at_its_last_event() -> None:
    events = run(event("metrics", 600.0, run="x", step=1))
    a = make_cluster_model(ENTRY, events, status="stale")
    b = make_cluster_model(ENTRY, events, status="stale")
    assert a["cost"] == b["cost"]
    assert a["updated"] == 600.0


def test_fingerprint_ignores_clocks_but_not_events() -> None:
    events = run()
    a = make_cluster_model(ENTRY, events, now=100.0)
    b = make_cluster_model(ENTRY, events, now=101.0)
    assert fingerprint([a]) == fingerprint([b])
    c = make_cluster_model(ENTRY, [*events, event("notice", 101.0, worker="w-0")], now=101.0)
    assert fingerprint([a]) != fingerprint([c])


def test_model_is_plain_json() -> None:
    import json

    m = make_cluster_model(ENTRY, run(), now=100.0)
    text = json.dumps(m, allow_nan=False)  # NaN would break the browser's JSON.parse
    assert json.loads(text)["workers"][0]["gpu"] is None  # the PS host has no GPU


def test_a_mixed_cluster_shows_its_mix_each_workers_type_and_cost_per_type() -> None:
    def typed(name: str, gpu: str, price: float) -> list[dict[str, Any]]:
        return [{**e, "gpu": gpu, "price": price} for e in vm(name, 0.0)]

    events = [
        event(
            "started",
            0.0,
            cluster="demo",
            gpu="k80",
            workers=3,
            mix={"k80": 2, "v100": 1},
            time_scale=1.0,
            catalog="paper-2019",
        ),
        *vm("ps-0", 0.0, role="ps", spot=False),
        *typed("w-0", "k80", 0.256),
        *typed("w-1", "k80", 0.256),
        *typed("w-2", "v100", 0.861),
        event("scale", 60.0, workers=4, mix={"k80": 2, "v100": 2}),
    ]
    m = make_cluster_model(ENTRY, events, now=3600.0)
    assert m["mix"] == {"k80": 2, "v100": 2} and m["target_workers"] == 4
    assert {w["name"]: w["gpu"] for w in m["workers"] if w["role"] == "worker"} == {
        "w-0": "k80",
        "w-1": "k80",
        "w-2": "v100",
    }
    by_gpu = m["cost_by_gpu"]
    assert by_gpu["k80"] == {
        "vms": 2,
        "cost": pytest.approx(2 * 0.256),
        "text": format.money(by_gpu["k80"]["cost"]),
    }
    assert by_gpu["v100"]["cost"] == pytest.approx(0.861)
    assert sum(r["cost"] for r in by_gpu.values()) == pytest.approx(m["cost"]["cost"])
    # A record from before mixes: its one type and count.
    old = make_cluster_model(ENTRY, run(), now=60.0)
    assert old["mix"] is None  # its started event names no GPU type
