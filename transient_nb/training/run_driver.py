"""The driver's core: a run's state, its events, and its PS generations.

:class:`RunCore` holds everything a :class:`~transient_nb.training.run.TrainingRun` knows (its
settings, its PS, its trainers, its checkpoints' progress), posts its events, and makes its PS
generations: the first one, and each one after a move, a reshard or a recovery, on the cluster's
PS hosts. The driver is stacked in parts, each a class on the one below, in this order:
``run_driver`` (this core), ``run_checkpoints`` (checkpoints, resume and recovery),
``run_trainers`` (a trainer per GPU worker, watched), ``run_loop`` (the driver thread, evaluation
and the end), and ``run`` (:class:`~transient_nb.training.run.TrainingRun`'s public side and
:func:`~transient_nb.training.run.train`).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from distributed import Variable

from transient_nb import limits
from transient_nb.eventlog.vocabulary import TOPIC, make_event
from transient_nb.training import checkpoint
from transient_nb.training import resume as resuming
from transient_nb.training.hparams import HParams
from transient_nb.training.ps import ParameterServer, regroup, shard_bounds
from transient_nb.training.workload import Workload

#: The driver logs under one name, whichever of its parts speaks.
logger = logging.getLogger("transient_nb.training.run")

#: A PS status answer older than this makes the driver check that the PS host is still there.
PS_OVERDUE_S = 1.0
#: Seconds a start waits for one PS host per shard before it places shards on fewer hosts.
PS_HOSTS_GRACE_S = 30.0
#: Bound of setting things up: creating an actor, the first checkpoint (seconds).
SETUP_TIMEOUT_S = 120.0
#: Seconds to read the result of a future that is done (a trainer's creation or end): it is at
#: hand, or never (its worker is gone), and the driver's loop must not wait on it.
RESULT_AT_HAND_S = 1.0


@dataclass
class _TrainerSlot:
    """One worker's trainer: its actor, the future of its ``run()``, and its restarts."""

    address: str
    attempt: int = 0
    actor: Any = None
    future: Any = None  # of the actor's creation while pending, of ``run()`` once started
    started: bool = False
    not_before: float = 0.0  # monotonic time before which a restart must not be submitted
    generation: int = 0  # the PS generation when its trainer was asked for
    reruns: int = 0  # trainers asked for again after one finished against an older PS


