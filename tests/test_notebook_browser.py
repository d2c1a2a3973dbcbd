"""Run the quickstart notebook in JupyterLab, in headless Chromium, and watch it work.

Starts JupyterLab on 127.0.0.1 (token auth, every Jupyter/IPython/XDG folder in a temporary one,
the default data path kept so the venv's ipywidgets and jupyter_bokeh lab extensions load), opens
``quickstart.ipynb``, runs every cell through the Run menu, and checks in the page that the control
panel renders, that the live Bokeh figures gain points while the run goes on, and that pressing the
panel's Preempt button puts a preemption marker on the workers figure. Screenshots go to
``test-artifacts/browser/``. Every process started here is ended by its PID.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import require, require_module  # tests/conftest.py
from transient_nb.eventlog.records import read_run_record
from transient_nb.notebook.views.report import save_report

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
#: Pictures for the documentation (docs/_ext/transient_docs/screenshots.py shows them).
DOCS_SHOTS = ROOT / "docs" / "_screenshots"
CHROMIUM = "/usr/bin/chromium"
TOKEN = "transient-nb-browser-test"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.timeout(1200),
]

#: The largest row count of the named ColumnDataSource over every Bokeh document in the page.
SOURCE_LENGTH = """(name) => {
    const docs = (window.Bokeh && window.Bokeh.documents) || [];
    let n = -1;
    for (const doc of docs) {
        const source = doc.get_model_by_name(name);
        if (source != null) n = Math.max(n, source.get_length() ?? 0);
    }
    return n;
}"""

#: The workers figure's markers: [kind, worker, detail] of each.
MARKERS = """() => {
    const docs = (window.Bokeh && window.Bokeh.documents) || [];
    let best = [];
    for (const doc of docs) {
        const m = doc.get_model_by_name("markers");
        if (m == null) continue;
        const col = (k) => Array.from(m.data.get ? m.data.get(k) : m.data[k]);
        const kinds = col("kind"), workers = col("worker"), details = col("detail");
        if (kinds.length >= best.length)
            best = kinds.map((k, i) => [k, workers[i], details[i]]);
    }
    return best;
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def environment(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    dirs = {
        "JUPYTER_CONFIG_DIR": "jupyter/config",
        "JUPYTER_DATA_DIR": "jupyter/data",
        "JUPYTER_RUNTIME_DIR": "jupyter/runtime",
        "IPYTHONDIR": "ipython",
        "XDG_CONFIG_HOME": "xdg/config",
        "XDG_CACHE_HOME": "xdg/cache",
        "XDG_DATA_HOME": "xdg/data",
        "XDG_RUNTIME_DIR": "xdg/runtime",
        "DASK_TRANSIENT__RUN_DIR": "runs",
        "DASK_TRANSIENT__REGISTRY_DIR": "clusters",
    }
    for var, sub in dirs.items():
        (tmp / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(tmp / sub)
    # JUPYTER_PATH stays unset: the venv's share/jupyter (the widget and Bokeh lab extensions)
    # must stay on the data path.
    env.pop("JUPYTER_PATH", None)
    return env


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read() or b"null")


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A JupyterLab server on 127.0.0.1; stopped, with its kernels, by PID."""
    # CI installs both (.ci/run) and must run this test: only outside CI may it be skipped.
    require(Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
    require_module("playwright.sync_api", 'pip install -e ".[test]"')
    root = tmp_path / "notebooks"
    root.mkdir()
    shutil.copy(ROOT / "notebooks" / "quickstart.ipynb", root)
    env = environment(tmp_path)
    port = free_port()
    log = open(tmp_path / "jupyter-lab.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--allow-root",
            "--no-browser",
            "--ServerApp.open_browser=False",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={TOKEN}",
            f"--ServerApp.root_dir={root}",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    kernels: set[int] = set()
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                get(f"{base}/api/status?token={TOKEN}")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "JupyterLab did not start:\n" + (tmp_path / "jupyter-lab.log").read_text()
                    ) from None
                time.sleep(0.25)
        yield {"base": base, "env": env, "tmp": tmp_path, "proc": proc, "kernels": kernels}
    finally:
        # The kernels (and the clusters they own, whose worker processes die with them) first,
        # through the server; then the server; then whatever is left, each by its PID.
        try:
            kernels |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
        try:
            for k in get(f"{base}/api/kernels?token={TOKEN}"):
                req = urllib.request.Request(
                    f"{base}/api/kernels/{k['id']}?token={TOKEN}", method="DELETE"
                )
                urllib.request.urlopen(req, timeout=30).close()
        except OSError:
            pass
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        for pid in kernels:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs([p for p in map(_process, kernels) if p is not None], timeout=30)
        log.close()


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def _dismiss_news(page: Any) -> None:
    """Answer JupyterLab's "notified about news?" toast, which would cover the screenshots."""
    no = page.locator(".jp-toast-button", has_text="No")
    if no.count():
        no.first.click()


def test_quickstart_in_jupyterlab(lab: dict[str, Any]) -> None:
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    minute = 60_000
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
            env=lab["env"],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{lab['base']}/lab/tree/quickstart.ipynb?token={TOKEN}")
            notebook = page.locator(".jp-NotebookPanel")
            expect(notebook).to_be_visible(timeout=3 * minute)
            expect(page.locator(".jp-Notebook .jp-Cell").first).to_be_visible(timeout=minute)

            # Run every cell but the last (`%transient_cluster down`) through the Run menu, once
            # the kernel is up: the cluster stays up for the panel's Preempt below however fast
            # the run ends (a slow browser once met a notebook already at its end). The last cell
            # runs after it.
            expect(page.get_by_text("Python 3 (ipykernel) | Idle").first).to_be_visible(
                timeout=3 * minute
            )
            first_prompt = page.locator(".jp-CodeCell .jp-InputPrompt").first
            last_cell = page.locator(".jp-Notebook .jp-CodeCell").last
            expect(last_cell).to_contain_text("%transient_cluster down")
            for attempt in range(3):
                last_cell.locator(".jp-InputPrompt").click()  # select it
                page.locator(".lm-MenuBar-item", has_text="Run").first.click()
                page.locator(".lm-Menu-item", has_text="Run All Above Selected Cell").first.click()
                try:  # the first cell's prompt turns from [ ] to [*] or [1]
                    expect(first_prompt).to_have_text(re.compile(r"\[(\*|\d+)\]"), timeout=minute)
                    break
                except AssertionError:
                    if attempt == 2:
                        raise
            _dismiss_news(page)

            # The control panel renders, with its worker table and buttons.
            preempt = page.locator(".transient-panel .widget-button", has_text="Preempt").first
            expect(preempt).to_be_visible(timeout=5 * minute)
            expect(page.locator(".transient-panel table.transient-vms").first).to_be_visible(
                timeout=minute
            )
            expect(page.locator(".transient-panel tr.transient-vm").first).to_be_visible(
                timeout=2 * minute
            )
            page.screenshot(path=str(ARTIFACTS / "1-panel.png"), full_page=True)
            DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
            page.locator(".transient-panel").first.screenshot(
                path=DOCS_SHOTS / "notebook-panel.png"
            )

            # The live figures gain points: the run's loss, and the cost while the cluster runs
            # (read twice, see it grow; the run may be over by the time a slow browser looks).
            page.wait_for_function(f"({SOURCE_LENGTH})('loss') > 0", timeout=5 * minute)
            page.wait_for_function(f"({SOURCE_LENGTH})('cost') > 0", timeout=minute)
            first = page.evaluate(SOURCE_LENGTH, "cost")
            page.wait_for_function(f"({SOURCE_LENGTH})('cost') > {first}", timeout=3 * minute)
            assert page.evaluate(SOURCE_LENGTH, "cost") > first
            page.locator(".bk-Figure").first.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "2-dashboard.png"), full_page=True)

            # Press Preempt on the panel: a notice marker for that worker appears on the figure.
            # (Wait for the notebook's own manual preemption first, so that the two are told apart.)
            expect(page.get_by_text("quickstart: preempting w-").first).to_be_visible(
                timeout=5 * minute
            )
            expect(preempt).to_be_enabled(timeout=3 * minute)
            worker = page.locator(".transient-panel .widget-dropdown select").first.input_value()
            before = [m for m in page.evaluate(MARKERS) if m[0] == "notice" and m[1] == worker]
            assert not before
            preempt.click()
            page.wait_for_function(
                f"({MARKERS})().some(m => m[0] === 'notice' && m[1] === {json.dumps(worker)}"
                " && m[2] === 'notice from manual')",
                timeout=2 * minute,
            )
            page.wait_for_function(
                f"({MARKERS})().some(m => m[0] === 'preempted' && m[1] === {json.dumps(worker)})",
                timeout=2 * minute,
            )
            # The figures shown (a run's own metrics have figures of their own, hidden when the
            # run has none of them).
            figures = page.locator(".bk-Figure:visible")
            figures.nth(min(3, figures.count() - 1)).scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "3-preempted.png"), full_page=True)
            dashboard = page.locator(".jp-OutputArea-output", has=page.locator(".bk-Figure"))
            dashboard.first.screenshot(path=DOCS_SHOTS / "notebook-dashboard.png")

            # The notebook runs to its end, and its last cell closes the cluster.
            last_cell.locator(".jp-InputPrompt").click()
            page.locator(".lm-MenuBar-item", has_text="Run").first.click()
            page.locator(".lm-Menu-item", has_text="Run Selected Cell and All Below").first.click()
            expect(page.get_by_text("Cluster quickstart is down").first).to_be_visible(
                timeout=10 * minute
            )
            page.screenshot(path=str(ARTIFACTS / "4-done.png"), full_page=True)
            # The run's HTML report, made from its record as `transient-nb run` makes it.
            record = max((lab["tmp"] / "runs").rglob("events.jsonl"), key=os.path.getmtime)
            report = save_report(str(lab["tmp"] / "report.html"), read_run_record(record))
            page.goto(Path(report).as_uri())
            expect(page.locator(".bk-Figure").first).to_be_visible(timeout=minute)
            page.screenshot(path=DOCS_SHOTS / "report.png", full_page=True)
            errors = page.locator(
                ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                has_text="Traceback",
            )
            assert errors.count() == 0
        finally:
            browser.close()
