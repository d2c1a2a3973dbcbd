"""Helpers shared by the benchmark scripts: tables, clusters, step-rate windows, plain loops.

Not a benchmark itself. The worker processes of :func:`transient_cluster` get this folder on
their ``PYTHONPATH``, so that functions of these modules can run there as tasks.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

#: Environment of every plain (baseline) process: the same as the Dask workers get from the local
#: backend (one BLAS/OpenMP thread, no MALLOC_TRIM_THRESHOLD_), so only the PS path differs.
PLAIN_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# -- output ----------------------------------------------------------------------------------------
def fmt(x: Any, digits: int = 3) -> str:
    """A number with ``digits`` significant digits (integers as they are)."""
    if isinstance(x, str):
        return x
    if isinstance(x, int):
        return str(x)
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if x == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - magnitude)
    return f"{x:.{decimals}f}"


def md_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table (the output every benchmark prints)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def parse_md_table(text: str) -> tuple[list[str], list[list[str]]]:
    """The first markdown table in ``text``: header and rows (for the tests)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("|")]
    if len(lines) < 2:
        raise ValueError("no markdown table in the output")
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    return cells[0], [row for row in cells[2:] if row != cells[0]]


def quiet() -> None:
    """Keep Dask's INFO chatter (scheduler, comms) off the terminal; warnings still show."""
    import distributed  # noqa: F401  (configures its loggers, which we then turn down)

    for name in list(logging.root.manager.loggerDict):
        if name.split(".")[0] in ("distributed", "transient_nb", "tornado"):
            logging.getLogger(name).setLevel(logging.WARNING)


def log(msg: str) -> None:
    """Progress on stderr (the table goes to stdout)."""
    import sys

    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def spread(values: Sequence[float]) -> str:
    """'min-max' of repeated measurements."""
    if len(values) < 2:
        return "-"
    return f"{fmt(min(values))}-{fmt(max(values))}"


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


@contextlib.contextmanager
def environ(changes: Mapping[str, str | None]) -> Iterator[None]:
    """These environment variables set (None: unset) for what starts in the block (processes
    inherit them), and back as they were after it."""
    saved = {k: os.environ.get(k) for k in changes}
    try:
        _set_environ(changes)
        yield
    finally:
        _set_environ(saved)


def _set_environ(values: Mapping[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# -- clusters ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def transient_cluster(workers: int, **options: Any) -> Iterator[Any]:
    """A local :class:`~transient_nb.TransientCluster` (real worker processes, no provisioning
    delay, no simulated preemptions), its run record in a temporary folder."""
    import dask

    from transient_nb import TransientCluster

    folder = tempfile.mkdtemp(prefix="transient-bench-")
    # The local backend starts its workers with this process's environment.
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.environ.get("PYTHONPATH", "")
    if here not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, path) if p)
    with dask.config.set({"transient.run-dir": folder, "transient.registry-dir": folder}):
        options = {"provisioning_delay": 0, "preemption": "none", **options}
        cluster = TransientCluster(workers=workers, **options)
        try:
            cluster.wait_for_workers(timeout=300)
            yield cluster
        finally:
            cluster.close()
            shutil.rmtree(folder, ignore_errors=True)


# -- step rates ---------------------------------------------------------------------------------------
def window_rates(
    times: Sequence[float], window_s: float, min_steps: int = 4, start: float = -math.inf
) -> list[float]:
    """Steps per second over consecutive windows of completion times ``times`` (sorted).

    A window spans at least ``window_s`` seconds and ``min_steps`` steps (slow CPU steps would
    otherwise make a short window count 2 or 3 steps, a quantised rate); it starts and ends on a
    step, so no partial step is counted. Completions before ``start`` are ignored (warm-up).
    """
    ts = sorted(t for t in times if t >= start)
    rates = []
    i = 0
    for j in range(1, len(ts)):
        if ts[j] - ts[i] >= window_s and j - i >= min_steps:
            rates.append((j - i) / (ts[j] - ts[i]))
            i = j
    return rates


