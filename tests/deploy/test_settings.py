"""Tests for transient_nb.deploy.settings: a cluster's settings, checked without a cluster."""

from __future__ import annotations

import dask.config
import pytest

from transient_nb.deploy import registry
from transient_nb.deploy.settings import (
    ClusterSettings,
    check_name,
    is_detached,
    positive_int,
)


def test_defaults_come_from_the_config_and_arguments_win() -> None:
    s = ClusterSettings.from_arguments(name="demo")
    assert s.mix == {"t4": 2} and s.gpu == "t4" and s.spot is True
    assert s.zones == ["us-central1-a"] and s.backend_name == "local"
    with dask.config.set({"transient.workers": 3, "transient.gpu": "l4"}):
        s = ClusterSettings.from_arguments(gpu="t4")
    assert s.mix == {"t4": 3}
    assert len(s.cluster_id) == 12 and s.name.startswith("transient-")


def test_a_mix_and_its_main_type() -> None:
    s = ClusterSettings.from_arguments(workers="k80=2,v100=1", prices="paper-2019")
    assert s.mix == {"k80": 2, "v100": 1} and s.gpu == "k80"
    s = ClusterSettings.from_arguments(
        workers={"k80": 2, "v100": 1}, gpu="V100", prices="paper-2019"
    )
    assert s.gpu == "v100"
    with pytest.raises(ValueError, match=r"gpu='p100' is not in workers='k80=2'"):
        ClusterSettings.from_arguments(workers="k80=2", gpu="p100", prices="paper-2019")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workers": 0}, r"workers=0 must be a whole number of at least 1"),
        ({"workers": True}, r"workers=True must be a whole number"),
        ({"ps_hosts": 0}, r"ps_hosts=0 must be a whole number"),
        ({"gpu": "h100"}, r"h100"),
        ({"time_scale": 0}, r"time_scale=0 must be positive"),
        ({"notice": "-5s"}, r"notice='-5s' must be a non-negative duration"),
        ({"replace_at": "later"}, r"replace_at='later': use 'preempted', 'notice' or 'ahead'"),
        ({"max_workers": 2, "workers": 3}, r"3 workers is above max_workers=2"),
        ({"budget": -1}, r"budget=-1 must be a positive number of dollars"),
        ({"deadline": "soon"}, r"deadline='soon' must be a positive duration"),
        (
            {"preemption": "zones:us-east1-c=exp:mean=60s"},
            r"names zone 'us-east1-c', where this cluster places no worker",
        ),
        ({"name": "Demo"}, r"Cluster name 'Demo' is not allowed"),
    ],
)
def test_every_bad_value_is_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClusterSettings.from_arguments(**kwargs)


def test_a_real_backend_runs_in_real_time() -> None:
    with pytest.raises(ValueError, match=r"time_scale=60 is only for the local backend"):
        ClusterSettings.from_arguments(backend="gce", time_scale=60)


def test_gce_asks_for_replacements_at_the_notice_unless_told() -> None:
    s = ClusterSettings.from_arguments(backend="gce", project="p")
    assert s.replace_at == "notice"
    s = ClusterSettings.from_arguments(backend="gce", project="p", replace_at="preempted")
    assert s.replace_at == "preempted"
    with (
        dask.config.set({"transient.gce.replace-at": "never"}),
        pytest.raises(ValueError, match=r"gce.replace-at='never'"),
    ):
        ClusterSettings.from_arguments(backend="gce", project="p")


def test_the_hourly_cost_counts_the_dearest_placement_and_the_ps_hosts() -> None:
    s = ClusterSettings.from_arguments(
        workers=2, gpu="t4", fallback_gpus=["v100"], max_hourly_cost=1.0, name="c1"
    )
    policy = s.replacement_policy()
    # Two T4s that a stock-out may move to V100s: priced as V100s.
    with pytest.raises(ValueError, match=r"2 workers could cost \$.*above max_hourly_cost"):
        s.check_hourly_cost(policy, s.mix, {})
    cheap = ClusterSettings.from_arguments(workers=1, gpu="t4", max_hourly_cost=0.5, name="c2")
    cheap.check_hourly_cost(cheap.replacement_policy(), cheap.mix, {})
    with pytest.raises(ValueError, match=r"PS hosts"):
        cheap.check_hourly_cost(cheap.replacement_policy(), cheap.mix, {}, ps_hosts=4)


def test_a_name_in_use_is_refused_before_anything_starts() -> None:
    registry.register("taken", {"scheduler_address": "tls://127.0.0.1:1"})  # this process
    with pytest.raises(ValueError, match="taken"):
        ClusterSettings.from_arguments(name="taken")


def test_names() -> None:
    assert check_name("demo-1") == "demo-1"
    for bad in ("demo\n", "1demo", "demo-", "a" * 43, None, "dé"):
        with pytest.raises(ValueError, match="is not allowed"):
            check_name(bad)
    assert positive_int(2, "n") == 2
    with pytest.raises(ValueError, match=r"n=2.0"):
        positive_int(2.0, "n")


def test_detached_by_default_on_gce_only() -> None:
    assert is_detached(None, "gce") and not is_detached(None, "local")
    with dask.config.set({"transient.detached": True}):
        assert is_detached(None, "local")
