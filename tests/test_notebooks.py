"""Execute the notebooks headless (nbclient, a real ipykernel kernel) and check their outputs.

Each notebook runs top to bottom in a fresh kernel whose run records, cluster registry, IPython and
Jupyter folders all point into the test's temporary folder. The checks read what the cells
printed and displayed (the notebooks tag the cells that matter), not only that they ran.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from transient_nb.eventlog.records import read_run_record

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
WIDGET = "application/vnd.jupyter.widget-view+json"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def execute(name: str, tmp_path: Path, env: dict[str, str]) -> Any:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute(env=env)
    return nb


def cell(nb: Any, tag: str) -> Any:
    return next(c for c in nb.cells if tag in c.metadata.get("tags", []))


def stdout(c: Any) -> str:
    return "".join(o.text for o in c.outputs if o.output_type == "stream" and o.name == "stdout")


def shown(c: Any) -> list[dict[str, Any]]:
    return [o.data for o in c.outputs if o.output_type in ("display_data", "execute_result")]


def no_errors(nb: Any) -> None:
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors, errors


class _Table(HTMLParser):
    """The rows of the first HTML table (enough for a pandas DataFrame's ``to_html``)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def html_table(html: str) -> list[dict[str, str]]:
    parser = _Table()
    parser.feed(html)
    header, *body = [r for r in parser.rows if r]
    # pandas puts the index name on a row of its own, with empty cells: not a data row.
    return [dict(zip(header, r, strict=True)) for r in body if len(r) == len(header) and any(r[1:])]


def test_quickstart(tmp_path: Path, kernel_env: dict[str, str]) -> None:
    nb = execute("quickstart.ipynb", tmp_path, kernel_env)
    no_errors(nb)

    up = shown(cell(nb, "up"))
    assert any(WIDGET in d and d["text/plain"].startswith("<ClusterPanel quickstart") for d in up)

    train = shown(cell(nb, "train"))
    assert any("application/vnd.bokehjs_load.v0+json" in d for d in train)  # BokehJS, inline
    assert any(d.get("text/plain", "").startswith("BokehModel(") for d in train)
    # The run's progress, not a second copy of the cluster's panel (shown by `up`).
    assert any(d.get("text/plain", "").startswith("<RunPanel run-") for d in train)
    assert not any(d.get("text/plain", "").startswith("<ClusterPanel") for d in train)

    preempt = cell(nb, "preempt")
    assert "quickstart: preempting w-" in stdout(preempt)
    status = shown(preempt)[-1]["text/plain"]
    assert "saved" in status and "worker" in status

    summary = stdout(cell(nb, "run-summary"))
    m = re.search(r"steps reached: (\d+) of (\d+); test accuracy: ([\d.]+)%", summary)
    assert m, summary
    assert int(m.group(1)) >= int(m.group(2)) == 400
    assert float(m.group(3)) > 80
    assert int(re.search(r"preemptions survived: (\d+)", summary).group(1)) >= 1

    cost = stdout(cell(nb, "cost-summary"))
    saved = re.search(r"saved (\d+)%", cost)
    assert saved and int(saved.group(1)) > 0, cost

    assert "Cluster quickstart is down" in stdout(cell(nb, "down"))
    # Every cluster is closed: none is left in the registry.
    assert not list((tmp_path / "clusters").glob("*.json"))


# -- gce.ipynb, against the fake Compute Engine ----------------------------------------------------
def fake_gce_class() -> Any:
    """``FakeGCE`` of tests/backends/gce/fake_gce.py."""
    from tests.backends.gce.fake_gce import FakeGCE

    return FakeGCE


def instances(url: str, project: str, zones: list[str]) -> list[str]:
    """Names of the VMs the fake's REST API lists in ``zones`` (GCE's own instances.list)."""
    names = []
    for zone in zones:
        with urllib.request.urlopen(
            f"{url}/compute/v1/projects/{project}/zones/{zone}/instances", timeout=30
        ) as r:
            names += [i["name"] for i in json.load(r).get("items", [])]
    return names


def test_gce(tmp_path: Path, kernel_env: dict[str, str]) -> None:
    """gce.ipynb word for word, its GCE settings pointed at a fake Compute Engine whose VMs really
    run (their startup scripts start real Dask workers that join over TLS)."""
    project = "test-project"
    fake = fake_gce_class()(str(tmp_path / "vms"), project=project, run_vms=True, notice_s=2.0)
    try:
        env = {
            **kernel_env,
            # The switch: a plain-http endpoint makes the notebook pick its small experiment.
            "DASK_TRANSIENT__GCE__API_ENDPOINT": fake.url,
            "DASK_TRANSIENT__GCE__PROJECT": project,
            # The "VMs" run on this machine, with this Python, and the scheduler listens here.
            "DASK_TRANSIENT__GCE__SCHEDULER_HOST": "127.0.0.1",
            "DASK_TRANSIENT__GCE__PYTHON": sys.executable,
            "DASK_TRANSIENT__GCE__POLL_INTERVAL": "0.2s",
            "DASK_TRANSIENT__GCE__OPERATION_TIMEOUT": "60s",
            "DASK_TRANSIENT__GCE__DEATH_TIMEOUT": "60s",
            "DASK_TRANSIENT__NOTICE": "2s",
            # GCE's default is a detached cluster whose head is a VM: the client (this kernel)
            # reaches the head's scheduler through a firewall rule open to its own address.
            "DASK_TRANSIENT__GCE__CLIENT_CIDR": "127.0.0.1/32",
            # Every "VM" is a process of this machine: the notebook's local bucket folder is a
            # share every host mounts at the same path (else refused as host-local storage).
            "DASK_TRANSIENT__SHARED_PATHS": json.dumps([str(tmp_path / "bucket")]),
        }
        nb = execute("gce.ipynb", tmp_path, env)
        no_errors(nb)

        bucket = tmp_path / "bucket"
        setup = stdout(cell(nb, "setup"))
        assert setup.strip() == (
            f"project {project}; data digits; checkpoints under local://{bucket}/checkpoints"
        ), setup
        up = shown(cell(nb, "up"))
        assert any(d.get("text/plain", "").startswith("<ClusterPanel gce-demo") for d in up), up
        # The cluster is detached (its head is a VM): the kernel asks the head to preempt.
        assert "gce-demo: preempting 1 (with the notice)" in stdout(cell(nb, "preempt"))
        assert "gce-demo: scaling to 3 GPU workers." in stdout(cell(nb, "scale"))

        summary = stdout(cell(nb, "run-summary"))
        m = re.search(r"steps reached: (\d+) of (\d+); .* preemptions survived: (\d+)", summary)
        assert m, summary
        assert int(m.group(1)) >= int(m.group(2)) == 1000, summary
        assert int(m.group(3)) >= 1, summary
        # While the run trained: the notice, the VM stopped, a replacement asked for.
        # The head's record (the fake's VMs inherit this test's run folder through the
        # environment, as a VM image could set it).
        (record,) = (tmp_path / "runs").glob("gce-demo-*/events.jsonl")
        log = read_run_record(record)
        kinds = [e["kind"] for e in log]
        notice = next(i for i, e in enumerate(log) if e["kind"] == "notice")
        worker = log[notice]["worker"]
        preempted = next(
            i for i, e in enumerate(log) if e["kind"] == "preempted" and e["worker"] == worker
        )
        asked = next(
            i
            for i, e in enumerate(log)
            if e["kind"] == "replacement-requested" and e["worker"] == worker
        )
        finished = kinds.index("train-finished")
        assert notice < preempted < finished and notice < asked < finished, kinds

        cost = stdout(cell(nb, "cost-summary"))
        saved = re.search(r"saved (\d+)%", cost)
        assert saved and int(saved.group(1)) > 0, cost
        assert (tmp_path / "gce-demo-report.html").stat().st_size > 0
        # The run checkpointed to the "bucket" of the first cell, not to a literal placeholder.
        assert any((bucket / "checkpoints").iterdir())

        assert "Cluster gce-demo is down" in stdout(cell(nb, "down"))
        assert not list((tmp_path / "clusters").glob("*.json"))
        # Nothing is left behind in the "cloud": every VM the notebook created is deleted.
        zones = ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]
        assert instances(fake.url, project, zones) == []
    finally:
        fake.close()


