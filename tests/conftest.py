"""Shared fixtures and helpers of the transient_nb test suite.

Every test runs with ``transient.run-dir`` and ``transient.registry-dir`` pointing into its own
``tmp_path``, so that no test writes under the user's home folder or sees another test's clusters.
Tests wait on conditions (events in the log, registry state, processes gone) with
:func:`wait_for` / :func:`wait_for_sync`, never with bare sleeps.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import dask.config
import psutil
import pytest
from distributed import utils_test

# Dask's own fixture for the tests that want its leak checks.
from distributed.utils_test import cleanup  # noqa: F401

import transient_nb  # registers the ``transient`` config defaults

# Posting an event kind that transient_nb.eventlog.vocabulary does not declare raises, in this process and in
# the worker processes it starts (they inherit the environment): a test then fails.
os.environ.setdefault("TRANSIENT_NB_STRICT_EVENTS", "1")

# Most of the suite's clusters never train: their GPU workers skip the warm-up import of torch and
# the trainer, in this process and in every process the tests start (heads, kernels, the CLI: they
# inherit the environment); 2.5% of the suite's CPU (benchmarks/NOTES.md). The tests that train
# import it when their trainers start; tests/training/test_warmup.py turns it back on.
os.environ.setdefault("DASK_TRANSIENT__WARM_UP", "False")
dask.config.set({"transient.warm-up": os.environ["DASK_TRANSIENT__WARM_UP"] == "True"})


@pytest.fixture(scope="session", autouse=True)
def _dask_callback_thread() -> None:
    """Dask runs ``Future.add_done_callback`` callbacks in one thread it keeps for the life of
    the process, made on first use (the training driver wakes its loop through one). Made here
    first, so that the leak check of Dask's ``cleanup`` fixture does not blame whichever test
    happens to use it first."""
    from concurrent.futures import ThreadPoolExecutor

    from distributed.client import Future

    if Future._cb_executor is None or Future._cb_executor_pid != os.getpid():
        Future._cb_executor = ThreadPoolExecutor(1, thread_name_prefix="Dask-Callback-Thread")
        Future._cb_executor_pid = os.getpid()
        Future._cb_executor.submit(lambda: None).result()  # its thread started now


#: Poll interval of the wait helpers (seconds).
POLL_S = 0.05
#: The benchmark scripts (``benchmarks/``): see :func:`benchmark`.
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Point the run record and cluster registry folders at this test's ``tmp_path``.

    ``gen_test`` and ``gen_cluster`` reset dask's config to the snapshot that
    ``distributed.utils_test`` took when it was imported; the ``transient`` namespace, isolated,
    goes into that snapshot too, so that it survives the reset.
    """
    with dask.config.set(
        {
            "transient.run-dir": str(tmp_path / "runs"),
            "transient.registry-dir": str(tmp_path / "clusters"),
        }
    ):
        monkeypatch.setitem(
            utils_test.original_config, "transient", copy.deepcopy(dask.config.get("transient"))
        )
        yield


def _describe(predicate: Callable[..., Any]) -> str:
    return getattr(predicate, "__qualname__", repr(predicate))


def wait_for_sync(
    predicate: Callable[[], Any], timeout: float = 60, message: str | None = None
) -> Any:
    """Poll ``predicate()`` every 0.05 s until it returns something truthy; return that.

    Raises ``TimeoutError`` (with ``message``) after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(message or f"{_describe(predicate)} still false after {timeout}s")
        time.sleep(POLL_S)


async def wait_for(
    predicate: Callable[[], Any | Awaitable[Any]], timeout: float = 60, message: str | None = None
) -> Any:
    """Async twin of :func:`wait_for_sync`; ``predicate`` may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(message or f"{_describe(predicate)} still false after {timeout}s")
        await asyncio.sleep(POLL_S)


# -- what the suite needs -----------------------------------------------------------------------
def in_ci() -> bool:
    """Whether this is a CI run (``CI`` set, as CI services and ``.ci/run`` do)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(ok: bool, reason: str) -> None:
    """Skip the calling test when ``ok`` is false, but fail it in CI: there, a missing browser,
    module or tool is a broken machine, and a run that skips what it promises is not green."""
    if ok:
        return
    if in_ci():
        pytest.fail(f"{reason} (CI is set: the suite must not skip it)", pytrace=False)
    pytest.skip(reason)


def require_module(name: str, install: str) -> Any:
    """``importlib.import_module(name)``, or :func:`require`'s skip (fail in CI) naming ``install``."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        require(False, f"cannot import {name} ({e}): {install}")


