"""Tests for transient_nb.catalog.prices: shipped and custom catalogs, lookups, clear errors."""

from __future__ import annotations

from pathlib import Path

import dask.config
import pytest
import yaml

from transient_nb.catalog.prices import Price, PriceCatalog, shipped_catalogs

CUSTOM = {
    "name": "tiny",
    "date": "2030-01-01",
    "source": "a test",
    "billing": {"minimum": 30, "increment": 1},
    "regions": {
        "moon-1": {
            "zones": ["moon-1-a", "moon-1-b"],
            "gpus": {"x1": {"on_demand": 2.0, "spot": 0.5}},
            "machines": {"m4": {"on_demand": 0.2, "spot": 0.1}},
        }
    },
}


def test_shipped_catalogs() -> None:
    assert shipped_catalogs() == ["gce-2025", "paper-2019"]
    gce = PriceCatalog.load("gce-2025")
    assert gce.date == "2025-06-01"
    assert gce.minimum_s == 60 and gce.increment_s == 1
    assert "us-central1-a" in gce.zones() and "us-west1-c" in gce.zones()
    assert gce.gpus() == ["a100-40gb", "l4", "p100", "t4", "v100"]
    paper = PriceCatalog.load("paper-2019")
    assert paper.gpus() == ["k80", "p100", "v100"]


def test_default_catalog_comes_from_config() -> None:
    assert PriceCatalog.load().name == "gce-2025"
    with dask.config.set({"transient.prices.catalog": "paper-2019"}):
        assert PriceCatalog.load().name == "paper-2019"
        assert PriceCatalog.load("gce-2025").name == "gce-2025"


def test_worker_price_adds_machine_and_gpu() -> None:
    gce = PriceCatalog.load("gce-2025")
    p = gce.worker_price("t4", "n1-standard-8", "us-central1-a")
    assert p.on_demand == pytest.approx(0.35 + 0.38)
    assert p.spot == pytest.approx(0.14 + 0.08)
    assert p.rate(spot=True) == p.spot and p.rate(spot=False) == p.on_demand
    # No GPU: the machine alone (the PS host).
    assert gce.worker_price(None, "n1-standard-4", "us-east1-b") == Price(0.19, 0.04)
    # The paper's prices are whole-VM prices: the worker machine costs nothing extra.
    paper = PriceCatalog.load("paper-2019")
    assert paper.worker_price("k80", "n1-standard-8", "us-east1-c") == Price(0.723, 0.256)


def test_unknown_names_list_known_ones() -> None:
    gce = PriceCatalog.load("gce-2025")
    with pytest.raises(ValueError, match=r"Unknown GPU type 'h900'.*a100-40gb, l4, p100, t4, v100"):
        gce.gpu_price("h900", "us-central1-a")
    with pytest.raises(ValueError, match=r"Unknown zone 'mars-1a'.*us-central1-a, us-central1-b"):
        gce.region("mars-1a")
    with pytest.raises(ValueError, match=r"Unknown machine type 'n9'.*n1-standard-4"):
        gce.machine_price("n9", "us-central1-a")
    with pytest.raises(ValueError, match=r"Unknown price catalog 'gce-1999'.*gce-2025, paper-2019"):
        PriceCatalog.load("gce-1999")


def test_custom_catalog_file(tmp_path: Path) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(CUSTOM))
    cat = PriceCatalog.load(str(path))
    assert cat.name == "tiny" and cat.date == "2030-01-01" and cat.minimum_s == 30
    assert cat.zones() == ["moon-1-a", "moon-1-b"]
    assert cat.worker_price("x1", "m4", "moon-1-b") == Price(2.2, 0.6)
    with pytest.raises(ValueError, match=r"Unknown GPU type 't4' in moon-1-a.*use one of x1"):
        cat.gpu_price("t4", "moon-1-a")


