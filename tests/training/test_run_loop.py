"""The driver's loop and its start, against the in-process doubles of test_run_driver.py: a client
that creates the parameter servers it is asked for in process (``PSDouble`` on a private loop), a
recording Dask Variable, and a loop that runs a script, one step a round, where it asks why to
stop. The end-to-end runs on real worker processes are in test_run.py; these take a second at
most, so a mutation run can afford them (benchmarks/mutation.py).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from transient_nb.deploy.remote import RemoteCluster
from transient_nb.eventlog.vocabulary import TOPIC
from transient_nb.training import checkpoint, run_driver, run_loop
from transient_nb.training import run as run_module
from transient_nb.training.hparams import HParams
from transient_nb.training.models import build_model
from transient_nb.training.ps import ParameterServer
from transient_nb.training.resume import ResumePoint
from transient_nb.training.run import TrainingRun, train
from transient_nb.training.trainer import Trainer, decay_mask, flat_layout, get_flat

from .doubles import PSDouble
from .test_run_driver import HP, Client, Cluster, Done, Pending, logged, posted, wait_done

PS = {"resources": {"ps": 1}}
GPU = {"resources": {"gpu": 1}}
#: The loop's runs: a PS is never taken for lost because a slow machine stalled a round.
LOOP = HP.with_(ps_lost_after_s=60.0)


# -- doubles ------------------------------------------------------------------------------------------
class Actors(Client):
    """A client that creates the parameter servers it is asked for, in process (``PSDouble`` on
    the test's loop); anything else (a trainer) is recorded and never starts."""

    def __init__(self, loop) -> None:
        super().__init__()
        self.loop = loop
        self.created: list[Done] = []  # the futures of the PS actors, in order

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if fn is not ParameterServer:
            return super().submit(fn, *args, **kwargs)
        self.submitted.append((fn, args, dict(kwargs)))
        own = {k: v for k, v in kwargs.items() if k not in Placement}
        future = Done(PSDouble(ParameterServer(*args, **own), self.loop))
        self.created.append(future)
        return future

    def ps_calls(self) -> list[tuple[tuple, dict[str, Any]]]:
        return [(args, kwargs) for fn, args, kwargs in self.submitted if fn is ParameterServer]

    def trainer_calls(self) -> list[dict[str, Any]]:
        return [kwargs for fn, _, kwargs in self.submitted if fn is Trainer]


#: What ``submit`` reads itself (the placement of an actor), not its constructor.
Placement = ("actor", "workers", "allow_other_workers", "pure", "key")


@pytest.fixture
def variables(monkeypatch):
    """The run's Dask Variable (which needs a scheduler): its values and its deletion, recorded."""
    store = SimpleNamespace(values=[], clients=[], deleted=[])

    class Variable:
        def __init__(self, name: str, client: Any):
            self.name, self.client = name, client

        def set(self, value: str) -> None:
            store.values.append((self.name, value))
            store.clients.append(self.client)

        def delete(self) -> None:
            store.deleted.append(self.name)

    # A PS generation sets it (run_driver); the end deletes it (run_loop).
    monkeypatch.setattr(run_driver, "Variable", Variable)
    monkeypatch.setattr(run_loop, "Variable", Variable)
    return store


class Looping(TrainingRun):
    """A driver whose loop runs a script: in every round, where the loop asks why to stop, the
    round's state is kept, the calls in flight (the status asked, the checkpoint written) are
    waited for, so the next round reads them whatever the machine's pace, and the script's next
    step runs. When the script is over, the run is stopped."""

    script: list[Callable[[Looping], None]]
    rounds: list[dict[str, Any]]

    def _stop_reason(self) -> str | None:
        self.rounds.append(
            {
                "step": self.step,
                "next_eval": self._next_eval,
                "next_checkpoint": self._next_checkpoint,
                "checkpoint_step": self.checkpoint_step,
                "attempts": self._checkpoint_attempts,
                "wanted": self._checkpoint_wanted.is_set(),
                "generation": self._generation,
            }
        )
        if self._status_future is not None:
            wait_done(self._status_future)
        for f in (self._inflight or {}).get("futures", []):
            wait_done(f)
        reason = super()._stop_reason()
        if reason is not None:
            return reason
        if self.script:
            self.script.pop(0)(self)
            return None
        self._stop.set()
        return super()._stop_reason()


def looping(
    tmp_path, loop, monkeypatch, *script: Callable[[Looping], None], hp: HParams = LOOP, **kwargs
) -> Looping:
    """A driver whose ``_run`` is called by the test, on ``ps-a`` (and ``ps-b``) and a GPU and a
    CPU worker; its rounds follow each other at once."""
    monkeypatch.setattr(run_loop, "POLL_S", 0.0)
    cluster = Cluster(str(tmp_path), ps_hosts=kwargs.pop("ps_hosts", 1))
    run = Looping(cluster, "resnet8", "digits", hp, **kwargs)
    run.script, run.rounds = list(script), []
    run._client = Actors(loop)
    run._client.workers = {
        "tls://ps-a:1": {"name": "ps-0", **PS},
        "tls://ps-b:1": {"name": "ps-1", **PS},
        "tls://g:1": {"name": "w-0", **GPU},
        "tls://c:1": {"name": "w-1", "resources": {}},
        "tls://n:1": {"name": "w-2"},  # listed without resources
    }
    return run


def at(step: int) -> Callable[[Looping], None]:
    """A script step: every shard of the PS is at ``step`` (the loop sees it two rounds on)."""

    def move(run: Looping) -> None:
        for ps in run._ps:
            ps.ps.version = step

    return move


def idle(run: Looping) -> None:
    """A script step where nothing happens."""


def initial_model(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The weights, statistics and decay mask of resnet8 for digits, seeded as a run seeds it."""
    torch.manual_seed(seed)
    model = build_model("resnet8", num_classes=10)
    params, buffers = flat_layout(model)
    return get_flat(params), get_flat(buffers), decay_mask(model)


def without_time(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != "time"}


# -- the loop from its start to its end --------------------------------------------------------------
def test_a_run_starts_its_shards_from_the_seeded_model_and_checkpoints_step_0(
    loop, tmp_path, monkeypatch, variables
):
    run = looping(
        tmp_path,
        loop,
        monkeypatch,
        at(LOOP.steps),
        idle,
        shards=2,
        ps_hosts=2,
        seed=3,
        budget=5.0,
        target_accuracy=0.95,
    )
    run._run()
    w0, bn0, mask = initial_model(3)
    n = len(w0)
    half = (n + 1) // 2
    assert run._bounds == [(0, half), (half, n)]
    (started,) = posted(run, "train-started")
    assert without_time(started) == {
        "kind": "train-started",
        "run": run.id,
        "model": "resnet8",
        "data": "digits",
        "steps": LOOP.steps,
        "batch_size": LOOP.batch_size,
        "shards": 2,
        "elastic_shards": False,
        "parameters": n,
        "hparams": json.dumps(LOOP.to_dict()),
        "checkpoint_url": run.checkpoint_url,
        "target_accuracy": 0.95,
        "budget": 5.0,
    }
    calls = run._client.ps_calls()
    assert len(calls) == 2
    for i, ((args, kwargs), (a, b), host) in enumerate(
        zip(calls, run._bounds, ["tls://ps-a:1", "tls://ps-b:1"], strict=True)
    ):
        assert args[:3] == (run.id, i, 2)
        assert np.array_equal(args[3], w0[a:b]) and np.array_equal(args[4], mask[a:b])
        assert np.array_equal(args[5], bn0) if i == 0 else args[5] is None
        assert args[6:] == (LOOP.to_dict(), run.checkpoint_url)
        assert kwargs == {
            "version": 0,
            "momentum": None,
            "model": "resnet8",
            "generation": 0,
            "counters": None,
            "actor": True,
            "workers": [host],
            "allow_other_workers": False,
            "pure": False,
            "key": f"ps-{run.id}-g0-s{i}",
        }
    (name, value), *_ = variables.values
    assert name == run.variable and variables.clients[0] is run._client
    assert json.loads(value) == {
        "generation": 0,
        "shards": [
            ["tls://ps-host-0:1", f"ps-{run.id}-s0"],
            ["tls://ps-host-1:1", f"ps-{run.id}-s1"],
        ],
        "ps_zone": run._ps_zone,  # where shard 0's host is: the trainers pace for it
    }
    # A trainer is asked for on the GPU worker only, and never started here.
    (trainer,) = run._client.trainer_calls()
    assert trainer["workers"] == ["tls://g:1"] and trainer["key"] == f"trainer-{run.id}-w-0-0"
    # Step 0 checkpointed before the loop; the PS reaches its steps: evaluated and a checkpoint
    # started in the loop, then the end (evaluated again; the checkpoint being written is
    # published, nothing newer to write).
    kinds = [(e["kind"], e.get("step")) for e in posted(run)]
    assert kinds == [
        ("train-started", None),
        ("checkpoint", 0),
        ("eval", LOOP.steps),
        ("eval", LOOP.steps),
        ("checkpoint", LOOP.steps),  # the loop's, published by the end
        ("train-finished", LOOP.steps),
    ]
    assert [r["step"] for r in run.rounds] == [0, 0, LOOP.steps]
    assert run.rounds[0]["checkpoint_step"] == 0 and run.rounds[0]["next_eval"] == 100
    assert run.rounds[-1]["next_eval"] == LOOP.steps + 100
    assert run.reason == "steps" and posted(run, "train-finished")[0]["reason"] == "steps"


def test_the_loop_evaluates_and_checkpoints_at_their_steps_and_when_asked(
    loop, tmp_path, monkeypatch, variables
):
    def ask(run: Looping) -> None:
        run._checkpoint_wanted.set()

    hp = LOOP.with_(eval_every=50, checkpoint_every=130)
    run = looping(tmp_path, loop, monkeypatch, at(50), idle, at(130), idle, ask, idle, hp=hp)
    run._run()
    rounds = [
        (r["step"], r["next_eval"], r["next_checkpoint"], r["attempts"], r["wanted"])
        for r in run.rounds
    ]
    assert rounds == [
        (0, 50, 130, 1, False),
        (0, 50, 130, 1, False),
        (50, 100, 130, 1, False),  # evaluated at exactly its step
        (50, 100, 130, 1, False),
        # Evaluated past its step: the next one at the next multiple. A checkpoint started at
        # exactly its step (then one is asked for).
        (130, 150, 130, 2, False),
        (130, 150, 260, 3, False),  # published; the one asked for: nothing new since, settled
        (130, 150, 260, 3, False),  # asked for once only
    ]
    kinds = [(e["kind"], e.get("step")) for e in posted(run)]
    assert kinds == [
        ("train-started", None),
        ("checkpoint", 0),
        ("eval", 50),
        ("eval", 130),
        ("checkpoint", 130),
        ("eval", 130),
        ("train-finished", 130),
    ]
    assert run.reason == "stopped" and run._checkpoint_settled == 4


def test_a_resumed_run_goes_on_from_its_checkpoint_and_its_step(
    loop, tmp_path, monkeypatch, variables
):
    w0, bn0, _ = initial_model(0)
    n = len(w0)
    url = str(tmp_path / "earlier")
    shards = [w0[: n // 2] + 1, w0[n // 2 :] + 1]  # written by a run of two shards
    files = [
        checkpoint.write_shard(
            url,
            250,
            i,
            {
                "weights": w,
                "momentum": w * 10,
                "decay_mask": np.ones(len(w), dtype=np.uint8),
                "bn": bn0 * 2 if i == 0 else bn0,
            },
        )
        for i, w in enumerate(shards)
    ]
    checkpoint.write_manifest(url, 250, {"counters": {"gaps": 3}, "run": "run-old"}, files)
    point = ResumePoint("run-old", url, record="/runs/r/events.jsonl", last_step=270)
    hp = LOOP.with_(eval_every=100, checkpoint_every=40)
    run = looping(tmp_path, loop, monkeypatch, hp=hp, resume=point, shards=3, ps_hosts=2)
    run._run()
    (started,) = posted(run, "train-started")
    assert started["resumed_from"] == "/runs/r/events.jsonl"
    assert started["resumed_step"] == 250 and started["steps_lost"] == 20
    calls = run._client.ps_calls()
    assert [kw["version"] for _, kw in calls] == [250, 250, 250]
    assert [kw["counters"] for _, kw in calls] == [{"gaps": 3}, None, None]  # on shard 0 only
    assert [kw["workers"] for _, kw in calls] == [
        ["tls://ps-a:1"],
        ["tls://ps-b:1"],
        ["tls://ps-a:1"],
    ]
    whole = np.concatenate(shards)
    assert np.array_equal(np.concatenate([args[3] for args, _ in calls]), whole)
    assert np.array_equal(np.concatenate([kw["momentum"] for _, kw in calls]), whole * 10)
    assert np.array_equal(calls[0][0][5], bn0 * 2) and calls[1][0][5] is None
    # Nothing checkpointed at the start (its checkpoint is there); evaluations and checkpoints go
    # on from the step resumed at.
    (first,) = run.rounds
    assert first == {
        "step": 250,
        "next_eval": 300,
        "next_checkpoint": 280,
        "checkpoint_step": 250,
        "attempts": 0,
        "wanted": False,
        "generation": 0,
    }
    assert run._known_step == 250
    assert [e["kind"] for e in posted(run)] == ["train-started", "eval", "train-finished"]


def test_a_resume_without_a_record_names_its_checkpoint_and_loses_no_step(
    loop, tmp_path, monkeypatch, variables
):
    w0, bn0, _ = initial_model(0)
    url = str(tmp_path / "earlier")
    entry = checkpoint.write_shard(
        url, 40, 0, {"weights": w0, "momentum": w0, "decay_mask": np.ones(len(w0)), "bn": bn0}
    )
    checkpoint.write_manifest(url, 40, {"run": "run-old"}, [entry])
    run = looping(tmp_path, loop, monkeypatch, resume=ResumePoint("run-old", url))
    run._run()
    (started,) = posted(run, "train-started")
    assert started["resumed_from"] == url
    assert started["resumed_step"] == 40 and started["steps_lost"] == 0
    assert run.rounds[0]["next_eval"] == 100 and run.rounds[0]["next_checkpoint"] == 100


def test_a_ps_lost_in_the_loop_is_recreated_on_another_host_and_the_loop_goes_on(
    loop, tmp_path, monkeypatch, variables
):
    def leave(run: Looping) -> None:
        run._events.put({"kind": "left", "address": "tls://ps-a:1"})

    run = looping(tmp_path, loop, monkeypatch, leave, hp=LOOP.with_(steps=500))
    run._run()
    first, second = run._client.created
    assert first.released and not second.released  # the lost generation's actor let go
    (_, old), (_, new) = run._client.ps_calls()
    assert old["key"] == f"ps-{run.id}-g0-s0" and old["workers"] == ["tls://ps-a:1"]
    assert new["key"] == f"ps-{run.id}-g1-s0" and new["workers"] == ["tls://ps-b:1"]
    assert new["generation"] == 1 and new["version"] == 0
    assert [json.loads(v)["generation"] for _, v in variables.values] == [0, 1]
    kinds = [e["kind"] for e in posted(run)]
    assert kinds == [
        "train-started",
        "checkpoint",
        "ps-lost",
        "ps-recovered",
        "eval",
        "train-finished",
    ]
    assert [r["generation"] for r in run.rounds] == [0, 1]  # the loop went on after it
    assert run._ps_addresses == ["tls://ps-b:1"]


def test_an_elastic_run_splits_its_ps_in_the_loop_when_a_ps_host_joins(
    loop, tmp_path, monkeypatch, variables
):
    def second_host(run: Looping) -> None:
        run.cluster.ps_hosts = 2

    run = looping(tmp_path, loop, monkeypatch, second_host, elastic_shards=True)
    run._run()
    assert run.shards == 2
    (split,) = posted(run, "ps-resharded")
    assert (split["shards_from"], split["shards"], split["generation"]) == (1, 2, 1)
    keys = [kw["key"] for _, kw in run._client.ps_calls()]
    assert keys == [f"ps-{run.id}-g0-s0", f"ps-{run.id}-g1-s0", f"ps-{run.id}-g1-s1"]
    assert [r["generation"] for r in run.rounds] == [0, 1]
    assert posted(run)[-1]["kind"] == "train-finished"


# -- creating a PS generation ------------------------------------------------------------------------
class Creation(Done):
    """An actor's creation: what the driver waits for it, recorded."""

    def __init__(self, address: str, key: str):
        super().__init__(SimpleNamespace(_address=address, key=key))
        self.asked: list[float | None] = []

    def result(self, timeout: float | None = None) -> Any:
        self.asked.append(timeout)
        return super().result(timeout)


class Creating(Client):
    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.submitted.append((fn, args, kwargs))
        return Creation(f"tls://actor-{args[1]}:1", kwargs["key"])


def creating(tmp_path, delay: Any = 0, **kwargs: Any) -> TrainingRun:
    run = TrainingRun(Cluster(str(tmp_path), ps_hosts=2), "resnet8", "digits", HP, **kwargs)
    run.cluster.provisioning_delay = delay
    run._client = Creating()
    run._client.workers = {"tls://b:1": PS, "tls://a:1": PS}
    run._mask = np.ones(6, dtype=np.uint8)
    waits: list[dict[str, Any]] = []

    def wait_for_ps_hosts(exclude, want, timeout, grace):
        waits.append({"exclude": exclude, "want": want, "timeout": timeout, "grace": grace})
        return ["tls://a:1", "tls://b:1"][:want]

    run._wait_for_ps_hosts = wait_for_ps_hosts  # type: ignore[method-assign]
    run.waits = waits  # type: ignore[attr-defined]
    return run


def states(shards: int) -> list[dict[str, Any]]:
    return [{"weights": np.zeros(2), "momentum": None, "bn": None} for _ in range(shards)]


@pytest.mark.parametrize(
    ("delay", "timeout"),
    [(0, 120.0), (None, 120.0), (5, 130.0), ("paper", 320.0), (object(), 320.0), (200, 520.0)],
    ids=["none", "unset", "5s", "paper", "unreadable", "long"],
)
def test_a_start_waits_for_the_ps_hosts_by_the_provisioning_delay(
    tmp_path, variables, delay, timeout
):
    """Two minutes plus two start-ups ("paper": the paper's start-ups, 100 s); a grace of 30 s
    at most before it goes on with fewer hosts."""
    run = creating(tmp_path, delay, shards=3)
    run._bounds = [(0, 2), (2, 4), (4, 6)]
    run._create_ps(states(3), step=0, counters=None)
    assert run.waits == [
        {"exclude": set(), "want": 2, "timeout": timeout, "grace": min(timeout, 30.0)}
    ]


def test_a_start_without_a_delay_attribute_waits_two_minutes(tmp_path, variables):
    run = creating(tmp_path)
    del run.cluster.provisioning_delay
    run._bounds = [(0, 6)]
    run._create_ps(states(1), step=0, counters=None)
    assert run.waits[0]["timeout"] == 120.0 and run.waits[0]["want"] == 1


def test_a_recovery_takes_the_hosts_there_are_without_the_lost_ones(tmp_path, variables):
    run = creating(tmp_path, shards=2)
    run._bounds = [(0, 3), (3, 6)]
    run._generation, run._ps_left = 1, True  # the first recovery
    run._ps_addresses = ["tls://a:1", "tls://a:1"]
    run._create_ps(states(2), step=7, counters={"gaps": 1})
    assert run.waits == [{"exclude": {"tls://a:1"}, "want": 2, "timeout": 120.0, "grace": 0.0}]
    run._ps_left = False  # a split: the hosts are all there
    run._create_ps(states(2), step=7, counters={"gaps": 1})
    assert run.waits[-1]["exclude"] == set()


def test_a_generation_is_placed_round_robin_and_the_old_one_released(tmp_path, variables):
    run = creating(tmp_path, shards=3)
    run._bounds = [(0, 2), (2, 4), (4, 6)]
    run._mask = np.array([1, 0, 1, 0, 1, 1], dtype=np.uint8)
    run._create_ps(states(3), step=0, counters=None)
    old = run._ps_futures
    run._generation = 1
    run._ps_left, run._status_future = True, Pending()
    run._ps_answered = time.monotonic() - 100
    before = time.monotonic()
    run._create_ps(states(3), step=9, counters={"gaps": 2})
    assert all(f.released for f in old) and not any(f.released for f in run._ps_futures)
    assert all(f.asked == [120.0] for f in run._ps_futures)  # a setup bound, not a call's
    calls = [kwargs for _, _, kwargs in run._client.submitted[3:]]
    assert [c["workers"] for c in calls] == [["tls://a:1"], ["tls://b:1"], ["tls://a:1"]]
    assert [c["counters"] for c in calls] == [{"gaps": 2}, None, None]
    assert [c["key"] for c in calls] == [f"ps-{run.id}-g1-s{i}" for i in range(3)]
    assert [list(args[4]) for _, args, _ in run._client.submitted[3:]] == [[1, 0], [1, 0], [1, 1]]
    assert run._ps_addresses == ["tls://a:1", "tls://b:1", "tls://a:1"]
    assert not run._ps_left and run._status_future is None and run._ps_answered >= before
    assert run._ps_zone is None  # a cluster that knows no zones
    assert json.loads(variables.values[-1][1]) == {
        "generation": 1,
        "shards": [[f"tls://actor-{i}:1", f"ps-{run.id}-g1-s{i}"] for i in range(3)],
        "ps_zone": None,
    }


def test_the_trainers_are_told_the_zone_of_the_first_ps_host(tmp_path, variables):
    run = creating(tmp_path)
    run.cluster.zone = "europe-west4-a"
    run._bounds = [(0, 6)]
    run._create_ps(states(1), step=0, counters=None)
    assert run._ps_zone == "europe-west4-a"  # the cluster's, knowing no better
    run._client.workers = {"tls://a:1": {"name": "ps-0", **PS}, "tls://b:1": {"name": "ps-1", **PS}}
    run.cluster.workers = {
        "ps-0": SimpleNamespace(spec=SimpleNamespace(zone="europe-west4-b")),
        "ps-1": SimpleNamespace(spec=SimpleNamespace(zone="europe-west4-c")),
    }
    run._create_ps(states(1), step=0, counters=None)
    assert run._ps_zone == "europe-west4-b"  # its VM's


def test_a_generation_needs_a_state_for_every_shard(tmp_path, variables):
    run = creating(tmp_path, shards=3)
    run._bounds = [(0, 2), (2, 4), (4, 6)]
    with pytest.raises(ValueError, match=r"^zip\(\) argument 2 is longer than argument 1$"):
        run._create_ps(states(2), step=0, counters=None)
    assert run._ps == [] and run._ps_futures == []  # no generation of two shards out of three


# -- the driver thread: its client, its end whatever happens ------------------------------------------
class Connection(Client):
    """The driver's own Dask client: how it was made, and what it did with it."""

    made: list[tuple[tuple, dict[str, Any]]] = []
    fail: BaseException | None = None

    def __init__(self, *args: Any, **kwargs: Any):
        if Connection.fail is not None:
            raise Connection.fail
        super().__init__()
        Connection.made.append((args, kwargs))
        self.log: list[Any] = []
        self.current = False
        self.close_fails = False

    def subscribe_topic(self, topic: str, handler: Any) -> None:
        self.log.append(("subscribe", topic))
        self.handler = handler

    def unsubscribe_topic(self, topic: str) -> None:
        self.log.append(("unsubscribe", topic))

    def close(self) -> None:
        self.log.append("close")
        if self.close_fails:
            raise OSError("already closed")

    def as_current(self) -> Any:
        connection = self

        class Current:
            def __enter__(self) -> None:
                connection.current = True

            def __exit__(self, *exc: Any) -> None:
                connection.current = False

        return Current()


class Scripted(TrainingRun):
    """A driver whose loop is replaced: it records where it ran, then fails if told to."""

    failure: BaseException | None = None

    def _run(self) -> None:
        self.trace = [("run", self._client.current)]
        if self.failure is not None:
            raise self.failure

    def _cleanup(self) -> None:
        self.trace.append(("cleanup", self._client.current))


@pytest.fixture
def connection(monkeypatch):
    """Dask's Client and the exit hooks, as the driver's modules name them, recorded: start()
    registers the hook (run), the driver thread unregisters it at its end (run_loop)."""
    Connection.made, Connection.fail = [], None
    monkeypatch.setattr(run_loop, "Client", Connection)
    hooks = SimpleNamespace(registered=[], unregistered=[])
    recorded = SimpleNamespace(
        register=hooks.registered.append, unregister=hooks.unregistered.append
    )
    monkeypatch.setattr(run_module, "atexit", recorded)
    monkeypatch.setattr(run_loop, "atexit", recorded)
    return hooks


def scripted(tmp_path, failure: BaseException | None = None) -> Scripted:
    run = Scripted(Cluster(str(tmp_path)), "resnet8", "digits", HP)
    run.failure = failure
    return run


def test_the_driver_talks_to_actors_directly_and_hears_the_cluster_events(tmp_path, connection):
    run = scripted(tmp_path)
    run._main()
    ((args, kwargs),) = Connection.made
    assert args == (run.cluster,) and kwargs == {"set_as_default": False, "direct_to_workers": True}
    client = run._client
    client.handler((123.0, {"kind": "joined", "worker": "w-5"}))
    assert run._events.get_nowait() == {"kind": "joined", "worker": "w-5"}
    assert run.trace == [("run", True), ("cleanup", True)]  # both with its client current
    assert client.log == [("subscribe", TOPIC), ("unsubscribe", TOPIC), "close"]
    assert connection.unregistered == [run._at_exit] and run.done
    assert run.finished is not None and run.started <= run.finished <= time.time()
    assert run.error is None and run.reason is None and posted(run) == []


def test_a_driver_that_fails_says_why_and_still_lets_everything_go(tmp_path, connection, caplog):
    run = scripted(tmp_path, failure=ValueError("x" * 600))
    run.step, run.accuracy, run.lost_in_flight = 42, 0.5, 3
    run.started = time.time() - 5
    run._main()
    assert run.trace == [("run", True), ("cleanup", True)]
    assert isinstance(run.error, ValueError) and run.reason == "error"
    (done,) = posted(run)
    assert without_time(done) == {
        "kind": "train-finished",
        "run": run.id,
        "reason": "error",
        "step": 42,
        "error": "x" * 500,
        "accuracy": 0.5,
        "wall_s": done["wall_s"],
        "lost_in_flight": 3,
    }
    assert 5 <= done["wall_s"] < 60
    assert run._client.log[-2:] == [("unsubscribe", TOPIC), "close"]
    assert connection.unregistered == [run._at_exit] and run.done
    assert any(
        r.levelname == "ERROR" and r.getMessage() == f"Training run {run.id} failed"
        for r in caplog.records
    )


def test_trainers_that_all_failed_end_the_run_with_their_own_error(tmp_path, connection):
    run = scripted(tmp_path, failure=RuntimeError("raised at the end"))
    first = RuntimeError("Every trainer kept failing")
    run.error, run.reason = first, "trainer-failed"
    run._main()
    assert run.error is first and run.reason == "trainer-failed"
    (done,) = posted(run)
    assert done["reason"] == "trainer-failed" and done["error"] == "Every trainer kept failing"


def test_a_driver_that_cannot_connect_still_ends(tmp_path, connection, caplog):
    caplog.set_level("INFO", "transient_nb.training.run")
    run = scripted(tmp_path)
    Connection.fail = OSError("no scheduler")
    run._main()
    assert str(run.error) == "no scheduler" and run.reason == "error"
    assert logged(caplog, "INFO", f"Could not post train-finished for run {run.id}")
    assert connection.unregistered == [run._at_exit] and run.done and run.finished is not None


def test_a_client_that_fails_to_close_does_not_keep_the_run_going(tmp_path, connection):
    class Closing(Scripted):
        def _run(self) -> None:
            self._client.close_fails = True
            super()._run()

    run = Closing(Cluster(str(tmp_path)), "resnet8", "digits", HP)
    run._main()
    assert run._client.log[-1] == "close" and run.error is None
    assert connection.unregistered == [run._at_exit] and run.done


def test_a_started_run_is_stopped_when_the_kernel_exits_and_unhooked_when_done(
    tmp_path, connection
):
    run = scripted(tmp_path)
    assert run.start() is run
    assert connection.registered == [run._at_exit]
    assert run.wait(timeout=10) is run
    run._thread.join(10)
    assert connection.unregistered == [run._at_exit] and not run._thread.is_alive()


# -- waiting, stopping, checkpointing from the notebook -----------------------------------------------
class Waits(threading.Event):
    """An event whose waits are recorded (and never block)."""

    def __init__(self) -> None:
        super().__init__()
        self.waited: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waited.append(timeout)
        return self.is_set()


def plain(tmp_path, hp: HParams = HP) -> TrainingRun:
    run = TrainingRun(Cluster(str(tmp_path)), "resnet8", "digits", hp)
    run._client = Client()
    return run


def test_waiting_says_how_far_the_run_got_or_why_it_failed(tmp_path):
    run = plain(tmp_path)
    run._done = Waits()
    run.step = 7
    with pytest.raises(TimeoutError) as info:
        run.wait(0.5)
    assert str(info.value) == f"Run {run.id} still going after 0.5 s (step 7)."
    with pytest.raises(TimeoutError):
        run.wait()
    assert run._done.waited == [0.5, None]  # without a timeout, for as long as it takes
    run._done.set()
    assert run.wait() is run
    run.error = ValueError("boom")
    with pytest.raises(RuntimeError) as failed:
        run.wait()
    assert str(failed.value) == f"Training run {run.id} failed: boom"
    assert failed.value.__cause__ is run.error


def test_stopping_waits_for_the_end_unless_told_not_to(tmp_path):
    run = plain(tmp_path)
    run._done = Waits()
    assert run.stop() is run and run._stop.is_set()
    assert run.stop(timeout=3) is run
    assert run.stop(wait=False) is run
    assert run._done.waited == [120, 3]


def test_a_kernel_exit_stops_a_run_still_going_within_a_call_timeout(tmp_path):
    run = plain(tmp_path, hp=HP.with_(call_timeout_s=2.0))
    run._done = Waits()
    run._at_exit()
    assert run._stop.is_set() and run._done.waited == [12.0]
    over = plain(tmp_path)
    over._done = Waits()
    over._done.set()
    over._at_exit()
    assert not over._stop.is_set() and over._done.waited == []


class Settles(threading.Event):
    """The driver's "checkpoint wanted" flag, answered at once when it is set: the attempt being
    written settles, then ``settle`` more are started and settled, the last at step 300."""

    def __init__(self, run: TrainingRun, settle: int):
        super().__init__()
        self.run, self.settle = run, settle

    def set(self) -> None:
        super().set()
        self.run._checkpoint_settled = self.run._checkpoint_attempts
        for _ in range(self.settle):
            self.run._checkpoint_attempts += 1
            self.run._checkpoint_settled = self.run._checkpoint_attempts
        self.run.checkpoint_step = 300


def test_an_explicit_checkpoint_waits_for_an_attempt_started_after_it(tmp_path):
    run = plain(tmp_path)
    run._checkpoint_wanted = Settles(run, settle=1)
    assert run.checkpoint() == 300 and run._checkpoint_wanted.is_set()
    # One attempt was being written when it was asked for: its settling is not enough.
    run = plain(tmp_path)
    run._checkpoint_attempts, run._checkpoint_settled = 2, 1
    run._checkpoint_wanted = Settles(run, settle=0)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        run.checkpoint(timeout=0.2)
    assert str(info.value) == f"No checkpoint of run {run.id} within 0.2 s."
    assert 0.2 <= time.monotonic() - t0 < 1  # looked at every 50 ms
    assert run._checkpoint_settled == 2
    run._checkpoint_wanted = Settles(run, settle=1)
    assert run.checkpoint(timeout=0.2) == 300


def test_an_explicit_checkpoint_waits_two_minutes_by_default(tmp_path, monkeypatch):
    clock = SimpleNamespace(now=1000.0, slept=[])

    def sleep(seconds: float) -> None:
        clock.slept.append(seconds)
        clock.now += seconds

    run = plain(tmp_path)
    # The module's clock, moved by its own sleeps: two minutes pass at once.
    monkeypatch.setattr(
        run_module, "time", SimpleNamespace(monotonic=lambda: clock.now, sleep=sleep)
    )
    with pytest.raises(TimeoutError) as info:
        run.checkpoint()
    assert str(info.value) == f"No checkpoint of run {run.id} within 120 s."
    assert set(clock.slept) == {0.05} and 120 <= sum(clock.slept) < 120.1


def test_an_explicit_checkpoint_of_a_finished_run_returns_at_once(tmp_path):
    run = plain(tmp_path)
    run.checkpoint_step = 80
    run._done.set()
    t0 = time.monotonic()
    assert run.checkpoint(timeout=30) == 80
    assert time.monotonic() - t0 < 1


# -- what the notebook reads ----------------------------------------------------------------------------
def test_a_run_shows_its_model_data_progress_and_state(tmp_path):
    run = plain(tmp_path)
    head = f"<TrainingRun {run.id}: resnet8 on digits, step 0/1000"
    assert repr(run) == f"{head}, created>"
    release = threading.Event()
    run._thread = threading.Thread(target=release.wait)
    run._thread.start()
    try:
        assert repr(run) == f"{head}, running>"
    finally:
        release.set()
        run._thread.join()
    run.step, run.accuracy = 1000, 0.91251
    run.reason = "steps"
    assert (
        repr(run)
        == f"<TrainingRun {run.id}: resnet8 on digits, step 1000/1000, accuracy 0.913, steps>"
    )
    run.accuracy, run.reason, run.error = None, "error", OSError("disk full")
    assert (
        repr(run) == f"<TrainingRun {run.id}: resnet8 on digits, step 1000/1000, error: disk full>"
    )


def test_a_run_reads_its_own_and_the_cluster_events_from_the_cluster_log(tmp_path, monkeypatch):
    run = plain(tmp_path)
    mine = {"kind": "metrics", "run": run.id, "step": 5}
    log = [
        {"kind": "started"},  # the cluster's own
        {"kind": "metrics", "run": "run-other", "step": 9},
        mine,
        {"kind": "preempted", "worker": "w-1", "run": None},
    ]
    run.cluster.monitor = SimpleNamespace(events=log)
    run.cluster.catalog = SimpleNamespace(minimum_s=30.0)
    events = run.events()
    assert events == [log[0], mine, log[3]]
    events[1]["step"] = 6  # copies: the log is not changed
    assert mine["step"] == 5
    seen = []
    monkeypatch.setattr(
        run_module.resuming,
        "summarize_run",
        lambda evs, minimum_s: seen.append(("summary", evs, minimum_s)) or {"steps": 5},
    )
    monkeypatch.setattr(
        run_module.resuming,
        "run_history",
        lambda evs, t0, minimum_s: seen.append(("history", evs, t0, minimum_s)) or "frame",
    )
    assert run.summary() == {"steps": 5}
    assert run.history == "frame"
    assert seen == [
        ("summary", [log[0], mine, log[3]], 30.0),
        ("history", [log[0], mine, log[3]], run.started, 30.0),
    ]


def test_an_event_that_cannot_be_posted_is_only_said(tmp_path, caplog):
    caplog.set_level("INFO", "transient_nb.training.run")
    run = plain(tmp_path)
    run._post_safely("eval", step=3, accuracy=0.5)
    assert without_time(posted(run)[0]) == {
        "kind": "eval",
        "run": run.id,
        "step": 3,
        "accuracy": 0.5,
    }
    run._client = None
    run._post_safely("train-finished", step=4)
    assert logged(caplog, "INFO", f"Could not post train-finished for run {run.id}")


def test_the_worker_listing_is_read_whole_and_unreadable_is_not_empty(tmp_path):
    asked = []

    class Listing:
        def __init__(self, info: Any):
            self.info = info

        def scheduler_info(self, **kwargs: Any) -> Any:
            asked.append(kwargs)
            if isinstance(self.info, Exception):
                raise self.info
            return self.info

    run = plain(tmp_path)
    run._client = Listing({"workers": {"tls://a:1": PS}, "address": "tls://s:1"})
    assert run._workers() == {"tls://a:1": PS}
    assert asked == [{"n_workers": -1}]  # every worker, not the first few
    run._client = Listing({"address": "tls://s:1"})
    assert run._workers() == {}
    run._client = Listing(OSError("scheduler busy"))
    assert run._workers() is None


# -- train(): the checks before anything starts, and what it starts ----------------------------------
class Unstarted(TrainingRun):
    """A run that ``train()`` makes but that never starts a thread: its start and waits recorded."""

    def start(self) -> TrainingRun:
        self.calls = ["start"]
        return self

    def wait(self, timeout: float | None = None) -> TrainingRun:
        self.calls.append("wait")
        return self


@pytest.fixture
def unstarted(monkeypatch):
    monkeypatch.setattr(run_module, "TrainingRun", Unstarted)


def test_train_starts_a_run_with_one_shard_per_ps_host_that_follows_them(tmp_path, unstarted):
    cluster = Cluster(str(tmp_path), ps_hosts=2)
    run = train(cluster, model="resnet8", data="digits", steps=77, lr=0.2, seed=4, device="cpu")
    assert isinstance(run, Unstarted) and run.calls == ["start"]
    assert (run.cluster, run.model_name, run.data, run.seed, run.device) == (
        cluster,
        "resnet8",
        "digits",
        4,
        "cpu",
    )
    assert run.shards == 2 and run.elastic_shards
    assert run.hp == HParams(steps=77, lr=0.2)
    assert run.resume is None and run.deadline is None and run.budget is None
    assert run.target_accuracy is None
    default = train(Cluster(str(tmp_path), ps_hosts=None))
    assert (default.model_name, default.data, default.shards) == ("resnet32", "synthetic", 1)
    assert default.hp == HParams() and default.seed == 0 and default.device is None
    assert default.checkpoint_url == str(tmp_path / "checkpoints" / default.id)


def test_train_keeps_the_shards_it_is_given(tmp_path, unstarted):
    run = train(Cluster(str(tmp_path), ps_hosts=2), model="resnet8", data="digits", shards=3)
    assert run.shards == 3 and not run.elastic_shards


def test_train_passes_its_stop_conditions_and_waits_when_told(tmp_path, unstarted):
    cluster = Cluster(str(tmp_path))
    cluster.spent = 1.0
    url = str(tmp_path / "ck")
    before = time.time()
    run = train(
        cluster,
        model="resnet8",
        data="digits",
        target_accuracy=0.9,
        budget=2.5,
        deadline="2h",
        checkpoint_url=url,
        wait=True,
    )
    assert run.calls == ["start", "wait"]
    assert run.target_accuracy == 0.9 and run.budget == 2.5 and run.limits.budget == 2.5
    assert before + 7200 <= run.deadline <= time.time() + 7200
    assert run.checkpoint_url == f"{url}/{run.id}"  # the run's own folder under the URL given


@pytest.mark.parametrize("spent", [2.5, 3.0])
def test_train_refuses_a_budget_already_spent(tmp_path, unstarted, spent):
    cluster = Cluster(str(tmp_path))
    cluster.spent = spent
    with pytest.raises(ValueError) as info:
        train(cluster, model="resnet8", data="digits", budget=2.5)
    assert str(info.value) == (
        f"budget=$2.50 is already spent: this cluster has cost ${spent:.4f} so far. "
        "Raise the budget or start a new cluster."
    )


def test_train_refuses_a_cluster_that_is_not_running(tmp_path, unstarted):
    cluster = Cluster(str(tmp_path))
    cluster.status = SimpleNamespace(name="closed")
    with pytest.raises(ValueError) as info:
        train(cluster, model="resnet8", data="digits")
    assert str(info.value) == "The cluster is closed; start it (or a new one) first."
    cluster.status = SimpleNamespace(name="running")
    assert train(cluster, model="resnet8", data="digits").calls == ["start"]


def test_train_refuses_a_cloud_run_without_shared_checkpoints(tmp_path, unstarted):
    cluster = Cluster(str(tmp_path))
    cluster.backend = SimpleNamespace(name="gcp")
    with pytest.raises(ValueError, match=r"^checkpoint_url=None: on the gcp backend the PS"):
        train(cluster, model="resnet8", data="digits")


def test_train_probes_the_shared_checkpoints_of_a_cloud_run(tmp_path, unstarted, monkeypatch):
    probed = []
    # The check lives with the checkpoints (run re-exports it).
    monkeypatch.setattr(checkpoint, "probe_checkpoint_url", probed.append)
    cluster = Cluster(str(tmp_path))
    cluster.backend = SimpleNamespace(name="gcp")
    run = train(cluster, model="resnet8", data="digits", checkpoint_url="gs://bucket/runs")
    assert probed == ["gs://bucket/runs"] and run.checkpoint_url == f"gs://bucket/runs/{run.id}"


def test_train_checks_its_arguments_before_anything(tmp_path, unstarted):
    cluster = Cluster(str(tmp_path))
    with pytest.raises(ValueError, match=r"^Unknown model 'resnet9'"):
        train(cluster, model="resnet9")
    with pytest.raises(ValueError, match=r"^invalid data spec 'nonsense'; accepted forms"):
        train(cluster, model="resnet8", data="nonsense")
    with pytest.raises(ValueError, match=r"^shards=0 must be a whole number"):
        train(cluster, model="resnet8", data="digits", shards=0)
    with pytest.raises(ValueError) as info:
        train(cluster, model="resnet8", data="digits", target_accuracy=1.5)
    assert str(info.value) == "target_accuracy=1.5 must be in (0, 1], e.g. 0.9."
    with pytest.raises(ValueError) as info:
        train(cluster, model="resnet8", data="digits", budget=-1)
    assert str(info.value) == "budget=-1 must be a positive number of dollars, e.g. 5.0."


def test_train_on_a_cluster_that_names_no_ps_hosts_makes_one_shard(tmp_path, unstarted):
    cluster = Cluster(str(tmp_path))
    del cluster.ps_hosts  # a cluster of another kind
    run = train(cluster, model="resnet8", data="digits")
    assert run.shards == 1 and run.elastic_shards


def test_train_resumes_a_run_with_its_settings(tmp_path, unstarted):
    url = str(tmp_path / "earlier")
    w = np.zeros(4, dtype=np.float32)
    entry = checkpoint.write_shard(
        url, 30, 0, {"weights": w, "momentum": w, "decay_mask": np.ones(4), "bn": None}
    )
    meta = {
        "run": "run-0123abcd",
        "model": "resnet8",
        "data": "digits",
        "shards": 2,
        "hparams": {"steps": 500, "lr": 0.3},
    }
    checkpoint.write_manifest(url, 30, meta, [entry])
    run = train(Cluster(str(tmp_path), ps_hosts=1), resume=url, steps=900)
    assert run.id == "run-0123abcd" and run.resume.checkpoint_url == url
    assert (run.model_name, run.data, run.shards) == ("resnet8", "digits", 2)
    assert run.hp.steps == 900 and run.hp.lr == 0.3
    assert run.elastic_shards  # no shards given: it follows the PS hosts from there
    kept = train(Cluster(str(tmp_path)), resume=url)
    assert kept.hp.steps == 500
    for key, given, earlier in (("model", "resnet20", "resnet8"), ("data", "synthetic", "digits")):
        with pytest.raises(ValueError) as info:
            train(Cluster(str(tmp_path)), resume=url, **{key: given})
        assert str(info.value) == (
            f"{key}={given!r} differs from the run being resumed ({earlier!r}): its checkpoint "
            f"holds that {key}'s weights. Drop {key}= to resume, or start a new run."
        )
    with pytest.raises(ValueError, match=r"^shards=3 differs from the run being resumed \(2\)"):
        train(Cluster(str(tmp_path)), resume=url, shards=3)


def test_train_refuses_to_resume_a_checkpoint_that_names_no_run(tmp_path, unstarted):
    url = str(tmp_path / "anonymous")
    entry = checkpoint.write_shard(url, 30, 0, {"weights": np.zeros(4, dtype=np.float32)})
    checkpoint.write_manifest(url, 30, {"model": "resnet8", "data": "digits"}, [entry])
    with pytest.raises(ValueError) as info:
        train(Cluster(str(tmp_path)), resume=url)
    assert str(info.value) == (
        f"resume={url!r}: its checkpoint names no run (it was not written by a transient_nb "
        "run), so no run can continue from it."
    )


class Detached(RemoteCluster):
    """A detached cluster's handle: its head runs the training."""

    def __init__(self) -> None:  # no connection
        self.asked: list[dict[str, Any]] = []
        self.view = SimpleNamespace(waited=0)
        self.view.wait = lambda: setattr(self.view, "waited", self.view.waited + 1)

    def train(self, **kwargs: Any) -> Any:
        self.asked.append(kwargs)
        return self.view


def test_train_on_a_detached_cluster_asks_its_head_with_what_was_given():
    cluster = Detached()
    view = train(cluster, "resnet8", steps=300, budget=1.5, lr=0.2, batch_size=None)
    assert view is cluster.view and view.waited == 0
    assert cluster.asked == [
        {"model": "resnet8", "steps": 300, "budget": 1.5, "seed": 0, "lr": 0.2}
    ]
    train(
        cluster,
        data="digits",
        resume="run-0123abcd",
        shards=2,
        target_accuracy=0.9,
        deadline="1h",
        checkpoint_url="gs://b/r",
        seed=None,
        device="cuda",
        wait=True,
    )
    assert cluster.asked[-1] == {
        "data": "digits",
        "resume": "run-0123abcd",
        "shards": 2,
        "target_accuracy": 0.9,
        "deadline": "1h",
        "checkpoint_url": "gs://b/r",
        "device": "cuda",
    }
    assert view.waited == 1


# -- a new run's own names and defaults -------------------------------------------------------------
def test_a_new_run_has_its_own_id_variable_thread_and_defaults(tmp_path):
    cluster = Cluster(str(tmp_path))
    run = TrainingRun(cluster, "resnet8", "digits", HP)
    assert re.fullmatch(r"run-[0-9a-f]{8}", run.id)
    assert run.variable == f"transient-ps-{run.id}"
    assert run.checkpoint_url == os.path.join(str(tmp_path), "checkpoints", run.id)
    assert run._thread.name == f"transient-{run.id}" and run._thread.daemon
    assert not run._thread.is_alive()  # started by start(), not by the constructor
    assert (run.seed, run.device, run.shards, run.elastic_shards) == (0, None, 1, False)
    assert (run.step, run.checkpoint_step, run.reason, run.error) == (0, -1, None, None)
    assert (run._next_eval, run._next_checkpoint) == (HP.eval_interval, HP.checkpoint_interval)
    assert TrainingRun(cluster, "resnet8", "digits", HP).id != run.id
    given = TrainingRun(cluster, "resnet8", "digits", HP, checkpoint_url="memory://ck/x/")
    assert given.checkpoint_url == f"memory://ck/x/{given.id}"  # runs may share the URL given


def test_the_run_posts_its_events_under_the_clusters_topic_with_its_id(tmp_path):
    run = plain(tmp_path)
    sent: list[tuple[str, dict[str, Any]]] = []
    run._client.log_event = lambda topic, event: sent.append((topic, event))
    run._post("eval", step=3, accuracy=0.5, test_loss=1.0)
    ((topic, event),) = sent
    assert topic == TOPIC
    assert {k: v for k, v in event.items() if k != "time"} == {
        "kind": "eval",
        "run": run.id,
        "step": 3,
        "accuracy": 0.5,
        "test_loss": 1.0,
    }
