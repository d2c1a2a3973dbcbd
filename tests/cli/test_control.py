"""Tests for transient_nb.cli.control: the commands on a cluster that runs."""

from __future__ import annotations

import pytest

from transient_nb.cli.commands import main


@pytest.mark.slow
def test_a_detached_mixed_cluster_scales_by_type(tmp_path, capsys):
    import dask

    from tests.conftest import of_kind, wait_for_sync
    from transient_nb.deploy import registry
    from transient_nb.deploy.connect import connect

    argv = ["up", "--name", "cli-mix", "--workers", "k80=1,v100=1", "--prices", "paper-2019"]
    # A fallback zone in another region, for move-ps (the head takes this process's settings).
    with dask.config.set({"transient.replacement.fallback-zones": ["us-east1-c"]}):
        assert main([*argv, "--preemption", "none", "--provisioning-delay", "0s"]) == 0
    capsys.readouterr()
    cluster = connect("cli-mix", prefer_local=False)
    try:

        def joined() -> dict[str, int]:
            df = cluster.vms()
            df = df[(df["role"] == "worker") & (df["state"] == "joined")]
            return {str(g): int(n) for g, n in df.groupby("gpu").size().items()}

        wait_for_sync(lambda: joined() == {"k80": 1, "v100": 1}, timeout=90)
        # On-demand counts the head refuses: exit 2, the value named, nothing changed.
        for on_demand, words in [
            ("3", "scale(on_demand=3): 3 v100 on demand, but the mix keeps 2 v100"),
            ("h900=1", "1 h900 on demand, but the mix keeps 0 h900"),
        ]:
            assert main(["scale", "cli-mix", "2", "--gpu", "v100", "--on-demand", on_demand]) == 2
            assert words in capsys.readouterr().err
        assert cluster.mix == {"k80": 1, "v100": 1}
        # The new v100 worker runs on demand (the head's on_demand says 1 v100).
        assert main(["scale", "cli-mix", "2", "--gpu", "v100", "--on-demand", "1"]) == 0
        assert "scaling to 2 v100 workers, 1 on demand." in capsys.readouterr().out
        wait_for_sync(lambda: joined() == {"k80": 1, "v100": 2}, timeout=90)
        assert cluster.mix == {"k80": 1, "v100": 2}
        wait_for_sync(
            lambda: of_kind(cluster.monitor.events, "scale", on_demand={"v100": 1}), timeout=30
        )
        vms = cluster.vms()
        dear = vms[(vms["role"] == "worker") & (vms["state"] == "joined") & vms["spot"].eq(False)]
        assert list(dear["gpu"]) == ["v100"]
        # A plain number is ambiguous for a mixed cluster: the owner's answer says so.
        assert main(["scale", "cli-mix", "4"]) == 2
        assert "this cluster mixes k80=1,v100=2" in capsys.readouterr().err
        # A second PS host, asked of the head: refused past four, then it joins.
        assert main(["scale-ps", "cli-mix", "5"]) == 2
        assert "scale_ps(5): at most 4 PS hosts" in capsys.readouterr().err
        assert main(["scale-ps", "cli-mix", "0"]) == 2
        # Refused by the option table's type, as the magic refuses it.
        assert "'0' is not a whole number of PS hosts of at least 1" in capsys.readouterr().err
        assert main(["scale-ps", "cli-mix", "2"]) == 0
        assert "Cluster cli-mix: keeping 2 PS host(s)" in capsys.readouterr().out
        wait_for_sync(
            lambda: "ps-1" in set(cluster.vms().query("state == 'joined'").index), timeout=90
        )
        # The PS hosts move to the fallback zone, asked of the head; a zone it may not use is
        # refused with the zones it may.
        assert main(["move-ps", "cli-mix", "europe-west4-a"]) == 2
        assert (
            "move_ps('europe-west4-a'): not a zone this cluster may use "
            "(us-central1-a, us-east1-c)" in capsys.readouterr().err
        )
        assert main(["move-ps", "cli-mix", "us-east1-c", "--reason", "cli"]) == 0
        assert "Cluster cli-mix: moving the PS to us-east1-c." in capsys.readouterr().out
        wait_for_sync(
            lambda: of_kind(cluster.monitor.events, "ps-move", zone="us-east1-c", reason="cli"),
            timeout=30,
        )

        def ps_zones() -> list[str]:
            vms = cluster.vms()
            return sorted(vms[(vms["role"] == "ps") & (vms["state"] == "joined")]["zone"])

        # Both PS hosts anew in us-east1-c, the old ones given back (no run to move first).
        wait_for_sync(lambda: ps_zones() == ["us-east1-c", "us-east1-c"], timeout=120)
        assert main(["status", "cli-mix"]) == 0
        status = capsys.readouterr().out
        assert "per type" in status and "k80 1 VMs" in status and "v100 2 VMs" in status
    finally:
        cluster.close()
        assert main(["down", "cli-mix"]) == 0
    assert registry.entries() == []


def test_adapt_starts_and_stops_the_policy_of_a_detached_cluster(capsys):
    from transient_nb import connect

    argv = ["--name", "cli-adapt", "--workers", "1", "--preemption", "none"]
    assert main(["up", *argv, "--provisioning-delay", "0s"]) == 0
    try:
        assert main(["adapt", "cli-adapt", "deadline:10m", "--gpus", "t4,v100"]) == 0
        assert "Cluster cli-adapt: policy on, goal deadline:10m." in capsys.readouterr().out
        assert main(["adapt", "cli-adapt", "soon"]) == 2  # refused here, nothing sent
        assert main(["adapt", "cli-adapt", "off"]) == 0
        assert "policy off" in capsys.readouterr().out
        cluster = connect("cli-adapt")
        try:
            answers = [
                e
                for e in cluster.monitor.events
                if e["kind"] == "control" and e.get("action") == "adapt"
            ]
        finally:
            cluster.close()
        assert [a["ok"] for a in answers] == [True, True]  # the head ran both
    finally:
        assert main(["down", "cli-adapt"]) == 0


def test_attach_to_a_failed_run_says_why_and_exits_non_zero(capsys, monkeypatch):
    from types import SimpleNamespace

    from transient_nb.cli import control as cli

    failed = {"kind": "train-finished", "reason": "error", "error": "eval_images=0:\nno images"}
    job = SimpleNamespace(
        id="run-0dead",
        done=True,
        step=3,
        accuracy=None,
        status={},
        started_event={"steps": 50},
        finished_event=failed,
        reason=failed["reason"],
        error=failed["error"],
    )
    closed = []
    cluster = SimpleNamespace(name="c", run=job, close=lambda: closed.append(True))
    monkeypatch.setattr(cli, "_connect", lambda name: cluster)
    assert main(["attach", "c", "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert "transient-nb: run run-0dead failed (error): eval_images=0: no images" in err
    assert "Summary" not in out and closed == [True]
