"""Tests for transient_nb.notebook.magics: ``%transient_cluster`` and ``%%transient_cluster``.

An in-process IPython shell runs the magics; widgets need no frontend (the ``comm`` package's
dummy comm). Clusters are real and small.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import fsspec
import pytest
from distributed.core import Status
from fsspec.implementations.memory import MemoryFileSystem
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from tests.conftest import of_kind, wait_for_sync
from transient_nb import TransientCluster
from transient_nb.deploy import registry
from transient_nb.notebook.magics import SUBCOMMANDS, TransientMagics
from transient_nb.notebook.views.panel import ClusterPanel
from transient_nb.notebook.views.progress import RunPanel
from transient_nb.notebook.views.status import ClusterStatus


@pytest.fixture
def ip() -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "transient_nb")
    yield shell
    magics: TransientMagics = shell.magics_manager.registry["TransientMagics"]
    for cluster in list(magics.clusters.values()):
        if getattr(cluster, "detached", False) and cluster.status.name == "running":
            cluster.shutdown()  # a head left by a failed test: closing the handle would not end it
        else:
            cluster.close()
    magics.clusters.clear()
    magics.cluster = None
    for name in ("cluster", "run", "c2", *_notebook_objects()):
        shell.user_ns.pop(name, None)
    shell.run_line_magic("unload_ext", "transient_nb")


def magic(ip: InteractiveShell, line: str) -> Any:
    return ip.run_line_magic("transient_cluster", line)


def printed(ip: InteractiveShell, line: str) -> str:
    """What the magic ``line`` prints."""
    with capture_output() as out:
        magic(ip, line)
    return out.stdout


def widgets_shown(captured: Any) -> list[Any]:
    return [o for o in captured.outputs if "application/vnd.jupyter.widget-view+json" in o.data]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("", "Give a subcommand: %transient_cluster up"),
        ("launch", "Unknown subcommand 'launch': type one of up, scale"),
        ("scale 3", "No running cluster for `scale`: start one with %transient_cluster up"),
        ("preempt", "No running cluster for `preempt`"),
        ("status", "No running cluster for `status`"),
        ("train --steps 10", "No running cluster for `train`"),
        ("down", "No running cluster for `down`"),
        ("scale-ps 2", "No running cluster for `scale-ps`"),
        ("move-ps us-east1-c", "No running cluster for `move-ps`"),
        ("connect nope", "No transient cluster named 'nope' is registered"),
        # The API's ValueErrors, re-raised with their message.
        ("up --gpu h9000", "Unknown GPU type 'h9000'"),
        ("up --preemption sometimes", "sometimes"),
        ("up --notice=-5s", "notice='-5s' must be a non-negative duration"),
        ("up --name Demo_1", "Cluster name 'Demo_1' is not allowed"),
        # Issue 11: limits refused before anything starts.
        ("up --workers 1000", "1000 workers is above max_workers=64"),
        ("up --workers 3 --max-workers 2", "3 workers is above max_workers=2"),
        ("up --workers 4 --max-hourly-cost 0.5", "above max_hourly_cost=$0.50/h"),
        ("up --backend gce --time-scale 120", "time_scale=120 is only for the local backend"),
        # Mixed GPU types: every mistake names its value, before anything starts.
        ("up --workers k80=2,v100=1", "Unknown GPU type 'k80' in us-central1-a"),  # gce-2025
        ("up --workers t4=1,h9000=1", "Unknown GPU type 'h9000'"),
        ("up --workers t4=1,v100=1 --gpu l4", "gpu='l4' is not in workers='t4=1,v100=1'"),
    ],
)
def test_mistakes_say_what_to_type(ip: InteractiveShell, line: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        magic(ip, line)
    assert message in str(info.value)
    assert not TransientCluster._instances or all(
        c.status != Status.running for c in TransientCluster._instances
    )


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("cluster:\n  workers: 0", "cluster: workers=0 must be a whole number of at least 1"),
        ("cluster: {}\ntrain:\n  model: vgg", "Unknown model 'vgg': use one of"),
        ("cluster: {}\ntrain:\n  data: mnist", "train: "),
        # Issue 11: the whole train: block is checked before the cluster is created.
        ("cluster: {}\ntrain:\n  steps: 0", "train: steps=0"),
        ("cluster: {}\ntrain:\n  lr: -1", "train: lr=-1"),
        ("cluster: {}\ntrain:\n  batch_size: 0", "train: batch_size=0"),
        ("cluster: {}\ntrain:\n  shards: 0", "train: shards=0"),
        ("cluster: {}\ntrain:\n  target_accuracy: 2", "train: target_accuracy=2"),
        ("cluster: {}\ntrain:\n  budget: -1", "train: budget=-1"),
        ("cluster:\n  workers: 1000", "1000 workers is above max_workers=64"),
        # Your own model and data: import paths and the notebook's names, pre-flighted.
        (
            "cluster: {}\ntrain:\n  model: nosuch.mod:net",
            "train: model='nosuch.mod:net': module 'nosuch.mod' cannot be imported",
        ),
        (
            "cluster: {}\ntrain:\n  model: bad_net\n  data: pair\n  loss: mse",
            "<lambda> returned a str, not an nn.Module: the factory must return the network",
        ),
        (
            "cluster: {}\ntrain:\n  model: wide_net\n  data: pair\n  loss: mse\n  batch_size: 16",
            "train: the model returns shape (16, 3) but the targets have shape (16, 1): with "
            "loss='mse' they must match",
        ),
        ("cluster: {}\ntrain:\n  metrics: auc", "train: metric 'auc': unknown built-in 'auc'"),
    ],
)
def test_cell_mistakes(ip: InteractiveShell, cell: str, message: str) -> None:
    ip.user_ns.update(_notebook_objects())
    before = len(registry.entries())
    with pytest.raises(UsageError) as info:
        ip.run_cell_magic("transient_cluster", "", cell)
    assert message in str(info.value)
    assert len(registry.entries()) == before  # nothing was started


class ReadOnlyFS(MemoryFileSystem):
    """An fsspec filesystem that refuses writes, as a bucket without write permission does."""

    protocol = "readonly-magics"

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" not in mode:
            raise PermissionError(f"403: no write permission on {path}")
        return super()._open(path, mode, **kwargs)


@pytest.fixture
def fake_gce(tmp_path: Path) -> Iterator[Any]:
    """tests/backends/gce/fake_gce.py's Compute Engine, as the configured GCE endpoint."""
    from tests.backends.gce.fake_gce import FakeGCE

    fake = FakeGCE(str(tmp_path / "vms"), project="test-project")
    settings = {
        "transient.gce.api-endpoint": fake.url,
        "transient.gce.project": fake.project,
        "transient.gce.scheduler-host": "127.0.0.1",
        "transient.gce.python": sys.executable,
        "transient.gce.poll-interval": "0.1s",
        "transient.gce.operation-timeout": "30s",
    }
    try:
        with dask.config.set(settings):
            yield fake
    finally:
        fake.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (None, "train: checkpoint_url=None: on the gce backend the PS checkpoints must live"),
        ("/tmp/ckpt", "train: checkpoint_url='/tmp/ckpt': on the gce backend"),
        ("file:///tmp/ckpt", "train: checkpoint_url='file:///tmp/ckpt': on the gce backend"),
        ("readonly-magics://bucket/runs", "checkpoint_url='readonly-magics://bucket/runs' cannot"),
    ],
)
def test_a_gce_cell_checks_its_checkpoint_url_before_any_vm(
    fake_gce: Any, ip: InteractiveShell, url: str | None, message: str
) -> None:
    """Issue 11: a `backend: gce` cell whose `train:` block has no shared, writable
    checkpoint_url is refused before the cluster is created: no VM, no firewall, no API call."""
    fsspec.register_implementation(ReadOnlyFS.protocol, ReadOnlyFS, clobber=True)
    train_block = "  steps: 10\n" + (f"  checkpoint_url: {url}\n" if url else "")
    cell = (
        "cluster:\n  backend: gce\n  workers: 1\n  gpu: t4\n  zone: us-central1-a\n"
        "  detached: false\n"
        f"train:\n{train_block}"
    )
    magics: TransientMagics = ip.magics_manager.registry["TransientMagics"]
    before = len(registry.entries())
    with pytest.raises(UsageError) as info:
        ip.run_cell_magic("transient_cluster", "", cell)
    text = str(info.value)
    assert message in text
    # It says what to pass (the shape), or what to check (the probe).
    assert "gs://BUCKET/PREFIX" in text or "may write to it" in text
    assert fake_gce.requests == []  # not a single Compute Engine call, let alone an insert
    assert fake_gce.instance_names() == []
    assert len(registry.entries()) == before and magics.clusters == {}
    assert magics.cluster is None