class PSPoller:
    """Samples the PS status of a training run (shard 0) every ``interval`` seconds.

    Records one completion time per accepted update (at the poll that saw it), globally and per
    trainer: the step timestamps of a run through the PS, seen from outside.
    """

    def __init__(self, cluster: Any, variable: str, interval: float = 0.02):
        self.cluster = cluster
        self.variable = variable
        self.interval = interval
        self.steps: list[float] = []  # one time per global step
        self.per_trainer: dict[str, list[float]] = {}
        self.first_seen: dict[str, float] = {}  # when a trainer's first accepted update was seen
        self.samples: list[tuple[float, int, int]] = []  # (time, generation, step)
        self.generation: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._last_step: int | None = None
        self._last_acc: dict[str, int] = {}

    def __enter__(self) -> PSPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(30)

    def _main(self) -> None:
        import json

        from distributed import Client, Variable
        from distributed.actor import Actor

        from transient_nb.training.ps import ParameterServer

        with Client(self.cluster, set_as_default=False, direct_to_workers=True) as client:
            actor = None
            gen = None
            while not self._stop.is_set():
                try:
                    if actor is None:  # (again) look up the current PS
                        info = json.loads(Variable(self.variable, client=client).get(timeout=1))
                        if info["generation"] != gen:
                            gen = self.generation = int(info["generation"])
                            self._last_step = None
                            self._last_acc = {}
                        with client.as_current():
                            actor = Actor(ParameterServer, *info["shards"][0])
                    t0 = time.time()
                    with client.as_current():
                        # A short timeout: a lost PS must not blind the poller to its successor.
                        st = actor.status().result(timeout=0.25)
                    self._record((t0 + time.time()) / 2, st)
                except Exception:
                    actor = None  # not published yet, or the PS is lost or being replaced
                self._stop.wait(self.interval)

    def _record(self, t: float, st: dict[str, Any]) -> None:
        step = int(st["step"])
        self.samples.append((t, int(st["generation"]), step))
        if self._last_step is not None and step > self._last_step:
            self.steps += [t] * (step - self._last_step)
        self._last_step = step
        for name, n in st["accepted"].items():
            if n > 0:
                self.first_seen.setdefault(name, t)
            before = self._last_acc.get(name)
            if before is None:  # first sight: counts from here on
                self.per_trainer.setdefault(name, [])
            elif n > before:
                self.per_trainer.setdefault(name, []).extend([t] * (n - before))
            self._last_acc[name] = n


#: Steps every loop takes past its warm-up, however long they take: two rate windows of
#: :func:`window_rates`' four steps.
MIN_STEADY_STEPS = 8


# -- plain (no PS) training loops ------------------------------------------------------------------------
def plain_loop(
    model_name: str,
    data: str,
    batch_size: int,
    device: str,
    threads: int,
    warmup: float,
    seconds: float,
    barrier: Any = None,
    seed: int = 0,
    min_steps: int = MIN_STEADY_STEPS,
) -> list[float]:
    """Train ``model_name`` in this process the way one would without a PS, from ``barrier``
    (all loops start together) until ``warmup + seconds`` after its first step and ``min_steps``
    steps past the warm-up (as :func:`run_through_ps` measures); the completion time of every step.

    The step is the Trainer's minus the PS: the same data pipeline (``BatchStream``, host-side
    augmentation), model, batch, thread count and device, float32 and NCHW as the Trainer (it
    has no autocast or channels_last option), with momentum SGD and weight decay in
    ``torch.optim.SGD``. On CUDA every step ends with a synchronisation, as the Trainer's does (its
    gradient goes to the host every step).
    """
    import torch
    import torch.nn.functional as F

    from transient_nb.training.data import BatchStream, load_dataset
    from transient_nb.training.models import build_model

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    dataset = load_dataset(data, train=True)
    model = build_model(model_name, num_classes=dataset.num_classes).to(device)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    stream = BatchStream(dataset, batch_size, seed=seed)
    cuda = device.startswith("cuda")
    if barrier is not None:
        barrier.wait()
    times: list[float] = []
    steady_from = stop_at = math.inf  # known once the first step is done
    # A host slower than the figures assume (a loaded CI machine) takes longer, not fewer steps:
    # a span of too few steps had no rate window at all and the table said "n/a".
    while time.time() < stop_at or sum(t >= steady_from for t in times) < min_steps:
        x, y = next(stream)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.time())
        if len(times) == 1:
            steady_from = times[0] + warmup
            stop_at = steady_from + seconds
    return times


