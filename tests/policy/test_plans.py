"""What plans are made of: kinds of worker from a price catalog, configurations, and the fields
of a plan in the policy's events."""

from __future__ import annotations

import math

from tests.policy.policy_helpers import K80, K80_OD, P100, P100_OD, V100
from transient_nb.catalog.prices import PriceCatalog
from transient_nb.policy.plans import (
    Configuration,
    Estimate,
    Plan,
    kinds_from_catalog,
    plan_fields,
)


def test_a_configuration_drops_empty_kinds_orders_them_by_name_and_describes_itself():
    """Two mappings of the same workers are one configuration (the frontier deduplicates on
    it), and its description is what the policy's panels and reasons show."""
    config = Configuration.of({V100: 1, K80: 2, K80_OD: 0})
    assert config.workers == ((K80, 2), (V100, 1))
    assert config == Configuration.of({K80: 2, V100: 1})
    assert config.describe() == "2 k80 in us-central1-a + 1 v100 in us-central1-a, 1 PS shard"
    assert Configuration.of({K80_OD: 1}, 2).describe() == (
        "1 k80 in us-central1-a (on demand), 2 PS shards"
    )
    assert Configuration.of({}, 3).describe() == "no workers, 3 PS shards"


def test_plan_fields_round_what_the_policy_event_shows_and_never_write_infinity():
    """The ``policy-decision`` event is JSON: four decimals (one for seconds), and None where
    nothing would ever finish."""
    config = Configuration.of({P100: 1, P100_OD: 2}, 2)
    estimate = Estimate(config, 12.3456789, 3.1415926, 1234.5678, 0.98765432, 64_000)
    fields = plan_fields(Plan("budget", estimate, None, "why", False))
    assert fields == {
        "goal": "budget",
        "workers": {"p100@us-central1-a": 1, "p100@us-central1-a:on-demand": 2},
        "shards": 2,
        "liveput": 12.3457,
        "hourly": 3.1416,
        "eta_s": 1234.6,
        "expected_cost": 0.9877,
        "feasible": False,
        "reason": "why",
    }
    never = Estimate(config, 0.0, 3.0, math.inf, math.inf)
    fields = plan_fields(Plan("deadline", never, None, "why"))
    assert fields["eta_s"] is None and fields["expected_cost"] is None
    assert fields["feasible"] is True


def test_kinds_come_from_the_price_catalog():
    catalog = PriceCatalog.load("paper-2019")
    kinds = kinds_from_catalog(catalog, ["k80", "v100", "nope"], ["us-central1-a"], "n1-standard-4")
    assert [k.gpu for k in kinds] == ["k80", "v100"]
    assert all(k.spot and k.hourly > 0 for k in kinds)


def test_kinds_skip_what_the_catalog_does_not_price_wherever_it_comes():
    """An unknown GPU type or zone first in the lists does not hide the known ones."""
    catalog = PriceCatalog.load("paper-2019")
    kinds = kinds_from_catalog(catalog, ["nope", "k80"], ["us-central1-a"], "n1-standard-4")
    assert [(k.gpu, k.zone) for k in kinds] == [("k80", "us-central1-a")]
