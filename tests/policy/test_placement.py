"""Tests for transient_nb.policy.placement: placement order and the memory of stock-outs."""

from __future__ import annotations

import pytest

from transient_nb.policy.placement import Placement, ReplacementPolicy


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_preferred_placement_first_then_zones_then_gpus() -> None:
    policy = ReplacementPolicy(
        "t4",
        "us-central1-a",
        True,
        fallback_zones=["us-central1-b", "us-central1-a"],  # the preferred zone is not repeated
        fallback_gpus=["l4"],
    )
    assert list(policy.candidates()) == [
        Placement("t4", "us-central1-a", True),
        Placement("t4", "us-central1-b", True),
        Placement("l4", "us-central1-a", True),
        Placement("l4", "us-central1-b", True),
    ]


def test_on_demand_fallback_comes_last() -> None:
    policy = ReplacementPolicy("t4", "z-a", True, fallback_zones=["z-b"], on_demand_fallback=True)
    assert list(policy.candidates()) == [
        Placement("t4", "z-a", True),
        Placement("t4", "z-b", True),
        Placement("t4", "z-a", False),
        Placement("t4", "z-b", False),
    ]
    # An on-demand cluster has nothing to fall back to.
    on_demand = ReplacementPolicy("t4", "z-a", False, on_demand_fallback=True)
    assert list(on_demand.candidates()) == [Placement("t4", "z-a", False)]


def test_stockouts_are_remembered_for_a_while() -> None:
    clock = Clock()
    policy = ReplacementPolicy(
        "t4", "z-a", True, fallback_zones=["z-b"], stockout_memory_s=600, clock=clock
    )
    policy.remember_stockout(Placement("t4", "z-a", True))
    assert list(policy.candidates()) == [Placement("t4", "z-b", True)]
    assert policy.stocked_out() == [Placement("t4", "z-a", True)]

    clock.now += 599
    assert next(policy.candidates()) == Placement("t4", "z-b", True)

    clock.now += 2  # the memory has run out: the preferred zone is tried first again
    assert policy.stocked_out() == []
    assert next(policy.candidates()) == Placement("t4", "z-a", True)


def test_everything_stocked_out_leaves_no_candidate() -> None:
    clock = Clock()
    policy = ReplacementPolicy("t4", "z-a", True, fallback_zones=["z-b"], clock=clock)
    for p in list(policy.candidates()):
        policy.remember_stockout(p)
    assert list(policy.candidates()) == []
    # A stock-out of spot capacity says nothing about on-demand.
    policy.on_demand_fallback = True
    assert list(policy.candidates()) == [
        Placement("t4", "z-a", False),
        Placement("t4", "z-b", False),
    ]


def test_policies_do_not_share_memory() -> None:
    a = ReplacementPolicy("t4", "z-a", True)
    b = ReplacementPolicy("t4", "z-a", True)
    a.remember_stockout(Placement("t4", "z-a", True))
    assert list(a.candidates()) == []
    assert list(b.candidates()) == [Placement("t4", "z-a", True)]


def _t4_in_a_or_b(clock: Clock, *, limit: int, window_s: float) -> ReplacementPolicy:
    """Spot T4s in z-a, z-b to fall back to; a zone with ``limit`` preemptions in ``window_s``
    is tried last."""
    return ReplacementPolicy(
        "t4",
        "z-a",
        True,
        fallback_zones=["z-b"],
        preemption_limit=limit,
        preemption_window_s=window_s,
        clock=clock,
    )


def test_a_zone_that_keeps_preempting_is_tried_last_until_the_window_passes() -> None:
    clock = Clock()
    policy = _t4_in_a_or_b(clock, limit=2, window_s=3600)
    policy.record_preemption("t4", "z-a")
    assert next(policy.candidates()) == Placement("t4", "z-a", True)  # one is not a pattern
    clock.now += 10
    policy.record_preemption("t4", "z-a")
    assert list(policy.candidates()) == [Placement("t4", "z-b", True), Placement("t4", "z-a", True)]
    # Another GPU type in the same zone is not affected, nor is a CPU (gpu=None) preemption.
    policy.record_preemption(None, "z-b")
    assert not policy.preempting("v100", "z-a")
    clock.now += 3600
    assert next(policy.candidates()) == Placement("t4", "z-a", True)


