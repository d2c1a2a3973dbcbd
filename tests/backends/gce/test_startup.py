"""Tests for transient_nb.backends.gce.startup: the VM's startup script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dask.config

from transient_nb.backends.gce import startup as gce_startup


def test_the_startup_script_powers_off_on_any_failure(tmp_path: Path) -> None:
    worker = gce_startup.worker_args(
        python=sys.executable,
        scheduler_address="tls://127.0.0.1:1",
        name="w-0",
        resources={"gpu": 1},
        nthreads=1,
        death_timeout_s=1,
        worker_ports="41000:41099",
        nanny_ports="41100:41199",
    )
    script = gce_startup.startup_script(
        worker=worker,
        vm={"name": "w-0", "role": "worker", "gpu": None, "zone": "z", "spot": True},
        notice_s=2,
    )
    assert "trap " in script and "EXIT" in script
    # transient.cluster-dask reaches the cloud VM's nanny and worker as it does a local one's.
    assert "export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False\n" in script
    assert "export DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL=2s\n" in script
    path = tmp_path / "startup.sh"
    path.write_text(script)
    marker = tmp_path / "powered-off"
    # No metadata server answers: the first curl fails under `set -e`.
    env = {
        "PATH": os.environ["PATH"],
        "GCE_METADATA_HOST": "127.0.0.1:9",
        "TRANSIENT_NB_POWEROFF": f"touch {marker}",
    }
    out = subprocess.run(["bash", str(path)], env=env, capture_output=True, timeout=60)
    assert out.returncode != 0
    assert marker.exists(), out.stderr.decode()[-2000:]


def test_cluster_dask_never_overrides_what_a_cloud_vm_must_have() -> None:
    """A key of transient.cluster-dask joins a cloud VM's environment but cannot turn its TLS off."""
    off = {"transient.cluster-dask.distributed.comm.require-encryption": False}
    with dask.config.set(off):
        env = gce_startup.worker_env({"name": "w-0"}, notice_s=30)
    assert env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "True"
    assert env["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"] == "False"
