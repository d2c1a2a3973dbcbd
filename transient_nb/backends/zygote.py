"""A warm start for local VMs: a process that imports Dask, torch and the trainer once, then forks
each VM from itself.

A cold local VM is ``python -m dask worker ...``: an interpreter that imports Dask (its nanny),
then a worker process that imports Dask again and, once it trains, torch and the trainer: 1-3 s of
a core per VM, most of the local backend's CPU in a test suite or a paced emulation that boots
hundreds of VMs. The zygote pays the imports once per owner process (a kernel, a head, a test
process); each VM is a ``fork()`` of it that runs the same ``dask worker`` command line
in-process, and its nanny forks its worker from itself (``multiprocessing-method: fork``), so that
the worker too starts with everything imported.

What a VM is does not change: its own session and process group (one ``killpg`` stops the nanny
and its worker), its own environment, folder and log, and it dies when its parent (the zygote)
dies, which dies when its owner does. The zygote is single-threaded and never runs an event
loop, so a fork inherits no threads, locks or signal wake-up descriptors. Where it cannot serve
(a dask-cuda command line, another interpreter or ``PYTHONPATH``, the zygote gone),
:class:`~transient_nb.backends.local.LocalBackend` starts the VM cold, as before
(``local.warm-start: false`` always does).

The owner talks to it over a Unix socket in a 0700 folder: one connection per VM, on which the
zygote answers the VM's PID, then its exit status once it has reaped it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from transient_nb.backends.base import WORKER_PRE_SPAWN_ENVIRON, die_with_parent

logger = logging.getLogger(__name__)

#: What the zygote imports before it forks anything (what every VM would import).
WARM_MODULES = (
    "dask.cli",
    "distributed",
    "distributed.cli.dask_worker",
    "transient_nb.worker.preload",
    "transient_nb.worker.guard",
    "transient_nb.training.warmup",
    "transient_nb.training.trainer",
    "transient_nb.training.ps",
)
#: Seconds the owner waits for a zygote to import everything and listen.
START_TIMEOUT_S = 60.0
#: How often the zygote reaps its VMs and checks that its owner lives (seconds).
TICK_S = 0.05


class ZygoteProcess:
    """A VM forked by the zygote, with the part of :class:`subprocess.Popen` a
    :class:`~transient_nb.backends.local.LocalVM` uses: ``pid``, ``poll()``, ``returncode``."""

    def __init__(self, conn: socket.socket, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._conn = conn
        self._buffer = b""

    def poll(self) -> int | None:
        """The exit status once the zygote has reaped the VM (a signal as ``-N``), else None."""
        if self.returncode is not None:
            return self.returncode
        try:
            chunk = self._conn.recv(4096)
        except BlockingIOError:
            return None
        except OSError:
            chunk = b""
        if not chunk:  # the zygote is gone: its VMs died with it (PR_SET_PDEATHSIG)
            self._finish(-signal.SIGKILL)
            return self.returncode
        self._buffer += chunk
        if b"\n" in self._buffer:
            self._finish(int(json.loads(self._buffer.split(b"\n", 1)[0])["exit"]))
        return self.returncode

    def _finish(self, code: int) -> None:
        self.returncode = code
        self._conn.close()


class Zygote:
    """The owner's side: start the zygote (once), and ask it for VMs.

    Parameters
    ----------
    python
        The interpreter of the VMs it can fork (the owner's own).
    """

    def __init__(self, python: str = sys.executable):
        self.python = python
        self.pythonpath = os.environ.get("PYTHONPATH", "")
        self._folder = tempfile.mkdtemp(prefix="transient-nb-zygote-")  # 0700
        self.address = os.path.join(self._folder, "zygote.sock")
        self.proc = subprocess.Popen(
            [python, "-m", "transient_nb.backends.zygote", self.address, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=zygote_environ(os.environ),
        )
        self._ready = False

    def serves(self, cmd: Sequence[str], env: Mapping[str, str]) -> bool:
        """Whether a VM of this command line and environment can be forked from the zygote."""
        return (
            self.proc.poll() is None
            and len(cmd) > 3
            and list(cmd[:4]) == [self.python, "-m", "dask", "worker"]
            and env.get("PYTHONPATH", "") == self.pythonpath
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(self.address):
            if self.proc.poll() is not None:
                raise OSError(f"the zygote exited ({self.proc.returncode}) before it listened")
            if time.monotonic() > deadline:
                raise OSError(f"the zygote did not listen within {START_TIMEOUT_S:.0f} s")
            time.sleep(TICK_S)
        self._ready = True

    def spawn(
        self, cmd: Sequence[str], env: Mapping[str, str], log_path: str, cwd: str | None = None
    ) -> ZygoteProcess:
        """Fork a VM running ``cmd`` (``python -m dask worker ...``) in ``env``, its output
        appended to ``log_path``; blocks until the zygote answers its PID (milliseconds, once the
        zygote is up)."""
        if not self._ready:
            self._wait_ready()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(START_TIMEOUT_S)
            conn.connect(self.address)
            request = {"argv": list(cmd[2:]), "env": dict(env), "log": log_path}
            request["cwd"] = cwd or os.getcwd()
            conn.sendall(json.dumps(request).encode() + b"\n")
            answer = b""
            while b"\n" not in answer:
                chunk = conn.recv(4096)
                if not chunk:
                    raise OSError("the zygote closed the connection before it forked")
                answer += chunk
        except BaseException:
            conn.close()
            raise
        head, rest = answer.split(b"\n", 1)
        proc = ZygoteProcess(conn, int(json.loads(head)["pid"]))
        proc._buffer = rest
        conn.setblocking(False)
        return proc

    def close(self) -> None:
        """Stop the zygote (its VMs die with it) and remove its folder."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.address)
        with contextlib.suppress(OSError):
            os.rmdir(self._folder)


def zygote_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The zygote's environment: the owner's, with what every worker process gets from its nanny
    (:data:`~transient_nb.backends.base.WORKER_PRE_SPAWN_ENVIRON`) already in it. Libraries read
    it once, when the zygote imports them: torch's thread pools (one thread, not one a core,
    which on a host of many workers spins them against each other) and glibc's malloc."""
    env = dict(environ)
    for name, value in WORKER_PRE_SPAWN_ENVIRON.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = str(value)
    return env


