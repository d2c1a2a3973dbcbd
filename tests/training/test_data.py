"""Tests for transient_nb.training.data."""

from __future__ import annotations

import os

import pytest
import torch

from transient_nb.training import batches, cifar
from transient_nb.training import data as data_module
from transient_nb.training.data import DataSpec, load_dataset, parse_data_spec

torch.set_num_threads(1)

# --------------------------------------------------------------------------- specs


def test_parse_data_spec_accepted_forms() -> None:
    assert parse_data_spec("synthetic") == DataSpec("synthetic", size=10_000)
    assert parse_data_spec("synthetic:500") == DataSpec("synthetic", size=500)
    assert parse_data_spec("digits") == DataSpec("digits")
    url = "gs://bucket/dir/cifar-10-python.tar.gz"
    assert parse_data_spec(f"cifar10:{url}") == DataSpec("cifar10", location=url)
    home = parse_data_spec("cifar10:~/data/cifar")
    assert home.location == os.path.join(os.path.expanduser("~"), "data", "cifar")
    for spec in ("synthetic:500", "digits", f"cifar10:{url}"):
        assert str(parse_data_spec(spec)) == spec


@pytest.mark.parametrize(
    "bad",
    ["", "cifar", "cifar10", "cifar10:", "synthetic:abc", "synthetic:0", "digits:3", "imagenet"],
)
def test_malformed_spec_is_named_in_the_error(bad: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_data_spec(bad)
    assert repr(bad) in str(info.value)
    assert "cifar10:PATH-OR-URL" in str(info.value)
    with pytest.raises(ValueError):
        load_dataset(bad, train=True)


def test_loaded_data_is_cached_and_read_only() -> None:
    first = load_dataset("digits", train=True)
    assert load_dataset(parse_data_spec("digits"), train=True) is first
    assert not first.images.flags.writeable and not first.labels.flags.writeable


def test_the_sources_and_the_batches_are_still_named_here() -> None:
    """Each source and the batches have modules of their own; their public names are still
    imported from here (``__all__``), as every caller did."""
    assert data_module.BatchStream is batches.BatchStream
    assert data_module.to_tensor is batches.to_tensor
    assert data_module.write_cifar10_files is cifar.write_cifar10_files
    assert data_module.CIFAR10_DIRNAME == cifar.CIFAR10_DIRNAME
    for name in data_module.__all__:
        assert getattr(data_module, name) is not None, name
