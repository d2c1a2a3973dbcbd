"""Trainers: one Dask actor on every preemptible worker, also on replacements.

A trainer's :meth:`Trainer.run` is its training loop, in a thread of its own: draw a batch,
forward/backward, push the gradient to every PS shard and get the new weights back (one round
trip), repeat. When the worker gets a preemption notice, the drain hook lets the current step
finish, pushes that last gradient and leaves the PS cleanly. A call that is slow, fails, or is
overtaken by a new PS makes the trainer rejoin the current PS (a Dask ``Variable`` holds it) with
bounded, backed-off retries, and go on from its weights; only a PS that answers nothing for
``ps_lost_after_s`` makes it give up.

Its calls to the PS and its rejoining are :class:`~transient_nb.training.ps_link.PSLink`'s.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
import zlib
from typing import Any

import torch
from distributed import get_worker

from transient_nb.eventlog.vocabulary import TOPIC, make_event
from transient_nb.training.emulation import (
    CROSS_REGION_SLOWDOWN,
    StepPacer,
    cluster_time_scale,
    cross_region,
    parse_emulation,
    rate_basis,
)
from transient_nb.training.flat import FlatModel

# Re-exported: the driver and the tests import these from here (they live with the flat layout).
from transient_nb.training.flat import decay_mask as decay_mask
from transient_nb.training.flat import flat_layout as flat_layout
from transient_nb.training.flat import get_flat as get_flat
from transient_nb.training.flat import set_flat as set_flat
from transient_nb.training.hparams import HParams

# Re-exported: a trainer's link to the PS, and what it raises.
from transient_nb.training.ps_link import WAIT_SLICE_S as WAIT_SLICE_S
from transient_nb.training.ps_link import (
    Locator,
    PSLink,
    PSUnavailable,
    _merge,
    _Stopped,
    lookup_ps,
)
from transient_nb.training.ps_link import PSLost as PSLost
from transient_nb.training.ps_link import current_generation as current_generation
from transient_nb.training.workload import (
    Workload,
    batch_size_of,
    for_trainer,
    load_fixed,
    to_device,
)
from transient_nb.worker.drain import register_drain_hook, unregister_drain_hook
from transient_nb.worker.identity import vm_gpu, vm_name, vm_zone

logger = logging.getLogger(__name__)


#: How often a trainer checks that it still talks to the current PS (seconds).
GENERATION_CHECK_S = 2.0
#: How often a trainer posts its own ``worker-metrics`` (seconds).
METRICS_EVERY_S = 2.0


class Trainer(PSLink):
    """The training loop of one worker, as a Dask actor.

    Parameters
    ----------
    run
        Run id.
    model, data
        Model name and data spec (see :func:`~transient_nb.training.data.load_dataset`).
    hparams
        :class:`HParams` as a dict.
    variable
        Name of the Dask Variable that holds the current PS shards.
    bounds
        Shard slices of the flat parameter vector.
    seed
        Base seed; each worker draws its own batches.
    device
        "cuda", "cpu" or None (CUDA when available).
    name
        The trainer's name (default: the VM's name, else the worker's).
    locate
        How to find the current PS (default: read ``variable``); tests pass an in-process double.
    gpu, time_scale
        For ``hparams["emulate"]``: the GPU type to pace to (default: the VM's, from
        ``TRANSIENT_NB_VM``) and the cluster's time scale (default: its ``started`` event's).
    ps_zone, zone
        For ``hparams["emulate"]``: where the PS runs and where this trainer does (default: the
        VM's zone); a trainer in another region than the PS steps
        :data:`~transient_nb.training.emulation.CROSS_REGION_SLOWDOWN` times slower.
    workload
        The user's model, data and loss: ``"plugin"`` (the run's worker plugin), a
        :class:`~transient_nb.training.workload.Workload` (tests), or None: ``model`` on ``data``.

    Notes
    -----
    The loop runs in a thread of its own (:meth:`run` awaits it), not in the worker's single
    actor thread: a trainer that outlives its run can then never keep a later run's trainer from
    starting on the same worker.

    A call that does not answer within ``call_timeout_s``, fails, or is overtaken by a newer PS
    generation makes the trainer *rejoin*: look the PS up again, take its weights and register,
    retrying with exponential backoff. Only when no PS has answered for ``ps_lost_after_s`` does
    it give up with :class:`PSLost`. While it is away, the PS stops counting it as active.
    """

    def __init__(
        self,
        run: str,
        model: str,
        data: str,
        hparams: dict[str, Any],
        variable: str,
        bounds: list[tuple[int, int]],
        seed: int = 0,
        device: str | None = None,
        name: str | None = None,
        locate: Locator | None = None,
        gpu: str | None = None,
        time_scale: float | None = None,
        ps_zone: str | None = None,
        zone: str | None = None,
        workload: Workload | str | None = None,
    ):
        self.run_id = run
        self._workload = workload
        self.model_name = model
        self.data = data
        self.hp = HParams.from_dict(hparams)
        self.variable = variable
        self.bounds = bounds
        try:
            self.worker: Any = get_worker()
        except ValueError:  # built outside a worker (unit tests)
            self.worker = None
        self.name = name or vm_name(self.worker) or "trainer"
        self.gpu = gpu or vm_gpu()
        self.zone = zone or vm_zone()
        self.ps_zone = ps_zone
        self._repace = False  # the PS moved to or from this trainer's region: pace anew
        self._time_scale = time_scale
        self._locate: Locator = locate or (lambda timeout: lookup_ps(self.variable, timeout))
        self._custom_locate = locate is not None
        self.seed = (seed * 1_000_003 + zlib.crc32(self.name.encode())) % 2**31
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._stop = threading.Event()
        self._draining = threading.Event()
        self._done = threading.Event()
        self.local_step = 0
        self.accepted = 0
        self.ps_failures = 0
        self.rejoins = 0
        self.generation = -1
        self.state = "created"
        #: The data plane's connections to the shards (None: the actor carries the bytes).
        self._links: list[Any] | None = None
        self.data_plane = "dask"
        #: Events posted (kept here too, so a test without a worker can read them).
        self.posted: list[dict[str, Any]] = []
        if self.worker is not None:
            register_drain_hook(self._drain)

    # -- control (coroutines: they answer at once, even while the loop runs) ----------------------
    async def stop(self) -> None:
        """Stop after the current step (no final push)."""
        self._stop.set()

    async def status(self) -> dict[str, Any]:
        """Counters of this trainer."""
        return self._counters()

    async def run(self) -> dict[str, Any]:
        """Train until stopped, drained or the run has its steps; returns this trainer's counters.

        Raises what the loop raised (no data, out of memory, :class:`PSLost`): the driver
        watches this call, posts ``trainer-failed`` and restarts the trainer with backoff.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[dict[str, Any]] = loop.create_future()
        context = contextvars.copy_context()  # get_worker() and get_client() work in the thread

        def settle(result: Any, error: BaseException | None) -> None:
            if done.cancelled():
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(result)

        def target() -> None:
            try:
                result = context.run(self.train)
            except BaseException as e:
                loop.call_soon_threadsafe(settle, None, e)
            else:
                loop.call_soon_threadsafe(settle, result, None)

        # A named thread of its own (not the loop's shared pool): easy to find, gone when done.
        threading.Thread(
            target=target, name=f"transient-trainer-{self.run_id}", daemon=True
        ).start()
        return await done

    async def _drain(self, deadline: float) -> None:
        # Preemption notice: finish this step, push its gradient, leave; then the worker goes.
        self._draining.set()
        self._stop.set()
        while not self._done.is_set() and time.time() < deadline:
            await asyncio.sleep(0.02)

    def _counters(self) -> dict[str, Any]:
        return {
            "worker": self.name,
            "state": self.state,
            "local_step": self.local_step,
            "accepted": self.accepted,
            "ps_failures": self.ps_failures,
            "rejoins": self.rejoins,
            "generation": self.generation,
            "data_plane": self.data_plane,
        }

    # -- the run's events ---------------------------------------------------------------------------
    def _post(self, kind: str, **fields: Any) -> None:
        event = make_event(kind, run=self.run_id, **fields)
        self.posted.append(event)
        if self.worker is not None:
            self.worker.log_event(TOPIC, event)

    # -- emulation ------------------------------------------------------------------------------------
    def _pacer(self) -> StepPacer | None:
        """A pacer to the emulated step time of this VM's GPU type, if the run emulates one."""
        emu = parse_emulation(self.hp.emulate)
        if emu is None:
            return None
        scale = self._time_scale or cluster_time_scale(self.worker)
        # A user's model steps at a rate given for it (emulate="t4=30"), never at the paper's
        # ResNet-32 figures: without one it is not paced, and the event says so.
        rate = emu.rate_for(self.gpu, reference_model=self._reference_model)
        step_s = None if rate is None else self.hp.emulate_step_scale / (rate * scale)
        far = cross_region(self.zone, self.ps_zone)
        if far and step_s is not None:
            step_s *= CROSS_REGION_SLOWDOWN  # each round trip to a PS in another region
        # Posted unpaced too (steps_per_s None): a GPU type with no rate is said, not hidden.
        self._post(
            "emulation-paced",
            worker=self.name,
            role="worker",
            gpu=self.gpu,
            steps_per_s=rate,
            wall_steps_per_s=None if step_s is None else 1.0 / step_s,
            **({} if self._reference_model else {"basis": rate_basis(rate)}),
            time_scale=scale,
            step_scale=self.hp.emulate_step_scale,
            zone=self.zone,
            ps_zone=self.ps_zone,
            cross_region=far,
        )
        if step_s is None:
            return None
        # An unpaced PS's replies are this host's work; a paced PS's queue is the emulation's.
        return StepPacer(step_s, count_reply=emu.ps_steps_per_s is None)

    def _pace(self, pacer: StepPacer | None, final: bool = False) -> None:
        if pacer is None:
            return
        if not final:
            pacer.wait(self._stop)
        behind = pacer.behind(final)
        if behind is not None:
            self._post("emulation-behind", worker=self.name, role="worker", gpu=self.gpu, **behind)

    # -- the loop -------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """The training loop (blocking); :meth:`run` runs it in its own thread."""
        try:
            self._train()
        except BaseException:
            self.state = "failed"
            raise
        finally:
            if self.worker is not None:
                unregister_drain_hook(self._drain)
            self._done.set()
        return self._counters()

    def _train(self) -> None:
        torch.manual_seed(self.seed)
        threads = int(getattr(getattr(self.worker, "state", None), "nthreads", 1) or 1)
        torch.set_num_threads(max(1, threads))
        self.state = "loading"
        workload, fixed = for_trainer(self._workload, self.run_id, self.model_name, self.data)
        self._reference_model = workload.builtin_model
        # The built-in names take the same steps as ever: the data set, then the model from the
        # seeded generator, then the paper's augmented stream.
        workload.train_set()
        model = workload.build_model()
        if fixed:  # frozen weights and integer buffers as the driver built them, bit for bit
            load_fixed(model, fixed)
        model = model.to(self.device)
        model.train()
        flat = FlatModel(model, self.hp.wire_dtype)
        device_id = _device_id(flat.w.device)
        stream = workload.train_batches(self.hp.batch_size, self.seed)
        loss_fn = workload.loss_fn()
        pacer = self._pacer()
        shards: list[Any] = []
        t_report, imgs = time.time(), 0
        try:
            self.state = "joining"
            shards, version = self._rejoin(flat)
            self.state = "training"
            # With ``pipeline``, the push of step k travels while step k+1 is computed (from
            # the weights of step k-1: one more version of staleness); else one round trip
            # per step.
            pending: list[Any] | None = None
            while not self._stopping():
                if self._repace:
                    self._repace = False
                    pacer = self._pacer()
                if pacer is not None:
                    pacer.begin()
                x, y = next(stream)
                x, y = to_device(x, self.device), to_device(y, self.device)
                flat.mark_statistics()
                loss = loss_fn(model(x), y)
                model.zero_grad(set_to_none=False)  # in place: the gradients stay views
                loss.backward()
                grad, bn_delta = flat.grads()  # host buffers in the wire dtype, no allocation
                if pacer is not None:
                    pacer.computed()
                base = version
                final = self._draining.is_set()
                try:
                    if pending is not None:
                        pieces, bn, version = _merge(self._gather(pending))
                        pending = None
                        self._accept(flat, pieces, bn)
                    self.local_step += 1
                    futures = self._send(
                        shards, grad, base, float(loss.detach()), batch_size_of(y), bn_delta, final
                    )
                    if self.hp.pipeline and not final:
                        pending = futures
                    else:
                        pieces, bn, version = _merge(self._gather(futures))
                        self._accept(flat, pieces, bn)
                except PSUnavailable as e:
                    # Slow is not dead: rejoin the current PS (maybe a new generation) and go on
                    # from its weights. A gradient already sent may still be applied; if not,
                    # the PS counts the gap.
                    pending = None
                    self.ps_failures += 1
                    self._post(
                        "trainer-ps-lost", worker=self.name, step=version, error=str(e)[:200]
                    )
                    self.state = "rejoining"
                    if final:
                        break  # the notice's deadline will not wait for a rejoin
                    shards, version = self._rejoin(flat)
                    self.rejoins += 1
                    self.state = "training"
                    self._post(
                        "ps-rejoined", worker=self.name, generation=self.generation, step=version
                    )
                    continue
                imgs += batch_size_of(y)
                now = time.time()
                if now - t_report >= METRICS_EVERY_S:
                    self._post(
                        "worker-metrics",
                        worker=self.name,
                        step=version,
                        img_per_s=imgs / (now - t_report),
                        local_step=self.local_step,
                        device=device_id,
                    )
                    t_report, imgs = now, 0
                if final:
                    break  # drained: no more pushes
                if version >= self.hp.steps:
                    self.state = "finished"  # the run has all its steps
                    break
                self._pace(pacer)
                if self.generation >= 0 and now - self._t_generation >= GENERATION_CHECK_S:
                    # The driver may have re-created the PS while the old one still answers.
                    self._t_generation = now
                    if self._newer_generation():
                        pending = None
                        shards, version = self._rejoin(flat)
            self._pace(pacer, final=True)  # a run shorter than a judging window is judged too
            if pending is not None:  # the last push in flight: its reply still counts
                try:
                    self._accept(flat, *_merge(self._gather(pending))[:2])
                except PSUnavailable:
                    pass
        except _Stopped:
            pass
        finally:
            self._disconnect()
            if self._draining.is_set():
                self.state = "drained"
            elif self.state != "finished":  # ("failed" is set by train(), after this)
                self.state = "stopped"
            if not self._draining.is_set() and shards:
                try:  # best effort, bounded: the PS may be the reason we stop
                    self._gather([ps.unregister(self.name, True) for ps in shards])
                except (PSUnavailable, _Stopped):
                    pass

    _t_generation = 0.0
    _reference_model = True  # a built-in model (the paper's rates apply to it)


def _device_id(device: torch.device) -> str:
    """ "cpu", or "cuda:" and the GPU's UUID: trainers with distinct ids had GPUs of their own
    (what an honest speedup over one worker needs; see ``state.RunSummary``)."""
    if device.type != "cuda":
        return "cpu"
    props = torch.cuda.get_device_properties(device)
    return f"cuda:{getattr(props, 'uuid', device.index)}"
