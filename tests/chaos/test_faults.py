"""The fault matrix: real training runs (a small model on digits, ``conftest.small_model``) on the
local backend, one fault or fault sequence per test, each checking the outcome, the accounting,
the story and the clean-up."""

from __future__ import annotations

import os
import signal
import sys
import time

import cloudpickle
import pytest

from transient_nb.training.run import TrainingRun

from .conftest import (
    CALL_TIMEOUT_S,
    RUN_BOUND_S,
    accepted,
    address_of,
    assert_finished,
    assert_nothing_left,
    assert_story,
    chaos_cluster,
    frozen_ps_is_kept,
    kinds,
    ps_vm,
    replacement_recorded,
    replacement_trains,
    run_to_the_end,
    signal_vm,
    start,
    until,
    vm,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# The faults injected with client.run travel by value: the workers cannot import this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_worker_hard_killed_in_the_middle_of_a_push(record):
    with chaos_cluster(workers=3) as cluster:
        run = start(cluster, steps=2000)
        until(lambda: accepted(run, "w-1") >= 20, what="w-1 pushing")
        # Freeze the PS so that every trainer is inside a push, then kill w-1 there.
        ps = ps_vm(cluster)
        signal_vm(ps, signal.SIGSTOP)
        try:
            time.sleep(0.5)  # the fault's shape: the push is on the wire while the PS is frozen
            t_fault = time.time()
            cluster.preempt("w-1", notice=False)
        finally:
            signal_vm(ps, signal.SIGCONT)
        replacement_recorded(
            run, 2000, 1, record, "worker SIGKILLed mid-push", "replacement trains", t_fault
        )
        assert_story(
            run,
            ("preempted", {"worker": "w-1"}),
            ("replacement-requested", {}),
            ("joined", {"worker": "w-3"}),
            ("train-finished", {"reason": "steps"}),
        )
        assert len(kinds(run, "gradient-lost")) <= 1
        assert_nothing_left(cluster, run)


def test_preemption_notice_drains_the_last_gradient(record):
    with chaos_cluster(workers=3) as cluster:
        run = start(cluster, steps=2000)
        until(lambda: accepted(run, "w-0") >= 20, what="w-0 pushing")
        t_fault = time.time()
        cluster.preempt("w-0", notice=True)
        replacement_recorded(
            run, 2000, 0, record, "preemption notice (3 s)", "last gradient drained", t_fault
        )
        assert "w-0" in run.status["drained"]
        assert kinds(run, "gradient-lost") == [] and run.status["gaps"] == 0
        assert_story(
            run,
            ("notice", {"worker": "w-0"}),
            ("drained", {"worker": "w-0"}),
            ("left", {"worker": "w-0"}),
            ("joined", {"worker": "w-3"}),
            ("train-finished", {"reason": "steps"}),
        )
        assert_nothing_left(cluster, run)


def test_ps_host_killed_in_the_middle_of_a_checkpoint(tmp_path, sigcont, record):
    marker = tmp_path / "writing"
    with chaos_cluster(workers=2) as cluster:
        client = cluster.get_client()
        ps = ps_vm(cluster)
        ps_address = address_of(cluster, ps.name)

        def slow_writes(path=str(marker)):
            # The PS host's disk becomes slow: each shard file takes 3 s, announced by a marker.
            from transient_nb.training import checkpoint

            original = checkpoint.write_shard

            def write_shard(url, step, shard, arrays):
                if step > 0:
                    open(path, "w").write(str(step))
                    time.sleep(3)
                return original(url, step, shard, arrays)

            checkpoint.write_shard = write_shard

        client.run(slow_writes, workers=[ps_address])
        run = start(cluster, steps=600, shards=2, checkpoint_every=150)
        until(
            lambda: marker.exists() and run.checkpoint_step >= 0, what="a checkpoint being written"
        )
        torn_step = int(marker.read_text())
        # Freeze the trainers, so that the PS's own step (read from it, not from the driver) is
        # the last step it accepted when it dies.
        trainers = [vm(cluster, "w-0"), vm(cluster, "w-1")]
        for v in trainers:
            signal_vm(v, signal.SIGSTOP)
            sigcont.append(v)
        reads = []

        def settled():
            reads.append(int(run._ps[0].status().result(timeout=CALL_TIMEOUT_S)["step"]))
            return len(reads) >= 2 and reads[-1] == reads[-2] == run.step

        until(settled, 60, "the PS's step to settle, seen by the driver")
        last_accepted = reads[-1]
        t_fault = time.time()
        signal_vm(ps, signal.SIGKILL)  # the host dies while the shard files are being written
        for v in trainers:
            signal_vm(v, signal.SIGCONT)
        # One hard kill, so at most one gradient lost. (``lost_in_flight`` counts the gradients
        # of trainers whose worker died while computing; the trainers live on here, and what
        # the dead PS had accepted since the checkpoint is counted in steps_lost below.)
        finished = run_to_the_end(run, 600, lost_at_most=1)
        (lost,) = kinds(run, "ps-lost")
        (recovered,) = kinds(run, "ps-recovered")
        # The half-written checkpoint has no manifest: recovery took the previous complete one.
        events = run.events()
        complete = [e["step"] for e in events[: events.index(lost)] if e["kind"] == "checkpoint"]
        assert recovered["step"] == complete[-1] < torn_step
        assert recovered["source"] == "checkpoint"
        # The steps lost: the PS's own last accepted step (not the driver's) minus the checkpoint's.
        assert lost["step"] == last_accepted
        assert recovered["steps_lost"] == last_accepted - recovered["step"] > 0
        record.add_ps_recovery(
            "PS host SIGKILLed mid-checkpoint (2 shards)",
            finished,
            recovered,
            t_fault,
            also=f" (torn {torn_step} ignored)",
        )
        assert_story(
            run,
            ("checkpoint", {"step": 0}),
            ("ps-lost", {}),
            ("joined", {"worker": "ps-1"}),
            ("ps-recovered", {"generation": 1}),
            ("train-finished", {"reason": "steps"}),
        )
        assert_nothing_left(cluster, run)


def test_trainer_worker_frozen_past_the_call_timeout_then_resumed(sigcont, record):
    with chaos_cluster(workers=2) as cluster:
        run = start(cluster, steps=1200)
        until(lambda: accepted(run, "w-1") >= 20, what="w-1 pushing")
        frozen = vm(cluster, "w-1")
        t_freeze = time.time()
        signal_vm(frozen, signal.SIGSTOP)
        sigcont.append(frozen)
        # While it is frozen it stops counting as active (the LR follows the workers that push).
        until(lambda: run.status.get("active") == ["w-0"], 60, "w-1 no longer active")
        time.sleep(CALL_TIMEOUT_S)  # the fault: frozen well past the call timeout
        before = accepted(run, "w-1")
        t_resume = time.time()
        signal_vm(frozen, signal.SIGCONT)
        until(lambda: accepted(run, "w-1") > before, 120, "w-1 contributing again")
        t_back = time.time()
        until(lambda: accepted(run, "w-1") >= before + 10, 120, "w-1 contributing again")
        finished = run_to_the_end(run, 1200, lost_at_most=0)
        record.add(
            "trainer's worker SIGSTOPped past the call timeout, resumed",
            f"{finished['step']} steps; not active while frozen; contributes again",
            finished,
            recover_s=t_back - t_resume,
        )
        assert kinds(run, "ps-lost") == []  # a frozen trainer is not a lost PS
        assert kinds(run, "preempted") == []
        assert kinds(run, "trainer-failed") == []
        # From the freeze on: the PS counts w-0 alone, w-1 reports again once resumed (its own
        # events, stamped after the freeze), the PS counts both again, and the run finishes.
        assert_story(
            run,
            ("metrics", {"active_workers": 1}),
            ("worker-metrics", {"worker": "w-1"}),
            ("metrics", {"active_workers": 2}),
            ("train-finished", {"reason": "steps"}),
            since=t_freeze,
        )
        assert_nothing_left(cluster, run)


def test_ps_host_frozen_past_the_call_timeout_then_resumed(sigcont, record):
    with chaos_cluster(workers=2) as cluster:
        run = start(cluster, steps=800)
        until(lambda: run.step >= 100, what="step 100")
        frozen_ps_is_kept(
            cluster,
            run,
            800,
            sigcont,
            record,
            "PS host SIGSTOPped past the call timeout, resumed",
            "same PS kept, trainers rejoined",
        )
        rejoined = {e["worker"] for e in kinds(run, "ps-rejoined")}
        assert rejoined == {"w-0", "w-1"}
        assert all(e["generation"] == 0 for e in kinds(run, "ps-rejoined"))
        assert_nothing_left(cluster, run)


def _break_data(dask_worker=None):
    # This worker's disk lost the data set: loading it raises.
    # The trainer's workload reads its data through this name (training.workload).
    from transient_nb.training import workload

    def load_dataset(spec, train=True):
        raise OSError(f"cannot read {spec}: disk unreadable")

    workload.load_dataset = load_dataset


def test_trainer_that_raises_on_one_worker_only(record):
    with chaos_cluster(workers=2) as cluster:
        client = cluster.get_client()
        bad = address_of(cluster, "w-1")
        client.run(_break_data, workers=[bad])
        # A run longer than any backoff: it ends when we say so, once w-1 was given up (not
        # when w-0 happens to reach a step count first).
        run = start(cluster, steps=1_000_000, trainer_restarts=2)
        until(
            lambda: any(e["gave_up"] for e in kinds(run, "trainer-failed", worker="w-1")),
            RUN_BOUND_S,
            "w-1 was never given up",
        )
        given_up_at = run.step
        until(lambda: run.step >= given_up_at + 100, RUN_BOUND_S, "w-0 did not train on alone")
        run.stop(timeout=RUN_BOUND_S)
        finished = kinds(run, "train-finished")[-1]
        assert finished["reason"] == "stopped" and finished["lost_in_flight"] == 0
        status = run.status
        assert sum(status["accepted"].values()) == status["step"] == finished["step"]
        assert set(status["accepted"]) == {"w-0"}  # w-1 never contributed a step
        assert finished["step"] >= given_up_at + 100
        assert kinds(run, "gradient-lost") == []
        failed = kinds(run, "trainer-failed", worker="w-1")
        assert [e["attempt"] for e in failed] == [1, 2, 3]
        assert all("disk unreadable" in e["error"] for e in failed)
        assert [e["gave_up"] for e in failed] == [False, False, True]
        restarted = kinds(run, "trainer-restarted", worker="w-1")
        assert [e["delay_s"] for e in restarted] == [1.0, 2.0]  # backoff
        assert kinds(run, "trainer-failed", worker="w-0") == []
        assert_story(
            run,
            ("train-started", {}),
            ("trainer-failed", {"worker": "w-1", "attempt": 1, "gave_up": False}),
            ("trainer-restarted", {"worker": "w-1", "attempt": 1, "delay_s": 1.0}),
            ("trainer-failed", {"worker": "w-1", "attempt": 2, "gave_up": False}),
            ("trainer-restarted", {"worker": "w-1", "attempt": 2, "delay_s": 2.0}),
            ("trainer-failed", {"worker": "w-1", "attempt": 3, "gave_up": True}),
            ("train-finished", {"reason": "stopped"}),
        )
        record.add(
            "trainer raises on one worker (data unreadable)",
            f"{finished['step']} steps; w-1 restarted after 1, 2 s, then given up",
            finished,
        )
        assert_nothing_left(cluster, run)


def test_trainers_that_all_keep_failing_stop_the_run_with_their_error(record):
    with chaos_cluster(workers=2) as cluster:
        client = cluster.get_client()
        client.run(_break_data)
        t0 = time.monotonic()
        run = start(cluster, steps=500, trainer_restarts=1)
        with pytest.raises(RuntimeError, match="disk unreadable"):
            run.wait(timeout=RUN_BOUND_S)
        stopped_after = time.monotonic() - t0
        assert stopped_after < 120
        assert run.reason == "trainer-failed"
        summary = run.summary()
        assert summary["reason"] == "trainer-failed" and "disk unreadable" in summary["error"]
        assert summary["trainer_failures"] == 4  # two workers, one restart each
        # Accounting: no trainer ever pushed, so the PS accepted nothing and the run records
        # step 0; no worker died, so no gradient was lost.
        finished = assert_finished(run, 0, lost_at_most=0, reason="trainer-failed")
        assert finished["step"] == 0 and run.status["accepted"] == {}
        assert "disk unreadable" in finished["error"]
        assert kinds(run, "gradient-lost") == []
        # The story, for each worker: it fails, is restarted after the backoff, fails again and
        # is given up; only then does the run stop, with their error.
        for w in ("w-0", "w-1"):
            assert_story(
                run,
                ("train-started", {}),
                ("trainer-failed", {"worker": w, "attempt": 1, "gave_up": False}),
                ("trainer-restarted", {"worker": w, "attempt": 1, "delay_s": 1.0}),
                ("trainer-failed", {"worker": w, "attempt": 2, "gave_up": True}),
                ("train-finished", {"reason": "trainer-failed"}),
            )
        record.add(
            "every trainer raises (data unreadable everywhere)",
            "run stops: trainer-failed, the error in wait(), summary() and the log",
            None,
            stop_s=stopped_after,
        )
        assert_nothing_left(cluster, run)


def test_driver_exception_stops_everything_and_a_later_run_starts(monkeypatch, record):
    with chaos_cluster(workers=2) as cluster:

        def broken(self):
            raise ZeroDivisionError("evaluation blew up")

        monkeypatch.setattr(TrainingRun, "_evaluate", broken)
        first = start(cluster, steps=100_000, eval_every=150)
        with pytest.raises(RuntimeError, match="evaluation blew up"):
            first.wait(timeout=RUN_BOUND_S)
        # Accounting: the run ended at its first evaluation (step 150 or later); the step it
        # records is the last PS status the driver read, whose accepted updates add up to it.
        # (Steps the trainers pushed after that status, before they were stopped, are not in
        # train-finished: the error path releases the PS without reading it again.) No worker
        # died, so no gradient was lost.
        finished = assert_finished(first, 150, lost_at_most=0, reason="error")
        assert "evaluation blew up" in finished["error"]
        assert kinds(first, "gradient-lost") == []
        assert kinds(first, "eval") == []  # the evaluation never completed
        assert_story(
            first,
            ("train-started", {}),
            ("checkpoint", {"step": 0}),
            ("metrics", {}),  # the trainers trained: the PS reported its updates
            ("train-finished", {"reason": "error"}),
        )
        assert_nothing_left(cluster, first)
        monkeypatch.undo()
        # The same workers take a new run at once: no zombie trainer holds them.
        t_second = time.time()
        second = start(cluster, steps=300)
        until(lambda: second.step > 0, 120, "the second run training")
        t_back = time.time()
        finished = run_to_the_end(second, 300, lost_at_most=0)
        record.add(
            "driver raises (evaluation)",
            "run ends with the error; trainers, actors, Variable gone; next run trains",
            finished,
            recover_s=t_back - t_second,
        )
        assert accepted(second, "w-0") > 0 and accepted(second, "w-1") > 0
        assert_nothing_left(cluster, second)


def test_two_faults_at_once_ps_host_and_a_worker_killed(record):
    with chaos_cluster(workers=3) as cluster:
        run = start(cluster, steps=2000)
        until(lambda: run.checkpoint_step >= 100, what="a checkpoint after step 100")
        ps = ps_vm(cluster)
        t_fault = time.time()
        cluster.preempt("w-2", notice=False)
        os.killpg(ps.pid, signal.SIGKILL)
        t_back, finished = replacement_trains(run, 2000, lost_at_most=1, timeout=180)
        (recovered,) = kinds(run, "ps-recovered")
        assert recovered["source"] == "checkpoint" and recovered["step"] >= 100
        assert_story(
            run, ("ps-lost", {}), ("ps-recovered", {}), ("train-finished", {"reason": "steps"})
        )
        joined = {e["worker"] for e in kinds(run, "joined")}
        assert "ps-1" in joined and "w-3" in joined
        record.add(
            "PS host and a worker SIGKILLed at once",
            f"{finished['step']} steps; PS from step {recovered['step']}; replacement trains",
            finished,
            steps_lost=recovered["steps_lost"],
            recover_s=t_back - t_fault,
            ps_recover_s=recovered["time"] - t_fault,
        )
        assert_nothing_left(cluster, run)
