"""Warm interpreters for the suite's own Python subprocesses: the documentation's pages
(:mod:`tests.doc_pages`) and the benchmarks' ``--tiny`` runs.

Each of those is a fresh ``python`` that spends 2.5-4 s of a core importing torch, Dask, pandas,
Bokeh and the package before its first line of work: a minute of the suite's CPU in all, spent
on the same imports again and again. A :class:`WarmPython` starts one server per test module that
imports them once, single-threaded, then forks each run from itself, as the local backend's
zygote forks VMs (``transient_nb/backends/zygote.py``, whose recipe and helpers this uses: ``gc.freeze``
after the imports, a session of its own per run, the run's environment, folder and configuration,
fresh random seeds). What a run is does not change: it is ``python -m MODULE ARGS`` or
``python SCRIPT ARGS`` in its own process, with its own file descriptors (passed over the
server's Unix socket), exit status and process group.

A shell script that runs ``"$PYTHON" script.py ...`` gets the same through :meth:`WarmPython.shim`:
an executable that hands its arguments and descriptors to the server and exits with the run's
status; anything the server does not run (``python -`` with a program on stdin, options) runs in
a real interpreter.

    python -m tests.warm SOCKET MODULE...        # the server (started by WarmPython)
    python -m tests.warm --client SOCKET ARGS... # the shim's client
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: What a doc page's or a benchmark's process imports before its first line of work.
PRELOAD = (
    "torch",
    "numpy",
    "pandas",
    "distributed",
    "bokeh.plotting",
    "IPython.core.interactiveshell",
    "transient_nb",
    "transient_nb.deploy.cluster",
    "transient_nb.training.run",
    "transient_nb.training.trainer",
    "transient_nb.training.ps",
    "transient_nb.notebook.magics",
    "transient_nb.experiments.reproduce",
)
#: Seconds a client waits for the server to import everything and listen.
START_TIMEOUT_S = 120.0
#: How often the server reaps its runs (seconds).
TICK_S = 0.05


class WarmPython:
    """A server of warm interpreters, its runs forked from one process that imported ``preload``.

    Parameters
    ----------
    preload
        Modules the server imports before its first fork.
    """

    def __init__(self, preload: Sequence[str] = PRELOAD) -> None:
        self._folder = tempfile.mkdtemp(prefix="transient-nb-warm-")  # 0700
        self.address = os.path.join(self._folder, "warm.sock")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.warm", self.address, *preload],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | os.PathLike[str],
        timeout: float,
        merged: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python ARGV`` (``-m MODULE ...`` or ``SCRIPT ...``) warm; what it printed (its
        stderr in its stdout if ``merged``) and its exit status. Its process group (what it
        started there) is killed when it ends; past ``timeout``,
        :class:`subprocess.TimeoutExpired` is raised with what it printed."""
        with (
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
            open(os.devnull, "rb") as null,
        ):
            fds = (null.fileno(), out.fileno(), (out if merged else err).fileno())
            conn, pid = _start(self.address, argv, env, cwd, fds, self.proc.poll)
            try:
                code = _wait(conn, timeout)
            except TimeoutError:
                out.seek(0)
                raise subprocess.TimeoutExpired(argv, timeout, out.read().decode()) from None
            finally:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                conn.close()
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read().decode(), err.read().decode()
            return subprocess.CompletedProcess(list(argv), code, stdout, None if merged else stderr)

    def shim(self, folder: str | os.PathLike[str]) -> str:
        """An executable in ``folder`` that runs as ``python`` would, warm where it can (for a
        script's ``$PYTHON``); its path."""
        path = os.path.join(folder, "python-warm")
        with open(path, "w") as f:
            f.write(
                "#!/bin/sh\n"
                f'PYTHONPATH="{ROOT}${{PYTHONPATH:+:$PYTHONPATH}}" '
                f'exec "{sys.executable}" -m tests.warm --client "{self.address}" "$@"\n'
            )
        os.chmod(path, 0o700)
        return path

    def close(self) -> None:
        """Stop the server (its runs die with it) and remove its folder."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.address)
        with contextlib.suppress(OSError):
            os.rmdir(self._folder)


def _start(
    address: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | os.PathLike[str],
    fds: tuple[int, int, int],
    exited: Callable[[], int | None] = lambda: None,
) -> tuple[socket.socket, int]:
    """Ask the server for a run: the connection (its exit status comes on it) and its PID."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not os.path.exists(address):
        if exited() is not None:
            raise OSError(f"the warm server exited ({exited()}) before it listened")
        if time.monotonic() > deadline:
            raise OSError(f"the warm server did not listen within {START_TIMEOUT_S:.0f} s")
        time.sleep(TICK_S)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(address)
    request = {"argv": list(argv), "env": dict(env), "cwd": os.fspath(cwd)}
    socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], list(fds))
    return conn, int(json.loads(_line(conn))["pid"])


