"""Tests for transient_nb.deploy.preemption: preemptions by hand (a drain, a notice, the
replacement) and spares."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from distributed import Client

from tests.conftest import (
    index_of,
    kinds,
    of_kind,
    wait_for_sync,
)
from tests.deploy.cluster_helpers import (
    n_joined,
    preempted_workers,
    replaced,
    snapshot,
    worker_states,
)
from transient_nb import TransientCluster
from transient_nb.catalog.lifetimes import HOUR
from transient_nb.eventlog.records import read_run_record


# -- manual preemption, drain hooks, processes killed from outside, worker environment ---------
@pytest.mark.slow
def test_manual_preemption_drains_and_replaces(
    cleanup: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Dask's nanny would give workers this; the local backend must remove it even when the
    # parent has it set.
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    marks = tmp_path / "marks"
    marks.mkdir()

    def install_hook(folder: str, dask_worker: Any) -> str:
        import os
        import time

        from transient_nb.eventlog.vocabulary import TOPIC
        from transient_nb.worker import drain as agent

        name = json.loads(os.environ["TRANSIENT_NB_VM"])["name"]

        def hook(deadline: float) -> None:
            with open(os.path.join(folder, name), "w") as f:
                f.write(repr(time.time()))
            dask_worker.log_event(TOPIC, {"kind": "hook-ran", "time": time.time()})

        agent.register_drain_hook(hook)
        return name

    with TransientCluster(
        workers=2, notice="3s", provisioning_delay=0, seed=3, name="manual"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        cluster.wait_for_workers(timeout=60)
        env = client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
        assert len(env) == 3 and set(env.values()) == {None}
        env = client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"), nanny=True)
        assert set(env.values()) == {None}
        assert set(client.run(lambda: os.environ["OMP_NUM_THREADS"]).values()) == {"1"}
        assert sorted(client.run(install_hook, str(marks)).values()) == ["ps-0", "w-0", "w-1"]

        # -- by name, with notice: notice -> hook -> drained -> left -> preempted -> replaced
        assert cluster.preempt("w-0") == ["w-0"]
        wait_for_sync(lambda: replaced(snapshot(cluster), "w-0"), timeout=60)
        events = snapshot(cluster)
        order = [
            index_of(events, "notice", worker="w-0"),
            index_of(events, "hook-ran", worker="w-0"),
            index_of(events, "drained", worker="w-0"),
            index_of(events, "left", worker="w-0"),
            index_of(events, "preempted", worker="w-0"),
            index_of(events, "replacement-requested", worker="w-0"),
        ]
        assert -1 not in order and order == sorted(order), order
        drained = of_kind(events, "drained", worker="w-0")[0]
        assert drained["hooks"] == 1 and list(drained["errors"]) == []
        hook_time = float((marks / "w-0").read_text())
        assert hook_time < of_kind(events, "preempted", worker="w-0")[0]["time"]
        assert of_kind(events, "preempted", worker="w-0")[0]["source"] == "manual"
        wait_for_sync(lambda: n_joined(cluster) == 2, timeout=60)

        # -- by count, without notice: no notice, no drain, killed, replaced
        client.run(install_hook, str(marks))  # the replacement gets the hook too
        (victim,) = cluster.preempt(1, notice=False)
        assert victim in ("w-1", "w-2")
        wait_for_sync(lambda: replaced(snapshot(cluster), victim), timeout=60)
        events = snapshot(cluster)
        assert kinds(events, victim).count("notice") == 0
        assert of_kind(events, "drained", worker=victim) == []
        assert not (marks / victim).exists()
        assert of_kind(events, "preempted", worker=victim)[0]["notice"] is False
        wait_for_sync(lambda: n_joined(cluster) == 2, timeout=60)

        # -- a VM killed from outside (a crash) is noticed and replaced
        other = sorted(worker_states(cluster))[0]
        os.killpg(cluster.workers[other].pid, signal.SIGKILL)
        wait_for_sync(lambda: replaced(snapshot(cluster), other), timeout=60)
        lost = of_kind(snapshot(cluster), "preempted", worker=other)
        assert len(lost) == 1 and lost[0]["source"] == "lost" and lost[0]["notice"] is False

        # -- bad targets: clear errors, nothing preempted
        n_before = len(preempted_workers(snapshot(cluster)))
        for target, match in [
            ("w-99", r"No preemptible worker named 'w-99': use one of w-"),
            ("w-0", "No preemptible worker named 'w-0'"),  # already gone
            ("ps-0", "No preemptible worker named 'ps-0'"),
            (["w-99"], "'w-99'"),
            (0, "at least 1"),
            (-2, "at least 1"),
            (True, "give a number of workers or worker names"),
            (5, r"only 2 worker\(s\) can be preempted now"),
        ]:
            with pytest.raises(ValueError, match=match):
                cluster.preempt(target)
        for bad in (-1, 2.5, True):
            with pytest.raises(ValueError, match="whole number"):
                cluster.scale(bad)
        with pytest.raises(ValueError, match="not memory or cores"):
            cluster.scale(memory="4GB")
        assert len(preempted_workers(snapshot(cluster))) == n_before
        assert "ps-0" in cluster.workers
    record = read_run_record(cluster.run_record)
    assert of_kind(record, "preempted", worker="ps-0") == []


# -- scaling by hand while the simulator preempts -----------------------------------------------
@pytest.mark.slow
def test_a_worker_that_joins_during_its_notice_still_drains(cleanup: None) -> None:
    """A notice given while the VM boots reaches its worker once it joins (as GCE's metadata
    server would): the worker drains and leaves before the VM stops, not killed mid-step."""
    with TransientCluster(
        workers=1, notice="60s", provisioning_delay=0, name="late-join"
    ) as cluster:
        wait_for_sync(lambda: "running" in kinds(snapshot(cluster), worker="w-0"), timeout=60)
        assert "joined" not in kinds(snapshot(cluster), worker="w-0")  # still importing Dask
        cluster.preempt("w-0")
        wait_for_sync(lambda: "preempted" in kinds(snapshot(cluster), worker="w-0"), timeout=60)
        mine = kinds(snapshot(cluster), worker="w-0")
    assert mine.index("notice") < mine.index("joined") < mine.index("left")
    assert mine.index("left") < mine.index("preempted")
    # Gone once drained: far sooner than the 60 s notice.
    events = of_kind(snapshot(cluster), "preempted", worker="w-0")
    notice = of_kind(snapshot(cluster), "notice", worker="w-0")[0]
    assert events[0]["time"] - notice["time"] < 30


# -- replacement fallback: stock-outs, fallback zones, capacity exhausted -----------------------
@pytest.mark.slow
def test_a_spare_at_max_workers_is_refused_and_the_cluster_goes_on(cleanup: None) -> None:
    """replace_at="ahead" asks for a spare beside the worker it stands in for: at max_workers,
    that would be one worker too many, so none is created and the log says why."""
    with TransientCluster(
        workers=2, max_workers=2, provisioning_delay=0, replace_at="ahead", name="spare-cap"
    ) as cluster:
        cluster.wait_for_workers(2, timeout=120)
        cluster.workers["w-0"].running_since -= 24 * HOUR - 1  # 1 s short of GCE's 24 h limit
        (refused,) = wait_for_sync(
            lambda: of_kind(snapshot(cluster), "limit-refused", role="worker"), timeout=60
        )
        assert refused["limit"] == "max_workers" and refused["gpu"] == "t4"
        assert "would make 3 GPU workers, above max_workers=2" in refused["reason"]
        events = snapshot(cluster)
        assert index_of(events, "spare-requested", worker="w-0") < events.index(refused)
        assert not of_kind(events, "requested", worker="w-2")  # nothing was asked of the backend
        assert n_joined(cluster) == 2 and cluster._slots == {0: "w-0", 1: "w-1"}
