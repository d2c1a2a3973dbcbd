"""Tests for transient_nb.deploy.remote: a handle on a cluster that another process owns.

The "other process" is this one: the handle talks to the cluster only through the registry and
its scheduler (a Client, the event log over RPC, control requests on ``transient-control``),
exactly as it would across kernels.
"""

from __future__ import annotations

import pytest
from distributed.core import Status

from tests.conftest import of_kind, wait_for_sync
from transient_nb import TransientCluster, connect
from transient_nb.deploy import registry
from transient_nb.deploy.remote import RemoteCluster
from transient_nb.notebook.views.panel import ClusterPanel


def test_unknown_and_stale_names() -> None:
    with pytest.raises(ValueError, match=r"No transient cluster named 'nope'.*known: none"):
        connect("nope")
    # A registry entry whose owning process is gone.
    registry.register("ghost", {"scheduler_address": "tcp://127.0.0.1:1", "pid": 2**22 + 7})
    with pytest.raises(ValueError, match="is stale"):
        connect("ghost")


@pytest.mark.slow
def test_remote_handle_reads_and_controls(cleanup: None) -> None:
    with TransientCluster(
        workers=1,
        provisioning_delay=0,
        notice="1s",
        zone="us-central1-a",
        fallback_zones=["us-east1-c"],  # another region, for move_ps
        name="owned",
    ) as cluster:
        assert connect("owned") is cluster  # owned by this process: the cluster itself
        remote = connect("owned", prefer_local=False)
        try:
            assert isinstance(remote, RemoteCluster)
            assert remote.get_client().scheduler_info()["address"] == cluster.scheduler_address
            remote.wait_for_workers(1, timeout=120)
            # The mirror follows the owner's log.
            wait_for_sync(lambda: len(remote.monitor.events) >= len(cluster.monitor.events), 10)
            assert remote.monitor.events[0]["kind"] == "started"
            assert remote.catalog is not None and remote.time_scale == 1.0
            assert remote.cost().total == pytest.approx(cluster.cost().total, rel=0.2)
            assert set(remote.vms().index) == {"ps-0", "w-0"}
            assert "owned" in repr(remote)

            # Control requests are answered by the owning cluster.
            answer = remote.scale(2)
            assert answer["ok"] and answer["action"] == "scale"
            wait_for_sync(lambda: of_kind(cluster.monitor.events, "requested", worker="w-1"), 30)
            remote.wait_for_workers(2, timeout=120)
            remote.preempt("w-1", notice=False)
            wait_for_sync(lambda: of_kind(cluster.monitor.events, "preempted", worker="w-1"), 30)
            assert of_kind(cluster.monitor.events, "preempted", worker="w-1")[0]["notice"] is False
            with pytest.raises(ValueError, match="No preemptible worker named 'w-77'"):
                remote.preempt("w-77")
            with pytest.raises(ValueError, match="whole number"):
                remote.scale(-1)
            # A PS host more, through the owner (a detached cluster's policy and users alike);
            # the owner's refusal comes back as an error.
            answer = remote.scale_ps(2)
            assert answer["ok"] and answer["action"] == "scale-ps"
            wait_for_sync(lambda: of_kind(cluster.monitor.events, "ps-hosts", hosts=2), 30)
            assert cluster.ps_hosts == 2
            with pytest.raises(ValueError, match="cannot give back a shard's host"):
                remote.scale_ps(1)
            with pytest.raises(ValueError, match="whole number"):
                remote.scale_ps(0)

            # An on-demand share, through the owner: a bad count is refused (here, or by the
            # owner) with the value named, before anything changes.
            gpu = cluster.gpu
            for bad, words in (
                (3, rf"on_demand=3\): 3 {gpu} on demand, but the mix keeps 2 {gpu}"),
                ({"h9000": 1}, "1 h9000 on demand, but the mix keeps 0 h9000"),
                (-1, r"scale\(on_demand=-1\): give a whole number of workers"),
                ("v100=-1", r"on_demand='v100=-1'\): workers: v100=-1 is not a number"),
            ):
                with pytest.raises(ValueError, match=words):
                    remote.scale(2, on_demand=bad)
            assert cluster.on_demand == {} and cluster.mix == {gpu: 2}
            answer = remote.scale(2, on_demand=1)
            assert answer["ok"] and answer["action"] == "scale"
            assert cluster.on_demand == {gpu: 1}
            wait_for_sync(
                lambda: of_kind(cluster.monitor.events, "requested", role="worker", spot=False), 30
            )

            # The PS to the fallback zone, through the owner; a zone it may not use is refused.
            with pytest.raises(ValueError, match="give a zone name such as 'us-east1-c'"):
                remote.move_ps("")
            with pytest.raises(
                ValueError,
                match=r"move_ps\('nowhere-1a'\): not a zone this cluster may use "
                r"\(us-central1-a, us-east1-c\)",
            ):
                remote.move_ps("nowhere-1a")
            answer = remote.move_ps("us-east1-c", reason="remote")
            assert answer["ok"] and answer["action"] == "move-ps"
            wait_for_sync(
                lambda: of_kind(
                    cluster.monitor.events, "ps-move", zone="us-east1-c", reason="remote"
                ),
                30,
            )
            wait_for_sync(lambda: cluster.ps_move_zone is None, 120)
            assert cluster.placement.ps_zone == "us-east1-c"
            ps = [vm for vm in cluster.workers.values() if vm.spec.role == "ps" and not vm.stopped]
            assert {vm.spec.zone for vm in ps} == {"us-east1-c"}

            # The panel works on the handle as on a local cluster.
            panel = ClusterPanel(remote)
            wait_for_sync(lambda: "connected" in panel.header.value, 10)
            wait_for_sync(lambda: any(r["name"] == "w-1" for r in panel.rows), 10)
            panel.close()

            # Shut down through the owner.
            remote.shutdown()
            wait_for_sync(lambda: cluster.status == Status.closed, 60)
            assert remote.status == Status.closed
        finally:
            remote.close()


def test_the_core_handle_does_not_depend_on_the_views() -> None:
    import subprocess
    import sys

    code = (
        "import sys, transient_nb.deploy.remote; "
        "print(sorted(m for m in sys.modules if m.startswith(('transient_nb.notebook.views', 'ipywidgets'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
