"""Scaling: the mix of GPU workers a cluster keeps, its on-demand share, and the policy that
chooses them (``adapt``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from distributed.core import Status
from distributed.utils import NoOpAwaitable

from transient_nb.catalog.mix import Mix, format_mix, parse_mix
from transient_nb.deploy.preemption import Preemption

logger = logging.getLogger(__name__)


#: Keywords of Dask's ``Cluster.adapt``, which a transient cluster refuses (see ``adapt``).
DASK_ADAPT = (
    "minimum",
    "maximum",
    "minimum_cores",
    "maximum_cores",
    "minimum_memory",
    "maximum_memory",
)


class Scaling(Preemption):
    """``scale`` (a number, or a mix of GPU types; an on-demand share) and ``adapt``."""

    # -- scaling ----------------------------------------------------------------------------------------
    def scale(
        self,
        n: int | str | Mapping[str, int] = 0,
        memory: Any = None,
        cores: Any = None,
        *,
        gpu: str | None = None,
        on_demand: int | Mapping[str, int] | None = None,
    ) -> Any:
        """Keep ``n`` preemptible GPU workers (the PS host is not counted).

        Parameters
        ----------
        n
            How many workers: of type ``gpu`` if given (the other types keep theirs), else of
            the cluster's one type. A mixed cluster takes a whole mix instead
            (``{"k80": 2, "v100": 2}`` or ``"k80=2,v100=2"``, types left out go to 0) or a
            number with ``gpu=``; a plain number alone is refused there (0 excepted: no
            workers of any type), because no split of it between the types is the obvious one.
        gpu
            The GPU type that ``n`` counts; a type not in the cluster yet is added to it.
        on_demand
            How many of those workers run on demand, on a Spot cluster: a number (of the type
            ``n`` counts, or of the cluster's one type) or GPU type -> number (types left out:
            none). Default: as before, at most the new counts. New workers and replacements
            are asked for on demand until a type has that many; surplus on-demand workers are
            given back and replaced by Spot ones; more than it has replace its Spot workers
            most likely to be revoked. What the transient-aware policy does when a storm of
            revocations makes Spot too slow for a deadline.

        Examples
        --------
        >>> cluster.scale(4)  # doctest: +SKIP
        >>> cluster.scale(2, gpu="v100")  # doctest: +SKIP
        >>> cluster.scale({"k80": 3, "v100": 1})  # doctest: +SKIP
        >>> cluster.scale({"p100": 4}, on_demand={"p100": 1})  # doctest: +SKIP
        """
        if memory is not None or cores is not None:
            raise ValueError(
                "TransientCluster.scale takes a number of GPU workers, not memory or cores."
            )
        mix = self._scaled_mix(n, gpu)
        wanted = self._scaled_on_demand(on_demand, mix, gpu)
        # Refused before anything is asked for (the panel's and the magic's scale come here too).
        self.limits.check_workers(sum(mix.values()))
        self._check_hourly_cost(mix, wanted)
        if not self._closing:
            self._mix = mix
            self._on_demand = wanted
            assert self.loop is not None
            self.loop.add_callback(self._scale_to_target)
        if self.asynchronous:
            return NoOpAwaitable()
        return None

    def _scaled_mix(self, n: int | str | Mapping[str, int], gpu: str | None) -> Mix:
        """The mix that ``scale(n, gpu=gpu)`` asks for, checked against the catalog."""
        if isinstance(n, str) and n.strip().isdigit():
            n = int(n.strip())
        if isinstance(n, bool) or not isinstance(n, (int, str, Mapping)):
            raise ValueError(f"scale({n!r}): give a whole number of workers, 0 or more.")
        if isinstance(n, int):
            if n < 0:
                raise ValueError(f"scale({n!r}): give a whole number of workers, 0 or more.")
            if gpu is None:
                live = [g for g, c in self._mix.items() if c > 0]
                if n == 0:  # no workers of any type: unambiguous (and SpecCluster's close)
                    return {g: 0 for g in self._mix}
                if len(live) > 1:
                    raise ValueError(
                        f"scale({n}): this cluster mixes {format_mix(self._mix)}; say which type "
                        f"to scale, e.g. scale({n}, gpu={live[0]!r}), or give the whole mix, "
                        "e.g. scale({'k80': 2, 'v100': 1})."
                    )
                key = live[0] if live else self.gpu
            else:
                if not isinstance(gpu, str) or not gpu.strip():
                    raise ValueError(f"scale({n}, gpu={gpu!r}): give a GPU type such as 'v100'.")
                key = gpu.strip().lower()
            mix = {**self._mix, key: n}
        else:
            if gpu is not None:
                raise ValueError(
                    f"scale({n!r}, gpu={gpu!r}): a mix names its types already; drop gpu."
                )
            try:
                mix = parse_mix(n, self.gpu)
            except ValueError as e:
                if "asks for no workers" not in str(e):
                    raise
                mix = {}  # every type to 0: no workers, as scale(0)
        for g in mix:
            if g not in self._mix:
                for z in self._zones():
                    self.catalog.worker_price(g, self.machine_type, z)
        # Types at 0 stay in the mix until scaled again, so the cluster keeps its main type.
        kept = {g: 0 for g in self._mix}
        return {**kept, **mix}

    def _scaled_on_demand(
        self, on_demand: int | Mapping[str, int] | None, mix: Mix, gpu: str | None
    ) -> Mix:
        """The on-demand counts that ``scale(..., on_demand=on_demand)`` asks for, checked.

        Every type ever given a count keeps one (0 included): only those are brought to it, so
        an ``on_demand_fallback`` VM of a type never given one is left alone.
        """
        if on_demand is None:
            return {g: min(n, mix.get(g, 0)) for g, n in self._on_demand.items()}
        if isinstance(on_demand, Mapping):
            asked = {**{g: 0 for g in self._on_demand}, **dict(on_demand)}
        else:
            live = [g for g, c in mix.items() if c > 0]
            key = gpu.strip().lower() if gpu else live[0] if len(live) == 1 else None
            if key is None and on_demand == 0:
                return {g: 0 for g in self._on_demand}
            if key is None:
                raise ValueError(
                    f"scale(on_demand={on_demand!r}): this cluster mixes {format_mix(mix)}; give "
                    "a number per type, e.g. on_demand={'p100': 1}."
                )
            asked = {**self._on_demand, key: on_demand}
        out: Mix = {}
        for g, count in asked.items():
            name = str(g).strip().lower()
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(
                    f"scale(on_demand={on_demand!r}): {g}={count!r} is not a number of workers; "
                    "give a whole number, 0 or more."
                )
            if count > mix.get(name, 0):
                raise ValueError(
                    f"scale(on_demand={on_demand!r}): {count} {name} on demand, but the mix keeps "
                    f"{mix.get(name, 0)} {name}; at most that many can run on demand."
                )
            if count and not self.spot:
                raise ValueError(
                    f"scale(on_demand={on_demand!r}): this cluster's workers are all on demand "
                    "already (spot=False); on_demand= shares out a Spot cluster's workers."
                )
            out[name] = count
        return out

    async def _scale_to_target(self) -> None:
        if self._closing or self.status != Status.running:
            return
        asked = False

        async def announce() -> None:
            nonlocal asked
            if not asked:
                await self._post(
                    "scale", workers=self._target, mix=dict(self._mix), on_demand=self.on_demand
                )
                asked = True

        for gpu in list(self._mix):
            # Read now, not before the loop: an earlier pass awaits a scale-down while a later
            # scale() changes the mix, and must not undo what that one asked for.
            want = self._mix.get(gpu, 0)
            vms = self._worker_vms_of(gpu)
            pending = sum(
                1 for s, v in self._slots.items() if v == "" and self._slot_gpu.get(s) == gpu
            )
            if len(vms) + pending < want:
                await announce()
                await asyncio.gather(
                    *(self._provision("worker", gpu=gpu) for _ in range(want - len(vms) - pending))
                )
            elif len(vms) > want:
                await announce()
                # Selective revocation: the VMs not yet working first, then those most likely
                # to be revoked within the hour at their age, then the newest.
                await self._give_back_vms(gpu, self._give_back(vms, len(vms) - want))
            await self._rebalance_on_demand(gpu, announce)

    async def _give_back_vms(self, gpu: str, chosen: list[tuple[Any, float]]) -> None:
        """Give back ``chosen`` (VMs of ``gpu`` with their odds of revocation within the hour)."""
        for vm, odds in chosen:
            await self._post(
                "give-back",
                worker=vm.name,
                gpu=gpu,
                working=self._working(vm),
                p_revoked_1h=round(odds, 4),
                spot=bool(vm.spec.spot),
            )
            self.simulator.vm_gone(vm.name)
            self.worker_spec.pop(vm.name, None)
            if vm.spec.slot is not None:
                self._slots.pop(vm.spec.slot, None)
        await self._correct_state()

    async def _rebalance_on_demand(self, gpu: str, announce: Any) -> bool:
        """Bring ``gpu``'s on-demand workers to what ``scale`` asked: swap surplus on-demand
        workers for Spot ones, or the Spot workers most likely to be revoked for on-demand ones
        (each given back, then asked for again: the ask goes on demand while the type is
        short). Returns whether it changed anything."""
        if not self.spot or gpu not in self._on_demand:
            return False  # never given a count: its on-demand fallback VMs are left alone
        want = min(self._on_demand[gpu], self._mix.get(gpu, 0))
        vms = self._worker_vms_of(gpu)
        held = self._on_demand_held(gpu)
        if held > want:
            dear = [w for w in vms if not w.spec.spot]
            swap = self._give_back(dear, min(len(dear), held - want))
        elif held < want:
            # Only Spot workers the mix already counts: a type still growing asks on demand.
            cheap = [w for w in vms if w.spec.spot]
            swap = self._give_back(cheap, min(len(cheap), want - held))
        else:
            return False
        if not swap:
            return False
        await announce()
        await self._give_back_vms(gpu, swap)
        await asyncio.gather(*(self._provision("worker", gpu=gpu) for _ in swap))
        return True

    def _give_back(self, vms: list[Any], n: int) -> list[tuple[Any, float]]:
        """The ``n`` of ``vms`` to give back, with their odds of revocation within the hour."""
        from transient_nb.catalog.lifetimes import revoked_within
        from transient_nb.policy.placement import Held, give_back_order

        model = self._lifetime_model()
        now = time.time()
        held, by_name = [], {}
        for vm in vms:
            since = getattr(vm, "running_since", None)
            age_s = 0.0 if since is None else (now - since) * self.time_scale
            spot = bool(getattr(vm.spec, "spot", self.spot))
            gpu = self._asked_gpu(vm)
            odds = revoked_within(model, gpu, age_s, zone=vm.spec.zone) if spot else 0.0
            held.append(Held(vm.name, self._working(vm), odds, int(vm.name.split("-")[1])))
            by_name[vm.name] = vm
        return [(by_name[h.name], h.p_revoked_1h) for h in give_back_order(held)[:n]]

    # -- the transient-aware policy ------------------------------------------------------------------
    def adapt(
        self,
        Adaptive: Any = None,
        minimum: float | None = None,
        maximum: float | None = None,
        minimum_cores: int | None = None,
        maximum_cores: int | None = None,
        minimum_memory: str | None = None,
        maximum_memory: str | None = None,
        *,
        goal: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Let a :class:`~transient_nb.policy.adaptive.TransientPolicy` choose the GPU mix for a goal.

        Unlike Dask's ``adapt`` (which sizes a cluster to its task queue), the policy sizes it
        to a training goal, from the run's progress, the workers' step rates, revocations and
        prices; every change is a ``policy-decision`` event with its reason. Dask's form
        (an ``Adaptive`` class, ``minimum``/``maximum``) is refused with that advice: a transient
        cluster's GPU workers run trainers, not a task queue.

        Parameters
        ----------
        Adaptive
            The goal may come first, as a positional argument (``cluster.adapt("cost-per-step")``).
        goal
            ``"deadline"`` (with ``deadline="2h"``), ``"budget"`` (with ``budget=20``) or
            ``"cost-per-step"``; None stops a running policy (the cluster keeps its mix).
        **kwargs
            Passed to :class:`~transient_nb.policy.adaptive.TransientPolicy` (``gpus``, ``max_workers``,
            ``max_shards``, ``interval``, ``hysteresis``, ``on_demand``, ...). Where one PS is
            the bottleneck the policy adds PS hosts (:meth:`scale_ps`) for a run started
            without ``shards=``. On a Spot cluster it may run some workers on demand
            (:meth:`scale`'s ``on_demand``) where its goal needs them; ``on_demand=False``
            keeps them all Spot.

        Returns
        -------
        The running policy (None when stopped).

        Examples
        --------
        >>> policy = cluster.adapt(goal="deadline", deadline="2h")  # doctest: +SKIP
        >>> policy.last.reason  # doctest: +SKIP
        '6 k80 in us-central1-a, 1 PS shard: ETA 3.90 h -> 1.10 h, +1.30 $/h, ...'
        """
        from transient_nb.policy.adaptive import TransientPolicy

        if isinstance(Adaptive, str):
            goal, Adaptive = Adaptive, None
        given = (minimum, maximum, minimum_cores, maximum_cores, minimum_memory, maximum_memory)
        dask_form = [k for k, v in zip(DASK_ADAPT, given, strict=True) if v is not None]
        if Adaptive is not None or dask_form:
            raise ValueError(
                f"adapt({', '.join(dask_form) or 'Adaptive'}=...) is Dask's adaptive scaling to a "
                "task queue; a transient cluster sizes its GPU workers to a training goal: "
                "adapt(goal='deadline', deadline='2h'), adapt(goal='budget', budget=20) or "
                "adapt(goal='cost-per-step')."
            )
        previous = getattr(self, "_policy", None)
        policy = None if goal is None else TransientPolicy(self, goal, **kwargs)  # checks first
        if previous is not None:
            previous.stop()
        self._policy = policy
        if policy is not None:
            policy.start()
            if previous is None:
                self.close_hooks.append(self._stop_policy)
        return policy

    def _stop_policy(self) -> None:
        policy, self._policy = getattr(self, "_policy", None), None
        if policy is not None:
            policy.stop(announce=False)  # closing: the log ends with "closed" anyway