def test_leaving_a_stormy_zone_goes_near_the_ps_before_another_region() -> None:
    """The paper: workers in another region than the PS trained up to 48% slower. The
    fallbacks in the PS's region come first, whatever order they were given in."""
    clock = Clock()
    policy = ReplacementPolicy(
        "p100",
        "us-central1-a",
        True,
        fallback_zones=["us-east1-c", "us-central1-b"],
        preemption_limit=3,
        clock=clock,
    )
    assert [p.zone for p in policy.candidates()] == ["us-central1-a", "us-central1-b", "us-east1-c"]
    for _ in range(3):
        policy.record_preemption("p100", "us-central1-a")
    assert [p.zone for p in policy.candidates()] == ["us-central1-b", "us-east1-c", "us-central1-a"]
    # The PS's host runs in us-east1-c (it fell back there): that region first.
    policy.ps_zone = "us-east1-c"
    assert [p.zone for p in policy.candidates()] == ["us-east1-c", "us-central1-b", "us-central1-a"]
    # The zones a cluster may use keep their order (the PS host's own fallbacks).
    assert policy.zones() == ["us-central1-a", "us-east1-c", "us-central1-b"]


def test_a_stockout_is_skipped_for_exactly_its_memory() -> None:
    clock = Clock()
    policy = ReplacementPolicy("t4", "z-a", True, stockout_memory_s=600, clock=clock)
    policy.remember_stockout(Placement("t4", "z-a", True))
    clock.now += 599.5
    assert list(policy.candidates()) == []
    assert policy.stocked_out() == [Placement("t4", "z-a", True)]
    clock.now += 0.5  # 600 s on the dot: tried again
    assert policy.stocked_out() == []
    assert list(policy.candidates()) == [Placement("t4", "z-a", True)]


def test_a_limit_of_one_reorders_at_once_and_the_window_ends_exactly() -> None:
    clock = Clock()
    clock.now = 50_000.0  # a monotonic clock is far from zero
    policy = _t4_in_a_or_b(clock, limit=1, window_s=600)
    policy.record_preemption("t4", "z-a")
    assert list(policy.candidates()) == [Placement("t4", "z-b", True), Placement("t4", "z-a", True)]
    clock.now += 599.5
    assert policy.preempting("t4", "z-a")
    clock.now += 0.5  # the window is over: the preemption no longer counts
    assert not policy.preempting("t4", "z-a")
    assert next(policy.candidates()) == Placement("t4", "z-a", True)


def test_each_type_of_a_mix_has_its_own_preferred_gpu_and_the_same_fallbacks() -> None:
    p = ReplacementPolicy(
        "k80", "us-central1-a", True, fallback_zones=["us-east1-c"], fallback_gpus=["p100"]
    )
    assert [(c.gpu, c.zone) for c in p.candidates("v100")] == [
        ("v100", "us-central1-a"),
        ("v100", "us-east1-c"),
        ("p100", "us-central1-a"),
        ("p100", "us-east1-c"),
    ]
    # The type asked for is never tried twice when it is a fallback too.
    # (nor does the cluster's main type stand in for another type: only the fallbacks do).
    assert [c.gpu for c in p.placements("p100")] == ["p100", "p100"]
    assert [c.gpu for c in p.candidates()] == ["k80", "k80", "p100", "p100"]
    p.remember_stockout(Placement("v100", "us-central1-a", True))
    assert next(p.candidates("v100")) == Placement("v100", "us-east1-c", True)


def test_give_back_first_what_does_no_work_then_the_likeliest_revoked_then_the_newest() -> None:
    from transient_nb.policy.placement import Held, give_back_order

    held = [
        Held("w-0", True, 0.505, 0),  # a K80 22.5 h old: GCE's 24 h limit is near
        Held("w-1", True, 0.017, 1),  # 12 h old
        Held("w-2", True, 0.078, 2),  # in its first, riskiest hour
        Held("w-3", True, 0.078, 3),  # as risky, newer
        Held("w-4", False, 0.0, 4),  # still booting: gives nothing up
        Held("w-5", False, 0.9, 5),
    ]
    order = [h.name for h in give_back_order(held)]
    assert order == ["w-5", "w-4", "w-0", "w-3", "w-2", "w-1"]
    assert give_back_order([]) == []
    # Odds are compared as they are (to 9 digits, so float noise does not beat age), not
    # rounded to a whole 0 or 1: an older worker at 30% goes before a newer one at 10%.
    older, newer = Held("w-6", True, 0.3, 6), Held("w-7", True, 0.1, 7)
    assert [h.name for h in give_back_order([newer, older])] == ["w-6", "w-7"]