def test_malformed_catalog(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump({"regions": {"r": {"gpus": {}}}}))  # no zones
    with pytest.raises(ValueError, match=r"broken.yaml.*is malformed.*zones"):
        PriceCatalog.load(str(path))
    path.write_text(
        yaml.safe_dump({"regions": {"r": {"zones": ["z"], "gpus": {"g": {"spot": "cheap"}}}}})
    )
    with pytest.raises(ValueError, match="is malformed"):
        PriceCatalog.load(str(path))


# -- edges found by mutation testing (benchmarks/mutation.py) ------------------------------------
def test_a_minimal_catalog_gets_the_documented_defaults() -> None:
    cat = PriceCatalog.from_dict({"regions": {"r1": {"zones": ["r1-a"]}}}, origin="mine.yaml")
    assert (cat.name, cat.date, cat.source) == ("mine.yaml", "undated", "mine.yaml")
    assert (cat.minimum_s, cat.increment_s) == (60.0, 1.0)  # GCE's billing
    assert cat.regions["r1"].name == "r1" and cat.regions["r1"].zones == ("r1-a",)
    assert cat.regions["r1"].gpus == {} and cat.regions["r1"].machines == {}
    assert cat.region("r1-a").name == "r1"
    assert PriceCatalog.from_dict({"regions": {}}).name == "<dict>"
    # A region that prices nothing says so.
    with pytest.raises(
        ValueError,
        match=r"Unknown GPU type 't4' in r1-a \(catalog 'mine.yaml'\): use one of none, or load a price catalog that lists it\.",
    ):
        cat.gpu_price("t4", "r1-a")
    with pytest.raises(
        ValueError,
        match=r"Unknown machine type 'm4' in r1-a \(catalog 'mine.yaml'\): use one of none, or load",
    ):
        cat.machine_price("m4", "r1-a")


def test_billing_section_is_read() -> None:
    data = {**CUSTOM, "billing": {"minimum": 30, "increment": 5}}
    cat = PriceCatalog.from_dict(data)
    assert (cat.minimum_s, cat.increment_s) == (30.0, 5.0)
    assert cat.source == "a test"


def test_machine_types_are_listed_in_the_error() -> None:
    machines = {"m8": {"on_demand": 0.4, "spot": 0.2}, "m4": {"on_demand": 0.2, "spot": 0.1}}
    region = {"zones": ["moon-1-a"], "gpus": {"x1": {"on_demand": 2.0, "spot": 0.5}}}
    data = {"regions": {"moon-1": {**region, "machines": machines}}}
    cat = PriceCatalog.from_dict(data)
    with pytest.raises(ValueError, match=r"use one of m4, m8, or load a price catalog"):
        cat.machine_price("m2", "moon-1-a")
    with pytest.raises(ValueError, match=r"use one of x1, or load a price catalog that lists it\."):
        cat.gpu_price("t4", "moon-1-a")


def test_malformed_catalog_error_says_what_is_wrong_and_what_is_needed() -> None:
    with pytest.raises(ValueError) as info:
        PriceCatalog.from_dict({"regions": {"r": {"gpus": {}}}}, origin="broken.yaml")
    assert str(info.value) == (
        "Price catalog 'broken.yaml' is malformed (KeyError: 'zones'); it needs "
        "'regions: {REGION: {zones: [...], gpus: {GPU: {on_demand: X, spot: Y}}, "
        "machines: {...}}}' as in transient_nb/catalog/gce-2025.yaml."
    )


def test_catalogs_carry_each_gpus_published_peak() -> None:
    for name in shipped_catalogs():
        catalog = PriceCatalog.load(name)
        assert set(catalog.gpus()) <= set(catalog.peaks), name  # every priced type has one
    gce = PriceCatalog.load("gce-2025")
    assert gce.peak_tflops("V100") == 15.7 and gce.peak_tflops("k80") == 4.37
    assert PriceCatalog.from_dict(CUSTOM).peak_tflops("x1") is None  # none given: none known
    custom = PriceCatalog.from_dict({**CUSTOM, "peaks": {"x1": 12.5}})
    assert custom.peak_tflops("x1") == 12.5
