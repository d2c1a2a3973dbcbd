"""Tests for transient_nb.server.manager: the ClusterManager alone, without a Jupyter server.

The routes' tests (tests/server/test_handlers.py) drive it through a real server, with clusters;
the models it serves are tests/server/test_model.py's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from transient_nb.deploy import registry
from transient_nb.server.manager import ClusterManager, ClusterNotFound


def test_with_no_cluster_the_list_is_empty_and_a_name_is_not_found() -> None:
    async def look() -> None:
        manager = ClusterManager()
        try:
            assert await manager.list_clusters() == []
            with pytest.raises(ClusterNotFound, match=r"named 'demo' \(known: none\)"):
                await manager.get_cluster("demo")
            with pytest.raises(ClusterNotFound, match=r"named 'demo' \(known: none\)"):
                await manager.scale("demo", 2)
        finally:
            await manager.close()

    asyncio.run(look())


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ([1, 2], "as a JSON object"),
        ({"colour": "red"}, "Unknown parameter 'colour': use some of name, workers"),
        ({"workers": "2"}, "workers='2' must be a whole number, or a mix such as k80=2,v100=1"),
        ({"spot": 1}, "spot=1 must be true or false"),
        ({"time_scale": True}, "time_scale=True must be a whole number or a number"),
        ({"prices": "/tmp/catalog.yaml"}, "is not one of the packaged price catalogs"),
    ],
)
def test_what_the_form_may_not_send_is_refused_before_any_head_starts(
    params: Any, fragment: str
) -> None:
    manager = ClusterManager()
    with pytest.raises(ValueError) as info:
        asyncio.run(manager.create(params))
    assert fragment in str(info.value)
    assert registry.entries() == [] and manager._starting == {}


def test_the_form_offers_the_configured_catalog_and_the_packaged_ones() -> None:
    options = ClusterManager().options()
    assert options["catalog"] in options["catalogs"]
    assert "t4" in options["gpus"] and "us-central1-a" in options["zones"]
    assert set(options["defaults"]) >= {"workers", "gpu", "zone", "spot", "preemption"}
