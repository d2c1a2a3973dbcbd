"""Tests for transient_nb.deploy.ps_hosts: more PS hosts, billed, and what is refused."""

from __future__ import annotations

import pytest

from tests.conftest import (
    index_of,
    of_kind,
)
from tests.deploy.cluster_helpers import (
    snapshot,
)
from transient_nb import TransientCluster


def test_scale_ps_adds_billed_ps_hosts_and_refuses_what_it_cannot_do(cleanup: None) -> None:
    # 1 T4 ($0.22/h) and 2 PS hosts ($0.19/h each) fit under $0.65/h; a third PS host does not.
    with TransientCluster(
        workers=1, provisioning_delay=0, max_hourly_cost=0.65, name="more-ps"
    ) as cluster:
        for bad, match in [
            (0, r"scale_ps: n=0 must be a whole number of at least 1"),
            ("2", r"scale_ps: n='2' must be a whole number"),
            (9, r"scale_ps\(9\): at most 4 PS hosts"),
            (3, r"above max_hourly_cost=\$0.65/h"),
        ]:
            with pytest.raises(ValueError, match=match):
                cluster.scale_ps(bad)
        assert cluster.ps_hosts == 1 and of_kind(snapshot(cluster), "ps-hosts") == []
        cluster.scale_ps(2)
        cluster.wait_for_workers(timeout=120)  # the PS hosts count too
        with pytest.raises(ValueError, match=r"cannot give back a shard's host"):
            cluster.scale_ps(1)
        events = snapshot(cluster)
        i = index_of(events, "ps-hosts", hosts=2, hosts_from=1)
        assert index_of(events, "joined", i, worker="ps-1", role="ps") > i
        billed = cluster.cost().per_vm
    assert (billed.loc[["ps-0", "ps-1"], "cost"] > 0).all()


def test_a_ps_move_that_would_break_max_hourly_cost_is_refused_before_anything(
    cleanup: None,
) -> None:
    """The new PS hosts of a move run beside the old ones until the run has moved: both count."""
    # 1 T4 and 1 PS host fit under $0.50/h; a second PS host for the move does not.
    with TransientCluster(
        workers=1,
        provisioning_delay=0,
        max_hourly_cost=0.5,
        fallback_zones=["us-east1-c"],
        name="move-cap",
    ) as cluster:
        cluster.wait_for_workers(timeout=120)
        with pytest.raises(ValueError, match=r"move_ps\('us-east1-c'\).*above max_hourly_cost"):
            cluster.move_ps("us-east1-c")
        events = snapshot(cluster)
        assert cluster.ps_move_zone is None and of_kind(events, "ps-move") == []
        assert not of_kind(events, "requested", worker="ps-1")
