"""Tests for transient_nb.notebook.magic_cell: the ``%%transient_cluster`` cell's YAML body.

The mistakes of the body alone; those the cluster or train() find are the magic's
(tests/notebook/test_magics.py).
"""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from transient_nb.notebook.magic_cell import cell_spec


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("cluster: [workers", "The cell is not valid YAML at line 1"),
        ("- workers: 3", "The cell must be a YAML mapping"),
        ("cluster:\n  workers: 2\nexperiment: x", "Unknown section 'experiment'"),
        ("cluster: 3", "`cluster:` must be a mapping of settings"),
        ("cluster:\n  wrkers: 3", "Unknown cluster setting 'wrkers': use some of workers, gpu"),
        ("cluster: {}\ntrain:\n  stepz: 3", "Unknown train setting 'stepz'"),
    ],
)
def test_cell_mistakes(cell: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        cell_spec(cell)
    assert message in str(info.value)


def test_a_cell_is_cluster_settings_and_optional_train_settings() -> None:
    assert cell_spec("cluster:\n  workers: 2\n  time-scale: 60") == (
        {"workers": 2, "time_scale": 60},
        None,
    )
    cluster, train = cell_spec("cluster: {}\ntrain:\n  steps: 10\n  momentum: 0.8")
    assert cluster == {} and train == {"steps": 10, "momentum": 0.8}
    assert cell_spec("cluster:\ntrain:") == ({}, {})
