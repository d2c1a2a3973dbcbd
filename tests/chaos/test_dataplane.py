"""Faults of the data plane itself (transient_nb.training.wire): real training runs on the local
backend whose trainer <-> PS connections are cut, whose PS dies in the middle of a reply, and whose
PS freezes on the cross-host path (TLS). Each is detected and recovered within the bounds of the
rest of the suite (``call_timeout_s``, ``ps_lost_after_s``, rejoin with backoff)."""

from __future__ import annotations

import json
import sys
import time

import cloudpickle
import pytest

from .conftest import (
    CALL_TIMEOUT_S,
    accepted,
    address_of,
    assert_nothing_left,
    assert_story,
    chaos_cluster,
    frozen_ps_is_kept,
    kinds,
    ps_vm,
    run_to_the_end,
    start,
    until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _cut_data_plane(dask_worker=None):
    # Every data-plane connection of every PS shard on this worker drops (a network cut).
    return sum(
        ps._data_server.cut()
        for ps in dask_worker.state.actors.values()
        if getattr(ps, "_data_server", None)
    )


def _die_in_the_middle_of_a_reply(after):
    # The PS host dies (its whole process group, as a VM that stops) while its reply to a push
    # is half sent: after ``after`` more replies, the next one sends half its bytes, then the kill.
    import os
    import signal as sig

    from transient_nb.training.wire import frame

    real = frame.Channel.send_frame
    count = [0]

    def send_frame(self, kind, meta, arrays, offsets=(), fd=None):
        if kind == frame.REPLY:
            count[0] += 1
            if count[0] > after:
                head = frame.encode_head(kind, meta, arrays, offsets)
                self.sock.settimeout(5)
                self.sock.sendall(head[: len(head) // 2])
                os.killpg(os.getpgid(0), sig.SIGKILL)
        yield from real(self, kind, meta, arrays, offsets, fd)

    frame.Channel.send_frame = send_frame


def _transports(run):
    finished = kinds(run, "train-finished")[-1]
    return {t["data_plane"] for t in json.loads(finished["trainers"])}


def test_data_plane_connections_cut_twice_are_rejoined(record):
    with chaos_cluster(workers=2) as cluster:
        run = start(cluster, steps=800)
        until(lambda: min(accepted(run, "w-0"), accepted(run, "w-1")) >= 20, what="both pushing")
        client = cluster.get_client()
        address = address_of(cluster, ps_vm(cluster).name)
        t_fault = time.time()
        cuts = client.run(_cut_data_plane, workers=[address])[address]
        assert cuts == 2  # one connection per trainer
        until(lambda: len(kinds(run, "ps-rejoined")) >= 2, 60, "both trainers back")
        t_back = max(e["time"] for e in kinds(run, "ps-rejoined"))
        step = run.step
        until(lambda: run.step >= step + 50, 120, "training on")
        assert client.run(_cut_data_plane, workers=[address])[address] == 2
        finished = run_to_the_end(run, 800, lost_at_most=0)
        record.add(
            "data-plane connections cut (twice)",
            f"{finished['step']} steps; same PS, trainers reconnected",
            finished,
            steps_lost=0,
            recover_s=t_back - t_fault,
            gaps=run.status["gaps"],
        )
        # A cut is not a lost PS: the same generation goes on; at most the gradient that was on
        # the wire of each cut connection never arrived (counted as a gap, not hidden).
        assert kinds(run, "ps-lost") == [] and kinds(run, "ps-recovered") == []
        assert {e["worker"] for e in kinds(run, "ps-rejoined")} == {"w-0", "w-1"}
        assert all(e["generation"] == 0 for e in kinds(run, "ps-rejoined"))
        assert run.status["gaps"] <= 4
        assert _transports(run) == {"unix"}
        assert_story(
            run,
            ("trainer-ps-lost", {}),
            ("ps-rejoined", {}),
            ("trainer-ps-lost", {}),
            ("ps-rejoined", {}),
            ("train-finished", {"reason": "steps"}),
            since=t_fault,
        )
        assert_nothing_left(cluster, run)


def test_ps_host_killed_in_the_middle_of_a_reply(record):
    with chaos_cluster(workers=2) as cluster:
        client = cluster.get_client()
        run = start(cluster, steps=600, checkpoint_every=100)
        until(lambda: run.checkpoint_step >= 100, what="a checkpoint after step 100")
        address = address_of(cluster, ps_vm(cluster).name)
        t_fault = time.time()
        client.run(_die_in_the_middle_of_a_reply, 5, workers=[address])
        until(lambda: kinds(run, "ps-lost"), 120, "the PS seen lost")
        finished = run_to_the_end(run, 600, lost_at_most=0)
        (recovered,) = kinds(run, "ps-recovered")
        assert recovered["source"] == "checkpoint" and recovered["step"] >= 100
        record.add_ps_recovery(
            "PS host SIGKILLed mid-reply (data plane)", finished, recovered, t_fault
        )
        # Every trainer saw its call fail (a cut reply is an error at once, not a slow PS) and
        # followed the new generation.
        lost_calls = [e for e in kinds(run, "trainer-ps-lost") if e["time"] >= t_fault]
        assert lost_calls
        assert_story(
            run,
            ("ps-lost", {}),
            ("ps-recovered", {"generation": 1}),
            ("ps-rejoined", {"generation": 1}),
            ("train-finished", {"reason": "steps"}),
            since=t_fault,
        )
        assert _transports(run) == {"unix"}
        assert_nothing_left(cluster, run)


def test_ps_frozen_on_the_cross_host_path_then_resumed(sigcont, record):
    with chaos_cluster(workers=2) as cluster:
        run = start(cluster, steps=600, data_plane="tls")
        until(lambda: run.step >= 100, what="step 100")
        noticed_s = frozen_ps_is_kept(
            cluster,
            run,
            600,
            sigcont,
            record,
            "PS host SIGSTOPped on the cross-host (TLS) data plane, resumed",
            "same PS kept, trainers rejoined over TLS",
        )
        # Noticed within the call timeout (plus a wait slice and the machine's load).
        assert noticed_s < CALL_TIMEOUT_S + 10
        assert _transports(run) == {"tls"}
        assert_nothing_left(cluster, run)
