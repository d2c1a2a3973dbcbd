"""Tests for transient_nb.backends.local: worker processes standing in for cloud VMs."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import dask.config
import psutil
import pytest
from distributed import Client
from distributed.utils_test import gen_cluster

from tests.conftest import alive, wait_for, wait_for_sync
from transient_nb.backends import CapacityError, VMSpec, get_backend
from transient_nb.backends.local import LocalBackend, LocalVM
from transient_nb.catalog.prices import Price
from transient_nb.deploy import registry

PRICE = Price(0.73, 0.22)


def spec(name: str = "w-0", role: str = "worker", zone: str = "us-central1-a") -> VMSpec:
    if role == "ps":
        return VMSpec(name, "ps", None, zone, False, "n1-standard-4", Price(0.19, 0.19), None,
                      {"ps": 1})  # fmt: skip
    return VMSpec(name, "worker", "t4", zone, True, "n1-standard-8", PRICE, 0, {"gpu": 1})


# -- configuration and command line -------------------------------------------------------------
def test_options_from_config_and_arguments(tmp_path: Path) -> None:
    with dask.config.set({"transient.local.stockouts": ["z-a"], "transient.local.nthreads": 2}):
        backend = LocalBackend(str(tmp_path), cuda="never")
        assert backend.stockouts == {"z-a"} and backend.nthreads == 2
        backend = LocalBackend(str(tmp_path), stockouts=["z-b"], nthreads=3, cuda="never")
        assert backend.stockouts == {"z-b"} and backend.nthreads == 3
    assert backend.death_timeout == 60
    assert LocalBackend(str(tmp_path), death_timeout="2 minutes").death_timeout == 120
    assert isinstance(get_backend("local", log_dir=str(tmp_path)), LocalBackend)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"nthreads": 0}, "nthreads=0 must be at least 1"),
        ({"cuda": "maybe"}, "Bad cuda='maybe'"),
        ({"cuda": "always"}, "cuda='always' needs CUDA GPUs and dask-cuda"),
    ],
)
def test_bad_options(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    if kwargs.get("cuda") == "always" and LocalBackend(str(tmp_path)).use_cuda:
        kwargs = {"cuda": "maybe"}  # a machine with GPUs and dask-cuda: check the other error
        match = "Bad cuda='maybe'"
    with pytest.raises(ValueError, match=match):
        LocalBackend(str(tmp_path), **kwargs)


def test_command_line_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    backend = LocalBackend(str(tmp_path), nthreads=1, cuda="never")
    assert "no CUDA GPU" in backend.describe() or "CUDA GPU(s) found" in backend.describe()
    cmd, env = backend.command(spec("w-3"), "tcp://127.0.0.1:8786")
    assert cmd[:4] == [sys.executable, "-m", "dask", "worker"]
    assert cmd[cmd.index("--name") + 1] == "w-3"
    assert cmd[cmd.index("--nthreads") + 1] == "1"
    assert cmd[cmd.index("--preload") + 1] == "transient_nb.worker.preload"
    assert cmd[cmd.index("--resources") + 1] == "gpu=1"
    assert cmd[cmd.index("--death-timeout") + 1] == "60s"
    assert "tcp://127.0.0.1:8786" in cmd
    # The nanny must not put MALLOC_TRIM_THRESHOLD_ back into the worker.
    assert "MALLOC_TRIM_THRESHOLD_" not in env
    pre_spawn = ast.literal_eval(env["DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON"])
    assert pre_spawn["MALLOC_TRIM_THRESHOLD_"] is None
    assert json.loads(env["TRANSIENT_NB_VM"]) == {
        "name": "w-3", "role": "worker", "gpu": "t4", "zone": "us-central1-a", "spot": True,
    }  # fmt: skip
    cmd, env = backend.command(spec("ps-0", role="ps"), "tcp://127.0.0.1:8786")
    assert cmd[cmd.index("--resources") + 1] == "ps=1"
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # the PS host never takes a GPU
    # One host: the PS's data plane is a Unix socket (a run's data_plane may say otherwise).
    assert env["TRANSIENT_NB_DATA_PLANE"] == "unix"
    # transient.cluster-dask: no profiler, rarer event-loop checks; this process's own DASK_*
    # variable wins over it (as it did before the setting existed).
    assert env["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"] == "False"
    assert env["DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL"] == "500ms"
    monkeypatch.setenv("DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL", "30ms")
    with dask.config.set({"transient.cluster-dask.distributed.worker.profile.enabled": True}):
        _, env = backend.command(spec("w-4"), "tcp://127.0.0.1:8786")
    assert env["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"] == "True"
    assert env["DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL"] == "30ms"


@pytest.mark.parametrize("warm_up", [True, False])
def test_warm_up_follows_the_setting(tmp_path: Path, warm_up: bool) -> None:
    """transient.warm-up, read when the command line is written, puts the warm-up preload on it
    or leaves it off; the other preloads stay, in their order."""
    backend = LocalBackend(str(tmp_path), nthreads=1, cuda="never")
    with dask.config.set({"transient.warm-up": warm_up}):
        cmd, _ = backend.command(spec("w-1"), "tcp://127.0.0.1:8786")
    preloads = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--preload"]
    expected = ["transient_nb.worker.preload", "transient_nb.worker.guard"]
    if warm_up:
        expected.insert(1, "transient_nb.training.warmup")
    assert preloads == expected


# -- one VM, real processes, against a real scheduler -------------------------------------------
def _worker_dask_settings() -> tuple[bool, float, float]:
    from dask.utils import parse_timedelta

    get = dask.config.get
    return (
        bool(get("distributed.worker.profile.enabled")),
        float(parse_timedelta(get("distributed.admin.tick.interval"))),
        float(parse_timedelta(get("distributed.admin.system-monitor.interval"))),
    )


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, kind: str, **fields: Any) -> None:
        self.events.append((kind, fields))

    def kinds(self) -> list[str]:
        return [k for k, _ in self.events]


@gen_cluster(nthreads=[], timeout=120)
async def test_vm_lifecycle_with_real_processes(s: Any, tmp_path: Path) -> None:
    backend = LocalBackend(str(tmp_path / "logs"), stockouts=["us-central1-f"], cuda="never")
    post = Recorder()
    running: list[str] = []
    exited: list[str] = []

    def make(name: str, zone: str = "us-central1-a") -> LocalVM:
        return backend.make_vm(
            spec(name, zone=zone),
            scheduler_address=s.address,
            post=post,
            on_running=lambda vm: running.append(vm.name),
            on_exit=lambda vm: exited.append(vm.name),
            delay_s=0.2,
        )

    # A stocked-out zone: requested, then a capacity error, and no process.
    with pytest.raises(CapacityError, match="No capacity for t4 VMs in us-central1-f"):
        await make("w-9", zone="us-central1-f").start()
    assert post.kinds() == ["requested"]

    a, b, c = make("w-0"), make("w-1"), make("w-2")
    for vm in (a, b, c):
        await vm.start()
    assert post.kinds()[1:7] == ["requested", "provisioning"] * 3
    assert all(vm.pid is None for vm in (a, b, c))  # still "provisioning" (the delay)
    await wait_for(lambda: len(s.workers) == 3, timeout=60)
    assert sorted(running) == ["w-0", "w-1", "w-2"]
    assert {ws.name for ws in s.workers.values()} == {"w-0", "w-1", "w-2"}
    assert a.lifecycle == "running"
    fields = dict(post.events)["running"]
    assert fields["price"] == 0.22 and fields["price_on_demand"] == 0.73 and fields["slot"] == 0
    assert (tmp_path / "logs" / "w-0.log").exists()
    pids_a = {a.pid} | {p.pid for p in psutil.Process(a.pid).children(recursive=True)}
    assert len(pids_a) >= 2  # the nanny and its worker
    # Both run with transient.cluster-dask's settings (a forked VM reads its own environment).
    async with Client(s.address, asynchronous=True) as client:
        for nanny in (False, True):
            seen = await client.run(_worker_dask_settings, nanny=nanny)
            assert set(seen.values()) == {(False, 0.5, 2.0)}, (nanny, seen)

    # Preemption without notice: the whole process group is killed, the VM does not call it a
    # crash.
    await a.preempt(notice=False)
    await wait_for(lambda: not alive(pids_a), timeout=10)  # SIGKILL takes effect at once
    await wait_for(lambda: len(s.workers) == 2, timeout=60)

    # Deletion: SIGTERM, the worker leaves, "deleted" is posted, nothing is left.
    pids_b = {b.pid} | {p.pid for p in psutil.Process(b.pid).children(recursive=True)}
    await b.close()
    await wait_for(lambda: not alive(pids_b), timeout=10)
    assert post.kinds()[-1] == "deleted" and b.lifecycle == "deleted"
    await b.close()  # twice is harmless
    assert post.kinds().count("deleted") == 1

    # A VM that dies by itself is reported to the cluster.
    os.killpg(c.pid, signal.SIGKILL)
    await wait_for(lambda: exited == ["w-2"], timeout=30)
    await c.close()
    await wait_for(lambda: not alive({c.pid}), timeout=10)
    assert backend.live_pids == set()


@gen_cluster(nthreads=[], timeout=60)
async def test_vm_deleted_while_provisioning_never_starts(s: Any, tmp_path: Path) -> None:
    backend = LocalBackend(str(tmp_path), cuda="never")
    post = Recorder()
    vm = backend.make_vm(spec("w-0"), scheduler_address=s.address, post=post, delay_s=30)
    await vm.start()
    await vm.close()
    assert vm.proc is None
    assert post.kinds() == ["requested", "provisioning", "deleted"]


# -- no VM outlives its owner -----------------------------------------------------------------
SCRIPT = textwrap.dedent(
    """
    import json, sys
    import dask, psutil
    dask.config.set({"transient.run-dir": sys.argv[1], "transient.registry-dir": sys.argv[2]})
    from transient_nb import TransientCluster

    # A death timeout far beyond the test's: only the owner's death can stop the workers.
    cluster = TransientCluster(
        workers=2, provisioning_delay=0, name="orphan-test", death_timeout="10 minutes"
    )
    cluster.wait_for_workers(timeout=120)
    pids = set()
    for vm in cluster.workers.values():
        pids.add(vm.pid)
        pids |= {p.pid for p in psutil.Process(vm.pid).children(recursive=True)}
    print("PIDS " + json.dumps(sorted(pids)), flush=True)
    if sys.argv[3] == "wait":
        sys.stdin.readline()  # until the test kills us
    # else: the interpreter exits without cluster.close()
    """
)


def _run_script(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "runs"), str(tmp_path / "clusters"), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _read_pids(proc: subprocess.Popen[str]) -> set[int]:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("PIDS "):
            return set(json.loads(line[5:]))
    raise AssertionError(f"the script ended (rc={proc.wait()}) before its workers joined")


@pytest.mark.slow
def test_interpreter_exit_without_close_stops_every_vm(tmp_path: Path) -> None:
    proc = _run_script(tmp_path, "exit")
    try:
        pids = _read_pids(proc)
        assert len(pids) >= 6  # PS host and two workers, each a nanny and a worker process
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    wait_for_sync(lambda: not alive(pids), timeout=60, message=f"left behind: {alive(pids)}")
    # The atexit close also unregistered the cluster.
    assert registry.entries(str(tmp_path / "clusters")) == []


@pytest.mark.slow
def test_sigkill_of_the_owner_stops_every_vm(tmp_path: Path) -> None:
    proc = _run_script(tmp_path, "wait")
    try:
        pids = _read_pids(proc)
        assert len(pids) >= 6 and alive(pids) == pids
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    # PR_SET_PDEATHSIG kills every nanny with its owner; each worker follows its nanny.
    wait_for_sync(lambda: not alive(pids), timeout=60, message=f"left behind: {alive(pids)}")
    (entry,) = registry.entries(str(tmp_path / "clusters"))
    assert entry["name"] == "orphan-test" and entry["stale"] is True


OWNER_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    import psutil
    from transient_nb.backends import VMSpec
    from transient_nb.backends.local import LocalBackend
    from transient_nb.catalog.prices import Price

    async def main():
        backend = LocalBackend(sys.argv[2], cuda="never", death_timeout="10 minutes")

        async def post(kind, **fields):
            pass

        spec = VMSpec("w-0", "worker", "t4", "z", True, "n1-standard-8", Price(1, 1), 0, {})
        vm = backend.make_vm(spec, scheduler_address=sys.argv[1], post=post, delay_s=0)
        await vm.start()
        while vm.pid is None or not psutil.Process(vm.pid).children():
            await asyncio.sleep(0.05)
        pids = [vm.pid] + [p.pid for p in psutil.Process(vm.pid).children(recursive=True)]
        print("PIDS " + json.dumps(pids), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@pytest.mark.slow
@gen_cluster(nthreads=[], timeout=120)
async def test_vm_dies_with_its_owner_even_when_its_scheduler_lives(s: Any, tmp_path: Path) -> None:
    # The VM's scheduler (this test's) outlives the VM's owner (a subprocess): only
    # PR_SET_PDEATHSIG can stop the VM when the owner is killed.
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, s.address, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        await wait_for(lambda: len(s.workers) == 1, timeout=90)
        pids = _read_pids(proc)  # printed before the worker could register
        assert alive(pids) == set(pids)
        proc.kill()
        proc.wait(timeout=30)
        await wait_for(lambda: not alive(pids), timeout=30)
        await wait_for(lambda: not s.workers, timeout=30)
    finally:
        proc.kill()


@pytest.mark.slow
def test_the_ps_data_plane_admits_only_members_on_both_of_its_paths(tmp_path: Path) -> None:
    """A real local cluster: its PS's data plane is a Unix socket only this user can reach (the
    default) or, on the cross-host path, TLS only the cluster's certificates open."""
    import stat

    from tests.conftest import endless_run
    from tests.training.wire.outsiders import assert_only_members_admitted, knock_unix_as_nobody
    from transient_nb import TransientCluster

    with TransientCluster(workers=1, preemption="none", provisioning_delay=0) as cluster:
        cluster.wait_for_workers(timeout=180)
        for path in ("auto", "tls"):
            run = endless_run(cluster, data_plane=path)
            try:
                wait_for_sync(lambda run=run: run.step >= 5, timeout=180)
                endpoint = run._ps[0].data_endpoint().result(timeout=30)
                if path == "auto":
                    sock = endpoint["unix"]
                    assert "tls" not in endpoint
                    assert stat.S_IMODE(os.stat(os.path.dirname(sock)).st_mode) == 0o700
                    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
                    if os.getuid() == 0:  # another user: the folder keeps it out
                        assert knock_unix_as_nobody(sock) == "no entry"
                else:
                    assert "unix" not in endpoint
                    assert_only_members_admitted(endpoint, cluster.backend.ca, str(tmp_path), "w-0")
                step = run.step
                wait_for_sync(lambda run=run, step=step: run.step >= step + 3, timeout=60)
            finally:
                run.stop(wait=True, timeout=60)
            finished = [e for e in run.events() if e.get("kind") == "train-finished"][-1]
            used = {t["data_plane"] for t in json.loads(finished["trainers"])}
            assert used == {"unix" if path == "auto" else "tls"}