def test_what_the_provider_does_not_offer_is_never_a_placement() -> None:
    p = ReplacementPolicy(
        "t4", "us-central1-a", True, fallback_zones=["us-central1-b"], fallback_gpus=["v100"]
    )
    p.not_offered |= {("v100", "us-central1-b")}
    assert [(c.gpu, c.zone) for c in p.candidates()] == [
        ("t4", "us-central1-a"),
        ("t4", "us-central1-b"),
        ("v100", "us-central1-a"),
    ]
    assert ("v100", "us-central1-b") not in {(c.gpu, c.zone) for c in p.placements()}


def test_a_preferred_zone_comes_first_for_its_type_only() -> None:
    p = ReplacementPolicy(
        "t4", "us-central1-a", True, fallback_zones=["us-central1-b", "us-east1-c"]
    )
    p.prefer_zone("v100", "us-east1-c")
    assert p.preferred_zones == {"v100": "us-east1-c"}
    # The type asked for picks its zone (not the policy's own type's), then the fallbacks.
    assert [c.zone for c in p.placements("v100")] == [
        "us-east1-c",
        "us-central1-a",
        "us-central1-b",
    ]
    assert [c.zone for c in p.placements("t4")] == ["us-central1-a", "us-central1-b", "us-east1-c"]
    assert [c.zone for c in p.placements()] == ["us-central1-a", "us-central1-b", "us-east1-c"]


def test_preferring_the_policys_own_zone_forgets_the_preference() -> None:
    p = ReplacementPolicy("t4", "us-central1-a", True, fallback_zones=["us-central1-b"])
    p.prefer_zone("t4", "us-central1-a")  # never preferred: nothing to forget, no error
    assert p.preferred_zones == {}
    p.prefer_zone("t4", "us-central1-b")
    assert p.preferred_zones == {"t4": "us-central1-b"}
    p.prefer_zone("t4", "us-central1-a")
    assert p.preferred_zones == {}
    assert [c.zone for c in p.placements("t4")] == ["us-central1-a", "us-central1-b"]


def test_a_zone_the_cluster_may_not_use_is_refused_with_the_ones_it_may() -> None:
    p = ReplacementPolicy("t4", "us-central1-a", True, fallback_zones=["us-east1-c"])
    with pytest.raises(ValueError) as info:
        p.prefer_zone("t4", "mars-1a")
    assert str(info.value) == (
        "Zone 'mars-1a' is not one this cluster may use: us-central1-a, us-east1-c."
    )
    assert p.preferred_zones == {}


def test_odds_that_differ_past_9_digits_are_equal_and_the_newest_goes_first() -> None:
    from transient_nb.policy.placement import Held, give_back_order

    # 4e-10 is float noise at 9 digits: the older worker's odds do not beat the newer one's age.
    older, newer = Held("w-8", True, 0.1 + 4e-10, 8), Held("w-9", True, 0.1, 9)
    assert [h.name for h in give_back_order([older, newer])] == ["w-9", "w-8"]


def test_a_worker_kept_on_demand_tries_every_on_demand_placement_before_spot() -> None:
    # scale(on_demand=...): better a Spot worker than none, but on demand first, in every zone.
    policy = ReplacementPolicy("t4", "z-a", True, fallback_zones=["z-b"])
    assert list(policy.candidates("t4", on_demand_first=True)) == [
        Placement("t4", "z-a", False),
        Placement("t4", "z-b", False),
        Placement("t4", "z-a", True),
        Placement("t4", "z-b", True),
    ]
    # Without it, a Spot cluster never rents on demand (no on-demand fallback here).
    assert [p.spot for p in policy.candidates("t4")] == [True, True]
    # An on-demand cluster has nothing to put first.
    on_demand = ReplacementPolicy("t4", "z-a", False)
    assert list(on_demand.placements("t4", on_demand_first=True)) == [Placement("t4", "z-a", False)]
