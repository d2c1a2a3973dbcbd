"""The driver's decisions, one function at a time, against in-process doubles: a recording client,
a cluster that only answers what the driver asks of it, and real parameter servers on a private
event loop (``doubles.PSDouble``). Its core and PS generations (``run_driver``), its checkpoints,
resume and recovery (``run_checkpoints``) and its trainers (``run_trainers``) are tested here. The end-to-end runs on real worker processes are in
test_run.py; these take milliseconds, so a mutation run can afford them (benchmarks/mutation.py).
"""

from __future__ import annotations

import datetime
import json
import os
import queue
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from transient_nb.training import checkpoint, run_loop
from transient_nb.training.hparams import HParams
from transient_nb.training.models import build_model
from transient_nb.training.ps import ParameterServer, shard_bounds
from transient_nb.training.resume import ResumePoint
from transient_nb.training.run import (
    CHECKPOINTS_KEPT,
    PS_OVERDUE_S,
    TRAINER_BACKOFF_MAX_S,
    TrainingRun,
    _parse_deadline,
    _resumed_settings,
    _TrainerSlot,
    check_checkpoint_url,
    check_train_args,
    probe_checkpoint_url,
)
from transient_nb.training.trainer import Trainer, flat_layout, get_flat

from .doubles import SHORT, PSDouble

HP = HParams(
    steps=1000,
    checkpoint_every=100,
    eval_every=100,
    eval_images=40,
    trainer_restarts=2,
    **SHORT,
)


# -- doubles ------------------------------------------------------------------------------------------
class Done:
    """A finished future: its value, or its error."""

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value, self.error, self.released = value, error, False

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise self.error
        return self.value

    def release(self) -> None:
        self.released = True

    def add_done_callback(self, fn: Any) -> None:
        fn(self)  # done already: at once, as a Dask future does


class Pending(Done):
    """A future that never finishes (a call to a frozen host)."""

    def done(self) -> bool:
        return False

    def add_done_callback(self, fn: Any) -> None:
        pass  # never done: never called

    def result(self, timeout: float | None = None) -> Any:
        raise TimeoutError("still pending")