def _notebook_objects() -> dict[str, Any]:
    """What a notebook's cells would define: models, a data pair, a metric."""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)
    return {
        "bad_net": lambda: "not a net",
        "wide_net": lambda: nn.Linear(4, 3),
        "small_net": lambda: nn.Linear(4, 1),
        "pair": (TensorDataset(x[:48], y[:48]), TensorDataset(x[48:], y[48:])),
        "mae": lambda out, t: float((out - t).abs().mean()),
    }


def test_save_and_estimate_need_no_cluster(ip: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="No training run in this kernel to save"):
        magic(ip, "save /tmp/x.pt")
    ip.user_ns.update(_notebook_objects())
    with pytest.raises(UsageError, match="'pair' is not a training run of this notebook"):
        magic(ip, "save /tmp/x.pt --run pair")
    est = magic(
        ip,
        "estimate --model small_net --data pair --loss mse --workers t4=2 --steps 100 "
        "--batch-size 16",
    )
    assert est.parameters == 5 and est.frame["workers"].tolist() == [1, 2]
    with pytest.raises(UsageError, match=r"estimate: .*No peak throughput for GPU type 'x9'"):
        magic(ip, "estimate --model small_net --data pair --loss mse --workers x9=1")


@pytest.mark.slow
def test_train_takes_the_notebooks_names_and_save_writes_the_weights(
    ip: InteractiveShell, tmp_path: Path
) -> None:
    import torch

    ip.user_ns.update(_notebook_objects())
    with capture_output():
        magic(ip, "up --workers 1 --provisioning-delay 0s --preemption none --name own-demo")
        run = magic(
            ip,
            # Steps enough that only the stop condition ends it, however fast the host trains
            # (200 were done before the first evaluation on a loaded machine).
            "train --model small_net --data pair --loss mse --metrics mae,mse --stop-at mae=50 "
            "--steps 100000 --batch-size 16 --eval-every 10 --wait --as run",
        )
    assert ip.user_ns["run"] is run and run.reason == "metric" and run.stopped_by == "mae<=50"
    assert set(run.summary()["metrics"]) == {"mae", "mse"}
    with capture_output() as saved:
        magic(ip, f"save {tmp_path / 'w.pt'}")
    assert f"Saved the trained weights of {run.id}" in saved.stdout
    net = torch.nn.Linear(4, 1)
    net.load_state_dict(torch.load(tmp_path / "w.pt"))
    assert torch.equal(net.weight, run.model().weight)
    with capture_output():
        magic(ip, "down")


