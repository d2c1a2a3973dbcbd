"""The driver's checkpoints: every shard at one agreed version, the manifest last; a resume
and a PS recovery from the run's own newest checkpoint.

:class:`Checkpoints` is the part of the driver (:mod:`transient_nb.training.run_driver`) that
writes the run's checkpoints in its own folder, prunes its own old ones, and loads only its own
(:func:`~transient_nb.training.checkpoint.check_owner`): a resume or a PS recovery never takes
another run's weights.
"""

from __future__ import annotations

import time
from typing import Any

from transient_nb.training import checkpoint
from transient_nb.training.checkpoint import Checkpoint
from transient_nb.training.optim import optimizer_state
from transient_nb.training.ps import regroup
from transient_nb.training.run_driver import (
    RESULT_AT_HAND_S,
    SETUP_TIMEOUT_S,
    RunCore,
    logger,
)

#: Complete checkpoints kept under the run's URL (older ones are deleted).
CHECKPOINTS_KEPT = 2


def _shard_states(ck: checkpoint.Checkpoint) -> list[dict[str, Any]]:
    """A checkpoint's shards as the PS takes them: weights, momentum (or a torch optimizer's
    state), statistics on shard 0."""
    return [
        {
            "weights": sh["weights"],
            "momentum": sh.get("momentum"),
            "bn": sh.get("bn") if i == 0 else None,
            "opt": optimizer_state(sh) or None,
        }
        for i, sh in enumerate(ck.shards)
    ]


