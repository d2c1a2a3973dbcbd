"""Paced emulation of GPU workers and of the paper's PS, on any backend's real processes.

The local backend trains on the CPU, so its trainers and its PS run at whatever speed the host
gives them. To reproduce what a cluster of GPUs would do, a run can *pace* its real processes:
every trainer stretches each step to its GPU type's step time, and each PS shard serves at most
the capacity that Li et al. measured for one 4-vCPU PS. Gradients, the asynchronous PS,
staleness, preemptions, replacements, the learning rate and the bill stay real; only how long a
GPU step takes and how many pushes a PS can serve are emulated.

Two clocks compress a run:

- the cluster's ``time_scale`` (simulated seconds per wall-clock second) divides every step time
  and service time, as it divides lifetimes, start-up delays and notices;
- ``emulate_step_scale`` (an :class:`~transient_nb.training.hparams.HParams` field) makes each
  global step of the run stand for that many steps of the emulated run: a step is paced to that
  many GPU step times, and counts that many at the PS's capacity. With
  ``emulate_step_scale = 64000 / steps`` a run of ``steps`` steps lasts, in simulated time, what
  the paper's 64K-step run lasted, so the paper's lifetimes, start-up delays and per-second
  prices apply unchanged and the expected number of revocations per run is the paper's.

The wall-clock step time of a worker is therefore ``emulate_step_scale / (steps_per_s *
time_scale)``. When the host cannot keep that pace (a step's own work takes longer), the trainer
posts ``emulation-behind`` and the run's summary says so, instead of a distorted figure passing as
an emulated one.

Examples
--------
>>> emu = parse_emulation("paper")
>>> emu.steps_per_s["k80"], emu.ps_steps_per_s
(4.56, 45.0)
>>> round(emu.step_s("k80", time_scale=120, step_scale=100), 4)  # wall seconds per step
0.1827
>>> round(1 / emu.ps_service_s(shards=2), 2)  # global steps/s of two PS shards
78.75
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from transient_nb.eventlog.vocabulary import ClusterStart

#: Per-worker steps/s of the paper's ResNet-32 (T2T, 1.86M parameters) at batch 128 in an
#: asynchronous cluster with one PS, measured by Li et al. (ICAC 2019, §3 of
#: ``reference/paper-facts.md``).
PAPER_STEPS_PER_S: dict[str, float] = {"k80": 4.56, "p100": 12.2, "v100": 15.6}

#: Estimates (NOT measurements) for the catalog's current GPUs, same model and batch. The paper's
#: P100 -> V100 step rate grew 1.28x for 1.7x the FP32 FLOPs: this small model at batch 128 is
#: bound by kernel launches and memory, not by FLOPs, so FLOP ratios are damped the same way.
#: T4 (8.1 TFLOPS FP32, 320 GB/s, 70 W, clocks down under load): about 0.7x a P100.
#: L4 (30 TFLOPS FP32 but 300 GB/s): about a V100. A100-40GB (19.5 FP32 / 156 TF32, 1.5 TB/s):
#: about 1.35x a V100. Replace them with your own measurements (``emulate="paper,t4=7.9"``).
ESTIMATED_STEPS_PER_S: dict[str, float] = {"t4": 8.5, "l4": 15.0, "a100": 21.0, "a100-40gb": 21.0}

#: Global steps/s that one 4-vCPU PS served at most (the paper's plateau: 43-47 with P100s and
#: V100s from 4-5 workers on).
PAPER_PS_STEPS_PER_S = 45.0
#: Gain of a second PS shard at 8 V100s (the paper: up to 1.75x, about 80 global steps/s).
PAPER_TWO_SHARD_GAIN = 1.75
#: Parameters of the model those PS figures were measured with (T2T's resnet_cifar_32).
PAPER_MODEL_PARAMETERS = 1_857_722
#: How much slower a worker steps when the PS is in another region (Li et al. §3: workers split
#: across regions trained up to 48% slower, P100; the PS belongs in the region with most workers).
CROSS_REGION_SLOWDOWN = 1.48

#: Trainers and PS shards judge their pace over windows of at least this long (seconds) ...
BEHIND_WINDOW_S = 2.0
#: ... and post ``emulation-behind`` at most this often (seconds).
BEHIND_REPEAT_S = 10.0
#: A window is behind when the host's own work per step exceeds the paced time by this factor:
#: below it, the pacing absorbs the difference and the emulated figure holds.
BEHIND_TOLERANCE = 1.0


def _rate(name: str, value: Any) -> float:
    try:
        rate = float(value)
    except (TypeError, ValueError):
        rate = math.nan
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(
            f"emulate: {name}={value!r} must be a positive number of steps per second, "
            f"e.g. {name}=4.56."
        )
    return rate


@dataclass(frozen=True)
class Emulation:
    """What a paced run emulates: step rates per GPU type and the PS's capacity.

    Parameters
    ----------
    steps_per_s
        Steps per second of one worker of each GPU type (batch and model of the emulated run),
        in simulated time.
    ps_steps_per_s
        Global steps per second that one PS serves at most (None: the PS is not paced).
    two_shard_gain
        How much faster two PS shards serve than one (see :meth:`ps_service_s`).
    spec
        The canonical text form (what :func:`parse_emulation` reads back).
    """

    steps_per_s: Mapping[str, float]
    ps_steps_per_s: float | None = None
    two_shard_gain: float = PAPER_TWO_SHARD_GAIN
    spec: str = field(default="", compare=False)
    #: GPU types whose rate was given as ``GPU=STEPS_PER_S`` (measured for the run's own model),
    #: not taken from ``paper`` (the paper's ResNet-32).
    given: frozenset[str] = field(default=frozenset(), compare=False)

    def rate_for(self, gpu: str | None, reference_model: bool = True) -> float | None:
        """Steps/s of one ``gpu`` worker: for the paper's reference workload (the built-in
        models) any rate; for a user's model only a rate given for it (None: not measured, the
        ResNet-32 figures would say nothing about it).

        Examples
        --------
        >>> emu = parse_emulation("paper,t4=30")
        >>> emu.rate_for("k80"), emu.rate_for("k80", reference_model=False), emu.rate_for("t4", False)
        (4.56, None, 30.0)
        """
        key = str(gpu).lower() if gpu else ""
        if not reference_model and key not in self.given:
            return None
        return self.steps_per_s.get(key)

    def step_s(
        self, gpu: str | None, time_scale: float = 1.0, step_scale: float = 1.0
    ) -> float | None:
        """Wall-clock seconds of one step of a ``gpu`` worker (None: no rate known, not paced)."""
        rate = self.steps_per_s.get(str(gpu).lower()) if gpu else None
        if rate is None:
            return None
        return step_scale / (rate * time_scale)

    def ps_service_s(
        self,
        shards: int = 1,
        time_scale: float = 1.0,
        step_scale: float = 1.0,
        parameters: int | None = None,
    ) -> float | None:
        """Wall-clock seconds one shard of ``shards`` spends on one push (None: not paced).

        A PS's time per push is modelled as a fixed cost ``a`` (the request, the reply, the
        optimizer's bookkeeping) plus a cost ``b`` proportional to the parameters it holds:
        ``t(n) = a + b / n`` for one of ``n`` shards. The two measured points fix it:
        ``t(1) = 1 / ps_steps_per_s`` and ``t(2) = t(1) / two_shard_gain`` (with the paper's
        figures, ``a`` is 14% of a push and ``b`` 86%; four shards would serve 2.9x one PS).
        ``parameters`` scales ``b`` from the paper's model (:data:`PAPER_MODEL_PARAMETERS`) to
        another model's size: the bytes a push moves and updates grow with it.

        Examples
        --------
        >>> emu = parse_emulation("paper")
        >>> round(1 / emu.ps_service_s(), 1), round(1 / emu.ps_service_s(parameters=466_906), 1)
        (45.0, 125.6)
        """
        if self.ps_steps_per_s is None:
            return None
        t1 = 1.0 / self.ps_steps_per_s
        b = 2.0 * (t1 - t1 / self.two_shard_gain)
        a = t1 - b
        if parameters is not None:
            b *= parameters / PAPER_MODEL_PARAMETERS
        return (a + b / max(1, shards)) * step_scale / time_scale


def parse_emulation(spec: str | Mapping[str, Any] | None) -> Emulation | None:
    """Read an emulation setting: ``None``/``"none"``, ``"paper"``, or a table.

    Text is a comma-separated list: ``paper`` (the paper's K80/P100/V100 rates, the documented
    estimates for T4/L4/A100, and the paper's 4-vCPU PS), ``GPU=STEPS_PER_S`` (add or replace
    one GPU type's rate), ``ps=paper``, ``ps=STEPS_PER_S`` or ``ps=none`` (the PS's capacity in
    global steps/s). A mapping holds the same items: ``{"k80": 4.56, "ps": 45}``. Without
    ``paper``, only the GPU types listed are paced and the PS is not, unless ``ps`` is given.

    Examples
    --------
    >>> parse_emulation("paper,ps=none").ps_steps_per_s is None
    True
    >>> parse_emulation({"t4": 7.9, "ps": 60}).spec
    't4=7.9,ps=60'
    >>> parse_emulation("paper,t4=7.9").steps_per_s["t4"]
    7.9
    >>> parse_emulation("papr")
    Traceback (most recent call last):
    ...
    ValueError: emulate: unknown item 'papr': use 'paper', 'GPU=STEPS_PER_S' (e.g. 'k80=4.56') or 'ps=paper|STEPS_PER_S|none'.
    """
    if spec is None:
        return None
    if isinstance(spec, Mapping):
        items = [f"{k}={v}" if k != "paper" else "paper" for k, v in spec.items()]
    elif isinstance(spec, str):
        items = [s.strip() for s in spec.split(",") if s.strip()]
    else:
        raise ValueError(
            f"emulate={spec!r}: use 'paper', a text such as 'k80=4.56,ps=45', or a dict."
        )
    if items in ([], ["none"]):
        return None
    rates: dict[str, float] = {}
    given: set[str] = set()
    ps: float | None = None
    canonical: list[str] = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep and key == "paper":
            rates.update(PAPER_STEPS_PER_S)
            rates.update(ESTIMATED_STEPS_PER_S)
            ps = PAPER_PS_STEPS_PER_S
            canonical.append("paper")
        elif sep and key == "ps":
            v = value.strip().lower()
            ps = None if v == "none" else PAPER_PS_STEPS_PER_S if v == "paper" else _rate("ps", v)
            canonical.append(f"ps={v}")
        elif sep and key.replace("-", "_").isidentifier():
            rates[key] = _rate(key, value.strip())
            given.add(key)
            canonical.append(f"{key}={value.strip()}")
        else:
            raise ValueError(
                f"emulate: unknown item {item!r}: use 'paper', 'GPU=STEPS_PER_S' (e.g. "
                "'k80=4.56') or 'ps=paper|STEPS_PER_S|none'."
            )
    return Emulation(rates, ps, spec=",".join(canonical), given=frozenset(given))


def rate_basis(rate: float | None) -> str:
    """Where a user's model's emulated step rate comes from (its ``emulation-paced`` event).

    Examples
    --------
    >>> rate_basis(30.0), rate_basis(None)
    ('the rate given for this model', 'no rate measured for this model')
    """
    return (
        "the rate given for this model" if rate is not None else "no rate measured for this model"
    )


def region_of(zone: str | None) -> str | None:
    """The region of a zone: ``"us-central1-a"`` -> ``"us-central1"`` (None stays None).

    Examples
    --------
    >>> region_of("us-central1-a"), region_of("europe-west4-b"), region_of(None)
    ('us-central1', 'europe-west4', None)
    """
    return None if not zone else str(zone).rsplit("-", 1)[0]


def cross_region(zone: str | None, ps_zone: str | None) -> bool:
    """Whether a worker in ``zone`` talks to a PS in another region (False when either is
    unknown).

    Examples
    --------
    >>> cross_region("us-east1-c", "us-central1-a"), cross_region("us-central1-b", "us-central1-a")
    (True, False)
    >>> cross_region(None, "us-central1-a")
    False
    """
    if not zone or not ps_zone:
        return False
    return region_of(zone) != region_of(ps_zone)


#: Read the run's time scale from the first events of the scheduler's log (the ``started``
#: event is among them); TRANSIENT_NB_TIME_SCALE overrides it (tests, hand-made workers).
_FIRST_EVENTS = 50


def _time_scale_of(events: Any) -> float:
    return ClusterStart.of(events).time_scale


def _env_time_scale() -> float | None:
    value = os.environ.get("TRANSIENT_NB_TIME_SCALE")
    return float(value) if value else None


def cluster_time_scale(worker: Any, timeout: float = 10.0) -> float:
    """The time scale of the cluster ``worker`` belongs to, from the ``started`` event (1.0 if
    there is none: GCE runs in real time). Blocking: call it from a thread, not the event loop."""
    env = _env_time_scale()
    if env is not None or worker is None:
        return env or 1.0
    from distributed.utils import sync

    try:
        events = sync(
            worker.loop,
            worker.scheduler.transient_events,
            since=0,
            limit=_FIRST_EVENTS,
            callback_timeout=timeout,
        )
    except Exception:  # an old scheduler or no monitor: real time
        return 1.0
    return _time_scale_of(events)


async def cluster_time_scale_async(worker: Any, timeout: float = 10.0) -> float:
    """:func:`cluster_time_scale` for code on the worker's event loop (the PS)."""
    env = _env_time_scale()
    if env is not None or worker is None:
        return env or 1.0
    try:
        events = await asyncio.wait_for(
            worker.scheduler.transient_events(since=0, limit=_FIRST_EVENTS), timeout
        )
    except Exception:
        return 1.0
    return _time_scale_of(events)