def test_help_is_the_docstring_with_every_subcommand(ip: InteractiveShell) -> None:
    doc = ip.find_line_magic("transient_cluster").__doc__
    for name in SUBCOMMANDS:
        assert f"%transient_cluster {name}" in doc
    for option in ("--workers", "--preemption", "--time-scale", "--fallback-zones", "--no-notice"):
        assert option in doc
    assert "cluster:" in doc and "train:" in doc


def test_clusters_and_runs_display_as_panels(ip: InteractiveShell) -> None:
    formatter = ip.display_formatter.ipython_display_formatter
    assert formatter.lookup_by_type(TransientCluster) is not None
    assert ("transient_nb.training.run", "TrainingRun") in formatter.deferred_printers
    ip.run_line_magic("unload_ext", "transient_nb")
    with pytest.raises(KeyError):
        formatter.lookup_by_type(TransientCluster)
    ip.run_line_magic("load_ext", "transient_nb")


@pytest.mark.slow
def test_a_cluster_session(ip: InteractiveShell) -> None:
    with capture_output() as captured:
        cluster = magic(
            ip,
            "up --workers 1 --gpu t4 --spot --zone us-central1-a --preemption none "
            "--provisioning-delay 0s --notice 1s --prices gce-2025 --time-scale 2 "
            "--fallback-zones us-central1-b,us-central1-c,us-east1-c --name magic-demo --as c2",
        )
    assert isinstance(cluster, TransientCluster)
    assert ip.user_ns["c2"] is cluster
    assert (cluster.name, cluster.time_scale, cluster.notice_s) == ("magic-demo", 2.0, 1.0)
    assert cluster.placement is not None
    shown = widgets_shown(captured)
    assert len(shown) == 1 and "ClusterPanel magic-demo" in shown[0].data["text/plain"]
    # Returned as the cell's result, the cluster is not displayed a second time...
    with capture_output() as again:
        ip.display_formatter.format(cluster)
    assert not widgets_shown(again) or ip.execution_count is None
    # ...but displaying it later shows its (one, live) panel.
    ip.execution_count += 1
    with capture_output() as later:
        ip.display_formatter.format(cluster)
    assert "ClusterPanel magic-demo" in later.outputs[0].data["text/plain"]

    cluster.wait_for_workers(1, timeout=120)
    out = printed(ip, "scale 2")
    assert "scaling to 2 GPU workers" in out
    cluster.wait_for_workers(2, timeout=120)

    with pytest.raises(UsageError, match=r"scale_ps\(5\): at most 4 PS hosts"):
        magic(ip, "scale-ps 5")
    out = printed(ip, "scale-ps 2")
    assert "magic-demo: keeping 2 PS host(s), one PS shard each." in out
    wait_for_sync(lambda: of_kind(cluster.monitor.events, "joined", worker="ps-1"), 60)
    assert cluster.ps_hosts == 2
    assert of_kind(cluster.monitor.events, "ps-hosts", hosts=2, hosts_from=1)

    # The PS hosts move to the fallback zone in another region; a zone the cluster may not use,
    # or a second move while one is under way, is refused with what to do.
    with pytest.raises(UsageError, match=r"move_ps\('nowhere-1a'\): not a zone this cluster may"):
        magic(ip, "move-ps nowhere-1a")
    out = printed(ip, "move-ps us-east1-c --reason closer")
    assert "magic-demo: moving the PS to us-east1-c." in out
    with pytest.raises(UsageError, match="the PS is being moved to us-east1-c already"):
        magic(ip, "move-ps us-central1-a")
    move = wait_for_sync(lambda: of_kind(cluster.monitor.events, "ps-move", zone="us-east1-c"), 30)
    assert move[0]["zone_from"] == "us-central1-a" and move[0]["reason"] == "closer"
    wait_for_sync(lambda: cluster.ps_move_zone is None, 120)
    assert cluster.placement.ps_zone == "us-east1-c"

    out = printed(ip, "preempt w-1 --no-notice")
    assert "preempting w-1 (without notice)" in out
    gone = wait_for_sync(lambda: of_kind(cluster.monitor.events, "preempted", worker="w-1"), 60)
    assert gone[0]["notice"] is False and gone[0]["source"] == "manual"
    with pytest.raises(UsageError, match="No preemptible worker named 'w-99'"):
        magic(ip, "preempt w-99")
    with pytest.raises(UsageError, match="Cannot preempt 0 workers"):
        magic(ip, "preempt 0")
    out = printed(ip, "preempt 1")
    assert "(with the notice)" in out
    wait_for_sync(lambda: len(of_kind(cluster.monitor.events, "notice")) == 1, 60)

    # An on-demand share: bad counts are refused with the value named, before anything changes.
    for line, words in (
        ("scale 2 --on-demand 3", "3 t4 on demand, but the mix keeps 2 t4"),
        ("scale 2 --on-demand h9000=1", "1 h9000 on demand, but the mix keeps 0 h9000"),
    ):
        with pytest.raises(UsageError, match=words):
            magic(ip, line)
    assert cluster.on_demand == {} and cluster.mix == {"t4": 2}
    out = printed(ip, "scale 2 --on-demand 1")
    assert "magic-demo: scaling to 2 GPU workers, 1 on demand." in out
    assert cluster.on_demand == {"t4": 1}
    wait_for_sync(
        lambda: of_kind(cluster.monitor.events, "requested", role="worker", spot=False), 60
    )

    status = magic(ip, "status")
    assert isinstance(status, ClusterStatus)
    assert "magic-demo: $" in repr(status) and "saved" in repr(status)
    assert {"ps", "worker"} <= set(status.table["role"])

    listing = magic(ip, "list")
    assert list(listing.index) == ["magic-demo"]
    assert listing.loc["magic-demo", "owner"] == "this kernel"

    out = printed(ip, "down")
    assert "Cluster magic-demo is down: $" in out and "saved" in out
    assert cluster.status == Status.closed
    with pytest.raises(UsageError, match="No running cluster for `status`"):
        magic(ip, "status")
    assert magic(ip, "list") is None


