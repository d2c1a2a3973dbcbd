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
from transient_nb.experiments import reproduce

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


@pytest.mark.timeout(1200)
def test_reproduce_paper(tmp_path: Path, kernel_env: dict[str, str]) -> None:
    # The paced section's reduced form (fewer steps; 4 V100s with one and two PS for the curve).
    nb = execute("reproduce_paper.ipynb", tmp_path, {**kernel_env, "TRANSIENT_NB_FULL": "0"})
    no_errors(nb)
    check_emulated_section(nb)
    baseline = stdout(cell(nb, "baseline"))
    assert re.search(r"one second here stands for \d+ s of the paper", baseline), baseline
    transient = stdout(cell(nb, "transient"))
    for n in (2, 4, 8):
        # "Training never restarted": every run reached all its steps, and every worker revoked
        # while it trained was replaced; start-ups follow the paper's measured 81-98 s.
        m = re.search(
            rf"{n} transient K80: (\d+) steps in [\d.]+ s, accuracy [\d.]+%, (\d+) of (\d+) workers "
            r"revoked \((\d+) while it trained\), (\d+) of them not replaced; "
            r"shortest start-up (\d+) s",
            transient,
        )
        assert m, transient
        steps, revoked, servers, during, not_replaced, startup = map(int, m.groups())
        assert steps >= 300, transient
        assert during <= revoked <= servers, transient
        assert not_replaced == 0, transient
        assert startup >= 81, transient

    # The cost model's claims, from the paper's prices and times.
    model = stdout(cell(nb, "cost-model"))
    assert "K80 worker: $0.256/h preemptible, $0.723/h on demand (35%)" in model, model
    hourly = dict(re.findall(r"^(\d [\w-]+ K80): \$([\d.]+)/h;", model, re.M))
    assert hourly == {
        "1 on-demand K80": "0.723",
        "2 transient K80": "0.655",
        "4 transient K80": "1.167",
        "8 transient K80": "2.191",
    }, model
    fed = {
        setup: (float(ours), float(paper))
        for setup, ours, paper in re.findall(
            r"^(\d [\w-]+ K80): .* h \$([\d.]+) \(the paper: \$([\d.]+)\)$", model, re.M
        )
    }
    assert fed["1 on-demand K80"] == (2.83, 2.83)
    assert fed["4 transient K80"][0] == 1.23
    for setup, (ours, paper) in fed.items():  # never less, at most ~11% more than the paper
        assert paper - 0.005 <= ours <= paper * 1.12, (setup, ours, paper)

    table = html_table(shown(cell(nb, "reproduce-table"))[-1]["text/html"])
    setups = [row[""] for row in table]  # the index (setup) has no header of its own
    assert setups == ["1 on-demand K80", "2 transient K80", "4 transient K80", "8 transient K80"]
    rows = {s: r for s, r in zip(setups, table, strict=True)}
    # The baseline calibrates the clock: its time and cost match the paper by construction.
    base = rows["1 on-demand K80"]
    assert float(base["time (h) here"]) == pytest.approx(3.91, abs=0.01)
    assert float(base["cost ($) here"]) == pytest.approx(2.83, abs=0.02)
    for setup, row in rows.items():
        hours, cost = float(row["time (h) here"]), float(row["cost ($) here"])
        assert hours > 0 and cost > 0, setup
        assert 0 <= float(row["accuracy (%) here"]) <= 100, setup
        assert re.fullmatch(r"\d+ of \d+", row["revoked here"]), setup
        # The cost is the measured time at the hourly rate, less what revoked workers did not bill
        # and the VMs that were still starting (never more than the whole time at the full rate).
        rate = {"1": 0.723, "2": 0.655, "4": 1.167, "8": 2.191}[setup[0]]
        assert cost <= hours * rate + 0.02, (setup, hours, cost)  # both rounded to cents
        saving = row["cheaper than baseline, here"]
        assert saving == f"{1 - cost / float(base['cost ($) here']):.0%}", (setup, saving)
    assert float(base["accuracy (%) here"]) > 80
    assert not list((tmp_path / "clusters").glob("*.json"))


def check_emulated_section(nb: Any) -> None:
    """The paced emulation's Table I/III and speed curve, paper beside ours."""
    out = stdout(cell(nb, "emulated-table"))
    assert "lifetimes are NOT rescaled" in out, out
    table = html_table(shown(cell(nb, "emulated-table"))[-1]["text/html"])
    rows = {row[""]: row for row in table}
    assert list(rows) == [s.label for s in reproduce.TABLE_SETUPS]
    if "host kept the pace in every row: True" in out:
        # Speedups within 15% of the paper's 1.8x, 3.7x, 7.7x; the baseline by construction.
        assert float(rows["1 on-demand K80"]["ours h"]) == pytest.approx(3.91, rel=0.1)
        for label, row in rows.items():
            paper, ours = float(row["paper speedup"]), float(row["ours speedup"])
            assert ours == pytest.approx(paper, rel=0.15), (label, row)
            assert float(row["ours $"]) > 0 and int(row["revocations"]) >= 0
    curve_out = stdout(cell(nb, "emulated-curve"))
    assert "host kept the pace in every point:" in curve_out, curve_out
    points = {
        (int(n), int(ps)): (float(ours), float(paper))
        for n, ps, ours, paper in re.findall(
            r"^v100 x(\d), (\d) PS: ([\d.]+) global steps/s \(paper shape ([\d.]+)\)$",
            curve_out,
            re.M,
        )
    }
    assert set(points) == {(4, 1), (4, 2)}, curve_out
    assert all(ours <= paper * 1.05 for ours, paper in points.values()), curve_out  # caps hold
    if "host kept the pace in every point: True" in curve_out:
        # Four V100s saturate one PS (45/s, the plateau); a second PS lets them go faster.
        assert points[(4, 1)][0] == pytest.approx(45, rel=0.1), curve_out
        assert points[(4, 2)][0] > points[(4, 1)][0] * 1.2, curve_out
    check_mixed_and_dynamic(nb)
    check_policy_evaluation(nb)