@dataclass
class _Window:
    """Steps and the host's own work in the current judging window."""

    t0: float
    steps: int = 0
    work_s: float = 0.0


class _Judge:
    """The judging windows of one pacer: whether its host's own work per step kept the pace,
    window by window, and the figures of a window that did not (at most every
    :data:`BEHIND_REPEAT_S`)."""

    def __init__(self, now: float):
        self.window = _Window(now)
        self._last_post = -math.inf

    def add(self, work_s: float) -> None:
        """One step (or push) of ``work_s`` seconds of the host's own work."""
        self.window.steps += 1
        self.window.work_s += work_s

    def judge(
        self, now: float, target_s: float, final: bool = False
    ) -> tuple[bool, dict[str, float] | None]:
        """Once a window is over (or, ``final``, the window so far): whether it fell behind
        ``target_s`` a step, and the figures to post (None: none due)."""
        win = self.window
        span = now - win.t0
        if (span < BEHIND_WINDOW_S and not final) or win.steps < 3:
            return False, None
        self.window = _Window(now)
        work = win.work_s / win.steps
        if work <= target_s * BEHIND_TOLERANCE:
            return False, None
        if now - self._last_post < BEHIND_REPEAT_S:
            return True, None
        self._last_post = now
        return True, {
            "target_steps_per_s": 1.0 / target_s,
            "achieved_steps_per_s": 1.0 / work,
            "window_s": span,
        }