@pytest.mark.slow
def test_connect_subcommand(ip: InteractiveShell) -> None:
    with TransientCluster(workers=1, provisioning_delay=0, notice="1s", name="elsewhere") as other:
        with capture_output() as captured:
            handle = magic(ip, "connect elsewhere --as cluster")
        assert handle is other  # this process owns it: the cluster itself
        assert ip.user_ns["cluster"] is other
        assert "ClusterPanel elsewhere" in widgets_shown(captured)[0].data["text/plain"]
        magic(ip, "status")


@pytest.mark.slow
def test_one_cell_experiment(ip: InteractiveShell) -> None:
    cell = """
cluster:
  workers: 1
  provisioning-delay: 0s
  notice: 1s
  name: cell-demo
train:
  model: resnet8
  data: digits
  steps: 30
  batch_size: 16
  eval_every: 15
  wait: true
"""
    with capture_output() as captured:
        run = ip.run_cell_magic("transient_cluster", "--run-as run", cell)
    assert ip.user_ns["run"] is run and ip.user_ns["cluster"] is run.cluster
    assert run.done and run.summary()["steps"] >= 30
    texts = [o.data["text/plain"] for o in widgets_shown(captured)]
    # The run's panel (which shows the cluster too) and the live dashboard.
    assert len(texts) == 2 and texts[0].startswith("<ClusterPanel cell-demo")
    assert texts[1].startswith("BokehModel(")
    panel = next(iter(v for v in TransientMagics_views(ip) if isinstance(v, ClusterPanel)))
    panel.update(force=True)
    assert panel.progress.value == panel.progress.max == 30
    assert "finished" in panel.run_info.value
    with capture_output():
        magic(ip, "down")


