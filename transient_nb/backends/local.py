"""The local backend: every VM is a real ``dask worker`` process group on this machine.

A VM boots after its (simulated, time-scaled) provisioning delay by starting the same command line a
cloud VM's startup script would run: ``python -m dask worker SCHEDULER --nworkers 1 ...`` (or
``dask cuda worker`` where CUDA GPUs and dask-cuda are present), with a nanny; by default
(``local.warm-start``) that command line runs in a fork of a process that imported Dask, torch and
the trainer once (:mod:`~transient_nb.backends.zygote`), and its nanny forks its worker. A
preemption kills the whole process group with SIGKILL, as a provider stopping a VM would; a notice
first asks the worker to drain and leave. Zones listed in ``transient.local.stockouts`` pretend to
have no GPUs left, to exercise the replacement policy's fallbacks.

The local control plane is TLS with mutual authentication, as on the cloud (``local.tls``): the
cluster's own CA (:mod:`~transient_nb.backends.tls`) issues the scheduler's and the client's
certificates in memory, and one certificate per worker, handed over in files only this user can
read (a 0700 folder, deleted at close). Another user of a shared machine can neither connect to
the scheduler nor to a worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import IO, Any

from dask.utils import parse_timedelta
from distributed.core import rpc

from transient_nb import config
from transient_nb.backends.base import (
    WORKER_PRE_SPAWN_ENVIRON,
    Backend,
    CapacityError,
    TransientVM,
    VMSpec,
    dask_environ,
    start_process,
)
from transient_nb.backends.tls import CLIENT_CN, ClusterCA, tls_lifetime_s
from transient_nb.backends.zygote import Zygote, ZygoteProcess, shared
from transient_nb.worker.peers import ROLE_CLIENT
from transient_nb.worker.preload import NANNY_PRELOADS, worker_preloads

logger = logging.getLogger(__name__)

#: How often a VM checks whether its process is still alive (seconds).
POLL_S = 0.05


def cuda_device_count() -> int:
    """Number of CUDA GPUs visible here, without initialising CUDA in this process."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return len([line for line in out.splitlines() if line.strip()])


def _dask_cuda_available() -> bool:
    try:
        import dask_cuda  # noqa: F401
    except Exception:
        return False
    return True