def test_your_model(tmp_path: Path, kernel_env: dict[str, str]) -> None:
    """A model and data defined in the notebook's cells train through preemptions; the live
    figures draw the notebook's own metric; the trained model comes back and is used."""
    nb = execute("your_model.ipynb", tmp_path, kernel_env)
    no_errors(nb)
    assert "1680 training and 420 test windows of 32 tokens, 3 kinds" in stdout(cell(nb, "data"))

    estimate = shown(cell(nb, "estimate"))[-1]
    assert "GFLOP per sample" in estimate["text/html"]
    rows = html_table(estimate["text/html"].split("</p>", 1)[1])
    assert {r["gpu"] for r in rows} == {"t4", "v100"}
    assert all(float(r["steps_per_s"]) > 0 and r["source"] == "estimate" for r in rows)

    train = shown(cell(nb, "train"))
    assert any(d.get("text/plain", "").startswith("<ClusterPanel your-model") for d in train)
    assert any(d.get("text/plain", "").startswith("BokehModel(") for d in train)

    assert "your-model: preempting w-" in stdout(cell(nb, "preempt"))
    summary = stdout(cell(nb, "summary"))
    m = re.search(
        r"steps reached: (\d+) of 600; accuracy: ([\d.]+)%; top2: ([\d.]+)%; "
        r"preemptions survived: (\d+); model: TokenNet \(16,579 parameters\)",
        summary,
    )
    assert m, summary
    steps, accuracy, top2, preemptions = int(m[1]), float(m[2]), float(m[3]), int(m[4])
    assert steps >= 600 and accuracy > 65 and top2 >= accuracy and preemptions >= 1
    assert "live figure 'Test metrics' draws: top2" in summary  # our metric, live
    history = html_table(shown(cell(nb, "summary"))[-1]["text/html"])
    assert "top2" in history[0]

    use = stdout(cell(nb, "use"))
    own = re.search(r"the model's own test accuracy: ([\d.]+)%", use)
    assert own and float(own[1]) > 65, use
    assert "-> prose" in use and "-> html" in use  # the clear cases
    save = stdout(cell(nb, "save"))
    assert "Saved the trained weights of run-" in save and "loaded: True" in save
    assert "Cluster your-model is down" in stdout(cell(nb, "down"))
    assert not list((tmp_path / "clusters").glob("*.json"))
