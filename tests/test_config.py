"""Tests for transient_nb.config: defaults, schema, precedence."""

from __future__ import annotations

from typing import Any

import dask.config
import jsonschema
import pytest
import yaml

from transient_nb import TransientCluster, config
from transient_nb.catalog.prices import PriceCatalog


def _load(path: str) -> dict[str, Any]:
    with open(path) as f:
        return yaml.safe_load(f)


def test_defaults_file_matches_schema() -> None:
    """Every key of transient.yaml is in the schema and vice versa (distributed's test_config)."""
    defaults = _load(config.DEFAULTS_FILE)
    schema = _load(config.SCHEMA_FILE)

    def walk(conf: dict[str, Any], sch: dict[str, Any], path: str) -> None:
        keys = set(conf)
        described = set(sch["properties"])
        assert keys - described == set(), f"{path}: keys missing from the schema"
        assert described - keys == set(), f"{path}: schema keys missing from transient.yaml"
        for key, value in conf.items():
            sub = sch["properties"][key]
            if isinstance(value, dict):
                assert sub.get("type") == "object", f"{path}.{key} should be an object"
                walk(value, sub, f"{path}.{key}")
            else:
                assert "properties" not in sub, f"{path}.{key} is a leaf in transient.yaml"
                assert sub.get("description"), f"{path}.{key} has no description"

    walk(defaults, schema, "")
    jsonschema.validate(defaults, schema)


def test_every_default_key_is_commented() -> None:
    """House style: a comment above every key of the defaults file."""
    with open(config.DEFAULTS_FILE) as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if i == 0 or not stripped or stripped.startswith("#"):
            continue
        assert lines[i - 1].strip().startswith("#") or stripped.endswith(":"), (
            f"line {i + 1} of transient.yaml ({stripped!r}) has no comment"
        )


def test_schema_rejects_bad_values() -> None:
    schema = _load(config.SCHEMA_FILE)
    bad = _load(config.DEFAULTS_FILE)
    bad["transient"]["workers"] = 0
    with pytest.raises(jsonschema.ValidationError, match=r"workers|minimum"):
        jsonschema.validate(bad, schema)


def test_defaults_are_registered() -> None:
    assert dask.config.get("transient.backend") == "local"
    assert dask.config.get("transient.replacement.at") == "preempted"
    assert config.get("prices.catalog") == "gce-2025"


def test_get_precedence() -> None:
    """Explicit argument > dask config > default."""
    assert config.get("gpu") == "t4"
    with dask.config.set({"transient.gpu": "v100"}):
        assert config.get("gpu") == "v100"
        assert config.get("gpu", override_with="l4") == "l4"
    assert config.get("gpu") == "t4"
    # False and 0 are explicit values, not "missing".
    with dask.config.set({"transient.spot": True}):
        assert config.get("spot", override_with=False) is False


def test_cluster_reads_config_without_starting(tmp_path: Any) -> None:
    """TransientCluster takes config values where no argument is given; arguments win.

    A bad explicit name makes __init__ fail after every setting was read but before anything
    starts, so precedence is visible without a cluster: a GPU type the config names but the
    catalog lacks fails, an explicit one that the catalog has does not.
    """
    with dask.config.set({"transient.gpu": "no-such-gpu"}):
        with pytest.raises(ValueError, match="no-such-gpu"):
            TransientCluster(name="Bad Name")
        with pytest.raises(ValueError, match="Cluster name 'Bad Name'"):
            TransientCluster(gpu="v100", name="Bad Name")
    with dask.config.set({"transient.prices.catalog": "paper-2019"}):
        # The paper's catalog has no t4 (the default GPU): the config's catalog was used.
        with pytest.raises(ValueError, match=r"Unknown GPU type 't4'.*catalog 'paper-2019'"):
            TransientCluster(name="Bad Name")
        # An explicit catalog wins over the config.
        with pytest.raises(ValueError, match="Cluster name"):
            TransientCluster(prices=PriceCatalog.load("gce-2025"), name="Bad Name")
    with dask.config.set({"transient.workers": 0}):
        with pytest.raises(ValueError, match="workers=0"):
            TransientCluster(name="Bad Name")
        with pytest.raises(ValueError, match="Cluster name"):
            TransientCluster(workers=3, name="Bad Name")
