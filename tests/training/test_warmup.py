"""Tests for transient_nb.training.warmup: GPU workers import the trainer while they join."""

from __future__ import annotations

import dask.config
import pytest

from tests.conftest import wait_for_sync


@pytest.mark.slow
def test_a_gpu_worker_imports_torch_and_the_trainer_while_it_joins() -> None:
    from transient_nb import TransientCluster

    # Defined here: cloudpickle sends it by value (the workers cannot import this test module).
    def _trainer_imported() -> bool:
        import sys

        return "transient_nb.training.trainer" in sys.modules

    # The suite turns the warm-up off (tests/conftest.py); this test turns the default back on,
    # on cold VMs (as on GCE): a VM forked from the local zygote has the trainer imported already.
    with (
        dask.config.set({"transient.warm-up": True, "transient.local.warm-start": False}),
        TransientCluster(workers=1, preemption="none", provisioning_delay=0) as cluster,
    ):
        cluster.wait_for_workers(1, timeout=120)
        client = cluster.get_client()
        info = client.scheduler_info(n_workers=-1)["workers"]
        gpu = [a for a, w in info.items() if "gpu" in w.get("resources", {})]
        ps = [a for a, w in info.items() if "gpu" not in w.get("resources", {})]
        assert gpu and ps
        # No trainer was ever asked for: only the warm-up can have imported it.
        wait_for_sync(
            lambda: all(client.run(_trainer_imported, workers=gpu).values()),
            120,
            "the GPU worker never warmed up",
        )
        assert not any(client.run(_trainer_imported, workers=ps).values())  # the PS host: no
