"""Execute the notebooks headless (nbclient, a real ipykernel kernel) and check their outputs.

Each notebook runs top to bottom in a fresh kernel whose run records, cluster registry, IPython and
Jupyter folders all point into the test's temporary folder. The checks read what the cells
printed and displayed (the notebooks tag the cells that matter), not only that they ran.
"""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
WIDGET = "application/vnd.jupyter.widget-view+json"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The kernel's environment: everything it writes goes under ``tmp_path``.

    Set here too, so that the kernel manager in this process (connection files) follows it.
    """
    for var, sub in (
        ("DASK_TRANSIENT__RUN_DIR", "runs"),
        ("DASK_TRANSIENT__REGISTRY_DIR", "clusters"),
        ("IPYTHONDIR", "ipython"),
        ("JUPYTER_CONFIG_DIR", "jupyter/config"),
        ("JUPYTER_DATA_DIR", "jupyter/data"),
        ("JUPYTER_RUNTIME_DIR", "jupyter/runtime"),
    ):
        monkeypatch.setenv(var, str(tmp_path / sub))
    # The default data path (the venv's share/jupyter) stays: the python3 kernel spec is there.
    monkeypatch.delenv("JUPYTER_PATH", raising=False)
    return dict(os.environ)


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


def test_reproduce_paper(tmp_path: Path, kernel_env: dict[str, str]) -> None:
    nb = execute("reproduce_paper.ipynb", tmp_path, kernel_env)
    no_errors(nb)
    baseline = stdout(cell(nb, "baseline"))
    assert re.search(r"one second here stands for \d+ s of the paper", baseline), baseline
    transient = stdout(cell(nb, "transient"))
    for n in (2, 4, 8):
        assert f"{n} transient K80: " in transient

    table = html_table(shown(cell(nb, "reproduce-table"))[-1]["text/html"])
    setups = [row[""] for row in table]  # the index (setup) has no header of its own
    assert setups == ["1 on-demand K80", "2 transient K80", "4 transient K80", "8 transient K80"]
    rows = {s: r for s, r in zip(setups, table, strict=True)}
    # The baseline calibrates the clock: its time and cost match the paper by construction.
    base = rows["1 on-demand K80"]
    assert float(base["time (h) here"]) == pytest.approx(3.91, abs=0.01)
    assert float(base["cost ($) here"]) == pytest.approx(2.83, abs=0.02)
    for setup, row in rows.items():
        assert float(row["time (h) here"]) > 0, setup
        assert float(row["cost ($) here"]) > 0, setup
        assert 0 <= float(row["accuracy (%) here"]) <= 100, setup
        assert re.fullmatch(r"\d+ of \d+", row["revoked here"]), setup
    assert float(base["accuracy (%) here"]) > 80
    assert not list((tmp_path / "clusters").glob("*.json"))