# -- events -------------------------------------------------------------------------------------
def benchmark(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` as a module, its folder on ``sys.path`` as when it runs as a script
    (it imports ``_common`` beside it): a test uses a benchmark's code, never a copy of it."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    module = importlib.import_module(name)
    assert Path(module.__file__ or "").parent == BENCHMARKS, module
    return module


#: ``train(emulate=PACED)``: each trainer paced to 10 steps/s (T4, the local backend's default
#: type). For runs that train until something stops them (a deadline, a kernel's death, a
#: button), whose test waits on events rather than on steps: unpaced, each trainer keeps a core
#: busy for as long as the test waits; paced, about a sixth of one at the default batch of 128 (13
#: ms of a core a step for resnet8 on digits, trainer and PS). Not for runs of a fixed number
#: of steps: they cost the same CPU paced, only spread over a longer test.
PACED = "t4=10"


def endless_run(cluster: Any, **options: Any) -> Any:
    """A resnet8 run on digits that trains until it is stopped (no evaluation, no checkpoint on
    the way): ``train``'s ``options`` on top."""
    from transient_nb import train

    params: dict[str, Any] = dict(
        model="resnet8",
        data="digits",
        steps=10**6,
        batch_size=16,
        eval_every=10**6,
        checkpoint_every=10**6,
    )
    return train(cluster, **{**params, **options})


def kinds(events: Iterable[dict[str, Any]], worker: str | None = None) -> list[str]:
    """The ``kind`` of every event (of one worker, if given), in order."""
    return [e["kind"] for e in events if worker is None or e.get("worker") == worker]


def of_kind(events: Iterable[dict[str, Any]], kind: str, **match: Any) -> list[dict[str, Any]]:
    """Events of one kind whose fields equal ``match``."""
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


def index_of(events: list[dict[str, Any]], kind: str, start: int = 0, **match: Any) -> int:
    """Index of the first event of ``kind`` (matching ``match``) at or after ``start``; -1 if none."""
    for i in range(start, len(events)):
        e = events[i]
        if e["kind"] == kind and all(e.get(k) == v for k, v in match.items()):
            return i
    return -1


# -- processes ----------------------------------------------------------------------------------
def child_pids() -> set[int]:
    """Every live descendant of this test process, but its zygote (kept for the process's life:
    transient_nb.backends.zygote); the VMs forked from it count."""
    from transient_nb.backends import zygote

    keep = zygote.current()
    return {
        p.pid
        for p in psutil.Process().children(recursive=True)
        if keep is None or p.pid != keep.proc.pid
    }


def alive(pids: Iterable[int]) -> set[int]:
    """The pids of ``pids`` that still run (zombies count as gone)."""
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def end_processes(procs: list[psutil.Process], timeout: float = 15) -> None:
    """End these processes (each by its pid, started by the test): terminate them, then kill
    those still there after ``timeout`` seconds."""
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, left = psutil.wait_procs(procs, timeout=timeout)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=5)


def vm_pids(cluster: Any) -> set[int]:
    """The processes of every VM of a local cluster now: each VM's top process and descendants."""
    pids: set[int] = set()
    for vm in list(cluster.workers.values()):
        pid = getattr(vm, "pid", None)
        if pid is None:
            continue
        pids.add(pid)
        try:
            pids |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
    return pids


@pytest.fixture(scope="session")
def warm_python() -> Iterator[Any]:
    """Warm interpreters for the doc pages' and the benchmarks' processes (:mod:`tests.warm`):
    one server per test process that needs them, started on first use."""
    from tests.warm import WarmPython

    server = WarmPython()
    yield server
    server.close()


@pytest.fixture
def kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A kernel's environment: everything it writes goes under ``tmp_path``, and its registry
    and run folders are this test's (those of ``_isolated_dirs``).

    Set here too, so that the kernel manager in this process (connection files) follows it.
    """
    for var, sub in (
        ("DASK_TRANSIENT__RUN_DIR", "runs"),
        ("DASK_TRANSIENT__REGISTRY_DIR", "clusters"),
        ("IPYTHONDIR", "ipython"),
        ("JUPYTER_CONFIG_DIR", "jupyter/config"),
        ("JUPYTER_DATA_DIR", "jupyter/data"),
        ("JUPYTER_RUNTIME_DIR", "jupyter/runtime"),
    ):
        monkeypatch.setenv(var, str(tmp_path / sub))
    # The default data path (the venv's share/jupyter) stays: the python3 kernel spec is there.
    monkeypatch.delenv("JUPYTER_PATH", raising=False)
    return dict(os.environ)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the package's and the benchmarks' bytecode once, before any test starts a process.

    The package is installed editable, so no installer compiled it; where the environment says
    ``PYTHONDONTWRITEBYTECODE`` (CI's does) no interpreter writes it either, and each of the
    suite's hundreds of processes (kernels, heads, CLIs, zygotes) compiled what it imported
    again, about 0.1 s each. Bytecode that exists is still read. Under pytest-xdist the
    controller does it, before its workers start.
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import compileall

    for folder in (Path(transient_nb.__file__).parent, BENCHMARKS):
        compileall.compile_dir(folder, quiet=1)


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    """Parameter ids without whitespace: mutmut hands test ids to pytest split on spaces, so a
    test whose id holds one is "not found" in every mutant's run and every mutant looks killed
    (benchmarks/mutation.py refuses such a run)."""
    if isinstance(val, str) and any(c.isspace() for c in val):
        return "_".join(val.split())
    return None


#: What makes a test ``slow`` without saying so: it starts real processes (a cluster, a kernel,
#: a browser, a Jupyter server, a CLI in a subprocess) or trains. The fast tier
#: (``pytest -m "not slow"``) is every other test: each module's unit tests, in minutes.
SLOW_SOURCE = (
    "TransientCluster(",
    "LocalCluster(",
    "SpecCluster(",
    "gen_cluster",
    "subprocess.",
    "Popen(",
    "train(",
    "connect(",
    "notebook_client",
    "NotebookClient",
    "sync_playwright",
    "jupyter_server",
)
#: Fixtures that start real processes.
SLOW_FIXTURES = frozenset(
    {
        "cluster",
        "client",
        "c",
        "s",
        "a",
        "b",
        "lab",
        "kernel_env",
        "server",
        "ps_process",
        "warm_python",
    }
)


def _starts_processes(item: pytest.Item) -> bool:
    import inspect

    function = getattr(item, "function", None)
    if function is None:  # a doctest: the examples that need a cluster say "+SKIP"
        return False
    if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    return any(needle in source for needle in SLOW_SOURCE)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test that starts real processes (:data:`SLOW_SOURCE`,
    :data:`SLOW_FIXTURES`), besides those marked by hand; under pytest-xdist, put the longest
    first (:func:`_longest_first`)."""
    slow = pytest.mark.slow
    for item in items:
        if item.get_closest_marker("slow") is None and _starts_processes(item):
            item.add_marker(slow)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each xdist worker collects; the order is theirs
        items.sort(key=_longest_first)


# -- running in parallel (pytest-xdist) ---------------------------------------------------------
#: The files whose tests take longest together, longest first (``--durations``, 2-core machine,
#: 2026-12-06). pyproject's ``--dist loadfile`` runs a file's tests on one worker, so these
#: start first: no worker picks one up when the others are nearly done. Then the files with slow
#: tests, then the rest. The longest notebook and benchmarks have files of their own for this.
LONGEST = (
    "tests/test_reproduce_notebook.py",
    "tests/training/test_run.py",
    "tests/test_gpu_suite.py",
    "tests/test_docs.py",
    "tests/test_paper_benchmarks.py",
    "tests/deploy/test_head.py",
    "tests/chaos/test_faults.py",
    "tests/test_benchmarks.py",
    "tests/test_notebooks.py",
)


def _longest_first(item: pytest.Item) -> int:
    """Sort key: the :data:`LONGEST` files' tests in that order, then the slow, then the rest
    (a stable sort keeps each group in the collection's order; a file goes where its first test
    does)."""
    for rank, prefix in enumerate(LONGEST):
        if item.nodeid.startswith(prefix):
            return rank
    return len(LONGEST) + (item.get_closest_marker("slow") is None)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's ``addopts``): one and a half workers a core, at least two. Part
    of a slow test's time is waiting (a cluster's processes starting, a paced run, a kernel, a
    browser), so a third worker on two cores keeps them busy; a fourth only stretches each test
    (benchmarks/NOTES.md, issue 31)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(2, (3 * (cores or 1)) // 2)
