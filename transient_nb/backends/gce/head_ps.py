"""The PS host of a detached GCE cluster: a worker process on the head VM itself.

The paper ran the parameter server and the scheduler on one non-preemptible 4-vCPU VM. A head
VM is exactly that host: on demand, never Spot, up for the whole run. So the head runs the
``ps`` worker as a process of its own (the same ``dask worker`` command line as a VM's startup
script, :func:`~transient_nb.backends.gce.startup.worker_args`) instead of creating another VM:
one VM fewer to pay for and to boot, and the PS line of the bill is the head VM.

TLS as for any VM, without enrolment: the head owns the cluster's CA, so it issues the worker's
key and certificate into 0600 files in a 0700 folder on the head VM (nothing goes through the
API). The worker listens on the VM's interface in ``gce.worker-ports``, which the cluster's
firewall rule opens to its VMs (the trainers dial the PS directly).

The process stays in the head's process group: when the head VM goes, it goes with it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from typing import IO, TYPE_CHECKING, Any

import psutil

from transient_nb.backends.base import TransientVM, VMSpec, start_process
from transient_nb.backends.gce.startup import worker_env
from transient_nb.worker.peers import ROLE_PS

if TYPE_CHECKING:
    from transient_nb.backends.gce.backend import GCEBackend

logger = logging.getLogger(__name__)

#: Seconds between two checks that the PS process still runs.
POLL_S = 0.2


class HeadPSVM(TransientVM):
    """The ``ps`` worker of a detached cluster, run as a process on the head VM."""

    def __init__(
        self,
        spec: VMSpec,
        *,
        backend: GCEBackend,
        delay_s: float = 0.0,  # no VM to boot
        connection_args: dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        super().__init__(spec, **kwargs)
        self.backend = backend
        self.connection_args = connection_args or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._folder: str | None = None
        self._log: IO[bytes] | None = None
        self._watch_task: asyncio.Future[None] | None = None

    async def post(self, kind: str, **fields: Any) -> None:
        """Log a lifecycle event; it names the instance the process runs on."""
        await super().post(kind, **{"instance": self.backend.instance_name("head"), **fields})

    async def _create(self) -> None:
        backend = self.backend
        self._folder = tempfile.mkdtemp(prefix=f"transient-nb-{self.name}-")  # 0700
        tls = backend.ca.write_files(
            self._folder, backend.instance_name(self.name), role=ROLE_PS, vm=self.name
        )
        args = backend.worker_command(
            self.name,
            self.spec.resources,
            python=sys.executable,
            scheduler_address=backend.scheduler_address or self.scheduler_address,
            # The head VM is never preempted: no GCE notice watcher.
            preloads=("transient_nb.worker.preload", "transient_nb.worker.guard"),
        )
        args += ["--tls-ca-file", tls["ca"], "--tls-cert", tls["cert"], "--tls-key", tls["key"]]
        vm = {"name": self.name, "role": "ps", "gpu": None, "zone": self.spec.zone, "spot": False}
        env = {
            **os.environ,
            **worker_env(vm, backend.notice_s, backend.data_ports),
            "CUDA_VISIBLE_DEVICES": "",
        }
        self.proc, self._log = start_process(args, env, os.path.join(self._folder, "worker.log"))
        self._watch_task = asyncio.ensure_future(self._watch())
        await self.running()

    async def _watch(self) -> None:
        assert self.proc is not None
        while self.proc.poll() is None:
            await asyncio.sleep(POLL_S)
        logger.warning("The PS worker process on the head VM exited (%s)", self.proc.returncode)
        self.exited_by_itself()

    async def _notify(self, deadline: float) -> None:
        return None  # never preempted: the head VM is on demand

    async def _stop(self, grace_s: float) -> None:
        if self._watch_task is not None and self._watch_task is not asyncio.current_task():
            self._watch_task.cancel()
        if self.proc is not None:
            try:
                procs = [psutil.Process(self.proc.pid)]
                procs += procs[0].children(recursive=True)
            except psutil.NoSuchProcess:
                procs = []
            for p in procs:
                try:
                    p.terminate()
                except psutil.NoSuchProcess:
                    pass
            _, left = await asyncio.to_thread(psutil.wait_procs, procs, grace_s)
            for p in left:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            await asyncio.to_thread(self.proc.wait)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    async def _kill(self) -> None:
        await self._stop(0.0)

    async def _delete(self) -> None:
        await self._stop(10.0)