def _wait(conn: socket.socket, timeout: float | None) -> int:
    """The run's exit status (a negative signal number if a signal ended it)."""
    conn.settimeout(timeout)
    try:
        return int(json.loads(_line(conn))["exit"])
    except TimeoutError:
        raise
    except (OSError, ValueError) as e:
        raise OSError(f"the warm server went away before the run ended: {e!r}") from e


def _line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1)  # one line at a time: what follows it is the next message
        if not chunk:
            raise OSError("the connection closed")
        data += chunk
    return data


def _client(address: str, argv: list[str]) -> int:
    """The shim: run ``python ARGV`` warm with this process's stdin, stdout and stderr."""
    if not argv or (argv[0].startswith("-") and argv[0] != "-m") or not os.path.exists(address):
        os.execv(sys.executable, [sys.executable, *argv])  # not a run the server makes
    conn, pid = _start(address, argv, os.environ, os.getcwd(), (0, 1, 2))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: os.killpg(pid, s))
    code = _wait(conn, None)
    return code if code >= 0 else 128 - code


# -- the server's side --------------------------------------------------------------------------


def serve(address: str, preload: Sequence[str]) -> None:
    """Import ``preload``, then fork a run per connection; answer its PID, then its status."""
    import gc
    import importlib

    from transient_nb.backends.base import die_with_parent

    die_with_parent()  # a test process killed outright takes its server with it
    gc.disable()
    for name in preload:
        with contextlib.suppress(ImportError):  # a run that needs it imports it, and says why
            importlib.import_module(name)
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    partial = address + ".new"
    listener.bind(partial)
    os.chmod(partial, 0o600)
    listener.listen(16)
    os.rename(partial, address)  # clients wait for this name: it appears once we listen
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    runs: dict[int, socket.socket] = {}
    while True:
        for key, _ in sel.select(TICK_S):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                pid = _fork_run(conn, listener, sel)
                if pid:
                    runs[pid] = conn
                    sel.register(conn, selectors.EVENT_READ, pid)
            else:  # a client that went away (killed, timed out): its run goes too
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(key.data, signal.SIGKILL)
                sel.unregister(key.fileobj)
        while runs:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            conn = runs.pop(pid, None)
            if conn is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(conn)
            with contextlib.suppress(OSError):
                conn.sendall(
                    json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n"
                )
            conn.close()


def _fork_run(conn: socket.socket, listener: socket.socket, sel: selectors.BaseSelector) -> int:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    request = json.loads(data)
    pid = os.fork()
    if pid == 0:
        _become_run(request, fds, [listener, conn])
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    return pid


def _become_run(request: dict, fds: list[int], keep_closed: Sequence[socket.socket]) -> None:
    """In the forked child: become ``python ARGV`` in the request's folder and environment."""
    code = 1
    try:
        for s in keep_closed:
            s.close()
        os.setsid()  # its own process group: a timeout kills the run and what it started
        from transient_nb.backends.base import die_with_parent
        from transient_nb.backends.zygote import _fresh_state, _plain_signals

        die_with_parent()
        import gc

        gc.enable()
        _plain_signals()
        for target, fd in enumerate(fds):  # stdin, stdout, stderr
            os.dup2(fd, target)
        for fd in set(fds) - {0, 1, 2}:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # sys.path as the run's own interpreter would start: its PYTHONPATH, then the site's.
        own = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [*own, *(p for p in sys.path[1:] if p not in own)]
        _fresh_state()
        code = _run(request["argv"])
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            import atexit

            atexit._run_exitfuncs()
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _run(argv: list[str]) -> int:
    import runpy

    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path.insert(0, os.getcwd())  # as python -m
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as python SCRIPT
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--client":
        sys.exit(_client(sys.argv[2], sys.argv[3:]))
    serve(sys.argv[1], sys.argv[2:])
