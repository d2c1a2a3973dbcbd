"""In-process doubles of remote actors, shared by the trainer's and the driver's unit tests, and
the trainer tests' PS and trainers (tests/training/test_trainer.py, test_ps_link.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any

from transient_nb.training.hparams import HParams
from transient_nb.training.models import build_model
from transient_nb.training.ps import ParameterServer
from transient_nb.training.trainer import Trainer, decay_mask, flat_layout, get_flat


class Future:
    """What an actor call returns: ``result(timeout)`` and ``done()``."""

    def __init__(self, fut: concurrent.futures.Future):
        self._fut = fut

    def result(self, timeout=None):
        return self._fut.result(timeout)

    def done(self):
        return self._fut.done()


class PSDouble:
    """A real :class:`ParameterServer` on a private event loop, behind calls that can be made
    slow (``frozen``) or failing (``error``), the way a remote actor's are."""

    def __init__(self, ps: ParameterServer, loop: asyncio.AbstractEventLoop):
        self.ps, self.loop = ps, loop
        self.frozen = threading.Event()
        self.error: Exception | None = None
        self.calls = 0
        #: The names of the methods called, in order, and their arguments.
        self.called: list[str] = []
        self.arguments: list[tuple[str, tuple, dict]] = []
        self.staleness: list[int] = []
        self.push_times: list[float] = []
        # What the driver reads of an actor handle: the host it lives on, and its key.
        self._address = f"tls://ps-host-{ps.shard}:1"
        self.key = f"ps-{ps.run}-s{ps.shard}"

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.ps, name)

        async def call(*args, **kwargs):
            self.calls += 1
            self.called.append(name)
            self.arguments.append((name, args, kwargs))
            if self.error is not None:
                raise self.error
            while self.frozen.is_set():
                await asyncio.sleep(0.01)
            if name == "push_pull":
                self.staleness.append(self.ps.version - kwargs["base_version"])
                reply = await method(*args, **kwargs)
                self.push_times.append(time.monotonic())
                return reply
            return await method(*args, **kwargs)

        return lambda *a, **k: Future(asyncio.run_coroutine_threadsafe(call(*a, **k), self.loop))


#: Short bounds and small steps, so that a slow or lost PS shows in seconds: the hyperparameters
#: every test of a trainer or a driver starts from.
SHORT = dict(batch_size=16, warmup_steps=0, call_timeout_s=0.5, ps_lost_after_s=3.0)
#: The trainer tests' hyperparameters.
TRAINER_HP = HParams(steps=60, metrics_interval_s=0.2, **SHORT)


def ps_double(loop, tmp_path, generation=0, hp=TRAINER_HP):
    """A real ResNet-8 PS of run ``r`` behind a :class:`PSDouble`."""
    model = build_model("resnet8", num_classes=10)
    params, buffers = flat_layout(model)
    ps = ParameterServer(
        "r",
        0,
        1,
        get_flat(params),
        decay_mask(model),
        get_flat(buffers),
        hp.to_dict(),
        str(tmp_path),
        generation=generation,
    )
    return PSDouble(ps, loop)


class Published:
    """The run's Variable: which PS generation is current."""

    def __init__(self, double):
        self.generation, self.shards = 0, [double]

    def __call__(self, timeout):
        return self.generation, list(self.shards)


def trainer_on(locate, hp=TRAINER_HP, name="w-0", **kwargs):
    """A ResNet-8 trainer of run ``r`` on digits that finds its PS with ``locate``."""
    n = len(get_flat(flat_layout(build_model("resnet8", num_classes=10))[0]))
    return Trainer(
        "r", "resnet8", "digits", hp.to_dict(), "v", [(0, n)], name=name, locate=locate, **kwargs
    )


def gatherer(generation=0, published=0, hp=None, locate=None):
    """A trainer of :func:`trainer_on` at PS generation ``generation`` (its calls time out after
    1.2 s), and the generation its locate publishes (``{"g": ...}``, to change)."""
    hp = hp or HParams(steps=10, call_timeout_s=1.2)
    published_gen = {"g": published}
    trainer = trainer_on(locate or (lambda timeout: (published_gen["g"], [])), hp=hp)
    trainer.generation = generation
    return trainer, published_gen