class Client:
    """What the driver asks of its Dask client: events, the worker listing, submit."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.workers: dict[str, dict[str, Any]] = {}
        self.unreadable = False
        self.listings = 0
        self.submitted: list[tuple[Any, tuple, dict[str, Any]]] = []
        self.reply: Any = None  # what the next submit returns

    def log_event(self, topic: str, event: dict[str, Any]) -> None:
        self.events.append(event)

    def scheduler_info(self, n_workers: int = 5) -> dict[str, Any]:
        self.listings += 1
        if self.unreadable:
            raise OSError("scheduler busy")
        return {"workers": dict(self.workers)}

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.submitted.append((fn, args, kwargs))
        return self.reply if self.reply is not None else Pending()


class Cluster:
    """The few attributes of a cluster that the driver reads."""

    def __init__(self, path: str, ps_hosts: int = 1):
        self.run_path = path
        self.ps_hosts = ps_hosts
        self.provisioning_delay = 0
        self.spent = 0.0

    def cost(self) -> SimpleNamespace:
        return SimpleNamespace(total=self.spent)


def driver(tmp_path, hp: HParams = HP, ps_hosts: int = 1, **kwargs: Any) -> TrainingRun:
    """A driver that is never started: its functions are called one by one."""
    run = TrainingRun(Cluster(str(tmp_path), ps_hosts), "resnet8", "digits", hp, **kwargs)
    run._client = Client()
    return run


def posted(run: TrainingRun, kind: str | None = None) -> list[dict[str, Any]]:
    events = run._client.events
    return [e for e in events if kind is None or e["kind"] == kind]


def ps_double(
    loop,
    run: TrainingRun,
    shard: int = 0,
    shards: int = 1,
    version: int = 0,
    weights: np.ndarray | None = None,
    bn: np.ndarray | None = None,
) -> PSDouble:
    w = np.arange(12, dtype=np.float32) if weights is None else weights
    ps = ParameterServer(
        run.id,
        shard,
        shards,
        w,
        np.ones(len(w), dtype=np.uint8),
        bn,
        run.hp.to_dict(),
        run.checkpoint_url,
        version=version,
        counters={"accepted": {"w-0": version}, "gaps": 1},
    )
    return PSDouble(ps, loop)


def logged(caplog, level: str, text: str) -> bool:
    """Whether the driver logged exactly ``text`` at ``level`` (what an operator reads)."""
    return any(
        r.name == "transient_nb.training.run" and r.levelname == level and r.getMessage() == text
        for r in caplog.records
    )


def wait_done(future: Any, timeout: float = 10.0) -> None:
    """Wait for an actor call to end, answered or failed (its result is read elsewhere)."""
    try:
        future.result(timeout)
    except Exception:
        pass
    assert future.done(), "the call never finished"


# -- deadlines and the checks made before anything starts --------------------------------------------
def test_a_deadline_is_a_duration_from_now_or_a_moment():
    assert _parse_deadline(None) is None
    moment = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    assert _parse_deadline(moment) == moment.timestamp()
    before = time.time()
    assert before + 7200 <= _parse_deadline("2h") <= time.time() + 7200
    assert before + 90 <= _parse_deadline(90) <= time.time() + 90
    with pytest.raises(ValueError) as info:
        _parse_deadline("soon")
    assert str(info.value) == "deadline='soon' must be a positive duration such as '2h'."


def test_train_arguments_are_checked_before_anything_starts():
    assert check_train_args().steps == HParams.steps  # its defaults are a valid run
    hp = check_train_args(model="resnet8", data="digits", steps=77, lr=0.2, batch_size=None)
    assert hp.steps == 77 and hp.lr == 0.2 and hp.batch_size == HParams.batch_size
    with pytest.raises(
        ValueError,
        match=r"Unknown model 'resnet9': use one of resnet8, resnet20, resnet32, resnet32-t2t\.",
    ):
        check_train_args(model="resnet9")
    for bad in (0, True, 1.5, "2"):
        with pytest.raises(ValueError, match=f"shards={bad!r} must be a whole number"):
            check_train_args(model="resnet8", shards=bad)
    assert check_train_args(model="resnet8", target_accuracy=1.0).steps == HParams.steps
    for bad in (0, 1.01, -0.5):
        with pytest.raises(ValueError, match=f"target_accuracy={bad!r} must be in"):
            check_train_args(model="resnet8", target_accuracy=bad)
    with pytest.raises(ValueError, match="deadline"):
        check_train_args(model="resnet8", deadline="tomorrowish")
    with pytest.raises(ValueError, match="data"):
        check_train_args(model="resnet8", data="mnist")
    with pytest.raises(ValueError, match="eval_images=0"):
        check_train_args(model="resnet8", eval_images=0)


def test_a_resumed_run_keeps_the_earlier_settings_unless_told_otherwise():
    point = ResumePoint(
        "run-1",
        "memory://ck",
        settings={
            "model": "resnet8",
            "data": "digits",
            "shards": 2,
            "steps": 500,
            "hparams": {"lr": 0.3, "steps": 500, "batch_size": 64, "no_such_field": 1},
        },
    )
    model, data, shards, steps, hp = _resumed_settings(point, None, None, None, None, {})
    assert (model, data, shards, steps) == ("resnet8", "digits", 2, 500)
    assert hp == {"lr": 0.3, "batch_size": 64}  # neither the steps nor what HParams lacks
    given = _resumed_settings(point, "resnet8", "digits", 2, 900, {"lr": 0.1})
    assert given[3] == 900 and given[4] == {"lr": 0.1, "batch_size": 64}
    for key, value in (("model", "resnet20"), ("data", "synthetic"), ("shards", 1)):
        args: dict[str, Any] = {"model": None, "data": None, "shards": None, key: value}
        with pytest.raises(ValueError, match=f"{key}={value!r} differs from the run being resumed"):
            _resumed_settings(point, args["model"], args["data"], args["shards"], None, {})
    bare = ResumePoint("run-2", "memory://ck2")
    assert _resumed_settings(bare, None, None, None, None, {}) == (
        "resnet32",
        "synthetic",
        1,
        None,
        {},
    )


def test_a_cloud_run_needs_shared_checkpoint_storage_that_can_be_written(tmp_path):
    check_checkpoint_url(None, "local")  # the run's own folder: nothing to check
    check_checkpoint_url("/tmp/x", "local")
    for bad, fs in (
        (None, None),
        ("/tmp/checkpoints", "LocalFileSystem"),
        ("file:///tmp/c", "LocalFileSystem"),
        ("local:///tmp/c", "LocalFileSystem"),
        ("memory://c", "MemoryFileSystem"),
    ):
        with pytest.raises(ValueError) as info:
            check_checkpoint_url(bad, "gce")
        where = f" (this one is a {fs}, on this host alone)" if fs else ""
        assert str(info.value) == (
            f"checkpoint_url={bad!r}: on the gce backend the PS checkpoints must live on storage "
            f"that outlives the PS host and that every host can reach{where}; pass a bucket "
            "URL, checkpoint_url='gs://BUCKET/PREFIX' (any fsspec URL of shared storage), or a "
            "local path under a share every host mounts (transient.shared-paths). Each run "
            "writes under PREFIX/<run id>/, so runs may share one."
        )
    probe_checkpoint_url("memory://bucket/runs")  # written, read back, deleted
    import fsspec

    assert fsspec.filesystem("memory").glob("/bucket/runs/*") == []
    with pytest.raises(ValueError) as info:
        probe_checkpoint_url("nosuch://b/runs")
    assert str(info.value) == (
        "checkpoint_url='nosuch://b/runs' cannot be written (ValueError: Protocol not known: "
        "nosuch). Check that the bucket exists and that your credentials (and the VMs' service "
        "account) may write to it, or pass another checkpoint_url."
    )
    folder = tmp_path / "runs"
    folder.mkdir()
    probe_checkpoint_url(f"{folder}/")  # a trailing slash, on a local absolute path
    assert list(folder.iterdir()) == []
    with pytest.raises(ValueError, match="cannot be written"):
        check_checkpoint_url("nosuch://b/runs", "gce")  # probed once the form is right


def test_storage_that_reads_back_other_bytes_is_refused():
    import io

    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class Corrupting(MemoryFileSystem):
        """Memory that answers every read with other bytes (a broken bucket or gateway)."""

        protocol = "corrupting"

        def _open(self, path, mode="rb", **kwargs):
            if "r" in mode:
                return io.BytesIO(b"ko")
            return super()._open(path, mode, **kwargs)

    fsspec.register_implementation("corrupting", Corrupting, clobber=True)
    with pytest.raises(ValueError) as info:
        probe_checkpoint_url("corrupting://bucket/runs")
    assert str(info.value) == (
        "checkpoint_url='corrupting://bucket/runs': a file written there did not read back the "
        "same."
    )


# -- when the run stops -------------------------------------------------------------------------------
def test_the_run_stops_at_its_steps_and_a_stop_comes_first(tmp_path):
    run = driver(tmp_path)
    run.step = HP.steps - 1
    assert run._stop_reason() is None
    run.step = HP.steps
    assert run._stop_reason() == "steps"
    run._stop.set()
    assert run._stop_reason() == "stopped"


def test_the_run_stops_at_its_target_accuracy(tmp_path):
    run = driver(tmp_path, target_accuracy=0.9)
    assert run._stop_reason() is None  # not evaluated yet
    run.accuracy = 0.8999
    assert run._stop_reason() is None
    run.accuracy = 0.9
    assert run._stop_reason() == "accuracy"
    assert driver(tmp_path)._stop_reason() is None  # no target: accuracy never stops it


def test_the_run_stops_at_its_budget_and_its_deadline(tmp_path):
    run = driver(tmp_path, budget=2.0)
    run.cluster.spent = 1.99
    assert run._stop_reason() is None
    run.cluster.spent = 2.0
    assert run._stop_reason() == "budget"
    late = driver(tmp_path, deadline=time.time() - 1)
    assert late._stop_reason() == "deadline"
    assert driver(tmp_path, deadline=time.time() + 3600)._stop_reason() is None


def test_the_run_stops_when_every_worker_has_been_given_up(tmp_path):
    run = driver(tmp_path)
    run._given_up = {"w-1": "ValueError: b", "w-0": "OSError: a"}
    run._slots["w-2"] = _TrainerSlot("tls://w2")
    assert run._stop_reason() is None  # one worker still trains
    run._slots.clear()
    assert run._stop_reason() == "trainer-failed"
    assert str(run.error) == (
        "Every trainer kept failing (2 worker(s), 2 restarts each): OSError: a; ValueError: b"
    )


def test_a_trainer_whose_worker_went_as_its_actor_was_made_is_restarted_not_fatal(tmp_path):
    # Dask's Actor refuses a call at once when the future that made it has since erred: the
    # worker left between the actor's creation and its first call (a notice that landed then).
    class LostActor:
        def run(self) -> Any:
            raise RuntimeError("Worker holding Actor was lost.  Status: error")

    run = driver(tmp_path)
    run._slots["w-0"] = slot = _TrainerSlot("tls://w0")
    slot.future = made = Done(LostActor())
    run._submit_trainers()
    (failed,) = posted(run, "trainer-failed")
    assert failed["worker"] == "w-0" and "Worker holding Actor was lost" in failed["error"]
    assert [e["worker"] for e in posted(run, "trainer-restarted")] == ["w-0"]
    assert slot.future is None and slot.actor is None and not slot.started
    assert made in run._released and run.error is None


# -- the PS: its status, and when it is lost ----------------------------------------------------------
def test_the_ps_status_is_asked_without_blocking_and_read_when_it_comes(loop, tmp_path):
    run = driver(tmp_path)
    double = ps_double(loop, run, version=40)
    run._ps = [double]
    run._known_step = 55  # a trainer's metrics said so: the driver's step never goes back
    run._poll_status()
    first = run._status_future
    assert first is not None and run._status_sent > 0 and run.step == 0
    wait_done(first)
    answered = run._ps_answered
    run._poll_status()
    assert run.step == 40 and run.status["step"] == 40 and run._known_step == 55
    assert run._ps_answered > answered
    # ... and the next question is already on its way.
    assert run._status_future is not None and run._status_future is not first


def test_a_failed_status_is_not_an_answer(loop, tmp_path, caplog):
    caplog.set_level("INFO", "transient_nb.training.run")
    run = driver(tmp_path)
    double = ps_double(loop, run, version=40)
    run._ps = [double]
    double.error = ConnectionError("comm closed")
    run._poll_status()
    wait_done(run._status_future)
    answered = run._ps_answered
    run._poll_status()
    assert run.step == 0 and run.status == {} and run._ps_answered == answered
    assert run._status_future is None  # asked again at the next round, not this one
    assert logged(caplog, "INFO", "PS status failed: ConnectionError('comm closed')")
    run._poll_status()
    assert run._status_future is not None


def test_an_unanswered_status_is_asked_again_after_the_call_timeout(loop, tmp_path, caplog):
    run = driver(tmp_path)
    double = ps_double(loop, run)
    run._ps = [double]
    double.frozen.set()
    run._poll_status()
    first = run._status_future
    run._poll_status()
    assert run._status_future is first  # within the call timeout: still waited for
    run._status_sent = time.monotonic() - HP.call_timeout_s - 0.05
    run._poll_status()
    assert run._status_future is not first
    assert time.monotonic() - run._status_sent < HP.call_timeout_s
    assert logged(caplog, "WARNING", "PS status: no answer within 0 s")  # 0.5 s, rounded
    double.frozen.clear()  # both calls end before the loop does
    wait_done(first)
    wait_done(run._status_future)


def test_a_status_that_cannot_be_sent_means_the_ps_host_is_gone(tmp_path, caplog):
    caplog.set_level("INFO", "transient_nb.training.run")

    class Gone:
        def status(self):
            raise RuntimeError("the actor's task erred")

    run = driver(tmp_path)
    run._poll_status()
    assert run._status_future is None and not run._ps_left  # no PS yet: nothing asked
    run._ps = [Gone()]
    run._poll_status()
    assert run._ps_left and run._ps_lost()
    assert logged(caplog, "INFO", 'PS status not sent: RuntimeError("the actor\'s task erred")')


def test_the_ps_is_lost_when_its_host_left_or_it_stays_silent(tmp_path):
    run = driver(tmp_path)
    run._ps_addresses = ["tls://ps-0:1"]
    run._client.workers = {"tls://ps-0:1": {"resources": {"ps": 1}}}
    run._ps_answered = time.monotonic()
    assert not run._ps_lost()
    assert run._client.listings == 0  # an answer this recent needs no listing
    run._ps_answered = time.monotonic() - PS_OVERDUE_S - 0.5
    assert not run._ps_lost()  # overdue, but its host is there
    assert run._client.listings == 1
    run._client.unreadable = True
    assert not run._ps_lost()  # an unreadable listing is not a missing host
    run._client.unreadable = False
    run._client.workers = {"tls://w-0:1": {"resources": {"gpu": 1}}}
    assert run._ps_lost()  # a confirmed listing without the PS host
    run._client.workers = {"tls://ps-0:1": {"resources": {"ps": 1}}}
    run._ps_answered = time.monotonic() - HP.ps_lost_after_s - 0.1
    assert run._ps_lost()  # there, but silent for too long
    run._ps_answered = time.monotonic()
    run._ps_left = True
    assert run._ps_lost()


def test_a_second_ps_host_of_its_own_shard_is_checked_too(tmp_path):
    run = driver(tmp_path)
    run._ps_addresses = ["tls://ps-0:1", "tls://ps-1:1"]
    run._client.workers = {"tls://ps-0:1": {"resources": {"ps": 1}}}
    run._ps_answered = time.monotonic() - PS_OVERDUE_S - 0.5
    assert run._ps_lost()


# -- PS hosts: placing shards, and following the hosts of an elastic run ------------------------------
def test_shards_are_placed_on_the_ps_hosts_there_are(tmp_path):
    run = driver(tmp_path)
    run._client.workers = {
        "tls://c:1": {"resources": {"ps": 1}},
        "tls://a:1": {"resources": {"ps": 1}},
        "tls://g:1": {"resources": {"gpu": 1}},
        "tls://b:1": {"resources": {"ps": 1}},
        "tls://n:1": {},  # listed without resources
    }
    t0 = time.monotonic()
    assert run._wait_for_ps_hosts(set(), want=2, timeout=5, grace=5) == ["tls://a:1", "tls://b:1"]
    assert run._wait_for_ps_hosts(set(), want=3, timeout=5, grace=5) == [
        "tls://a:1",
        "tls://b:1",
        "tls://c:1",
    ]
    assert time.monotonic() - t0 < 2  # as many as wanted: no grace waited out
    assert run._wait_for_ps_hosts({"tls://a:1"}, want=3, timeout=5, grace=0) == [
        "tls://b:1",
        "tls://c:1",
    ]
    t0 = time.monotonic()
    assert run._wait_for_ps_hosts(set(), want=4, timeout=5, grace=0.3) == [
        "tls://a:1",
        "tls://b:1",
        "tls://c:1",
    ]
    assert 0.3 <= time.monotonic() - t0 < 0.9  # the grace, looked at every 0.1 s
    run._client.workers = {"tls://g:1": {"resources": {"gpu": 1}}}
    with pytest.raises(TimeoutError, match="No PS host joined within 0 s"):
        run._wait_for_ps_hosts(set(), want=1, timeout=0.3, grace=0)
    run._stop.set()
    with pytest.raises(RuntimeError, match=r"^stopped while waiting for a PS host$"):
        run._wait_for_ps_hosts(set(), want=1, timeout=30, grace=0)


def test_the_ps_hosts_of_a_cluster_that_does_not_say_are_one(tmp_path):
    run = driver(tmp_path)
    del run.cluster.ps_hosts  # a cluster of another kind
    assert run._ps_host_count() == 1
    run.cluster.ps_hosts = None
    assert run._ps_host_count() == 1
    run.cluster.ps_hosts = 3
    assert run._ps_host_count() == 3


def test_an_elastic_run_wants_a_shard_per_ps_host_once_every_host_joined(tmp_path):
    ps = {"resources": {"ps": 1}}
    pinned = driver(tmp_path, ps_hosts=2)
    pinned._client.workers = {"tls://a:1": ps, "tls://b:1": ps}
    assert not pinned._wants_more_shards()  # shards= given: they stay
    run = driver(tmp_path, ps_hosts=2, elastic_shards=True)
    # A worker whose listing has no resources at all is no PS host.
    run._client.workers = {"tls://a:1": ps, "tls://g:1": {"resources": {"gpu": 1}}, "tls://n:1": {}}
    assert not run._wants_more_shards()  # the second host has not joined yet
    run._client.workers["tls://b:1"] = ps
    assert run._wants_more_shards()
    run.shards = 2
    assert not run._wants_more_shards()
    one = driver(tmp_path, ps_hosts=1, elastic_shards=True)
    one._client.workers = {"tls://a:1": ps}
    assert not one._wants_more_shards()
    assert one._client.listings == 0  # nothing to split: the listing is not even read


class Recreating(TrainingRun):
    """A driver whose new PS generations are recorded rather than created on a cluster."""

    def _create_ps(self, states, step, counters, hosts=None):
        self.created = {"states": states, "step": step, "counters": counters, "hosts": hosts}
        if hosts:  # where the PS runs now (the real one reads the cluster's record)
            self._ps_zone = "us-east1-c"


def recreating(tmp_path, **kwargs: Any) -> Recreating:
    run = Recreating(Cluster(str(tmp_path)), "resnet8", "digits", HP, **kwargs)
    run._client = Client()
    return run


def test_a_split_takes_the_live_ps_state_into_more_shards(loop, tmp_path):
    run = recreating(tmp_path, elastic_shards=True)
    w = np.arange(10, dtype=np.float32)
    double = ps_double(loop, run, version=120, weights=w, bn=np.array([7.0], dtype=np.float32))
    run._ps, run._bounds, run._known_step, run.step = [double], [(0, 10)], 125, 125
    run._inflight = {"step": 100}
    run._generation = 3  # after earlier recoveries
    run._ps_addresses = ["tls://a:1", "tls://b:1", "tls://a:1"]
    run._reshard(2)
    assert run._inflight is None  # a checkpoint of the old generation is never published
    assert run.shards == 2 and run._bounds == [(0, 5), (5, 10)] and run._generation == 4
    states = run.created["states"]
    assert [list(s["weights"]) for s in states] == [list(w[:5]), list(w[5:])]
    assert list(states[0]["bn"]) == [7.0] and states[1]["bn"] is None
    assert run.created["step"] == 120 and run.created["counters"]["accepted"] == {"w-0": 120}
    (split,) = posted(run, "ps-resharded")
    assert (split["shards_from"], split["shards"], split["step"]) == (1, 2, 120)
    assert split["steps_lost"] == 5 and split["generation"] == 4
    assert 0 <= split["seconds"] < 30 and split["addresses"] == ["tls://a:1", "tls://b:1"]
    assert run.step == run._known_step == 120
    run._reshard(3)  # nothing pushed since: nothing lost
    assert posted(run, "ps-resharded")[-1]["steps_lost"] == 0


def test_a_split_waits_while_the_ps_does_not_answer(loop, tmp_path):
    run = recreating(tmp_path, elastic_shards=True)
    double = ps_double(loop, run, version=120)
    double.error = ConnectionError("gone")
    run._ps, run._bounds = [double], [(0, 12)]
    run._reshard(2)
    assert run.shards == 1 and run._generation == 0 and not hasattr(run, "created")
    assert posted(run, "ps-resharded") == []
    run._ps_left = True
    run._reshard(2)  # a PS known to be gone is not even asked
    assert double.calls == 1


def test_a_move_takes_the_live_ps_state_to_the_new_hosts(loop, tmp_path):
    run = recreating(tmp_path)
    w = np.arange(10, dtype=np.float32)
    double = ps_double(loop, run, version=200, weights=w)
    run._ps, run._bounds, run._known_step, run.step = [double], [(0, 10)], 204, 204
    run._inflight = {"step": 200}
    run._ps_zone, run._ps_addresses = "us-central1-a", ["tls://old:1"]
    run._move_ps(["tls://new:1"])
    assert run._inflight is None and run.shards == 1 and run._bounds == [(0, 10)]
    assert run.created["hosts"] == ["tls://new:1"] and run.created["step"] == 200
    assert list(run.created["states"][0]["weights"]) == list(w)
    (moved,) = posted(run, "ps-moved")
    assert (moved["zone_from"], moved["zone"]) == ("us-central1-a", "us-east1-c")
    assert moved["step"] == 200 and moved["steps_lost"] == 4 and moved["generation"] == 1
    assert run.step == run._known_step == 200
    double.error = ConnectionError("gone")  # a PS that does not answer is not moved
    run._move_ps(["tls://new:1"])
    assert len(posted(run, "ps-moved")) == 1 and run._generation == 1


# -- recovery -----------------------------------------------------------------------------------------
def test_a_ps_whose_handle_broke_but_answers_moves_its_own_state(loop, tmp_path):
    run = recreating(tmp_path)
    double = ps_double(loop, run, version=250)
    run._ps, run._ps_addresses, run._known_step = [double], ["tls://ps-0:1"], 260
    run._generation = 2
    run._recover()
    lost, recovered = posted(run)  # in this order, nothing else
    assert lost["kind"] == "ps-lost" and recovered["kind"] == "ps-recovered"
    assert lost["step"] == 260 and lost["address"] == "tls://ps-0:1"
    assert lost["addresses"] == ["tls://ps-0:1"]
    assert recovered["source"] == "ps" and recovered["step"] == 250
    assert recovered["steps_lost"] == 10 and recovered["generation"] == run._generation == 3
    assert 0 <= recovered["seconds"] < 30
    assert list(run.created["states"][0]["weights"]) == list(range(12))
    assert run.created["step"] == 250 and run.created["counters"]["gaps"] == 1
    assert run.step == run._known_step == 250 and run._next_checkpoint == 300
    run._recover()  # again, nothing pushed since: nothing lost
    assert posted(run, "ps-recovered")[-1]["steps_lost"] == 0


def write_checkpoint(
    url: str, step: int, shards: list[np.ndarray], counters: dict, run: str
) -> None:
    """A complete checkpoint of run ``run`` (its manifest names it, as the driver's do)."""
    files = [
        checkpoint.write_shard(
            url,
            step,
            i,
            {
                "weights": w,
                "momentum": w * 10,
                "decay_mask": np.ones(len(w), dtype=np.uint8),
                "bn": np.array([3.0], dtype=np.float32) if i == 0 else None,
            },
        )
        for i, w in enumerate(shards)
    ]
    checkpoint.write_manifest(url, step, {"counters": counters, "run": run}, files)


def test_a_lost_ps_comes_back_from_the_newest_checkpoint_cut_for_the_run(tmp_path):
    run = recreating(tmp_path, shards=2)
    run._bounds = shard_bounds(8, 2)
    run._ps_left, run._ps_addresses, run._known_step = True, ["tls://a:1", "tls://a:1"], 230
    w = np.arange(8, dtype=np.float32)
    write_checkpoint(run.checkpoint_url, 100, [w * 0], {"gaps": 0}, run.id)
    write_checkpoint(run.checkpoint_url, 200, [w], {"gaps": 4}, run.id)  # one shard: before a split
    run._recover()
    lost, recovered = posted(run)
    assert lost["addresses"] == ["tls://a:1"]  # one host, said once
    assert recovered["source"] == "checkpoint" and recovered["step"] == 200
    assert recovered["steps_lost"] == 30
    states = run.created["states"]
    assert [list(s["weights"]) for s in states] == [list(w[:4]), list(w[4:])]
    assert [list(s["momentum"]) for s in states] == [list(w[:4] * 10), list(w[4:] * 10)]
    assert list(states[0]["bn"]) == [3.0] and states[1]["bn"] is None
    assert run.created["counters"] == {"gaps": 4} and run.created["step"] == 200
    assert run.step == 200 and run._next_checkpoint == 300


def test_a_lost_ps_without_a_checkpoint_ends_the_run_and_says_why(tmp_path):
    run = recreating(tmp_path)
    run._ps_left = True
    with pytest.raises(
        RuntimeError, match=r"no complete checkpoint under .*: the run cannot go on"
    ):
        run._recover()
    assert [e["kind"] for e in posted(run)] == ["ps-lost"]


def test_a_resumed_run_takes_the_checkpoint_of_the_earlier_one(tmp_path):
    url = str(tmp_path / "earlier")
    w = np.arange(8, dtype=np.float32)
    write_checkpoint(url, 300, [w[:4], w[4:]], {"gaps": 2}, "run-old")
    point = ResumePoint("run-old", url)
    run = recreating(tmp_path, shards=1, resume=point)
    assert run.id == "run-old" and run.checkpoint_url == url
    states, step, counters = run._resume_states(8)
    assert step == 300 and counters == {"gaps": 2} and len(states) == 1
    assert list(states[0]["weights"]) == list(w) and list(states[0]["bn"]) == [3.0]
    assert list(states[0]["momentum"]) == list(w * 10)
    two = recreating(tmp_path, shards=2, resume=point)
    halves, _, _ = two._resume_states(8)
    assert [list(h["momentum"]) for h in halves] == [list(w[:4] * 10), list(w[4:] * 10)]
    assert halves[1]["bn"] is None
    with pytest.raises(RuntimeError, match="holds 8 parameters; resnet8 has 9: resume with"):
        run._resume_states(9)
    empty = recreating(tmp_path, resume=ResumePoint("run-x", str(tmp_path / "none")))
    with pytest.raises(RuntimeError, match=r"No complete checkpoint under .*none to resume from"):
        empty._resume_states(8)


def test_a_lost_ps_never_comes_back_with_another_runs_weights(tmp_path):
    """Issue 30: the newest checkpoint in the run's folder is another run's (a shared URL, a
    folder copied by mistake): the recovery refuses it, says whose it is, and creates no PS."""
    run = recreating(tmp_path)
    run._bounds = shard_bounds(8, 1)
    run._ps_left, run._ps_addresses, run._known_step = True, ["tls://a:1"], 230
    w = np.arange(8, dtype=np.float32)
    write_checkpoint(run.checkpoint_url, 100, [w], {}, run.id)
    write_checkpoint(run.checkpoint_url, 200, [w * 7], {}, "run-0ace0ace")
    with pytest.raises(checkpoint.NotOwned) as info:
        run._recover()
    assert str(info.value).startswith(
        f"The checkpoint {checkpoint.step_dir(run.checkpoint_url, 200)} is run 'run-0ace0ace''s, "
        f"not run {run.id!r}'s: refused, its weights are not loaded."
    )
    assert not hasattr(run, "created")  # no PS generation of the other run's weights
    assert [e["kind"] for e in posted(run)] == ["ps-lost"]


def test_a_resume_refuses_a_checkpoint_of_another_run_model_or_layout(tmp_path):
    url = str(tmp_path / "earlier")
    w = np.arange(8, dtype=np.float32)
    write_checkpoint(url, 300, [w], {}, "run-0ace0ace")
    run = recreating(tmp_path, resume=ResumePoint("run-0123abcd", url))
    with pytest.raises(
        checkpoint.NotOwned, match="is run 'run-0ace0ace''s, not run 'run-0123abcd''s"
    ):
        run._resume_states(8)
    # Its own run, but another model's weights, or another layout of the model.
    files = [checkpoint.write_shard(url, 400, 0, {"weights": w})]
    checkpoint.write_manifest(url, 400, {"run": "run-0123abcd", "model": "resnet20"}, files)
    with pytest.raises(
        checkpoint.NotOwned, match="holds model 'resnet20''s weights, not 'resnet8''s"
    ):
        run._resume_states(8)
    layout = [["conv.weight", [2, 4], "float32", "w", 0]]
    files = [checkpoint.write_shard(url, 500, 0, {"weights": w})]
    checkpoint.write_manifest(
        url, 500, {"run": "run-0123abcd", "model": "resnet8", "layout": layout}, files
    )
    run._layout = [["conv.weight", [4, 2], "float32", "w", 0]]
    with pytest.raises(checkpoint.NotOwned, match=r"another layout of the model \(conv.weight is"):
        run._resume_states(8)
    run._layout = [("conv.weight", (2, 4), "float32", "w", 0)]  # the same, before JSON
    assert run._resume_states(8)[1] == 500


# -- checkpoints: every shard at one agreed step, the manifest last -----------------------------------
def test_a_checkpoint_aligns_the_shards_and_publishes_the_manifest_last(loop, tmp_path):
    run = driver(tmp_path, shards=2)
    shards = [
        ps_double(loop, run, 0, 2, version=250, weights=np.zeros(4, dtype=np.float32)),
        ps_double(loop, run, 1, 2, version=249, weights=np.ones(4, dtype=np.float32)),
    ]
    run._ps = shards
    run._start_checkpoint()
    job = run._inflight
    assert job is not None and job["step"] == 250 and shards[1].ps.version == 250  # aligned
    assert checkpoint.latest_step(run.checkpoint_url) is None  # no manifest before every file
    run._poll_checkpoint(block=True)
    assert run._inflight is None and run.checkpoint_step == 250 and run._next_checkpoint == 300
    (event,) = posted(run, "checkpoint")
    assert event["step"] == 250 and event["path"].endswith("manifest.json")
    assert 0 <= event["seconds"] < 30
    ck = checkpoint.load_latest(run.checkpoint_url)
    assert ck.step == 250 and [list(s["weights"]) for s in ck.shards] == [[0] * 4, [1] * 4]
    manifest = json.load(
        open(os.path.join(checkpoint.step_dir(run.checkpoint_url, 250), "manifest.json"))
    )
    assert manifest["run"] == run.id and manifest["shards"] == 2
    assert (manifest["model"], manifest["data"], manifest["generation"]) == ("resnet8", "digits", 0)
    assert HParams.from_dict(manifest["hparams"]) == HP and abs(manifest["time"] - time.time()) < 30
    assert manifest["counters"] == {
        "accepted": {"w-0": 250},
        "last_local": {},
        "gaps": 1,
        "lost_in_flight": 0,
    }
    assert run._checkpoint_settled == run._checkpoint_attempts == 1


def test_publishing_a_checkpoint_keeps_the_newest_ones_only(loop, tmp_path):
    run = driver(tmp_path)
    w = np.arange(12, dtype=np.float32)
    for step in (100, 200, 300):
        write_checkpoint(run.checkpoint_url, step, [w], {}, run.id)
    run._ps = [ps_double(loop, run, version=400)]
    run.checkpoint_step = 300
    run._checkpoint_now()
    assert checkpoint.steps(run.checkpoint_url) == [400, 300][:CHECKPOINTS_KEPT]


def test_old_checkpoints_that_cannot_be_deleted_are_left_and_said(loop, tmp_path, caplog):
    """Pruning is housekeeping: storage that refuses deletes keeps the checkpoint published."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class Undeletable(MemoryFileSystem):
        protocol = "undeletable"

        def rm(self, path, recursive=False, maxdepth=None):
            raise PermissionError("retention policy")

    fsspec.register_implementation("undeletable", Undeletable, clobber=True)
    caplog.set_level("INFO", "transient_nb.training.run")
    url = f"undeletable://runs-{tmp_path.name}"
    run = driver(tmp_path, checkpoint_url=url)
    url = run.checkpoint_url  # the run's own folder under it
    w = np.arange(12, dtype=np.float32)
    for step in (100, 200, 300):
        write_checkpoint(url, step, [w], {}, run.id)
    run._ps = [ps_double(loop, run, version=400)]
    run.checkpoint_step = 300
    run._checkpoint_now()
    assert run.checkpoint_step == 400 and checkpoint.steps(url) == [400, 300, 200, 100]
    assert logged(
        caplog, "INFO", "Could not prune old checkpoints: PermissionError('retention policy')"
    )


def test_a_final_checkpoint_that_fails_does_not_lose_the_end_of_the_run(loop, tmp_path, caplog):
    run = driver(tmp_path)
    run._ps = [resnet8_ps(loop, run, version=50)]

    class Refusing(Client):
        def log_event(self, topic, event):
            if event["kind"] == "checkpoint":
                raise OSError("event log full")
            super().log_event(topic, event)

    run._client = Refusing()
    run._finish("steps")
    assert [e["kind"] for e in posted(run)] == ["eval", "train-finished"]
    assert logged(caplog, "WARNING", "Final checkpoint failed: OSError('event log full')")


def test_a_frozen_ps_holds_the_driver_only_for_its_call_timeout(loop, tmp_path):
    """Evaluation, reading the old PS's state and aligning a second shard each give up after
    the call timeout (0.5 s here) on a PS that never answers."""
    run = driver(tmp_path, shards=2)
    first = resnet8_ps(loop, run, version=9)
    second = ps_double(loop, run, 1, 2, version=9)
    run._ps = [first, second]
    second.frozen.set()
    t0 = time.monotonic()
    run._start_checkpoint()
    assert run._inflight is None
    assert run._old_ps_state() is None
    first.frozen.set()
    assert run._evaluate() is None
    assert time.monotonic() - t0 < 10
    first.frozen.clear()
    second.frozen.clear()


def test_nothing_new_is_never_published_over_a_newer_checkpoint(loop, tmp_path):
    run = driver(tmp_path)
    run._ps = [ps_double(loop, run, version=180)]
    run.checkpoint_step = 200  # written by an earlier generation, after a recovery went back
    run._start_checkpoint()
    assert run._inflight is None and run.checkpoint_step == 200
    assert run._next_checkpoint == 200  # 180 // 100 + 1 hundreds
    assert run._checkpoint_settled == 1 and posted(run) == []
    same = driver(tmp_path)
    same._ps = [ps_double(loop, same, version=300)]
    same.checkpoint_step = 300
    same._start_checkpoint()
    assert same._inflight is None and same._next_checkpoint == 400 and posted(same) == []


def test_an_explicit_checkpoint_publishes_the_one_being_written_first(loop, tmp_path):
    """_checkpoint_now (the end of a run, run.checkpoint()): the automatic checkpoint being
    written is waited for and published, then a new one of the PS as it is now."""
    import threading

    run = driver(tmp_path)
    double = ps_double(loop, run, version=100)
    run._ps = [double]
    run._start_checkpoint()
    assert run._inflight is not None and run._inflight["step"] == 100
    double.ps.version = 150  # pushes that arrived since
    double.frozen.set()  # the shard file being written is slow: wait for it, do not drop it
    threading.Timer(0.3, double.frozen.clear).start()
    run._checkpoint_now()
    assert [e["step"] for e in posted(run, "checkpoint")] == [100, 150]
    assert run.checkpoint_step == 150 and run._inflight is None


def test_a_frozen_ps_delays_a_checkpoint_by_the_call_timeout_only(loop, tmp_path, caplog):
    caplog.set_level("INFO", "transient_nb.training.run")
    run = driver(tmp_path)
    double = ps_double(loop, run, version=100)
    run._ps = [double]
    run._checkpoint_attempts = 5
    double.frozen.set()
    t0 = time.monotonic()
    run._start_checkpoint()
    assert time.monotonic() - t0 < 5 and run._inflight is None
    assert run._checkpoint_attempts == 6 and run._checkpoint_settled == 0
    assert logged(caplog, "INFO", "Checkpoint snapshot failed: TimeoutError()")
    double.frozen.clear()


def test_a_snapshot_that_fails_starts_no_checkpoint(loop, tmp_path):
    run = driver(tmp_path, shards=2)
    first, second = ps_double(loop, run, 0, 2, version=10), ps_double(loop, run, 1, 2, version=10)
    second.error = ConnectionError("comm closed")
    run._ps = [first, second]
    run._start_checkpoint()
    assert run._inflight is None and run._checkpoint_attempts == 1
    assert run._checkpoint_settled == 0 and run.checkpoint_step == -1


def test_a_checkpoint_write_that_fails_or_hangs_is_given_up(tmp_path, caplog):
    run = driver(tmp_path)
    run._inflight = {
        "attempt": 1,
        "step": 100,
        "counters": {},
        "futures": [Done(error=OSError("disk full"))],
        "t0": time.monotonic(),
    }
    run._poll_checkpoint()
    assert run._inflight is None and run.checkpoint_step == -1 and posted(run) == []
    assert logged(caplog, "WARNING", "Checkpoint of step 100 failed: OSError('disk full')")
    hanging = {
        "attempt": 2,
        "step": 100,
        "counters": {},
        "futures": [Pending()],
        "t0": time.monotonic(),
    }
    run._inflight = hanging
    run._poll_checkpoint()
    assert run._inflight is hanging  # a slow bucket is not a hang
    hanging["t0"] = time.monotonic() - 120.5  # the bound: 120 s, or 4 call timeouts if longer
    run._poll_checkpoint()
    assert run._inflight is None and run._checkpoint_settled == 0 and posted(run) == []
    assert logged(caplog, "WARNING", "Checkpoint of step 100 not written within 120 s")
    slow = driver(tmp_path, hp=HP.with_(call_timeout_s=40.0))  # bound: 160 s
    for waited, kept in ((150, True), (170, False)):
        job = {"attempt": 1, "step": 5, "counters": {}, "futures": [Pending()]}
        slow._inflight = {**job, "t0": time.monotonic() - waited}
        slow._poll_checkpoint()
        assert (slow._inflight is not None) == kept, waited


# -- trainers: started on every GPU worker, watched, restarted with backoff, given up -----------------
def test_a_trainer_is_asked_for_on_its_worker_and_run_once_created(tmp_path):
    run = driver(tmp_path, seed=3, device="cpu")
    run._bounds = [(0, 12)]
    run._want_trainer("w-0", "tls://w0:1")
    run._want_trainer("w-0", "tls://elsewhere:1")  # already has one
    run._given_up["w-9"] = "OSError: x"
    run._want_trainer("w-9", "tls://w9:1")  # given up: stays idle
    assert list(run._slots) == ["w-0"] and run._slots["w-0"].address == "tls://w0:1"
    creating = Pending()
    run._client.reply = creating
    run._submit_trainers()
    ((fn, args, kwargs),) = run._client.submitted
    assert fn is Trainer and args == (
        run.id,
        "resnet8",
        "digits",
        HP.to_dict(),
        run.variable,
        [(0, 12)],
    )
    assert kwargs["workers"] == ["tls://w0:1"] and kwargs["allow_other_workers"] is False
    assert kwargs["actor"] is True and kwargs["pure"] is False
    assert kwargs["seed"] == 3 and kwargs["device"] == "cpu"
    assert kwargs["key"] == f"trainer-{run.id}-w-0-0"
    assert kwargs["ps_zone"] is None  # no PS yet
    run._submit_trainers()  # still being created: not asked twice
    assert len(run._client.submitted) == 1 and not run._slots["w-0"].started

    class Actor:
        def run(self):
            return Done({"state": "finished"})

    created = Done(Actor())
    run._slots["w-0"].future = created
    run._submit_trainers()
    slot = run._slots["w-0"]
    assert (
        slot.started
        and isinstance(slot.actor, Actor)
        and slot.future.value == {"state": "finished"}
    )
    assert created in run._released


def test_a_trainer_that_could_not_be_created_is_retried_later(tmp_path, caplog):
    caplog.set_level("INFO", "transient_nb.training.run")
    run = driver(tmp_path)
    run._want_trainer("w-0", "tls://w0:1")
    run._want_trainer("w-1", "tls://w1:1")
    run._slots["w-0"].future = Done(error=RuntimeError("worker left"))
    run._slots["w-1"].future = Done(SimpleNamespace(run=lambda: Pending()))
    run._submit_trainers()
    slot = run._slots["w-0"]
    assert not slot.started and slot.future is None and slot.attempt == 1
    assert run._slots["w-1"].started  # the one after it is still looked at
    assert [e["kind"] for e in posted(run)] == ["trainer-failed", "trainer-restarted"]
    failed = posted(run, "trainer-failed")[0]
    assert failed["worker"] == "w-0" and failed["error"] == "RuntimeError: worker left"
    assert logged(caplog, "INFO", "Trainer on w-0 did not start: RuntimeError('worker left')")
    run._submit_trainers()  # not before its backoff
    assert run._client.submitted == []
    slot.not_before = time.monotonic() - 0.01
    run._submit_trainers()
    assert run._client.submitted[0][2]["key"] == f"trainer-{run.id}-w-0-1"


def test_failed_trainers_restart_with_doubling_backoff_then_are_given_up(tmp_path, caplog):
    run = driver(tmp_path)
    slot = run._slots.setdefault("w-0", _TrainerSlot("tls://w0:1", actor=object(), started=True))
    first = Done(error=RuntimeError("x"))
    slot.future = first
    t0 = time.monotonic()
    run._trainer_failed("w-0", slot, RuntimeError("CUDA error: out of memory\nmore lines"))
    assert first in run._released
    assert slot.actor is None and slot.future is None and not slot.started
    assert t0 + 1.0 <= slot.not_before <= time.monotonic() + 1.0
    run._trainer_failed("w-0", slot, RuntimeError("again"))
    assert slot.not_before >= t0 + 2.0
    run._trainer_failed("w-0", slot, ValueError(""))
    failed = posted(run, "trainer-failed")
    assert [(e["attempt"], e["gave_up"]) for e in failed] == [(1, False), (2, False), (3, True)]
    assert failed[0]["error"] == "RuntimeError: CUDA error: out of memory"
    assert failed[2]["error"] == "ValueError: " and failed[0]["worker"] == "w-0"
    restarted = posted(run, "trainer-restarted")
    assert [(e["attempt"], e["delay_s"]) for e in restarted] == [(1, 1.0), (2, 2.0)]
    assert {e["worker"] for e in restarted} == {"w-0"}
    assert logged(
        caplog,
        "WARNING",
        "Trainer on w-0 failed (attempt 1): RuntimeError: CUDA error: out of memory",
    )
    assert logged(
        caplog,
        "WARNING",
        "Worker w-0 gave up after 3 failed trainers; it stays idle (scale it away): ValueError: ",
    )
    assert "w-0" not in run._slots and run._given_up == {"w-0": "ValueError: "}


def test_the_restart_backoff_is_capped_and_the_error_text_cut(tmp_path):
    run = driver(tmp_path, hp=HP.with_(trainer_restarts=20))
    slot = _TrainerSlot("tls://w0:1", attempt=6)
    run._slots["w-0"] = slot
    run._trainer_failed("w-0", slot, OSError("y" * 400))
    (failed,) = posted(run, "trainer-failed")
    assert failed["error"] == ("OSError: " + "y" * 400)[:300]
    (restarted,) = posted(run, "trainer-restarted")
    assert restarted["delay_s"] == TRAINER_BACKOFF_MAX_S == 30.0  # not 2**6 = 64


def test_ended_trainers_are_told_apart(tmp_path):
    run = driver(tmp_path)
    ends = {
        "raised": Done(error=ValueError("boom")),  # first: the ones after it are still looked at
        "drained": Done({"state": "drained"}),
        "finished": Done({"state": "finished"}),
        "early": Done({"state": "stopped"}),
        "running": Pending(),
    }
    run._slots["creating"] = _TrainerSlot("tls://c:1", future=Done(object()))
    for name, future in ends.items():
        run._slots[name] = _TrainerSlot(f"tls://{name}:1", future=future, started=True)
    run._watch_trainers()
    # A drained worker is leaving (its replacement gets a trainer); a finished one is done.
    assert sorted(run._slots) == ["creating", "early", "finished", "raised", "running"]
    failed = {e["worker"]: e["error"] for e in posted(run, "trainer-failed")}
    assert failed == {
        "early": "RuntimeError: trainer ended early (stopped)",
        "raised": "ValueError: boom",
    }
    stopping = driver(tmp_path)
    stopping._slots["w"] = _TrainerSlot(
        "tls://w:1", future=Done({"state": "stopped"}), started=True
    )
    stopping._stop.set()
    stopping._watch_trainers()
    assert posted(stopping) == []  # stopped because the run stops


def test_a_trainer_that_finished_against_an_older_ps_is_asked_for_again(tmp_path):
    """The PS was moved (generation 1) from a state read at step 637, after which the old PS
    served the run's 640 steps and the trainer finished there: the run is 3 steps short with
    no trainer left. It gets a new one (a new key), not a failure; a trainer that finished
    against the PS of now, a run that has its steps, or one stopping, does not."""
    run = driver(tmp_path, hp=HP.with_(steps=640))
    run._generation, run.step = 1, 637
    old = Done({"state": "finished", "generation": 0})
    slot = _TrainerSlot("tls://w0:1", future=old, started=True)
    run._slots["w-0"] = slot
    run._watch_trainers()
    assert (slot.future, slot.actor, slot.started, slot.reruns, slot.attempt) == (
        None,
        None,
        False,
        1,
        0,
    )
    assert old in run._released and posted(run, "trainer-failed") == []
    (restarted,) = posted(run, "trainer-restarted")
    assert (restarted["worker"], restarted["attempt"], restarted["delay_s"]) == ("w-0", 0, 0.0)
    run._submit_trainers()
    (_, _, kwargs) = run._client.submitted[-1]
    assert kwargs["key"] == f"trainer-{run.id}-w-0-0-1" and slot.generation == 1
    # Not again for the same: the new trainer finishing against generation 1 is done.
    slot.future, slot.started = Done({"state": "finished", "generation": 1}), True
    run._watch_trainers()
    assert slot.reruns == 1 and len(posted(run, "trainer-restarted")) == 1
    # Its counters decide, not when it was asked for: one asked for at generation 0 that
    # followed the PS to generation 1 and finished there is done too.
    slot.generation = 0
    slot.future, slot.started = Done({"state": "finished", "generation": 1}), True
    run._watch_trainers()
    assert slot.reruns == 1 and slot.started
    # Another regeneration short of the steps: a second new trainer, its own key.
    run._generation = 2
    run._watch_trainers()
    assert slot.reruns == 2 and not slot.started
    run._submit_trainers()
    assert run._client.submitted[-1][2]["key"] == f"trainer-{run.id}-w-0-0-2"
    for step, stop in ((640, False), (637, True)):
        other = driver(tmp_path, hp=HP.with_(steps=640))
        other._generation, other.step = 1, step
        if stop:
            other._stop.set()
        done = _TrainerSlot("tls://w0:1", future=Done({"state": "finished", "generation": 0}))
        done.started = True
        other._slots["w-0"] = done
        other._watch_trainers()
        assert done.reruns == 0 and done.started and posted(other) == []


def test_trainers_are_stopped_and_their_counters_gathered(tmp_path, caplog):
    import threading

    caplog.set_level("INFO", "transient_nb.training.run")
    run = driver(tmp_path)

    class Actor:
        stopped = 0

        def stop(self):
            Actor.stopped += 1

    class Stopping(Done):
        """A trainer's run() that returns a moment after it is told to stop."""

        def __init__(self) -> None:
            super().__init__({"accepted": 7})
            self.event = threading.Event()
            threading.Timer(0.3, self.event.set).start()

        def done(self) -> bool:
            return self.event.is_set()

    run._slots = {
        "c": _TrainerSlot("tls://c:1", actor=None, future=Pending()),  # being created
        "d": _TrainerSlot("tls://d:1", actor=Actor(), future=Pending()),  # created, not run
        "a": _TrainerSlot("tls://a:1", actor=Actor(), started=True, future=Done({"accepted": 5})),
        "b": _TrainerSlot(
            "tls://b:1", actor=Actor(), started=True, future=Done(error=OSError("x"))
        ),
        "e": _TrainerSlot("tls://e:1", actor=Actor(), started=True, future=Stopping()),
    }
    t0 = time.monotonic()
    assert run._stop_trainers() == [{"accepted": 5}, {"accepted": 7}]
    assert time.monotonic() - t0 < 5  # each waited for as long as it takes, not the bound
    assert Actor.stopped == 3
    assert logged(caplog, "INFO", "Trainer on b ended with OSError('x')")


# -- what the cluster's events tell the driver --------------------------------------------------------
def test_events_bring_trainers_to_new_workers_and_note_a_ps_host_leaving(tmp_path):
    run = driver(tmp_path)
    run._ps_addresses = ["tls://ps:1"]
    for event in (
        {"kind": "metrics", "run": run.id},  # no step: it says nothing of the PS's
    ):
        run._events.put(event)
    run._handle_events()
    assert run._known_step == 0
    for event in (
        {"kind": "metrics", "run": run.id, "step": 40},
        {"kind": "metrics", "run": "run-other", "step": 90},
        {"kind": "metrics", "run": run.id, "step": 10},
        {"kind": "joined", "role": "worker", "worker": "w-3", "address": "tls://w3:1"},
        {"kind": "joined", "role": "ps", "worker": "ps-1", "address": "tls://ps1:1"},
        {"kind": "left", "role": "worker", "worker": "w-8", "address": "tls://w8:1"},
    ):
        run._events.put(event)
    run._handle_events()
    assert run._known_step == 40
    assert list(run._slots) == ["w-3"] and run._slots["w-3"].address == "tls://w3:1"
    assert not run._ps_left
    run._events.put({"kind": "left", "role": "ps", "worker": "ps-0", "address": "tls://ps:1"})
    run._handle_events()
    assert run._ps_left
    with pytest.raises(queue.Empty):
        run._events.get_nowait()


def test_a_preempted_worker_asks_the_ps_whether_it_died_mid_step(loop, tmp_path):
    run = driver(tmp_path, shards=2)
    shards = [ps_double(loop, run, 0, 2), ps_double(loop, run, 1, 2)]
    run._ps = shards
    for double in shards:  # w-0 holds the weights and computes
        double.ps.registered.add("w-0")
        double.ps.computing["w-0"] = True
    running = Pending()
    run._slots["w-0"] = _TrainerSlot("tls://w0:1", started=True, future=running)
    run._slots["w-1"] = _TrainerSlot("tls://w1:1", future=Pending())  # never started
    run._events.put({"kind": "preempted", "role": "worker", "worker": "w-0"})
    run._events.put({"kind": "left", "role": "worker", "worker": "w-1"})
    run._handle_events()
    assert run._slots == {} and running in run._released
    assert [name for name, _, _ in run._unregistering] == ["w-0"]  # w-1 never trained
    for future in run._unregistering[0][1]:
        wait_done(future)
    run.step = 77
    run._poll_unregistering()
    assert run.lost_in_flight == 1 and run._unregistering == []
    (lost,) = posted(run, "gradient-lost")
    assert lost["worker"] == "w-0" and lost["step"] == 77
    assert [d.ps.lost_in_flight for d in shards] == [1, 1]


def test_a_preemption_with_the_ps_gone_too_counts_nothing(tmp_path, caplog):
    caplog.set_level("INFO", "transient_nb.training.run")

    class Gone:
        def unregister(self, name, drained):
            raise RuntimeError("actor gone")

    run = driver(tmp_path)
    run._ps = [Gone()]
    run._slots["w-0"] = _TrainerSlot("tls://w0:1", started=True, future=Pending())
    run._events.put({"kind": "preempted", "role": "worker", "worker": "w-0"})
    run._events.put({"kind": "joined", "role": "worker", "worker": "w-5", "address": "tls://w5"})
    run._handle_events()
    assert run._slots.keys() == {"w-5"} and run._unregistering == []  # and the next event read
    assert logged(caplog, "INFO", "Could not unregister w-0: RuntimeError('actor gone')")


def test_unregistering_counts_a_gradient_only_when_the_ps_says_so(tmp_path):
    run = driver(tmp_path)
    run.lost_in_flight = 2  # counted before
    now = time.monotonic()
    run._unregistering = [
        ("waiting", [Pending()], now),  # first: the ones after it are still looked at
        ("lost", [Done(True)], now),
        ("fine", [Done(False)], now),
        ("erred", [Done(error=OSError("x"))], now),
        ("silent", [Pending()], now - HP.call_timeout_s - 0.1),
    ]
    run._poll_unregistering()
    assert run.lost_in_flight == 3
    assert [e["worker"] for e in posted(run, "gradient-lost")] == ["lost"]
    assert [name for name, _, _ in run._unregistering] == ["waiting"]


# -- evaluation and the end ---------------------------------------------------------------------------
def resnet8_ps(loop, run: TrainingRun, version: int) -> PSDouble:
    import torch

    torch.manual_seed(0)  # the same weights every time
    model = build_model("resnet8", num_classes=10)
    params, buffers = flat_layout(model)
    return ps_double(loop, run, version=version, weights=get_flat(params), bn=get_flat(buffers))


def test_evaluation_reads_the_ps_weights_on_the_run_test_images(loop, tmp_path, caplog):
    from transient_nb.training.data import load_dataset

    caplog.set_level("INFO", "transient_nb.training.run")
    run = driver(tmp_path)
    run._ps = [resnet8_ps(loop, run, version=300)]
    accuracy = run._evaluate()
    assert accuracy is not None and 0 <= accuracy <= 1 and run.accuracy == accuracy
    (event,) = posted(run, "eval")
    assert event["step"] == 300 and event["accuracy"] == accuracy and event["test_loss"] > 0
    test = load_dataset("digits", train=False)
    # The test set's first eval_images (held by the workload once read).
    assert list(run.workload._cache[f"test-{HP.eval_images}"][1]) == list(
        test.labels[: HP.eval_images]
    )
    run._ps[0].error = ConnectionError("gone")
    assert run._evaluate() is None and len(posted(run, "eval")) == 1
    assert logged(caplog, "INFO", "Evaluation skipped: ConnectionError('gone')")
    every = driver(tmp_path, hp=HP.with_(eval_images=None))
    every._ps = [resnet8_ps(loop, every, version=1)]
    every._evaluate()
    assert len(every.workload._cache["test-None"][1]) == len(test)


def test_evaluation_uses_the_ps_batch_norm_statistics(loop, tmp_path):
    """Shard 0's statistics go into the model evaluated; a PS without any, the model's own."""
    losses = []
    for scale in (1.0, 100.0, None):
        run = driver(tmp_path)
        double = resnet8_ps(loop, run, version=1)
        if scale is None:
            double.ps.bn = None
        else:
            double.ps.bn = double.ps.bn * scale  # every running mean and variance scaled
        run._ps = [double]
        assert run._evaluate() is not None
        losses.append(posted(run, "eval")[0]["test_loss"])
    assert losses[0] != losses[1] and losses[2] == losses[0]


def test_the_end_evaluates_checkpoints_and_reports(loop, tmp_path):
    run = driver(tmp_path)
    run._ps = [resnet8_ps(loop, run, version=1000)]
    run.lost_in_flight = 2
    run.accuracy = 0.25  # from an evaluation before the end: evaluated again at the end
    run.started = time.time() - 5
    run._finish("steps")
    assert run.reason == "steps" and run.step == 1000 and run.checkpoint_step == 1000
    kinds = [e["kind"] for e in posted(run)]
    assert kinds == ["eval", "checkpoint", "train-finished"]
    done = posted(run, "train-finished")[0]
    assert done["reason"] == "steps" and done["step"] == 1000 and done["checkpoint_step"] == 1000
    assert done["lost_in_flight"] == 2 and done["gaps"] == 1
    assert json.loads(done["accepted"]) == {"w-0": 1000} and json.loads(done["trainers"]) == []
    assert done["accuracy"] == run.accuracy == posted(run, "eval")[0]["accuracy"]
    assert 5 <= done["wall_s"] < 60


def test_the_end_reports_what_it_can_when_the_ps_does_not_answer(loop, tmp_path):
    import datetime as dt

    run = driver(tmp_path)
    double = resnet8_ps(loop, run, version=10)
    double.error = ConnectionError("gone")
    run._ps = [double]
    when = dt.datetime(2030, 1, 1)
    run._slots["w-0"] = _TrainerSlot(
        "tls://w0:1",
        actor=SimpleNamespace(stop=lambda: None),
        started=True,
        future=Done({"t": when}),
    )
    run._finish("stopped")
    (done,) = posted(run)
    assert done["kind"] == "train-finished" and done["reason"] == "stopped"
    assert json.loads(done["accepted"]) == {} and done["gaps"] is None
    assert json.loads(done["trainers"]) == [{"t": str(when)}]  # what JSON lacks, as text


def test_a_run_that_reached_its_accuracy_is_not_evaluated_again(loop, tmp_path):
    run = driver(tmp_path, target_accuracy=0.5)
    run._ps = [resnet8_ps(loop, run, version=400)]
    run.accuracy = 0.6
    run._finish("accuracy")
    assert [e["kind"] for e in posted(run)] == ["checkpoint", "train-finished"]


def test_a_run_whose_trainers_all_failed_raises_their_error_at_the_end(loop, tmp_path):
    run = driver(tmp_path)
    run._ps = [resnet8_ps(loop, run, version=5)]
    run.error = RuntimeError("Every trainer kept failing")
    with pytest.raises(RuntimeError, match="Every trainer kept failing"):
        run._finish("trainer-failed")
    assert run.checkpoint_step == 5 and posted(run, "train-finished") == []
    run.error = None
    with pytest.raises(RuntimeError, match=r"^trainers failed$"):
        run._finish("trainer-failed")


def test_cleanup_leaves_nothing_of_the_run(tmp_path, monkeypatch, caplog):
    caplog.set_level("INFO", "transient_nb.training.run")
    run = driver(tmp_path)
    deleted = []

    class Variable:
        def __init__(self, name, client):
            self.name, self.client = name, client

        def delete(self):
            assert self.client is run._client
            deleted.append(self.name)

    futures = [Done(), Done(), Done()]
    call = SimpleNamespace()  # an actor call's future: it holds nothing to release
    run._released = [futures[0], call]
    run._ps_futures = [futures[1]]
    run._slots["w-0"] = _TrainerSlot("tls://w0:1", future=futures[2])
    run._ps = [object()]
    # The run's Dask Variable, which needs a scheduler: a double that records its deletion.
    monkeypatch.setattr(run_loop, "Variable", Variable)
    run._cleanup()
    assert run._stop.is_set() and all(f.released for f in futures)
    assert run._slots == {} and run._ps == [] and run._released == [] and run._ps_futures == []
    assert deleted == [run.variable]


def test_cleanup_goes_on_past_what_fails_and_says_so(tmp_path, monkeypatch, caplog):
    caplog.set_level("INFO", "transient_nb.training.run")
    run = driver(tmp_path)

    class Variable:
        def __init__(self, name, client):
            pass

        def delete(self):
            raise OSError("no scheduler")

    monkeypatch.setattr(run_loop, "Variable", Variable)
    run._slots["w-0"] = _TrainerSlot("tls://w0:1", started=True)  # no future: stopping fails
    run._cleanup()
    assert run._slots == {}
    assert logged(
        caplog,
        "INFO",
        "Stopping trainers: AttributeError(\"'NoneType' object has no attribute 'done'\")",
    )
    assert logged(caplog, "INFO", f"Could not delete {run.variable}: OSError('no scheduler')")


def test_the_trainers_are_told_the_zone_of_shard_0s_host(tmp_path):
    """From the cluster's record of the VM behind the host's address; else the cluster's zone."""
    run = driver(tmp_path)
    run._client.workers = {
        "tls://ps0:1": {"name": "ps-0", "resources": {"ps": 1}},
        "tls://w0:1": {"name": "w-0"},
    }
    run.cluster.zone = "us-central1-a"
    run.cluster.workers = {"ps-0": SimpleNamespace(spec=SimpleNamespace(zone="us-central1-f"))}
    assert run._zone_of("tls://ps0:1") == "us-central1-f"
    assert run._zone_of("tls://w0:1") == "us-central1-a"  # no record of it: the cluster's zone
    assert run._zone_of("tls://gone:1") == "us-central1-a"
    del run.cluster.zone
    assert run._zone_of("tls://gone:1") is None
    run._client.unreadable = True
    run.cluster.workers = {}
    assert run._zone_of("tls://ps0:1") is None


class Stalled(Done):
    """An actor's creation that finished, on a worker revoked since: asking for the actor waits
    on a task the scheduler can never run again, until the asker's bound."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[float | None] = []

    def result(self, timeout: float | None = None) -> Any:
        self.asked.append(timeout)
        raise TimeoutError(f"timed out after {timeout} s.")


def test_a_trainer_created_on_a_worker_revoked_since_holds_the_driver_a_second_at_most(tmp_path):
    """Under a storm this happened every few revocations: the driver waited out the whole call
    bound (30 s by default) for the actor of a worker already gone, and no other trainer started
    meanwhile. A finished future's result is at hand or never: one second, as for a trainer's
    end."""
    run = driver(tmp_path, hp=HP.with_(call_timeout_s=30.0, ps_lost_after_s=60.0))
    run._want_trainer("w-3", "tls://w3:1")
    stalled = Stalled()
    run._slots["w-3"].future = stalled
    run._submit_trainers()
    assert stalled.asked == [1.0]
    (failed,) = posted(run, "trainer-failed")
    assert failed["worker"] == "w-3" and failed["error"] == "TimeoutError: timed out after 1.0 s."
    assert posted(run, "trainer-restarted")[0]["attempt"] == 1


def test_the_ps_moves_once_the_new_hosts_in_the_zone_asked_for_have_joined(tmp_path):
    """``ps_move_zone`` set by the cluster (move_ps): the hosts there that do not hold the PS
    yet, once as many as the PS has shards have joined; none while the PS is there already,
    no move is asked, or too few have joined."""
    ps = {"resources": {"ps": 1}}
    run = driver(tmp_path, ps_hosts=2)
    run.shards = 2
    run._ps_addresses = ["tls://old:1", "tls://old:1"]
    run._ps_zone = "us-central1-a"
    run.cluster.zone = "us-central1-a"
    run.cluster.workers = {
        name: SimpleNamespace(spec=SimpleNamespace(zone=zone))
        for name, zone in (
            ("ps-0", "us-central1-a"),
            ("ps-1", "us-east1-c"),
            ("ps-2", "us-east1-c"),
            ("ps-3", "us-east1-b"),
        )
    }
    run._client.workers = {
        "tls://old:1": {"name": "ps-0", **ps},
        "tls://new1:1": {"name": "ps-1", **ps},
        "tls://far:1": {"name": "ps-3", **ps},  # another zone than the one asked for
        "tls://w:1": {"name": "w-0", "resources": {"gpu": 1}},
    }
    assert run._ps_move_hosts() is None  # no move asked for
    assert run._client.listings == 0  # and the listing is not even read
    run.cluster.ps_move_zone = "us-east1-c"
    assert run._ps_move_hosts() is None  # one of the two new hosts has joined
    run._client.workers["tls://new2:1"] = {"name": "ps-2", **ps}
    assert run._ps_move_hosts() == ["tls://new1:1", "tls://new2:1"]
    run._ps_zone = "us-east1-c"  # moved: nothing more to do until the cluster asks again
    assert run._ps_move_hosts() is None


def test_the_driver_wakes_for_an_event_a_trainer_at_hand_and_a_stop(tmp_path):
    """The loop sleeps until something needs it (at most a poll): an event on the run's topic,
    a trainer actor that is ready to run, a stop."""
    run = driver(tmp_path)
    assert not run._wake.is_set()
    run._on_event((0.0, {"kind": "joined", "worker": "w-1", "role": "worker"}))
    assert run._wake.is_set() and run._events.get_nowait()["worker"] == "w-1"
    run._wake.clear()
    run._bounds = [(0, 12)]
    run._want_trainer("w-0", "tls://w0:1")
    run._client.reply = Pending()
    run._submit_trainers()
    assert not run._wake.is_set()  # still being created
    run._slots.clear()
    run._want_trainer("w-2", "tls://w2:1")
    run._client.reply = Done(object())
    run._submit_trainers()
    assert run._wake.is_set()  # created: the next turn starts it
    run._wake.clear()
    run.stop(wait=False)
    assert run._wake.is_set()