class StepPacer:
    """Stretches a trainer's steps to ``step_s`` wall seconds each, and says when it cannot.

    A step's cycle is the trainer's own work (batch, forward, backward, gradients), the push and
    its reply, then a pause up to ``step_s`` from the cycle's start. The host is *behind* when
    its work per step, averaged over a window, exceeds ``step_s``: then no pause can hide it, and
    the emulated rate is not reached. With ``count_reply`` (the PS is not paced) the push and
    its reply are the host's work too; without it (the PS is paced), a slow reply is the emulated
    PS's queue, the plateau the pacing exists to show, so only the trainer's own work counts
    (the PS says itself when it cannot keep its capacity).

    Examples
    --------
    >>> pacer = StepPacer(0.01)
    >>> pacer.begin(); pacer.computed(); slept = pacer.wait()
    >>> 0 < slept <= 0.01
    True
    """

    def __init__(self, step_s: float, clock: Any = time.monotonic, count_reply: bool = False):
        self.step_s = float(step_s)
        self.count_reply = count_reply
        self._clock = clock
        self._t0 = clock()
        self._work = 0.0
        self._judge = _Judge(clock())
        self.steps = 0
        self.behind_windows = 0

    def begin(self) -> None:
        """A step starts (before its batch is drawn)."""
        self._t0 = self._clock()
        self._work = 0.0

    def computed(self) -> None:
        """The step's own work is done (its gradient is ready to push)."""
        self._work = self._clock() - self._t0

    def wait(self, stop: threading.Event | None = None) -> float:
        """Pause until the step has lasted ``step_s``; returns the seconds paused.

        ``stop`` ends the pause early (a notice must not wait for the pace).
        """
        self.steps += 1
        elapsed = self._clock() - self._t0
        self._judge.add(elapsed if self.count_reply else self._work)
        pause = self.step_s - elapsed
        if pause <= 0:
            return 0.0
        if stop is not None:
            stop.wait(pause)
        else:
            time.sleep(pause)
        return pause

    def behind(self, final: bool = False) -> dict[str, float] | None:
        """Once a window is over: the figures of a host that fell behind, else None.

        Returns ``{"target_steps_per_s", "achieved_steps_per_s", "window_s"}`` (wall-clock
        rates: the pace, and what the host's own work allowed) at most every
        :data:`BEHIND_REPEAT_S`. ``final`` judges the window so far (the trainer stops), so
        that a run shorter than a window is judged too.
        """
        behind, figures = self._judge.judge(self._clock(), self.step_s, final)
        if behind:
            self.behind_windows += 1
        return figures


