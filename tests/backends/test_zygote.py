"""Tests for transient_nb.backends.zygote: local VMs forked from a warm interpreter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from distributed import Client
from distributed.utils_test import gen_cluster

from tests.backends.test_local import Recorder, spec
from tests.conftest import alive, wait_for, wait_for_sync
from transient_nb.backends import zygote
from transient_nb.backends.local import LocalBackend
from transient_nb.backends.zygote import Zygote, ZygoteProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def own_zygote() -> Any:
    z = Zygote()
    yield z
    z.close()
    assert z.proc.poll() is not None and not os.path.exists(z.address)


def test_serves_the_plain_worker_of_its_own_interpreter_and_path(own_zygote: Zygote) -> None:
    worker = [sys.executable, "-m", "dask", "worker", "tls://127.0.0.1:1"]
    env = {"PYTHONPATH": own_zygote.pythonpath}
    assert own_zygote.serves(worker, env)
    # dask-cuda's command line, another interpreter, another PYTHONPATH: a cold start.
    assert not own_zygote.serves([sys.executable, "-m", "dask", "cuda", "worker", "x"], env)
    assert not own_zygote.serves(["/usr/bin/python3", *worker[1:]], env)
    assert not own_zygote.serves(worker, {"PYTHONPATH": own_zygote.pythonpath + ":/elsewhere"})


def test_a_forked_vm_has_its_environment_folder_and_log_and_its_exit_comes_back(
    own_zygote: Zygote, tmp_path: Path
) -> None:
    log = tmp_path / "w-0.log"
    env = {**os.environ, "TRANSIENT_NB_TEST_MARK": "only-in-this-vm"}
    # A usage error: click says why in the VM's log and exits with 2, as `python -m dask` does.
    cmd = [sys.executable, "-m", "dask", "worker", "tcp://127.0.0.1:9", "--nthreads", "many"]
    proc = own_zygote.spawn(cmd, env, str(log), cwd=str(tmp_path))
    assert isinstance(proc, ZygoteProcess) and proc.pid > 0
    wait_for_sync(lambda: proc.poll() is not None, timeout=60)
    assert proc.returncode == 2 and proc.poll() == 2
    assert "Invalid value for '--nthreads': 'many' is not a valid integer" in log.read_text()
    assert "TRANSIENT_NB_TEST_MARK" not in os.environ  # the owner's own environment is untouched


def test_a_vm_whose_zygote_is_gone_counts_as_killed(own_zygote: Zygote, tmp_path: Path) -> None:
    # `dask worker` with no scheduler that answers: it would wait until its death timeout.
    cmd = [sys.executable, "-m", "dask", "worker", "tcp://127.0.0.1:9", "--death-timeout", "600"]
    proc = own_zygote.spawn(cmd, dict(os.environ), str(tmp_path / "w.log"))
    assert proc.poll() is None
    own_zygote.close()
    wait_for_sync(lambda: proc.poll() is not None, timeout=30)
    assert proc.returncode == -9
    # The VM died with its parent (PR_SET_PDEATHSIG), not left running.
    wait_for_sync(lambda: not alive({proc.pid}), timeout=30)


def test_an_owner_killed_outright_leaves_no_zygote_and_no_folder(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from transient_nb.backends.zygote import Zygote; z = Zygote(); "
            "z._wait_ready(); print(z.proc.pid, z.address, flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None
        pid, address = owner.stdout.readline().split()
        assert os.path.exists(address)
    finally:
        owner.kill()  # no close(), no atexit
        owner.wait()
    wait_for_sync(lambda: not alive({int(pid)}), timeout=30)
    assert not os.path.exists(os.path.dirname(address))


def test_a_vm_is_its_own_process_group_by_the_time_its_pid_comes_back(
    own_zygote: Zygote, tmp_path: Path
) -> None:
    # A preemption right after the start kills the VM's group: one that does not exist yet (the
    # child had not reached its setsid()) was ProcessLookupError, and the VM lived on.
    cmd = [sys.executable, "-m", "dask", "worker", "tcp://127.0.0.1:9", "--death-timeout", "600"]
    for i in range(4):
        proc = own_zygote.spawn(cmd, dict(os.environ), str(tmp_path / f"w{i}.log"))
        assert os.getpgid(proc.pid) == proc.pid
        os.killpg(proc.pid, signal.SIGKILL)
        wait_for_sync(lambda proc=proc: proc.poll() is not None, timeout=30)
        assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("warm", [True, False])
@gen_cluster(nthreads=[], timeout=120)
async def test_a_warm_vm_is_one_process_group_with_everything_imported(
    s: Any, tmp_path: Path, warm: bool
) -> None:
    backend = LocalBackend(str(tmp_path), cuda="never", tls=False, warm_start=warm)
    vms = [
        backend.make_vm(spec(f"w-{i}"), scheduler_address=s.address, post=Recorder(), delay_s=0)
        for i in range(2)
    ]
    for vm in vms:
        await vm.start()
    await wait_for(lambda: len(s.workers) == 2, timeout=90)
    assert all(isinstance(vm.proc, ZygoteProcess) == warm for vm in vms)
    async with Client(s.address, asynchronous=True) as client:

        def probe() -> dict[str, Any]:
            import json

            import numpy as np

            return {
                "pgid": os.getpgid(0),
                "torch": "torch" in sys.modules,  # the suite's warm-up is off: only the zygote
                "vm": json.loads(os.environ["TRANSIENT_NB_VM"])["name"],
                "draw": float(np.random.random()),
            }

        seen = await client.run(probe)
    by_vm = {info["vm"]: info for info in seen.values()}
    assert sorted(by_vm) == ["w-0", "w-1"]
    for vm in vms:
        info = by_vm[vm.name]
        # The nanny leads the VM's group, and its worker is in it: one killpg stops both.
        assert info["pgid"] == vm.pid
        assert info["torch"] is warm
    # Forks of one zygote draw their own random numbers, as fresh interpreters do.
    assert by_vm["w-0"]["draw"] != by_vm["w-1"]["draw"]
    pids = {vm.pid for vm in vms}
    pids |= {p.pid for vm in vms for p in psutil.Process(vm.pid).children(recursive=True)}
    assert len(pids) >= 4  # two nannies, two workers
    await vms[0].preempt(notice=False)  # SIGKILL to the group
    await vms[1].close()  # SIGTERM: the worker leaves
    await wait_for(lambda: not alive(pids), timeout=30)
    assert backend.live_pids == set()


def test_shared_is_one_zygote_per_process() -> None:
    z = zygote.shared()
    assert zygote.shared() is z and zygote.current() is z and z.proc.poll() is None