class RunCore:
    """A run's state, its events and its PS generations (see the module's docstring)."""

    def __init__(
        self,
        cluster: Any,
        model: str,
        data: str,
        hparams: HParams,
        *,
        workload: Workload | None = None,
        stop_at: Mapping[str, tuple[str, float]] | None = None,
        shards: int = 1,
        elastic_shards: bool = False,
        target_accuracy: float | None = None,
        budget: float | None = None,
        deadline: float | None = None,
        checkpoint_url: str | None = None,
        seed: int = 0,
        device: str | None = None,
        resume: resuming.ResumePoint | None = None,
    ):
        self.cluster = cluster
        #: What is trained (the built-in ``model`` on ``data`` unless a workload is given).
        self.workload = workload or Workload(model, data)
        self.model_name = self.workload.model_name
        self.data = self.workload.data_name
        #: Metric -> (">=" or "<=", threshold): the run stops when one is met (``stop_at``).
        self.stop_at = dict(stop_at or {})
        #: The condition that stopped the run (``"mae<=0.3"``), if one did.
        self.stopped_by: str | None = None
        self.hp = hparams
        self.shards = shards
        #: Follow the cluster's PS hosts: when it gains one, split the PS into one more shard.
        self.elastic_shards = elastic_shards
        self.target_accuracy = target_accuracy
        self.deadline = deadline  # UNIX seconds
        # The run's own money and time limits, under the cluster's (which stop the cluster):
        # the same Limits and the same rule, counted from the run's start.
        self.limits = limits.Limits(
            budget=budget, deadline_s=None if deadline is None else deadline - time.time()
        )
        self._limits_t0 = time.monotonic()
        self.seed = seed
        self.device = device
        #: Where a resumed run goes on from (it keeps the earlier run's id and checkpoints).
        self.resume = resume
        self.id = resume.run_id if resume else f"run-{uuid.uuid4().hex[:8]}"
        #: The run's own checkpoint folder: ``checkpoint_url/<id>`` (runs may share the URL
        #: given), the resumed run's folder, or by default the run's folder of the run record
        #: (``checkpoints/<id>``: already its own, so no id is added to it).
        if resume is not None:
            self.checkpoint_url = resume.checkpoint_url
        elif checkpoint_url:
            self.checkpoint_url = checkpoint.run_url(checkpoint_url, self.id)
        else:
            self.checkpoint_url = os.path.join(cluster.run_path, "checkpoints", self.id)
        self.variable = f"transient-ps-{self.id}"
        self.reason: str | None = None
        self.error: BaseException | None = None
        self.step = 0
        self.accuracy: float | None = None
        #: Every metric of the newest evaluation, and its test loss.
        self.metrics: dict[str, float] = {}
        self.test_loss: float | None = None
        self.started = time.time()
        self.finished: float | None = None
        self.status: dict[str, Any] = {}
        #: Gradients lost with workers killed mid-step (at most one per killed worker).
        self.lost_in_flight = 0
        #: Step of the newest complete checkpoint (-1: none yet).
        self.checkpoint_step = -1
        self._stop = threading.Event()
        self._done = threading.Event()
        # Set by what the driver must answer (an event, a trainer at hand, stop): its loop runs
        # then, not at its next poll (a replacement's trainer starts up to 2 polls sooner).
        self._wake = threading.Event()
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._slots: dict[str, _TrainerSlot] = {}
        self._given_up: dict[str, str] = {}  # worker -> the error it kept failing with
        self._released: list[Any] = []  # futures of ended trainers, released at cleanup
        self._ps: list[Any] = []
        self._ps_futures: list[Any] = []
        #: The hosts of the current PS generation's shards (shard i on the i-th, round robin).
        self._ps_addresses: list[str] = []
        self._ps_zone: str | None = None  # where shard 0 runs (told to the trainers)
        self._ps_left = False
        self._generation = 0
        self._bounds: list[tuple[int, int]] = []
        self._mask = np.zeros(0, dtype=np.uint8)
        self._next_eval = hparams.eval_interval
        self._next_checkpoint = hparams.checkpoint_interval
        self._checkpoint_wanted = threading.Event()
        # Checkpoint attempts started, and the latest one settled (published, or nothing new to
        # publish): run.checkpoint() waits for an attempt started after it was called.
        self._checkpoint_attempts = 0
        self._checkpoint_settled = 0
        self._inflight: dict[str, Any] | None = None  # the checkpoint being written
        self._status_future: Any = None
        self._status_sent = 0.0
        self._ps_answered = time.monotonic()
        self._known_step = 0  # the last step the PS is known to have accepted
        self._metrics_step = -1  # the step of the newest ``metrics`` event of this run seen
        self._unregistering: list[tuple[str, list[Any], float]] = []
        self._eval_model: torch.nn.Module | None = None
        #: The model's layout (export.layout) and what the PS never holds (fixed_state).
        self._layout: list[Any] = []
        self._fixed: dict[str, np.ndarray] = {}
        self._fixed_entry: dict[str, Any] | None = None
        self._optimizer: bytes | None = None  # a torch optimizer for the PS, cloudpickled
        self._plugin: str | None = None  # the workload's worker plugin, once registered
        self._client: Any = None
        self._thread = threading.Thread(target=self._main, name=f"transient-{self.id}", daemon=True)

    @property
    def budget(self) -> float | None:
        """The run's money limit in dollars (``train(budget=...)``), kept by its ``limits``."""
        return self.limits.budget

    def _post(self, kind: str, **fields: Any) -> None:
        self._client.log_event(TOPIC, make_event(kind, run=self.id, **fields))

    def _post_safely(self, kind: str, **fields: Any) -> None:
        try:
            self._post(kind, **fields)
        except Exception:
            logger.info("Could not post %s for run %s", kind, self.id)

    def _workers(self) -> dict[str, dict[str, Any]] | None:
        """The scheduler's workers, or None when they cannot be read right now (never ``{}``
        for "unknown": an empty listing must not look like a lost PS host)."""
        try:
            info = self._client.scheduler_info(n_workers=-1)
        except Exception:
            return None
        return dict(info.get("workers", {}))

    def _zone_of(self, address: str) -> str | None:
        """The zone of the VM behind a worker's address (the cluster's record of it), else the
        cluster's zone: trainers are told where the PS is (a paced trainer in another region
        steps slower, as the paper measured)."""
        name = ((self._workers() or {}).get(address) or {}).get("name")
        vm = (getattr(self.cluster, "workers", None) or {}).get(name)
        zone = getattr(getattr(vm, "spec", None), "zone", None) or getattr(
            self.cluster, "zone", None
        )
        return str(zone) if zone else None

    def _main(self) -> None:
        """The driver thread's body: :class:`~transient_nb.training.run_loop.RunLoop`'s."""
        raise NotImplementedError

    def _abandon_checkpoint(self) -> None:
        """Drop the checkpoint being written (a new PS generation, or one that hangs)."""
        self._inflight = None  # its manifest is never written: readers ignore its files

    # -- PS ---------------------------------------------------------------------------------------------
    def _poll_status(self) -> None:
        """Ask the PS for its counters without blocking the loop on a slow PS."""
        now = time.monotonic()
        fut = self._status_future
        if fut is not None and fut.done():
            self._status_future = None
            try:
                self.status = fut.result(timeout=RESULT_AT_HAND_S)
            except Exception as e:
                logger.info("PS status failed: %r", e)
                return
            self._ps_answered = now
            self.step = int(self.status["step"])
            self._known_step = max(self._known_step, self.step)
        elif fut is not None and now - self._status_sent > self.hp.call_timeout_s:
            logger.warning("PS status: no answer within %.0f s", self.hp.call_timeout_s)
            self._status_future = None  # ask again; _ps_lost decides when it is lost
        if self._status_future is None and self._ps:
            try:
                self._status_future = self._ps[0].status()
                self._status_sent = now
            except Exception as e:
                # The scheduler marked the actor's task erred: its worker is gone for sure.
                logger.info("PS status not sent: %r", e)
                self._ps_left = True

    def _ps_lost(self) -> bool:
        """Lost means gone: its host left the cluster, or it answered nothing for a while."""
        if self._ps_left:
            return True
        silent = time.monotonic() - self._ps_answered
        if silent <= PS_OVERDUE_S:
            return False
        # Overdue: is its host still a member? (A call to a killed host can hang rather than
        # fail, so waiting for the call alone took up to call_timeout_s: measured 31 s.)
        workers = self._workers()
        if workers is not None and any(a not in workers for a in self._ps_addresses):
            return True  # a confirmed listing without a PS host
        return silent > self.hp.ps_lost_after_s

    def _ps_host_count(self) -> int:
        return max(1, int(getattr(self.cluster, "ps_hosts", 1) or 1))

    def _wants_more_shards(self) -> bool:
        """An elastic run whose cluster has more PS hosts than it has shards, all joined."""
        if not self.elastic_shards or self._ps_host_count() <= self.shards:
            return False
        joined = [
            a for a, info in (self._workers() or {}).items() if "ps" in info.get("resources", {})
        ]
        return len(joined) >= self._ps_host_count()

    def _ps_move_hosts(self) -> list[str] | None:
        """The hosts to move the PS to, once the cluster asked for a move
        (:meth:`~transient_nb.TransientCluster.move_ps`: ``ps_move_zone``) and as many of its new
        PS hosts there have joined as the PS has shards; None while there is none to make."""
        zone = getattr(self.cluster, "ps_move_zone", None)
        if not zone or self._ps_zone == zone:
            return None
        hosts = sorted(
            str(addr)
            for addr, info in (self._workers() or {}).items()
            if "ps" in info.get("resources", {})
            and addr not in self._ps_addresses
            and self._zone_of(addr) == zone
        )
        return hosts if len(hosts) >= min(self.shards, self._ps_host_count()) else None

    def _move_ps(self, hosts: list[str]) -> None:
        """Move the PS to ``hosts``, from its own state (as :meth:`_reshard`, with the same
        shards): the trainers follow the new generation, paced for their distance from it."""
        before = self._ps_zone
        done = self._regenerate(self.shards, hosts)
        if done is not None:
            self._post("ps-moved", zone_from=before, zone=self._ps_zone, **done)

    def _reshard(self, shards: int) -> None:
        """Split the PS into ``shards`` shards, one per PS host, from its own state.

        The same move as a recovery (a new generation the trainers follow), from the live PS:
        what is lost is at most the pushes that reach the old shards while their state is read.
        """
        before = self.shards
        done = self._regenerate(shards)
        if done is not None:
            self._post("ps-resharded", shards_from=before, shards=shards, **done)

    def _regenerate(self, shards: int, hosts: list[str] | None = None) -> dict[str, Any] | None:
        """A new PS generation of ``shards`` shards (on ``hosts``, else one per PS host) from
        the live PS's own state; the event's fields, or None when the PS does not answer
        (:meth:`_ps_lost` decides, and the next round tries again)."""
        t0 = time.time()
        self._abandon_checkpoint()
        states = self._old_ps_state()
        if states is None:
            return None
        step = int(states[0]["step"])
        if shards != self.shards:
            self.shards = shards
            self._bounds = shard_bounds(self._bounds[-1][1], shards)
        self._generation += 1
        self._create_ps(
            regroup(states, shards), step=step, counters=states[0]["counters"], hosts=hosts
        )
        done = {
            "step": step,
            "steps_lost": max(0, self._known_step - step),
            "seconds": time.time() - t0,
            "generation": self._generation,
            "addresses": list(dict.fromkeys(self._ps_addresses)),
        }
        self.step = self._known_step = step
        return done

    def _wait_for_ps_hosts(
        self, exclude: set[str], want: int, timeout: float, grace: float
    ) -> list[str]:
        """The PS hosts to place shards on (sorted, at most ``want``), none of ``exclude``.

        Waits for ``want`` hosts, but goes on with fewer (at least one) once ``grace`` seconds
        have passed.
        """
        t0 = time.time()
        while True:
            hosts = sorted(
                str(addr)
                for addr, info in (self._workers() or {}).items()
                if "ps" in info.get("resources", {}) and addr not in exclude
            )
            waited = time.time() - t0
            if len(hosts) >= want or (hosts and waited >= grace):
                return hosts[:want]
            if waited >= timeout:
                raise TimeoutError(f"No PS host joined within {timeout:.0f} s.")
            if self._stop.is_set():
                raise RuntimeError("stopped while waiting for a PS host")
            self._stop.wait(0.1)

    def _create_ps(
        self,
        states: list[dict[str, Any]],
        step: int,
        counters: dict[str, Any] | None,
        hosts: list[str] | None = None,
    ) -> None:
        try:
            delay = float(getattr(self.cluster, "provisioning_delay", 0) or 0)
        except (TypeError, ValueError):  # "paper": start-ups drawn from the paper's 81-98 s
            delay = 100.0
        # A start waits (a while) for one host per shard; a recovery takes the hosts there
        # are at once rather than wait out a lost host's replacement: shards then share a
        # host until the next generation.
        recovering = self._generation > 0
        timeout = 120 + 2 * delay
        hosts = hosts or self._wait_for_ps_hosts(
            set(self._ps_addresses) if self._ps_left else set(),
            want=min(self.shards, self._ps_host_count()),
            timeout=timeout,
            grace=0.0 if recovering else min(timeout, PS_HOSTS_GRACE_S),
        )
        futures = [
            self._client.submit(
                ParameterServer,
                self.id,
                i,
                self.shards,
                st["weights"],
                self._mask[a:b],
                st["bn"],
                self.hp.to_dict(),
                self.checkpoint_url,
                version=step,
                momentum=st["momentum"],
                model=self.model_name,
                generation=self._generation,
                counters=counters if i == 0 else None,
                **self._custom_ps_kwargs(st),
                actor=True,
                workers=[hosts[i % len(hosts)]],
                allow_other_workers=False,
                pure=False,
                key=f"ps-{self.id}-g{self._generation}-s{i}",
            )
            for i, (st, (a, b)) in enumerate(zip(states, self._bounds, strict=True))
        ]
        old = self._ps_futures
        # Creating an actor ships its arrays and waits for the scheduler: a setup bound, not a
        # call's.
        self._ps = [f.result(timeout=SETUP_TIMEOUT_S) for f in futures]
        self._ps_futures = futures
        for f in old:  # the previous generation's actors are released from their worker
            f.release()
        self._ps_addresses = [hosts[i % len(hosts)] for i in range(len(self._ps))]
        self._ps_zone = self._zone_of(hosts[0])
        self._ps_left = False
        self._ps_answered = time.monotonic()
        self._status_future = None
        Variable(self.variable, client=self._client).set(
            json.dumps(
                {
                    "generation": self._generation,
                    "shards": [[ps._address, ps.key] for ps in self._ps],
                    # Where the PS runs now: trainers pace for their distance from it.
                    "ps_zone": self._ps_zone,
                }
            )
        )

    def _custom_ps_kwargs(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """What a PS of a user's workload takes beyond the built-in one's: the model's size (an
        emulated PS's service time scales with it), the torch optimizer and its state."""
        if self.workload.builtin:
            return {}
        kwargs: dict[str, Any] = {"parameters": int(self._bounds[-1][1])}
        if self._optimizer is not None:
            kwargs.update(optimizer=self._optimizer, opt_state=state.get("opt"))
        return kwargs

    def _old_ps_state(self) -> list[dict[str, Any]] | None:
        """The old PS's own state, if it still answers (it is fresher than any checkpoint)."""
        if self._ps_left or not self._ps:
            return None
        try:
            return [
                ps.get_state().result(timeout=min(5.0, self.hp.call_timeout_s)) for ps in self._ps
            ]
        except Exception:
            return None