class Checkpoints(RunCore):
    """Checkpoints, resume and recovery (see the module's docstring)."""

    def _resume_states(self, n_params: int) -> tuple[list[dict[str, Any]], int, Any]:
        """The PS shards' states from the newest complete checkpoint of the resumed run."""
        assert self.resume is not None
        ck = self._load_own_checkpoint()
        if ck is None:
            raise RuntimeError(
                f"No complete checkpoint under {self.checkpoint_url} to resume from."
            )
        sizes = [len(sh["weights"]) for sh in ck.shards]
        if sum(sizes) != n_params:
            raise RuntimeError(
                f"The checkpoint at {ck.url} holds {sum(sizes)} parameters; {self.model_name} has "
                f"{n_params}: resume with the model of the earlier run."
            )
        # The earlier run may have gained shards after it started (an elastic PS): the same
        # vector, cut for this run's shards.
        return regroup(_shard_states(ck), self.shards), ck.step, ck.meta.get("counters")

    def _load_own_checkpoint(self) -> Checkpoint | None:
        """The newest complete checkpoint of the run's folder, refused (a ValueError that says
        whose it is) unless it is this run's, of its model and layout: a resume or a PS recovery
        never loads another run's weights."""
        return checkpoint.load_latest(
            self.checkpoint_url,
            run=self.id,
            model=self.workload.model_ref,  # by value, a model's name is not its identity
            layout=self._layout or None,
        )

    def _recover(self) -> None:
        lost_at = self._known_step
        self._post(
            "ps-lost",
            step=lost_at,
            address=self._ps_addresses[0] if self._ps_addresses else None,
            addresses=list(dict.fromkeys(self._ps_addresses)),
        )
        t0 = time.time()
        self._abandon_checkpoint()
        states = self._old_ps_state()
        if states is not None:
            # Its handle broke but it answers: move its own state, lose nothing.
            resumed = int(states[0]["step"])
            counters = states[0]["counters"]
            source = "ps"
        else:
            ck = self._load_own_checkpoint()
            if ck is None:
                raise RuntimeError(
                    f"The PS was lost and there is no complete checkpoint under "
                    f"{self.checkpoint_url}: the run cannot go on."
                )
            resumed = ck.step
            counters = ck.meta.get("counters")
            states = _shard_states(ck)
            source = "checkpoint"
        if len(states) != self.shards:
            # Written before the PS gained a shard: the same vector, cut for today's shards.
            states = regroup(states, self.shards)
        self._generation += 1
        self._create_ps(states, step=resumed, counters=counters)
        self._post(
            "ps-recovered",
            step=resumed,
            steps_lost=max(0, lost_at - resumed),
            seconds=time.time() - t0,
            generation=self._generation,
            source=source,
        )
        self.step = resumed
        self._known_step = resumed
        self._next_checkpoint = (
            resumed // self.hp.checkpoint_interval + 1
        ) * self.hp.checkpoint_interval

    # -- checkpoints: every shard at one agreed version, the manifest last --------------------------
    def _start_checkpoint(self, timeout: float | None = None) -> None:
        timeout = timeout or self.hp.call_timeout_s
        self._checkpoint_attempts += 1
        attempt = self._checkpoint_attempts
        try:
            first = self._ps[0].snapshot().result(timeout=timeout)
            step = int(first["step"])
            for ps in self._ps[1:]:
                ps.snapshot(step).result(timeout=timeout)
        except Exception as e:
            logger.info("Checkpoint snapshot failed: %r", e)
            return
        if step <= self.checkpoint_step:
            # Nothing new since the last one (or older): never publish it over a newer one.
            self._next_checkpoint = (
                step // self.hp.checkpoint_interval + 1
            ) * self.hp.checkpoint_interval
            self._inflight = None
            self.checkpoint_step = max(self.checkpoint_step, step)
            self._checkpoint_settled = attempt
            return
        self._inflight = {
            "attempt": attempt,
            "step": step,
            "counters": first["counters"],
            "futures": [ps.write_snapshot(step) for ps in self._ps],
            "t0": time.monotonic(),
        }

    def _poll_checkpoint(self, block: bool = False) -> None:
        job = self._inflight
        if job is None:
            return
        bound = max(120.0, 4 * self.hp.call_timeout_s)  # a slow bucket is not a hang
        if block:
            end = job["t0"] + bound
            while not all(f.done() for f in job["futures"]) and time.monotonic() < end:
                time.sleep(0.02)
        if not all(f.done() for f in job["futures"]):
            if time.monotonic() - job["t0"] > bound:
                logger.warning(
                    "Checkpoint of step %d not written within %.0f s", job["step"], bound
                )
                self._abandon_checkpoint()
            return
        self._inflight = None
        try:
            files = [f.result(timeout=RESULT_AT_HAND_S) for f in job["futures"]]
            path = checkpoint.write_manifest(
                self.checkpoint_url,
                job["step"],
                {
                    "run": self.id,
                    "model": self.model_name,
                    "model_ref": self.workload.model_ref,
                    "optimizer": self.workload.describe()["optimizer"],
                    "data": self.data if isinstance(self.workload.data, str) else None,
                    "layout": self._layout,
                    "fixed": self._fixed_entry,
                    "shards": self.shards,
                    "generation": self._generation,
                    "hparams": self.hp.to_dict(),
                    "counters": job["counters"],
                    "time": time.time(),
                },
                files,
            )
        except Exception as e:
            logger.warning("Checkpoint of step %d failed: %r", job["step"], e)
            return
        self.checkpoint_step = job["step"]
        self._checkpoint_settled = job["attempt"]
        self._next_checkpoint = (
            job["step"] // self.hp.checkpoint_interval + 1
        ) * self.hp.checkpoint_interval
        self._post(
            "checkpoint",
            step=job["step"],
            path=path,
            seconds=time.monotonic() - job["t0"],
        )
        try:
            checkpoint.prune(self.checkpoint_url, keep=CHECKPOINTS_KEPT, run=self.id)
        except Exception as e:  # housekeeping only
            logger.info("Could not prune old checkpoints: %r", e)

    def _checkpoint_now(self) -> None:
        if self._inflight is not None:
            self._poll_checkpoint(block=True)
        self._start_checkpoint(timeout=max(self.hp.call_timeout_s, SETUP_TIMEOUT_S / 4))
        self._poll_checkpoint(block=True)
