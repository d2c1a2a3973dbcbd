"""Tests for transient_nb.backends.gce.options: the GCE backend's settings, checked before any call."""

from __future__ import annotations

from pathlib import Path

import dask.config
import pytest
from google.auth.credentials import AnonymousCredentials

from transient_nb.backends.gce.backend import GCEBackend
from transient_nb.backends.gce.options import HEAD_PORT, check_cidr


def backend(tmp_path: Path, **kw: object) -> GCEBackend:
    """A backend whose API is never called (nothing here reaches a server)."""
    return GCEBackend(
        str(tmp_path),
        project="p",
        api_endpoint="http://127.0.0.1:9",
        credentials=AnonymousCredentials(),
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("bad", ["203.0.113.7/33", "my laptop", "203.0.113.7/24"])
def test_a_client_cidr_must_be_a_network(bad: str) -> None:
    with pytest.raises(ValueError, match="client-cidr"):
        check_cidr(bad)
    assert check_cidr("2001:db8::1") == "2001:db8::1/128"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            {"provisioning_model": "cheap"},
            r"provisioning_model='cheap': use 'spot' or 'preemptible'",
        ),
        ({"termination_action": "keep"}, r"termination_action='KEEP': use 'DELETE' or 'STOP'"),
        ({"worker_ports": "41000-41099"}, r"worker_ports='41000-41099': give a port or a range"),
        ({"retries": -1}, r"retries=-1 must be 0 or more"),
        ({"scheduler": "remote"}, r"scheduler='remote' is not supported yet"),
        ({"client_cidr": "10.0.0.0/33"}, r"client-cidr"),
    ],
)
def test_every_bad_setting_is_named(tmp_path: Path, kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        backend(tmp_path, **kw)


@pytest.mark.parametrize("wide", ["0.0.0.0/0", "203.0.112.0/23", "2001:db8::/48"])
def test_a_client_cidr_wider_than_a_slash_24_is_refused_unless_forced(
    tmp_path: Path, wide: str
) -> None:
    with pytest.raises(ValueError, match=r"wider than a /(24|64).*allow_wide_client_cidr=True"):
        backend(tmp_path, client_cidr=wide)
    assert backend(tmp_path, client_cidr=wide, allow_wide_client_cidr=True).client_cidr == wide
    with dask.config.set({"transient.gce.allow-wide-client-cidr": True}):
        assert backend(tmp_path, client_cidr=wide).client_cidr == wide
    # A /24 and anything narrower pass as before.
    assert backend(tmp_path, client_cidr="203.0.113.0/24").client_cidr == "203.0.113.0/24"


def test_arguments_win_over_the_config_and_a_head_gets_a_fixed_port(tmp_path: Path) -> None:
    with dask.config.set({"transient.gce.network": "vpc-1", "transient.gce.disk-size-gb": 77}):
        b = backend(tmp_path, disk_size_gb=100)
    assert (b.network, b.disk_size_gb, b.image_project) == ("vpc-1", 100, "p")
    assert b.provisioning_model == "spot" and b.termination_action == "DELETE"
    assert backend(tmp_path, head=True).scheduler_port == HEAD_PORT