class ServicePacer:
    """One PS shard as a single server that spends ``service_s`` wall seconds per push.

    Pushes are served first come, first served: each waits for the end of its service slot, so
    at most ``1 / service_s`` pushes a second get through, whatever the host could do. The
    shard is *behind* when its real work per push (applying the gradient and copying the reply)
    exceeds ``service_s`` over a window.

    Examples
    --------
    >>> import asyncio
    >>> pacer = ServicePacer(0.01)
    >>> async def three():
    ...     t0 = time.monotonic()
    ...     await asyncio.gather(*(pacer.serve() for _ in range(3)))
    ...     return time.monotonic() - t0
    >>> asyncio.run(three()) >= 0.03
    True
    """

    def __init__(self, service_s: float, clock: Any = time.monotonic):
        self.service_s = float(service_s)
        self._clock = clock
        self._free = -math.inf
        self._judge = _Judge(clock())

    async def serve(self) -> None:
        """Wait until this push's service slot is over (the emulated PS has served it)."""
        now = self._clock()
        start = max(now, self._free)
        self._free = start + self.service_s
        # Assigned before the await: calls on one event loop get their slots in arrival order.
        await asyncio.sleep(self._free - now)

    def worked(self, seconds: float) -> None:
        """The real work of one push took ``seconds``."""
        self._judge.add(seconds)

    def behind(self) -> dict[str, float] | None:
        """As :meth:`StepPacer.behind`, for the PS's capacity."""
        return self._judge.judge(self._clock(), self.service_s)[1]
