"""Detached clusters: a head process owns the cluster and its runs (training/remote_run.py is
the handle of a run in a head), and outlives the kernel.

Real processes throughout: the head (``python -m transient_nb.deploy.head``), its worker processes, a
real IPython kernel that is SIGKILLed, the ``transient-nb`` CLI in a subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import dask.config
import psutil
import pytest
from jupyter_client.manager import KernelManager

from tests.conftest import PACED, wait_for_sync
from transient_nb import TransientCluster, connect, train
from transient_nb.catalog.prices import PriceCatalog
from transient_nb.deploy import registry
from transient_nb.deploy.remote import RemoteCluster
from transient_nb.eventlog.records import read_run_record

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FAST = {"preemption": "none", "provisioning_delay": "1s"}
TINY_RUN = {"model": "resnet8", "data": "digits", "eval_images": 200}


def _gone(pids: list[int]) -> bool:
    return not any(
        psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids
    )


def _family(pid: int) -> list[int]:
    proc = psutil.Process(pid)
    return [pid, *(c.pid for c in proc.children(recursive=True))]


def _kinds(events: list[dict[str, Any]], run_id: str | None = None) -> list[str]:
    return [e["kind"] for e in events if run_id is None or e.get("run") in (None, run_id)]


def _kernel(env: dict[str, str], cwd: Path) -> tuple[KernelManager, Any]:
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env, cwd=str(cwd))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    return km, kc


def _run_cell(kc: Any, code: str, timeout: float = 300) -> str:
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    text = "".join(out)
    assert reply["content"]["status"] == "ok", text
    return text


def _value(text: str, key: str) -> str:
    line = next(ln for ln in text.splitlines() if ln.startswith(key + " "))
    return line.split(" ", 1)[1].strip()


def test_a_detached_run_outlives_the_kernel_and_down_leaves_nothing(
    tmp_path: Path, kernel_env: dict[str, str]
) -> None:
    name = "outlives-1"
    km, kc = _kernel(kernel_env, tmp_path)
    try:
        text = _run_cell(
            kc,
            "import os\n"
            "from transient_nb import TransientCluster, train\n"
            f"cluster = TransientCluster(workers=2, detached=True, name={name!r}, "
            "preemption='none', provisioning_delay='1s')\n"
            "cluster.wait_for_workers(2, timeout=180)\n"
            "run = train(cluster, model='resnet8', data='digits', steps=100000, "
            f"eval_images=200, checkpoint_every=500, emulate={PACED!r})\n"
            "print('KERNEL', os.getpid())\n"
            "print('RUN', run.id)\n",
        )
        kernel_pid, run_id = int(_value(text, "KERNEL")), _value(text, "RUN")
        os.kill(kernel_pid, signal.SIGKILL)
        wait_for_sync(lambda: _gone([kernel_pid]), 60, "the kernel did not die")
    finally:
        kc.stop_channels()
        km.cleanup_resources()

    cluster = connect(name)
    assert isinstance(cluster, RemoteCluster) and cluster.detached
    head_pid = int(cluster.entry["pid"])
    assert head_pid != kernel_pid
    run = cluster.run
    assert run is not None and run.id == run_id
    # No kernel owns it: the steps keep increasing...
    before = wait_for_sync(lambda: run.step, 120, "the run never reported a step")
    wait_for_sync(lambda: run.step > before + 50, 120, "the run stopped with its kernel")

    # ... and a preempted worker is replaced by the head.
    def joined() -> set[str]:
        return {
            str(e["worker"])
            for e in cluster.monitor.events
            if e.get("kind") == "joined" and e.get("role") == "worker"
        }

    first = joined()
    cluster.preempt(sorted(first)[0], notice=False)
    wait_for_sync(lambda: joined() - first, 120, "no replacement joined")
    family = _family(head_pid)
    assert len(family) >= 3  # the head and its worker processes
    cluster.close()

    # A fresh kernel sees the whole history and a live dashboard.
    km2, kc2 = _kernel(kernel_env, tmp_path)
    try:
        text = _run_cell(
            kc2,
            "from transient_nb import connect\n"
            "from transient_nb.notebook.views.dashboard import Dashboard\n"
            f"c = connect({name!r})\n"
            "r = c.run\n"
            "h = r.history\n"
            "d = Dashboard(c, r)\n"
            "print('RUN', r.id)\n"
            "print('ROWS', len(h))\n"
            "print('FIRST', int(h['step'].iloc[0]))\n"
            "print('DASH', len(d.events))\n"
            "d.stop() if hasattr(d, 'stop') else None\n"
            "c.close()\n",
        )
    finally:
        kc2.stop_channels()
        km2.shutdown_kernel(now=True)
    assert _value(text, "RUN") == run_id
    assert int(_value(text, "ROWS")) >= 2
    assert int(_value(text, "FIRST")) < before + 50  # from the start, not from the reconnect
    assert int(_value(text, "DASH")) > 0

    # `down` from the CLI stops the run and the cluster; nothing is left running.
    done = subprocess.run(
        [sys.executable, "-m", "transient_nb.cli", "down", name],
        env=kernel_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    wait_for_sync(lambda: _gone(family), 60, "processes of the cluster outlived `down`")
    assert registry.entries() == []
    record = read_run_record(next((tmp_path / "runs").glob(f"{name}-*/events.jsonl")))
    kinds = _kinds(record, run_id)
    assert kinds.index("train-finished") < kinds.index("closed")
    finished = next(e for e in record if e["kind"] == "train-finished")
    assert finished["reason"] == "stopped"


def test_a_killed_head_leaves_its_record_and_resume_goes_on(tmp_path: Path) -> None:
    cluster = TransientCluster(workers=2, detached=True, **FAST)
    run = train(cluster, steps=600, checkpoint_every=100, **TINY_RUN)
    record_path = cluster.entry["run_record"]
    wait_for_sync(
        lambda: any(
            e.get("kind") == "checkpoint" and e.get("run") == run.id and e["step"] >= 200
            for e in cluster.monitor.events
        ),
        180,
        "no checkpoint past step 200",
    )
    family = _family(int(cluster.entry["pid"]))
    os.kill(family[0], signal.SIGKILL)
    # The workers leave with their head; the record stays, whole, on disk.
    wait_for_sync(lambda: _gone(family), 60, "workers outlived their head")
    cluster.close()
    with pytest.raises(ValueError, match="stale"):
        connect(cluster.name)
    earlier = read_run_record(record_path)
    checkpoints = [
        e["step"] for e in earlier if e["kind"] == "checkpoint" and e.get("run") == run.id
    ]
    last_step = max(
        e["step"]
        for e in earlier
        if e.get("run") == run.id and e["kind"] in ("metrics", "checkpoint")
    )
    assert "train-finished" not in _kinds(earlier, run.id)

    with TransientCluster(workers=2, **FAST) as again:
        resumed = train(again, resume=run.id)
        assert resumed.id == run.id
        resumed.wait(timeout=300)
        started = next(e for e in resumed.events() if e["kind"] == "train-started")
        summary = resumed.summary()
        history = resumed.history
    # It went on from the newest complete checkpoint the record names, and says what was lost.
    assert started["resumed_step"] == max(checkpoints)
    assert started["steps_lost"] == last_step - max(checkpoints)
    assert started["resumed_from"] == record_path
    assert summary["steps"] >= 600 and summary["reason"] == "steps"
    assert summary["attempts"] == 2
    assert summary["steps_lost"] >= started["steps_lost"]
    # One run: the earlier attempt's rows first, time and money going on from there.
    assert history["step"].iloc[0] < max(checkpoints) <= history["step"].iloc[-1]
    assert history["time"].is_monotonic_increasing
    assert history["cost"].is_monotonic_increasing


def test_a_deadline_stops_a_detached_run_with_no_client(tmp_path: Path) -> None:
    cluster = TransientCluster(workers=1, detached=True, deadline="40s", **FAST)
    run = train(cluster, steps=1_000_000, emulate=PACED, **TINY_RUN)
    wait_for_sync(lambda: run.step > 0, 120, "the run never started")
    head = psutil.Process(int(cluster.entry["pid"]))
    record_path = cluster.entry["run_record"]
    cluster.close()  # no client from here on
    head.wait(timeout=180)
    kinds = _kinds(read_run_record(record_path), run.id)
    assert kinds.index("limit-reached") < kinds.index("train-finished") < kinds.index("closed")
    assert registry.entries() == []


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"workers": 0}, "workers=0"),
        ({"gpu": "h900"}, "h900"),
        ({"prices": PriceCatalog.load("paper-2019")}, "prices="),
    ],
)
def test_bad_input_to_a_detached_cluster_starts_nothing(kwargs: dict[str, Any], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        TransientCluster(detached=True, **kwargs)
    assert registry.entries() == []
    # Refused by the client itself: no head process was started to refuse it (none wrote its
    # spec or its log).
    heads = Path(dask.config.get("transient.run-dir")) / "heads"
    assert not heads.exists() or not list(heads.iterdir())


def test_train_on_a_detached_cluster_checks_its_input_before_the_head_starts_anything(
    tmp_path: Path,
) -> None:
    cluster = TransientCluster(workers=1, detached=True, **FAST)
    try:
        with pytest.raises(ValueError, match="eval_images=0"):
            train(cluster, model="resnet8", data="digits", eval_images=0)
        with pytest.raises(ValueError, match="no run record"):
            train(cluster, resume="run-00000000")
        assert cluster.runs() == []
    finally:
        cluster.shutdown()


def test_shutdown_succeeds_when_the_head_closes_before_its_answer_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # CI found this race: the head answers "stop" and closes its scheduler before the client's
    # next read of the event log, which then fails to connect. Reading slowly makes it certain.
    from transient_nb.deploy import remote as connect_module

    cluster = TransientCluster(workers=1, detached=True, **FAST)
    name, head_pid = cluster.name, int(cluster.entry["pid"])
    monkeypatch.setattr(connect_module, "POLL_S", 8.0)
    answer = cluster.shutdown()
    assert answer["action"] == "stop" and answer["closed"] is True
    psutil.Process(head_pid).wait(timeout=60) if psutil.pid_exists(head_pid) else None
    assert all(e["name"] != name or e["stale"] for e in registry.entries())


def test_shutdown_still_stops_the_head_after_the_mirror_gave_up() -> None:
    # Under load the handle's event-log mirror can give up (MAX_FAILURES slow reads) and mark the
    # handle closed; shutdown() must still stop the head, not leave it running (a CI leak).
    from distributed.core import Status

    cluster = TransientCluster(workers=1, detached=True, **FAST)
    cluster.status = Status.closed  # what the mirror does when it gives up
    answer = cluster.shutdown()
    # The head answered and its cluster is closed (its registry entry is gone).
    assert answer["action"] == "stop" and answer["closed"] is True
    assert all(e["name"] != cluster.name or e["stale"] for e in registry.entries())


def test_a_model_defined_in_the_clients_notebook_trains_in_the_head_and_comes_back(
    tmp_path: Path, kernel_env: dict[str, str]
) -> None:
    """The client's ``__main__`` (a kernel's cell) defines the model, the data and a metric; the
    detached cluster's head rebuilds them from the control request and trains; another process
    then gets the trained module back from the head: ``connect(NAME).run.model()``."""
    import torch

    from transient_nb import load_state_dict

    name = "own-model-1"
    km, kc = _kernel(kernel_env, tmp_path)
    try:
        text = _run_cell(
            kc,
            "import torch\n"
            "from torch import nn\n"
            "from torch.utils.data import TensorDataset\n"
            "from transient_nb import TransientCluster, train\n"
            "class Net(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.body = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))\n"
            "    def forward(self, x):\n"
            "        return self.body(x)\n"
            "g = torch.Generator().manual_seed(0)\n"
            "x = torch.randn(400, 4, generator=g)\n"
            "y = (x @ torch.tensor([1.0, -2.0, 0.5, 0.0]))[:, None]\n"
            "pair = (TensorDataset(x[:320], y[:320]), TensorDataset(x[320:], y[320:]))\n"
            "def mae(out, t):\n"
            "    return float((out - t).abs().mean())\n"
            f"cluster = TransientCluster(workers=2, detached=True, name={name!r}, "
            "preemption='none', provisioning_delay='1s')\n"
            "run = train(cluster, model=Net, data=pair, loss='mse', metrics={'mae': mae}, "
            "optimizer=lambda p: torch.optim.Adam(p, lr=1e-2), steps=300, batch_size=32, "
            "eval_every=100)\n"
            "run.wait(timeout=400)\n"
            "print('RUN', run.id)\n"
            "print('MAE', run.summary()['metrics']['mae'])\n"
            "cluster.close()\n",
            timeout=600,
        )
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    run_id, mae = _value(text, "RUN"), float(_value(text, "MAE"))
    assert mae < 0.5  # learned (the targets' spread is about 2.3)
    cluster = connect(name)
    try:
        run = cluster.run
        assert run is not None and run.id == run_id and run.model_name == "Net"
        model = run.model()  # the class came from the kernel's __main__, through the head
        assert type(model).__name__ == "Net" and isinstance(model, torch.nn.Module)
        assert not model.training
        final = load_state_dict(run_id)  # from the run's checkpoints, here
        state = model.state_dict()
        assert list(state) == list(final)
        assert all(torch.equal(state[k], final[k]) for k in final)
        assert all(torch.equal(v, final[k]) for k, v in run.state_dict().items())
        g = torch.Generator().manual_seed(0)
        x = torch.randn(400, 4, generator=g)
        y = (x @ torch.tensor([1.0, -2.0, 0.5, 0.0]))[:, None]
        with torch.no_grad():
            assert float((model(x[320:]) - y[320:]).abs().mean()) == pytest.approx(mae, rel=0.2)
    finally:
        cluster.shutdown()
    assert registry.entries() == []


def test_the_export_rpc_answers_the_clusters_client_only() -> None:
    import threading
    from types import SimpleNamespace

    from transient_nb.backends.tls import CLIENT_CN
    from transient_nb.deploy.head import Head

    head = Head.__new__(Head)  # its handlers alone: no cluster behind it
    head.runs, head._lock = {}, threading.Lock()

    def comm(cn: str, role: str) -> Any:
        subject = ((("commonName", cn),), (("organizationalUnitName", role),))
        return SimpleNamespace(extra_info={"peercert": {"subject": subject}})

    with pytest.raises(PermissionError, match="transient_export is for the cluster's client"):
        head._export(comm("w-0", "worker"), run="run-00000001")  # a worker's certificate
    with pytest.raises(ValueError, match=r"No run 'run-00000001' on this cluster \(runs: none\)"):
        head._export(comm(CLIENT_CN, "client"), run="run-00000001")