def _plain_child(queue: Any, kwargs: dict[str, Any]) -> None:
    try:
        queue.put(("ok", plain_loop(**kwargs)))
    except BaseException as e:  # report, do not hang the parent
        queue.put(("error", repr(e)))


def run_plain_processes(n: int, **kwargs: Any) -> list[list[float]]:
    """Run :func:`plain_loop` in ``n`` fresh processes that start stepping together; the step
    times of each."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    barrier = ctx.Barrier(n)
    with environ({**PLAIN_ENV, "MALLOC_TRIM_THRESHOLD_": None}):
        procs = [
            ctx.Process(
                target=_plain_child,
                args=(queue, {**kwargs, "barrier": barrier, "seed": i}),
                daemon=True,
            )
            for i in range(n)
        ]
        for p in procs:
            p.start()
    results = []
    try:
        for _ in procs:
            status, value = queue.get(timeout=kwargs["warmup"] + kwargs["seconds"] + 600)
            if status != "ok":
                raise RuntimeError(f"plain training process failed: {value}")
            results.append(value)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return results


def run_through_ps(
    cluster: Any,
    *,
    model: str,
    data: str,
    batch_size: int,
    device: str | None,
    trainers: int,
    warmup: float,
    seconds: float,
    timeout: float = 600,
    pipeline: bool = False,
    min_steps: int = MIN_STEADY_STEPS,
) -> tuple[list[list[float]], list[float]]:
    """Train through the PS with :func:`transient_nb.train` on every gpu worker of ``cluster``
    until each of ``trainers`` trainers has pushed for ``warmup + seconds`` and ``min_steps``
    steps past its warm-up; the step times of each trainer and of the PS (global steps), seen by
    polling the PS.
    """
    from transient_nb import train

    run = train(
        cluster,
        model=model,
        data=data,
        steps=10**9,
        batch_size=batch_size,
        lr=0.01,
        eval_every=10**9,
        checkpoint_every=10**9,
        device=device,
        pipeline=pipeline,
    )
    deadline = time.monotonic() + timeout
    try:
        while not run.status and not run.done:  # the PS exists and is published
            if time.monotonic() > deadline:
                raise TimeoutError(f"no parameter server within {timeout} s")
            time.sleep(0.05)
        with PSPoller(cluster, run.variable) as poller:
            while True:
                if run.done:
                    run.wait(0)  # re-raises the driver's error
                    raise RuntimeError(f"run ended early: {run.reason}")
                firsts = [ts[0] for ts in poller.per_trainer.values() if ts]
                steady_from = max(firsts, default=math.inf) + warmup
                if (
                    len(firsts) >= trainers
                    and time.time() >= steady_from + seconds
                    and all(
                        sum(t >= steady_from for t in ts) >= min_steps
                        for ts in poller.per_trainer.values()
                    )
                ):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{trainers} trainers did not all train within {timeout} s")
                time.sleep(0.1)
    finally:
        run.stop(wait=True, timeout=60)
    return list(poller.per_trainer.values()), poller.steps


def data_planes(run: Any) -> list[str]:
    """The data planes (``unix``, ``tls``, ``dask``) the run's trainers used, from its
    ``train-finished`` event."""
    import json

    finished = [e for e in run.events() if e.get("kind") == "train-finished"]
    if not finished:
        return []
    trainers = json.loads(finished[-1].get("trainers") or "[]")
    return sorted({str(t.get("data_plane")) for t in trainers})


def steady_window(
    step_times: Sequence[Sequence[float]], warmup_s: float
) -> tuple[float, float] | None:
    """The interval in which every loop of ``step_times`` was past its warm-up and still
    running: from the last first step plus ``warmup_s`` to the first last step."""
    if not step_times or any(len(t) < 2 for t in step_times):
        return None
    start = max(t[0] for t in step_times) + warmup_s
    end = min(t[-1] for t in step_times)
    return (start, end) if end > start else None


def aggregate_rate(
    step_times: Sequence[Sequence[float]],
    window_s: float,
    span: tuple[float, float],
    min_steps: int = 4,
) -> tuple[float, int]:
    """Median over windows of the summed step rate of several loops within ``span``, and the
    number of windows."""
    merged = sorted(t for ts in step_times for t in ts if span[0] <= t <= span[1])
    rates = window_rates(merged, window_s, min_steps=min_steps)
    return median(rates), len(rates)