def check_policy_evaluation(nb: Any) -> None:
    """Issue 16's evaluation, reduced: a policy run and a static run of the same paced work."""
    out = stdout(cell(nb, "policy-evaluation"))
    assert "calm, progress per dollar" not in out  # no reactive run in the reduced form
    rows = html_table(shown(cell(nb, "policy-evaluation"))[-1]["text/html"])
    assert [r["run"] for r in rows] == ["static 4 P100", "policy cost-per-step"], rows
    for r in rows:
        assert r["failed"] == "" and float(r["hours"]) > 0 and float(r["cost"]) > 0, r
    # The PS bottleneck, reduced: 8 V100 on one PS and a 0.3 h deadline no worker count meets
    # there. The policy adds a PS shard (and gives back the V100s two shards cannot feed).
    out = stdout(cell(nb, "policy-plateau"))
    (row,) = html_table(shown(cell(nb, "policy-plateau"))[-1]["text/html"])
    assert row["failed"] == "" and row["start"] == "8 v100", row
    shards, changes = int(row["shards"]), int(row["changes"])
    assert f"on {shards} PS shard(s)" in out and (shards == 1 or changes >= 1), (row, out)
    if int(row["behind"]) == 0:
        # The host kept the pace, so the PS's plateau was the emulation's, not the host's: the
        # policy must have seen it and added a shard (the run started on one). How much sooner
        # the run ended is the host's pace, not the emulation's: a second of a busy host's PS
        # boot or policy tick stands for many simulated ones, and no paced process counts it as
        # behind (0.44 h with three test workers on two cores, under
        # the one PS's 0.40 h when the suite ran alone; benchmarks/NOTES.md, issue 31).
        assert shards == 2 and changes >= 1, (row, out)
    else:
        # A host too busy to push what 8 V100s would leaves one PS unsaturated: then it is
        # right not to pay for a second one (what the policy measured, the events say).
        assert shards in (1, 2), row


def check_mixed_and_dynamic(nb: Any) -> None:
    """Experiments 3 and 4 of issue 15: a real mixed cluster, then paced mixed and growing runs."""
    demo = stdout(cell(nb, "mixed-demo"))
    assert "workers per GPU type: {'k80': 2, 'p100': 1, 'v100': 2}" in demo, demo
    assert "cost per type adds up: True" in demo, demo
    out = stdout(cell(nb, "emulated-mixed"))
    assert "python benchmarks/paper_emulation.py --mixed --seed 0" in out, out
    (row,) = html_table(shown(cell(nb, "emulated-mixed"))[-1]["text/html"])
    assert row[""] == "2 K80 + P100 + V100" and row["types"] == "2 k80 + 1 p100 + 1 v100"
    assert all(g in row["steps by type"] for g in ("k80", "p100", "v100")), row
    if "host kept the pace in every row: True" in out:
        # 2 x 4.56 + 12.2 + 15.6 = 36.9 global steps/s in the paper's model, under the PS's 45.
        assert float(row["of model"]) == pytest.approx(1.0, abs=0.15), row
    out = stdout(cell(nb, "emulated-dynamic"))
    assert "python benchmarks/paper_emulation.py --dynamic --seed 0" in out, out
    (row,) = html_table(shown(cell(nb, "emulated-dynamic"))[-1]["text/html"])
    assert row[""] == "dynamic 1->4 transient K80", row
    check_growth(row)
    assert float(row["hours"]) > 0 and float(row["cost $"]) > 0, row


def check_growth(row: dict[str, str]) -> None:
    """A growing cluster's row: what the emulation guarantees whatever this host's pace.

    One worker more at each quarter mark (three scale-ups), each of which joined; the trainers
    that started before the run's end each show a join delay, never shorter than the paper's
    simulated boot (81 s). How many started in time is the host's pace: a loaded host's process
    start-up stands for many simulated minutes (benchmarks/NOTES.md, round thirteen).
    """
    assert int(row["added"]) == 3, row
    assert int(row["joined"]) == 1 + 3, row
    joins = [float(j) for j in row["join s"].split(",") if j.strip()]
    assert len(joins) <= 3 and all(j >= 81 for j in joins), row


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