@pytest.mark.slow
def test_train_shows_the_run_not_a_second_cluster_panel(ip: InteractiveShell) -> None:
    with capture_output() as up:
        magic(ip, "up --workers 1 --provisioning-delay 0s --preemption none --name train-demo")
    assert [o.data["text/plain"][:24] for o in widgets_shown(up)] == ["<ClusterPanel train-demo"]
    with capture_output() as captured:
        run = magic(
            ip,
            "train --model resnet8 --data digits --steps 20 --batch-size 16 --eval-every 10 "
            "--wait --as run",
        )
    texts = [o.data["text/plain"] for o in widgets_shown(captured)]
    # The run's progress and the live dashboard; the cluster's panel stays the one above.
    assert len(texts) == 2 and texts[0].startswith(f"<RunPanel {run.id}")
    assert texts[1].startswith("BokehModel(")
    assert not any("ClusterPanel" in t for t in texts)
    view = next(v for v in TransientMagics_views(ip) if isinstance(v, RunPanel))
    view.update(force=True)
    assert view.progress.value == view.progress.max == 20
    assert "finished" in view.run_info.value
    # Displaying the run later shows the same progress view, not a cluster panel.
    ip.execution_count += 1
    with capture_output() as later:
        ip.display_formatter.format(run)
    assert later.outputs[0].data["text/plain"].startswith(f"<RunPanel {run.id}")
    with capture_output():
        magic(ip, "down")


def TransientMagics_views(ip: InteractiveShell) -> list[Any]:
    magics: TransientMagics = ip.magics_manager.registry["TransientMagics"]
    return [v for views in magics.views.values() for v in views]


