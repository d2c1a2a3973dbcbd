"""The chaos suite's tools: a small cluster, a training run on it, and the checks every fault
test makes (the run's outcome, the accounting of updates, the story the events tell, and that
nothing of the run is left behind)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil
import pytest
from torch import nn

from tests.conftest import wait_for_sync  # tests/conftest.py: the suite's wait helper
from transient_nb import TransientCluster, train
from transient_nb.training.run import TrainingRun

pytestmark = [pytest.mark.slow]

#: The bounds the suite trains with: a slow call is noticed in 2 s, a silent PS is lost at 30 s.
CALL_TIMEOUT_S = 2.0
PS_LOST_AFTER_S = 30.0
#: Every run must end within this (wall seconds, on the 2-core CI machine).
RUN_BOUND_S = 300


def until(predicate: Any, timeout: float = 180, what: str = "condition") -> Any:
    """Wait for ``predicate`` (the suite's bounded wait, tests/conftest.py)."""
    return wait_for_sync(predicate, timeout=timeout, message=f"timed out waiting for {what}")


@contextmanager
def chaos_cluster(workers: int = 3, **kwargs: Any) -> Iterator[TransientCluster]:
    """A local cluster whose every VM process is checked to be gone afterwards."""
    seen: set[int] = set()
    with TransientCluster(
        workers=workers, preemption="none", notice="3s", provisioning_delay=0, **kwargs
    ) as cluster:
        cluster.wait_for_workers(timeout=180)
        try:
            yield cluster
        finally:
            seen |= set(cluster.backend.live_pids)
    # No VM process of the cluster outlives it.
    until(
        lambda: (
            not [
                p
                for p in seen
                if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
            ]
        ),
        60,
        "VM processes to exit",
    )


#: Each trainer's pace (``train(emulate=...)``, the local backend's T4): about resnet8's own speed
#: on an idle 2-core host with three trainers, so that a run of 2000 steps still lasts the ~12 s
#: its faults and replacements happen in, at any load.
PACE = "t4=50"


def small_model() -> nn.Module:
    """The model every fault trains: a two-layer perceptron with batch norm on digits' 3x8x8
    images. The faults are in the PS, the trainers and the VMs, not in the model: this one costs
    about a tenth of resnet8's step (~1 of ~8 ms of a core) and still has a float and an integer
    buffer for the checkpoints to carry. An instance of torch's own modules, so the workers
    unpickle it without this file."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10)
    )


def start(cluster: TransientCluster, steps: int = 600, **kwargs: Any) -> TrainingRun:
    params = dict(
        model=small_model(),
        emulate=PACE,
        data="digits",
        steps=steps,
        batch_size=32,
        checkpoint_every=100,
        eval_every=steps,
        call_timeout_s=CALL_TIMEOUT_S,
        ps_lost_after_s=PS_LOST_AFTER_S,
    )
    params.update(kwargs)
    return train(cluster, **params)


def vm(cluster: TransientCluster, name: str) -> Any:
    return cluster.workers[name]


def ps_vm(cluster: TransientCluster) -> Any:
    return next(v for n, v in cluster.workers.items() if n.startswith("ps-"))


def address_of(cluster: TransientCluster, name: str) -> str:
    """The scheduler's address of the worker called ``name`` (``client.run``'s ``workers=``)."""
    workers = cluster.get_client().scheduler_info()["workers"]
    return next(a for a, w in workers.items() if w["name"] == name)


def signal_vm(v: Any, sig: int) -> None:
    """Send ``sig`` to the whole process group of a VM (nanny and worker), as a hypervisor
    freezing or killing the machine would."""
    os.killpg(v.pid, sig)


def accepted(run: TrainingRun, worker: str) -> int:
    return int(run.status.get("accepted", {}).get(worker, 0))


def kinds(run: TrainingRun, kind: str, **match: Any) -> list[dict[str, Any]]:
    return [
        e
        for e in run.events()
        if e.get("kind") == kind and all(e.get(k) == v for k, v in match.items())
    ]


def assert_story(
    run: TrainingRun, *steps: tuple[str, dict[str, Any]], since: float | None = None
) -> None:
    """The run's events contain these (kind, fields) in this order (only events stamped at or
    after ``since``, a wall time, when it is given: the story of a fault begins with it)."""
    events = run.events()
    if since is not None:
        events = [e for e in events if e.get("time", 0.0) >= since]
    i = 0
    for kind, fields in steps:
        while i < len(events) and not (
            events[i].get("kind") == kind and all(events[i].get(k) == v for k, v in fields.items())
        ):
            i += 1
        assert i < len(events), f"missing, or out of order: {kind} {fields}"
        i += 1


def assert_finished(
    run: TrainingRun, steps: int, lost_at_most: int, reason: str = "steps"
) -> dict[str, Any]:
    """The run ended for ``reason`` with at least ``steps`` steps, every accepted update is a
    recorded step, and it lost at most ``lost_at_most`` gradients (one per hard kill).

    A run that ends in error posts the step of the last PS status the driver read: the
    accounting is checked on that status (its accepted updates and its step are one snapshot).
    """
    finished = kinds(run, "train-finished")[-1]
    assert finished["reason"] == reason, finished
    assert finished["step"] >= steps
    status = run.status
    assert sum(status["accepted"].values()) == status["step"] == finished["step"]
    assert finished["lost_in_flight"] <= lost_at_most
    return finished


def run_to_the_end(run: TrainingRun, steps: int, lost_at_most: int) -> dict[str, Any]:
    """Wait for the run (:data:`RUN_BOUND_S` at most), then :func:`assert_finished` it."""
    run.wait(timeout=RUN_BOUND_S)
    return assert_finished(run, steps, lost_at_most)


def replacement_trains(
    run: TrainingRun, steps: int, lost_at_most: int, timeout: float = 120
) -> tuple[float, dict[str, Any]]:
    """Wait for the replacement worker (w-3) to contribute, then for the run's end: the wall time
    it was back, and :func:`run_to_the_end`'s event."""
    until(lambda: accepted(run, "w-3") > 0, timeout, "the replacement contributing")
    t_back = time.time()
    return t_back, run_to_the_end(run, steps, lost_at_most)


