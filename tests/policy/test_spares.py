"""Spares ahead of predicted revocations: the rule (transient_nb.policy.spares) and a real cluster."""

from __future__ import annotations

import pytest

from tests.conftest import kinds, of_kind, wait_for_sync
from transient_nb import TransientCluster
from transient_nb.catalog.lifetimes import HOUR, Exponential, PaperLifetimesByGpu
from transient_nb.policy.spares import AHEAD_ODDS, due_for_spare

PAPER = PaperLifetimesByGpu()


@pytest.mark.parametrize(
    ("gpu", "age_h", "lead_s", "due"),
    [
        ("k80", 0, 600, False),  # new
        ("k80", 12, 600, False),  # the curve is flat from 6 to 12 h: no revocation expected
        ("k80", 23.5, 600, False),  # 600 s of the last 1800: 1/3
        ("k80", 24 - 1000 / HOUR, 600, True),  # 600 of the last 1000: 60%
        ("k80", 24 - 300 / HOUR, 600, True),  # past the limit within the lead: certain
        ("v100", 24 - 1000 / HOUR, 600, True),
        ("t4", 24 - 1000 / HOUR, 600, True),  # types the paper did not measure: K80's curve
    ],
)
def test_a_spare_is_due_where_the_paper_curves_make_a_revocation_likely(gpu, age_h, lead_s, due):
    odds = due_for_spare(PAPER, gpu, age_h * HOUR, lead_s)
    assert (odds is not None) == due
    if due:
        assert odds >= AHEAD_ODDS


def test_no_spare_where_the_hazard_does_not_rise_with_age():
    # Memoryless lifetimes: an old worker is no likelier to go than its spare would be, even
    # when both are likely to (a mean of 10 min and a lead of 10 min: 63%).
    storm = Exponential("exp:mean=600s", 600.0)
    assert all(due_for_spare(storm, "k80", h * HOUR, 600) is None for h in (0, 1, 23.9))


@pytest.mark.slow
def test_a_spare_joins_before_the_predicted_revocation_and_nothing_else_is_asked(cleanup):
    """replace_at="ahead": a worker 1 s short of GCE's 24 h limit gets a spare at once; revoked
    while the spare still boots, it is not replaced a second time, and the cluster ends with its
    two workers, the spare in place of the old one."""
    with TransientCluster(
        workers=2, provisioning_delay="2s", replace_at="ahead", name="spares"
    ) as cluster:
        cluster.wait_for_workers(2, timeout=120)
        old = cluster.workers["w-0"]
        old.running_since -= 24 * HOUR - 1  # as if it had run 24 h less a second
        wait_for_sync(lambda: of_kind(cluster.monitor.events, "spare-requested"), timeout=60)
        (spare,) = of_kind(cluster.monitor.events, "spare-requested")
        assert spare["worker"] == "w-0" and spare["gpu"] == "t4" and spare["odds"] == 1.0
        assert 0 < spare["lead_s"] < 60 and spare["age_s"] >= 24 * HOUR - 1
        cluster.preempt("w-0", notice=False)  # the provider's 24 h limit, while the spare boots
        wait_for_sync(lambda: "joined" in kinds(cluster.monitor.events, worker="w-2"), 60)
        wait_for_sync(lambda: "preempted" in kinds(cluster.monitor.events, worker="w-0"), 60)
        events = list(cluster.monitor.events)
        assert not of_kind(events, "replacement-requested")  # the spare took its place
        assert not of_kind(events, "spare-requested", worker="w-1")  # young: no spare
        workers = {e["worker"] for e in of_kind(events, "requested") if e["role"] == "worker"}
        assert workers == {"w-0", "w-1", "w-2"}
        cluster.wait_for_workers(2, timeout=60)
