"""Tests for transient_nb.deploy.cluster: settings refused before anything starts, names taken."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask.config
import pytest
import yaml

from tests.conftest import (
    child_pids,
)
from transient_nb import TransientCluster
from transient_nb.deploy import registry


# -- bad input: a clear error, and nothing starts --------------------------------------------------
def _catalog_without_t4(tmp_path: Path) -> str:
    path = tmp_path / "no-t4.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "no-t4",
                "regions": {
                    "us-central1": {
                        "zones": ["us-central1-a"],
                        "gpus": {"l4": {"on_demand": 0.56, "spot": 0.22}},
                        "machines": {
                            "n1-standard-8": {"on_demand": 0.38, "spot": 0.08},
                            "n1-standard-4": {"on_demand": 0.19, "spot": 0.04},
                        },
                    }
                },
            }
        )
    )
    return str(path)


def _malformed_trace(tmp_path: Path) -> str:
    path = tmp_path / "trace.txt"
    path.write_text("1s,w-0\n2s w-1\n")
    return f"trace:{path}"


BAD_INPUT = [
    ({"gpu": "h100"}, ValueError, r"Unknown GPU type 'h100'.*a100-40gb, l4, p100, t4, v100"),
    ({"zone": "mars-1a"}, ValueError, r"Unknown zone 'mars-1a'.*us-central1-a, us-central1-b"),
    ({"workers": 0}, ValueError, r"workers=0 must be a whole number of at least 1"),
    ({"workers": -1}, ValueError, r"workers=-1 must be"),
    ({"workers": 2.5}, ValueError, r"workers=2.5 must be"),
    ("malformed-trace", ValueError, r"Malformed line 2 in preemption trace"),
    ("catalog-without-t4", ValueError, r"Unknown GPU type 't4'.*catalog 'no-t4'.*use one of l4"),
    ({"backend": "azure"}, ValueError, r"Unknown backend 'azure': use 'local' or 'gce'"),
    ({"preemption": "exp:mean=-1s"}, ValueError, r"Bad exponential preemption spec 'exp:mean=-1s'"),
    ({"preemption": "chaos"}, ValueError, r"Unknown preemption spec 'chaos'"),
    (
        {"preemption": "zones:us-east1-c=exp:mean=60s;*=none"},
        ValueError,
        r"names zone 'us-east1-c', where this cluster places no worker: its zones are "
        r"us-central1-a \(add it to fallback_zones",
    ),
    ({"name": "My Cluster"}, ValueError, r"Cluster name 'My Cluster' is not allowed"),
    ({"name": "-x"}, ValueError, r"Cluster name '-x' is not allowed"),
    ({"time_scale": 0}, ValueError, r"time_scale=0 must be positive"),
    ({"notice": "-5s"}, ValueError, r"notice='-5s' must be a non-negative duration"),
    ({"provisioning_delay": "soon"}, ValueError, r"Bad provisioning delay 'soon'"),
    ({"replace_at": "never"}, ValueError, r"replace_at='never'"),
    ({"fallback_zones": ["nowhere-1a"]}, ValueError, r"Unknown zone 'nowhere-1a'"),
    ({"fallback_gpus": ["tpu"]}, ValueError, r"Unknown GPU type 'tpu'"),
    ({"machine_type": "n9-huge"}, ValueError, r"Unknown machine type 'n9-huge'"),
    ({"nthreads": 0}, ValueError, r"nthreads=0 must be at least 1"),
    ({"ps_hosts": 0}, ValueError, r"ps_hosts=0 must be a whole number of at least 1"),
    ({"ps_hosts": "two"}, ValueError, r"ps_hosts='two' must be a whole number"),
    ({"cuda": "sometimes"}, ValueError, r"Bad cuda='sometimes'"),
    ({"wokers": 3}, TypeError, r"wokers"),
    # Limits (transient_nb.limits), refused before any spend.
    ({"workers": 65}, ValueError, r"65 workers is above max_workers=64.*max_workers=65"),
    ({"workers": 5, "max_workers": 4}, ValueError, r"5 workers is above max_workers=4"),
    ({"max_workers": 0}, ValueError, r"max_workers=0 must be a whole number"),
    ({"workers": 8, "max_hourly_cost": 1.0}, ValueError, r"above max_hourly_cost=\$1.00/h"),
    # Every PS host is billed: 1 worker ($0.22/h) and 4 PS hosts ($0.19/h each) is $0.98/h.
    (
        {"workers": 1, "ps_hosts": 4, "max_hourly_cost": 0.9},
        ValueError,
        r"\$0.98/h .*plus \$0.760/h for the PS hosts",
    ),
    ({"max_hourly_cost": -2}, ValueError, r"max_hourly_cost=-2 must be a positive number"),
    # Priced at the dearest placement allowed: here the on-demand fallback.
    (
        {"workers": 2, "max_hourly_cost": 1.0, "on_demand_fallback": True},
        ValueError,
        r"\$0.730/h each at the dearest allowed placement.*at most 1 workers",
    ),
    # Mixed GPU types (transient_nb.catalog.mix): every mistake named before anything starts.
    ({"workers": {}}, ValueError, r"workers=\{\} asks for no workers"),
    ({"workers": {"t4": -1}}, ValueError, r"t4=-1 is not a number of workers"),
    ({"workers": {"t4": 1, "tpu": 1}}, ValueError, r"Unknown GPU type 'tpu'"),
    # gce-2025 (the default catalog) has no price for a retired K80.
    ({"workers": "k80=2,t4=1"}, ValueError, r"Unknown GPU type 'k80' in us-central1-a"),
    ({"workers": {"t4": 1, "v100": 1}, "gpu": "l4"}, ValueError, r"gpu='l4' is not in"),
    ({"workers": {"t4": 40, "v100": 30}}, ValueError, r"70 workers is above max_workers=64"),
    (
        {"workers": {"t4": 1, "v100": 2}, "max_hourly_cost": 2.0},
        ValueError,
        r"3 workers could cost \$2\.\d\d/h.*above max_hourly_cost",
    ),
    ({"budget": 0}, ValueError, r"budget=0 must be a positive number of dollars"),
    ({"deadline": "soon"}, ValueError, r"deadline='soon' must be a positive duration"),
    ({"join_timeout": "-1s"}, ValueError, r"join_timeout='-1s' must be a positive duration"),
]


@pytest.mark.parametrize(
    "kwargs, exc, match", BAD_INPUT, ids=[str(k)[:40] for k, _, _ in BAD_INPUT]
)
def test_bad_input_starts_nothing(kwargs: Any, exc: type, match: str, tmp_path: Path) -> None:
    if kwargs == "malformed-trace":
        kwargs = {"preemption": _malformed_trace(tmp_path)}
    elif kwargs == "catalog-without-t4":
        kwargs = {"prices": _catalog_without_t4(tmp_path)}
    before = child_pids()
    with pytest.raises(exc, match=match):
        TransientCluster(**{"provisioning_delay": 0, **kwargs})
    assert child_pids() - before == set()
    assert registry.entries() == []
    assert not (tmp_path / "runs").exists()


def test_name_of_a_running_cluster_is_taken(tmp_path: Path) -> None:
    registry.register("taken", {"scheduler_address": "tcp://127.0.0.1:1"})  # this process: alive
    before = child_pids()
    with pytest.raises(ValueError, match=r"'taken' is already running \(kernel pid \d+\)"):
        TransientCluster(name="taken", provisioning_delay=0)
    assert child_pids() - before == set()
    assert registry.lookup("taken")["scheduler_address"] == "tcp://127.0.0.1:1"
    assert not (tmp_path / "runs").exists()


def test_the_scheduler_runs_with_cluster_dask_and_the_kernel_keeps_its_own_settings() -> None:
    """transient.cluster-dask reaches the scheduler this process builds (rarer event-loop checks
    and system samples), and nothing else of this process: the user's own settings stay."""
    with TransientCluster(workers=1, provisioning_delay=0) as cluster:
        callbacks = cluster.scheduler.periodic_callbacks
        assert callbacks["tick"].callback_time == 500 and callbacks["monitor"].callback_time == 2000
        assert dask.config.get("distributed.admin.tick.interval") == "20ms"
        assert dask.config.get("distributed.admin.system-monitor.interval") == "500ms"
    faster = {"transient.cluster-dask.distributed.admin.tick.interval": "50ms"}
    with dask.config.set(faster), TransientCluster(workers=1, provisioning_delay=0) as cluster:
        assert cluster.scheduler.periodic_callbacks["tick"].callback_time == 50