def replacement_recorded(
    run: TrainingRun,
    steps: int,
    lost_at_most: int,
    record: FaultRecord,
    fault: str,
    outcome: str,
    t_fault: float,
) -> dict[str, Any]:
    """:func:`replacement_trains`, then the fault's row: ``outcome`` after the steps, recovered
    when the replacement contributed (against the fault's wall time ``t_fault``); returns
    :func:`run_to_the_end`'s event."""
    t_back, finished = replacement_trains(run, steps, lost_at_most)
    record.add(fault, f"{finished['step']} steps; {outcome}", finished, recover_s=t_back - t_fault)
    return finished


def frozen_ps_is_kept(
    cluster: TransientCluster,
    run: TrainingRun,
    steps: int,
    sigcont: list[Any],
    record: FaultRecord,
    fault: str,
    outcome: str,
) -> float:
    """Freeze the PS host (SIGSTOP) until both trainers notice, and a call timeout more (short of
    ``ps_lost_after_s``), then resume it: both trainers rejoin the same PS and the run reaches
    ``steps``. Records the fault (``outcome`` after the steps) and returns how long the trainers
    took to notice."""
    ps = ps_vm(cluster)
    signal_vm(ps, signal.SIGSTOP)
    sigcont.append(ps)
    t0 = time.time()
    until(lambda: len(kinds(run, "trainer-ps-lost")) >= 2, 60, "both trainers to notice")
    noticed_s = time.time() - t0
    time.sleep(CALL_TIMEOUT_S)  # the fault: frozen past the timeout, short of ps_lost_after_s
    t_resume = time.time()
    signal_vm(ps, signal.SIGCONT)
    until(lambda: len(kinds(run, "ps-rejoined")) >= 2, 120, "both trainers back")
    t_back = max(e["time"] for e in kinds(run, "ps-rejoined"))
    finished = run_to_the_end(run, steps, lost_at_most=0)
    record.add(fault, f"{finished['step']} steps; {outcome}", finished, recover_s=t_back - t_resume)
    # Slow is not dead: the same PS goes on, no recovery, nothing thrown away.
    assert kinds(run, "ps-lost") == [] and kinds(run, "ps-recovered") == []
    assert_story(
        run,
        ("trainer-ps-lost", {}),
        ("ps-rejoined", {}),
        ("train-finished", {"reason": "steps"}),
    )
    return noticed_s


def assert_nothing_left(cluster: TransientCluster, run: TrainingRun) -> None:
    """No actor of the run on any worker, no trainer thread, and no Variable of it."""
    client = cluster.get_client()

    def leftovers(dask_worker: Any) -> list[str]:
        import threading

        actors = [str(k) for k in dask_worker.state.actors if run_id in str(k)]
        threads = [t.name for t in threading.enumerate() if run_id in t.name]
        return actors + [f"thread:{n}" for n in threads]

    run_id = run.id
    until(
        lambda: not any(client.run(leftovers).values()),
        60,
        "the run's actors and trainer threads to go",
    )
    variables = client.run_on_scheduler(
        lambda dask_scheduler: list(dask_scheduler.extensions["variables"].variables)
    )
    assert run.variable not in variables


@pytest.fixture
def sigcont() -> Iterator[list[Any]]:
    """VMs a test froze: resumed whatever happens, so that no frozen process is left."""
    frozen: list[Any] = []
    yield frozen
    for v in frozen:
        try:
            signal_vm(v, signal.SIGCONT)
        except (ProcessLookupError, TypeError):
            pass


class FaultRecord(dict):
    """A row of the fault matrix: fault, outcome, steps lost, gradients lost, time to recover."""

    def add(
        self,
        fault: str,
        outcome: str,
        finished: dict[str, Any] | None,
        steps_lost: int = 0,
        recover_s: float | None = None,
        **extra: Any,
    ) -> None:
        self.update(
            fault=fault,
            outcome=outcome,
            steps_lost=steps_lost,
            gradients_lost=finished["lost_in_flight"] if finished else 0,
            recover_s=recover_s,
            **extra,
        )

    def add_ps_recovery(
        self,
        fault: str,
        finished: dict[str, Any],
        recovered: dict[str, Any],
        t_fault: float,
        also: str = "",
    ) -> None:
        """The row of a PS recovered from a checkpoint: its ``ps-recovered`` event says from
        which step, how many steps were lost, and when (against the fault's wall time)."""
        self.add(
            fault,
            f"{finished['step']} steps; PS from step {recovered['step']}{also}",
            finished,
            steps_lost=recovered["steps_lost"],
            recover_s=recovered["time"] - t_fault,
        )


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Iterator[FaultRecord]:
    """The test's row of the fault matrix; appended to ``$TRANSIENT_NB_FAULT_MATRIX`` (JSON
    lines) when that is set, which is how ``benchmarks/fault_matrix.py`` collects the table."""
    row = FaultRecord(test=request.node.name)
    yield row
    path = os.environ.get("TRANSIENT_NB_FAULT_MATRIX")
    if path and "outcome" in row:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