class LocalVM(TransientVM):
    """A worker (or PS host) process group standing in for a cloud VM."""

    def __init__(
        self,
        spec: VMSpec,
        *,
        backend: LocalBackend,
        delay_s: float,
        connection_args: dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        super().__init__(spec, **kwargs)
        self.backend = backend
        self.delay_s = delay_s
        self.connection_args = connection_args or {}
        self.proc: subprocess.Popen[bytes] | ZygoteProcess | None = None
        self._boot_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Future[None] | None = None
        self._exited = asyncio.Event()
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """PID of the VM's top process (the nanny), once booted."""
        return self.proc.pid if self.proc else None

    async def _create(self) -> None:
        if self.spec.role == "worker" and self.spec.zone in self.backend.stockouts:
            raise CapacityError(self.spec.zone, self.spec.gpu)
        self._boot_task = asyncio.ensure_future(self._boot())

    async def _boot(self) -> None:
        await asyncio.sleep(self.delay_s)
        cmd, env = self.backend.command(self.spec, self.scheduler_address)
        os.makedirs(self.backend.log_dir, exist_ok=True)
        log_path = os.path.join(self.backend.log_dir, f"{self.name}.log")
        zygote = self.backend.zygote(cmd, env)
        if zygote is not None:
            # A warm VM's nanny forks its worker from itself, which has everything imported.
            warm = {**env, "DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD": "fork"}
            # Asked in a thread the cancellation of this boot does not interrupt: a VM forked
            # while its boot was cancelled is still this VM's to kill (its pid comes back).
            spawn = asyncio.ensure_future(asyncio.to_thread(zygote.spawn, cmd, warm, log_path))
            try:
                self._track(await asyncio.shield(spawn))
            except asyncio.CancelledError:
                self._track(await spawn)
                raise
            except OSError as e:
                logger.warning("Warm start of %s failed (%s): starting it cold", self.name, e)
        if self.proc is None:
            proc, self._log = start_process(cmd, env, log_path, new_session=True)
            self._track(proc)
        await self.running()

    def _track(self, proc: subprocess.Popen[bytes] | ZygoteProcess) -> None:
        """The VM's top process is ``proc``: watch it until it exits."""
        self.proc = proc
        self.backend.live_pids.add(proc.pid)
        self._watch_task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        assert self.proc is not None
        proc = self.proc
        # Polling (cheap: one waitpid per tick) rather than a waiting thread per VM, so that a
        # cluster leaves no threads behind.
        while proc.poll() is None:
            await asyncio.sleep(POLL_S)
        self.backend.live_pids.discard(proc.pid)
        self._exited.set()
        if self._log is not None:
            self._log.close()
        self.exited_by_itself()

    async def _notify(self, deadline: float) -> None:
        if self.proc is None:
            return  # still booting: nothing to drain
        try:
            addr = await self._worker_address()
            if addr is None:
                return
            async with rpc(addr, connection_args=self.connection_args) as w:
                await asyncio.wait_for(w.transient_notice(deadline=deadline), 5)
        except (OSError, asyncio.TimeoutError) as e:
            logger.info("Could not deliver the preemption notice to %s: %r", self.name, e)

    async def _wait_exit(self, deadline: float) -> None:
        if self.proc is None:
            return
        try:
            await asyncio.wait_for(self._exited.wait(), max(0.0, deadline - time.time()))
        except asyncio.TimeoutError:
            pass

    def _signal_group(self, sig: int) -> None:
        # Signal the group even when the top process is gone: a worker it spawned may not be.
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    async def _cancel_boot(self) -> None:
        """Cancel a boot in progress, and wait for it: a warm start that was already asked for
        still hands back its VM's process (to be killed)."""
        if self._boot_task is not None and not self._boot_task.done():
            self._boot_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await self._boot_task

    async def _kill(self) -> None:
        await self._cancel_boot()
        if self.proc is not None:
            self._signal_group(signal.SIGKILL)
            await self._exited.wait()

    async def _delete(self) -> None:
        await self._cancel_boot()
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(self._exited.wait(), 10)
            except asyncio.TimeoutError:
                pass
        # Whatever is left of the group (a worker whose nanny died first) goes now.
        self._signal_group(signal.SIGKILL)
        await self._exited.wait()


class LocalBackend(Backend):
    """Worker processes on this machine, standing in for cloud VMs.

    Parameters
    ----------
    log_dir
        Where each VM's output goes (``NAME.log``).
    stockouts
        Zones that pretend to have no GPU capacity.
    nthreads
        Threads per worker.
    cuda
        "auto": dask-cuda CUDA workers where GPUs and dask-cuda exist; "always"; "never".
    death_timeout
        A worker that loses its scheduler this long exits by itself.
    tls
        TLS with the cluster's own certificates between scheduler, workers and clients.
    tls_lifetime
        Seconds the cluster's CA, and so every certificate, lives (default ``tls-lifetime``).
    warm_start
        Fork VMs from this process's zygote (:mod:`~transient_nb.backends.zygote`), which has
        imported Dask, torch and the trainer once, instead of starting each cold (default
        ``local.warm-start``).
    """

    name = "local"

    def __init__(
        self,
        log_dir: str,
        stockouts: Sequence[str] | None = None,
        nthreads: int | None = None,
        cuda: str | None = None,
        death_timeout: str | float | None = None,
        tls: bool | None = None,
        tls_lifetime: float | None = None,
        warm_start: bool | None = None,
    ):
        self.log_dir = log_dir
        self.stockouts = set(config.get("local.stockouts", override_with=stockouts) or ())
        self.nthreads = int(config.get("local.nthreads", override_with=nthreads))
        if self.nthreads < 1:
            raise ValueError(f"nthreads={self.nthreads} must be at least 1.")
        mode = config.get("local.cuda", override_with=cuda)
        if mode not in ("auto", "always", "never"):
            raise ValueError(f"Bad cuda={mode!r}: use 'auto', 'always' or 'never'.")
        self.death_timeout = parse_timedelta(
            config.get("local.death-timeout", override_with=death_timeout)
        )
        self.gpus = cuda_device_count() if mode != "never" else 0
        if mode == "always" and (self.gpus == 0 or not _dask_cuda_available()):
            raise ValueError(
                "cuda='always' needs CUDA GPUs and dask-cuda (pip install 'transient_nb[gpu]'); "
                "use cuda='auto' to fall back to CPU workers."
            )
        self.use_cuda = self.gpus > 0 and _dask_cuda_available()
        self.warm_start = bool(config.get("local.warm-start", override_with=warm_start))
        self.live_pids: set[int] = set()
        self._next_gpu = 0
        self.tls = bool(config.get("local.tls", override_with=tls))
        self.ca: ClusterCA | None = None
        self._security: Any = None
        self._tls_dir: str | None = None
        if self.tls:
            self.ca = ClusterCA.create("local", tls_lifetime_s(tls_lifetime))
            self._security = self.ca.cluster_security()

    @property
    def security(self) -> Any:
        """The cluster's TLS (scheduler's and client's own certificates), or None without TLS."""
        return self._security

    def scheduler_options(self) -> dict[str, Any]:
        if not self.tls:
            return {}
        return {"protocol": "tls", "security": self._security}

    def tls_files(self, spec: VMSpec) -> dict[str, str] | None:
        """Issue the certificate of VM ``spec`` (its role, its name) into this cluster's private
        folder (0700)."""
        if self.ca is None:
            return None
        if self._tls_dir is None:
            self._tls_dir = tempfile.mkdtemp(prefix="transient-nb-tls-")
        folder = os.path.join(self._tls_dir, spec.name)
        return self.ca.write_files(folder, spec.name, role=spec.role, vm=spec.name)

    def client_tls_files(self, folder: str) -> dict[str, str] | None:
        """A client certificate in files in ``folder``, for this user's other processes (connect,
        the panel)."""
        if self.ca is None:
            return None
        return self.ca.write_files(folder, CLIENT_CN, role=ROLE_CLIENT)

    async def close(self) -> None:
        if self._tls_dir is not None:
            shutil.rmtree(self._tls_dir, ignore_errors=True)
            self._tls_dir = None

    def describe(self) -> str:
        if self.use_cuda:
            return f"local backend: dask-cuda workers on {self.gpus} CUDA GPU(s)"
        if self.gpus:
            return (
                f"local backend: {self.gpus} CUDA GPU(s) found but dask-cuda is not installed; "
                "falling back to CPU workers (pip install 'transient_nb[gpu]')"
            )
        return "local backend: no CUDA GPU found; workers train on the CPU (simulated GPU types)"

    def zygote(self, cmd: Sequence[str], env: dict[str, str]) -> Zygote | None:
        """The zygote that can fork a VM of this command line and environment, or None (a cold
        start): none where ``warm_start`` is off, for dask-cuda's command line, for another
        interpreter or ``PYTHONPATH``."""
        if not self.warm_start:
            return None
        try:
            z = shared()
        except OSError as e:
            logger.warning("No zygote (%s): local VMs start cold", e)
            return None
        return z if z.serves(cmd, env) else None

    def make_vm(self, spec: VMSpec, **kwargs: Any) -> LocalVM:
        return LocalVM(spec, backend=self, **kwargs)

    def command(self, spec: VMSpec, scheduler_address: str) -> tuple[list[str], dict[str, str]]:
        """The worker command line and environment of a VM (what a startup script would run)."""
        resources = ",".join(f"{k}={v:g}" for k, v in spec.resources.items())
        cuda = self.use_cuda and spec.role == "worker"
        base = (
            [sys.executable, "-m", "dask", "cuda", "worker"]
            if cuda
            else [sys.executable, "-m", "dask", "worker", "--nworkers", "1"]
        )
        cmd = [
            *base,
            scheduler_address,
            "--name",
            spec.name,
            "--nthreads",
            str(self.nthreads),
            "--death-timeout",
            f"{self.death_timeout}s",
            "--host",
            "127.0.0.1",
            "--no-dashboard",
            *(arg for name in worker_preloads() for arg in ("--preload", name)),
        ]
        if not cuda:  # dask-cuda's command line has no --preload-nanny
            cmd += [arg for name in NANNY_PRELOADS for arg in ("--preload-nanny", name)]
        if resources:
            cmd += ["--resources", resources]
        tls = self.tls_files(spec) if scheduler_address.startswith("tls://") else None
        if tls is not None:
            cmd += ["--tls-ca-file", tls["ca"], "--tls-cert", tls["cert"], "--tls-key", tls["key"]]
        env = dict(os.environ)
        env["DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON"] = repr(WORKER_PRE_SPAWN_ENVIRON)
        for name, value in dask_environ().items():
            env.setdefault(name, value)  # one set in this process's own environment wins
        env["TRANSIENT_NB_VM"] = json.dumps(
            {
                "name": spec.name,
                "role": spec.role,
                "gpu": spec.gpu,
                "zone": spec.zone,
                "spot": spec.spot,
            }
        )
        env.pop("MALLOC_TRIM_THRESHOLD_", None)
        # The PS's data plane: every VM is on this host, so a Unix socket (0700 folder, 0600
        # socket) carries the gradients; a run's data_plane="tls" takes the cross-host path.
        env.setdefault("TRANSIENT_NB_DATA_PLANE", "unix")
        if spec.role == "ps":
            env["CUDA_VISIBLE_DEVICES"] = ""  # the PS works on the host, as on the paper's CPU VM
        elif self.gpus:
            # One GPU per worker VM, round robin when there are more workers than GPUs.
            env["CUDA_VISIBLE_DEVICES"] = str(self._next_gpu % self.gpus)
            self._next_gpu += 1
        return cmd, env