_zygote: Zygote | None = None
_zygote_pid: int | None = None
_lock = threading.Lock()


def shared() -> Zygote:
    """This process's zygote, started on first use.

    One per owner process, whatever the number of clusters: a test process, a kernel or a head
    that boots cluster after cluster pays the imports once. It exits when this process has
    exited (it watches its parent), not at an ``atexit`` of its own: a cluster's own exit handler
    still retires its workers gracefully first.
    """
    global _zygote, _zygote_pid
    with _lock:
        if _running() is None:
            _zygote, _zygote_pid = Zygote(), os.getpid()
        assert _zygote is not None
        return _zygote


def current() -> Zygote | None:
    """This process's zygote if it has one running (none is started)."""
    with _lock:
        return _running()


def _running() -> Zygote | None:
    # A forked owner (a process that forked this one) has no zygote of its own yet.
    if _zygote is None or _zygote_pid != os.getpid() or _zygote.proc.poll() is not None:
        return None
    return _zygote


# -- the zygote's side --------------------------------------------------------------------------


def _become_vm(request: dict[str, Any], keep_closed: Sequence[socket.socket], grouped: int) -> None:
    """In the forked child: become the VM ``request`` describes, run it, and exit. ``grouped``:
    the pipe's end on which it tells the zygote that its process group exists."""
    code = 1
    zygote = os.getppid()
    try:
        for s in keep_closed:
            s.close()
        os.setsid()  # the VM's own session and process group
        os.close(grouped)  # the owner may killpg() it from now on
        die_with_parent()  # the zygote is single-threaded: its death, not a thread's, kills us
        if os.getppid() != zygote:  # it died before prctl armed the signal: none will come
            os.kill(os.getpid(), signal.SIGKILL)
        import gc

        gc.enable()
        _plain_signals()
        # The nanny forks its worker from a thread while its event loop holds SIGINT and SIGTERM
        # (a no-op handler that writes the signal to the loop's wake-up socket): a worker that
        # kept them would swallow a SIGTERM and pass it to its nanny's loop instead.
        os.register_at_fork(after_in_child=_plain_signals)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _fresh_state()
        sys.argv = ["dask", *request["argv"][1:]]  # what ``python -m dask`` sees
        import runpy

        try:
            runpy.run_module("dask", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _plain_signals() -> None:
    """The signal dispositions of a new interpreter, and no wake-up descriptor."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it at start-up


def _fresh_state() -> None:
    """What a new interpreter would have had: the configuration read from this VM's environment,
    and random generators of its own (a fork shares its parent's state)."""
    import dask.config

    dask.config.refresh()
    seed = int.from_bytes(os.urandom(4), "little")
    with contextlib.suppress(ImportError):
        import numpy as np

        np.random.seed(seed)
    with contextlib.suppress(ImportError):
        import torch

        torch.manual_seed(seed)


def serve(address: str, owner: int) -> None:
    """The zygote's loop: fork a VM per connection, answer its PID, then its exit status."""
    import gc
    import importlib

    # Python's recipe for a process that forks without exec: no collections while the modules
    # load (no freed holes in their pages), and the objects frozen before the first fork, so
    # that a VM's collections neither walk them nor write to their pages (copy-on-write).
    gc.disable()
    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # a VM that needs it imports it, and says why it failed
            pass
    gc.freeze()
    # Every module is imported; the logging handlers Dask set up write to the VM's log (fd 2).
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    partial = address + ".new"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(partial)
    listener.bind(partial)
    os.chmod(partial, 0o600)
    listener.listen(64)
    os.rename(partial, address)  # appears only once it accepts
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    while os.getppid() == owner:
        for _ready in selector.select(TICK_S):
            conn, _ = listener.accept()
            try:
                request = _read_request(conn)
                waiting, grouped = os.pipe()
                pid = os.fork()
            except Exception as e:  # the owner falls back to a cold start
                logger.warning("The zygote could not fork a VM: %r", e)
                conn.close()
                continue
            if pid == 0:
                selector.close()
                os.close(waiting)
                _become_vm(request, [listener, conn, *children.values()], grouped)
            # The PID goes to the owner once the child's setsid() is done (it closes its end of
            # the pipe, or dies): a killpg() of the VM sooner would find no group, and miss it.
            os.close(grouped)
            with contextlib.suppress(OSError):
                os.read(waiting, 1)
            os.close(waiting)
            children[pid] = conn
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            answer = children.pop(pid, None)
            if answer is not None:
                with contextlib.suppress(OSError):
                    exit_code = os.waitstatus_to_exitcode(status)
                    answer.sendall(json.dumps({"exit": exit_code}).encode() + b"\n")
                answer.close()
    # The owner is gone: so are the VMs (each dies with the zygote, PR_SET_PDEATHSIG), and so is
    # the zygote's folder (an owner killed outright never ran its close()).
    for remove, path in ((os.unlink, address), (os.rmdir, os.path.dirname(address))):
        with contextlib.suppress(OSError):
            remove(path)


def _read_request(conn: socket.socket) -> dict[str, Any]:
    conn.settimeout(10)
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise OSError("the owner closed the connection")
        data += chunk
    conn.settimeout(None)
    request: dict[str, Any] = json.loads(data)
    return request


if __name__ == "__main__":  # pragma: no cover - the zygote process itself
    serve(sys.argv[1], int(sys.argv[2]))