@pytest.mark.slow
def test_a_detached_session(ip: InteractiveShell) -> None:
    import psutil

    from transient_nb.deploy.remote import RemoteCluster

    with capture_output():
        cluster = magic(
            ip, "up --detach --workers 1 --provisioning-delay 0s --notice 1s --name magic-head"
        )
    assert isinstance(cluster, RemoteCluster) and cluster.detached
    head = int(cluster.entry["pid"])
    assert head != os.getpid()
    with capture_output() as captured:
        run = magic(ip, "train --model resnet8 --data digits --steps 40 --batch-size 16 --wait")
    assert ip.user_ns["run"] is run and run.reason == "steps" and run.step >= 40
    texts = [o.data["text/plain"] for o in widgets_shown(captured)]
    assert texts[0].startswith("<RunPanel") and texts[1].startswith("BokehModel(")
    with capture_output() as captured:
        magic(ip, "down")
    assert "is down" in captured.stdout
    psutil.Process(head).wait(timeout=120) if psutil.pid_exists(head) else None
    assert not psutil.pid_exists(head) or psutil.Process(head).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
def test_a_mixed_cluster_from_the_magic(ip: InteractiveShell) -> None:
    with capture_output():
        cluster = magic(
            ip,
            "up --workers k80=1,v100=1 --prices paper-2019 --preemption none "
            "--provisioning-delay 0s --notice 1s --name magic-mix --no-panel",
        )
    assert cluster.mix == {"k80": 1, "v100": 1}
    cluster.wait_for_workers(2, timeout=120)
    with pytest.raises(UsageError, match=r"scale\(3\): this cluster mixes k80=1,v100=1"):
        magic(ip, "scale 3")
    out = printed(ip, "scale 2 --gpu v100")
    assert "scaling to 2 v100 GPU workers" in out
    cluster.wait_for_workers(3, timeout=120)
    assert cluster.mix == {"k80": 1, "v100": 2}
    out = printed(ip, "scale k80=2,v100=1")
    assert "scaling to workers k80=2,v100=1" in out
    assert cluster.mix == {"k80": 2, "v100": 1}
    status = magic(ip, "status")
    workers = status.table[status.table["role"] == "worker"]
    assert {"k80", "v100"} <= set(workers["gpu"])
    with capture_output():
        magic(ip, "down")


def test_adapt_turns_the_policy_on_and_off_and_refuses_bad_goals(
    ip: InteractiveShell, tmp_path: Path
) -> None:
    with capture_output():
        cluster = magic(
            ip,
            "up --workers 1 --preemption none --provisioning-delay 0s --name magic-adapt "
            "--no-panel",
        )
    try:
        for bad, word in [
            ("adapt fastest", "goal 'fastest': write deadline:DURATION"),
            ("adapt deadline:soon", "needs deadline= a positive duration such as '2h', not 'soon'"),
            ("adapt budget:lots", "goal 'budget:lots'"),
        ]:
            with pytest.raises(UsageError, match=word):
                magic(ip, bad)
            assert getattr(cluster, "_policy", None) is None  # nothing was started
        out = printed(ip, "adapt deadline:2h --gpus t4,v100 --max-workers 3 --interval 5s")
        assert "policy on, goal deadline:2h" in out
        policy = cluster._policy
        assert policy.goal == "deadline" and policy.deadline_s == 7200
        assert policy.max_workers == 3 and policy.interval_s == 5
        # Each type Spot and on demand (the policy may run some on demand), unless --spot-only.
        assert sorted((k.gpu, k.spot) for k in policy.planner.kinds) == [
            ("t4", False),
            ("t4", True),
            ("v100", False),
            ("v100", True),
        ]
        printed(ip, "adapt cost-per-step --gpus t4 --spot-only")
        assert [(k.gpu, k.spot) for k in cluster._policy.planner.kinds] == [("t4", True)]
        assert cluster._policy.memory is None  # none configured
        memory = tmp_path / "memory.json"
        printed(ip, f"adapt cost-per-step --gpus t4 --memory {memory}")
        assert cluster._policy.memory.path == memory
        assert cluster._policy.memory.scope == "local"
        # --memory's old flag, for one release: it warns, and names the new one.
        with pytest.warns(DeprecationWarning, match="--history is now --memory"):
            printed(ip, f"adapt cost-per-step --gpus t4 --history {memory}")
        assert cluster._policy.memory.path == memory
        out = printed(ip, "adapt off")
        assert "policy off" in out and cluster._policy is None
    finally:
        with capture_output():
            magic(ip, "down")
