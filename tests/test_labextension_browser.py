"""The JupyterLab panel end to end: a real JupyterLab, a real kernel, headless Chromium.

A kernel (started here with jupyter_client, as any notebook's kernel is) creates a cluster; the
panel shows it and its workers; a worker is preempted from the panel and its replacement shows
up; a worker is added on demand and the PS moved to another zone from the panel; the connect code
goes into a notebook; the cluster is stopped from the panel; then a cluster
is created from the panel's form and stopped. Screenshots of each step go to
``test-artifacts/labextension/``.

Needs Chromium (Debian: ``apt-get install -y chromium``; elsewhere set ``TRANSIENT_NB_CHROMIUM``)
and the package installed (``pip install -e .``), which puts the prebuilt extension and the
server-extension config in place.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import (
    PACED,
    end_processes,
    require,
    require_module,
    wait_for_sync,
)  # tests/conftest.py
from transient_nb import connect, train

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = os.environ.get("TRANSIENT_NB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "labextension"
#: Pictures for the documentation (docs/_ext/transient_docs/screenshots.py shows them).
DOCS_SHOTS = Path(__file__).resolve().parents[1] / "docs" / "_screenshots"
TOKEN = "transient-nb-browser-test"
#: Generous DOM waits (ms): two CPU cores run JupyterLab, a kernel, Chromium and the workers.
SLOW_MS = 90_000

KERNEL_CODE = """
from transient_nb import TransientCluster
c = TransientCluster(
    workers=2,
    name="browser-demo",
    provisioning_delay=0,
    notice="1s",
    fallback_zones=["us-east1-c"],
)
c.wait_for_workers(timeout=60)
"""


@dataclass
class Lab:
    url: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _isolated_env(root: Path) -> dict[str, str]:
    """Environment of JupyterLab and of the kernel: every Jupyter, IPython, XDG and Dask folder in
    ``root``, and one cluster registry they share."""
    folders = {
        "JUPYTER_CONFIG_DIR": "jupyter-config",
        "JUPYTER_DATA_DIR": "jupyter-data",
        "JUPYTER_RUNTIME_DIR": "jupyter-runtime",
        "IPYTHONDIR": "ipython",
        "XDG_CONFIG_HOME": "xdg-config",
        "XDG_CACHE_HOME": "xdg-cache",
        "XDG_DATA_HOME": "xdg-data",
        "XDG_RUNTIME_DIR": "xdg-runtime",
        "DASK_CONFIG": "dask",
        "DASK_TRANSIENT__REGISTRY_DIR": "clusters",
        "DASK_TRANSIENT__RUN_DIR": "runs",
    }
    env = dict(os.environ)
    for var, name in folders.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        env[var] = str(root / name)
    # Clusters made from the panel's form come up at once, and preemptions are quick.
    env["DASK_TRANSIENT__PROVISIONING_DELAY"] = "0s"
    env["DASK_TRANSIENT__NOTICE"] = "1s"
    # A policy turned on from the panel may grow a cluster up to this (3 processes, not 64).
    env["DASK_TRANSIENT__LIMITS__MAX_WORKERS"] = "3"
    # No "news" toast over the page.
    settings = root / "jupyter-config" / "lab" / "user-settings" / "@jupyterlab"
    (settings / "apputils-extension").mkdir(parents=True, exist_ok=True)
    (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    return env


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """JupyterLab on 127.0.0.1 with a known token, ended (with its kernels) at teardown."""
    # CI installs both (.ci/run): there, a missing one fails the test, never a silent skip.
    require(os.path.exists(CHROMIUM), f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
    require_module("playwright.sync_api", 'pip install -e ".[test]"')
    env = _isolated_env(tmp_path)
    (tmp_path / "notebooks").mkdir()
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.open_browser=False",
        f"--IdentityProvider.token={TOKEN}",
        f"--ServerApp.root_dir={tmp_path / 'notebooks'}",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = tmp_path / "jupyterlab.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)  # waiting for a process to listen: nothing to wait on but the port
        yield Lab(url, env, proc, log)
    finally:
        children = _descendants(proc.pid)
        # SIGTERM is Jupyter Server's clean stop: kernels shut down, extensions' clusters close.
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        end_processes([p for p in children if p.is_running()])
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, ARTIFACTS / "jupyterlab.log")


@pytest.fixture
def kernel_cluster(lab: Lab, tmp_path: Path) -> Iterator[Any]:
    """A real IPython kernel that created the cluster ``browser-demo``; ended by PID at teardown."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3", connection_file=str(tmp_path / "kernel.json"))
    km.start_kernel(env=lab.env)
    kc = km.blocking_client()
    pid = km.provisioner.process.pid  # type: ignore[union-attr]
    try:
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        reply = kc.execute_interactive(KERNEL_CODE, timeout=180)
        assert reply["content"]["status"] == "ok", reply["content"]
        yield kc
    finally:
        # Close the cluster if the test did not stop it; then the kernel and all it started.
        children = _descendants(pid)
        try:
            kc.execute_interactive("c.close()", timeout=60)
        except Exception:
            pass
        children += [p for p in _descendants(pid) if p not in children]
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        end_processes([psutil.Process(pid)] if psutil.pid_exists(pid) else [])
        end_processes([p for p in children if p.is_running()])


def test_panel_shows_preempts_connects_stops_and_creates(lab: Lab, kernel_cluster: Any) -> None:
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            page.goto(f"{lab.url}/lab?token={TOKEN}")
            tab = page.locator('.jp-SideBar .lm-TabBar-tab[data-id="transient-nb-sidebar"]')
            expect(tab).to_be_visible(timeout=SLOW_MS)
            tab.click()
            panel = page.locator("#transient-nb-sidebar")
            expect(panel).to_be_visible()

            # The kernel's cluster: the PS host and two GPU workers, all joined.
            card = panel.locator('.tnb-Cluster[data-cluster="browser-demo"]')
            expect(card.locator('div.tnb-Worker[data-state="joined"]')).to_have_count(
                3, timeout=SLOW_MS
            )
            expect(card.locator(".tnb-Placement")).to_contain_text("t4")
            expect(card.locator(".tnb-Placement")).to_contain_text("spot")
            expect(card.locator(".tnb-Cost")).to_contain_text("so far")
            expect(card.locator(".tnb-Dashboard")).to_have_attribute(
                "href", re.compile(r"^http://127\.0\.0\.1:\d+/status")
            )
            page.screenshot(path=ARTIFACTS / "1-cluster-listed.png")

            # Preempt w-0 from the panel: it shows preempted, and its replacement w-2 joins.
            card.locator('.tnb-Worker[data-worker="w-0"] .tnb-PreemptButton').click()
            expect(card.locator('.tnb-Worker[data-worker="w-0"]')).to_have_attribute(
                "data-state", "preempted", timeout=SLOW_MS
            )
            expect(card.locator('.tnb-Worker[data-worker="w-2"]')).to_have_attribute(
                "data-state", "joined", timeout=SLOW_MS
            )
            expect(card.locator(".tnb-Counts")).to_contain_text("preemptions survived: 1")
            # The gone worker folds into one line (its row inside, closed); a click opens it.
            fold = card.locator("details.tnb-Gone")
            expect(fold.locator(".tnb-GoneLine")).to_contain_text("1 preempted, $")
            expect(fold.locator('.tnb-Worker[data-worker="w-0"]')).to_be_hidden()
            fold.locator(".tnb-GoneLine").click()
            expect(fold.locator('.tnb-Worker[data-worker="w-0"]')).to_be_visible()
            page.screenshot(path=ARTIFACTS / "2-worker-preempted-and-replaced.png")
            DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
            panel.screenshot(path=DOCS_SHOTS / "lab-panel.png")

            # Scale from the panel's form: a third worker, and it runs on demand.
            card.locator(".tnb-ScaleButton").click()
            form = page.locator(".jp-Dialog .tnb-ScaleForm")
            expect(form).to_contain_text("empty to keep them as they are (0 now)")
            form.locator('input[name="workers"]').fill("3")
            form.locator('input[name="on_demand"]').fill("1")
            page.locator(".jp-Dialog .jp-mod-accept").click()
            added = card.locator('.tnb-Worker[data-worker="w-3"]')
            expect(added).to_have_attribute("data-state", "joined", timeout=SLOW_MS)
            expect(added.locator(".tnb-WorkerInfo")).to_contain_text("t4 · on-demand")
            for spot in ("w-1", "w-2"):
                info = card.locator(f'.tnb-Worker[data-worker="{spot}"] .tnb-WorkerInfo')
                expect(info).to_contain_text("t4 · spot")

            # Move the PS to the fallback zone: a new PS host starts there, the old one goes.
            card.locator(".tnb-MovePsButton").click()
            dialog = page.locator(".jp-Dialog")
            expect(dialog).to_contain_text("The PS runs in us-central1-a")
            dialog.locator("select").select_option("us-east1-c")
            page.locator(".jp-Dialog .jp-mod-accept").click()
            new_ps = card.locator('.tnb-Worker[data-worker="ps-1"]')
            expect(new_ps).to_have_attribute("data-state", "joined", timeout=SLOW_MS)
            expect(new_ps.locator(".tnb-WorkerInfo")).to_contain_text("us-east1-c")
            expect(card.locator('.tnb-Worker[data-worker="ps-0"]')).to_have_attribute(
                "data-state", "deleted", timeout=SLOW_MS
            )
            page.screenshot(path=ARTIFACTS / "2b-on-demand-worker-and-ps-moved.png")

            # The connect code goes into a new notebook's first cell.
            page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
            cell = page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first
            expect(cell).to_be_visible(timeout=SLOW_MS)
            card.locator(".tnb-ConnectButton").click()
            # transient_nb.connect by name, or a plain distributed.Client where it is missing.
            expect(cell).to_contain_text(
                re.compile(r'connect\("browser-demo"\)|Client\("tcp://'), timeout=SLOW_MS
            )
            page.screenshot(path=ARTIFACTS / "3-connect-code-inserted.png")

            # Stop it from the panel: the owning kernel closes it, and it leaves the list.
            card.locator(".tnb-StopButton").click()
            page.locator(".jp-Dialog .jp-mod-accept").click()
            expect(card).to_have_count(0, timeout=SLOW_MS)
            expect(panel.locator(".tnb-Empty")).to_be_visible()
            page.screenshot(path=ARTIFACTS / "4-stopped-empty.png")

            # A cluster from the panel's own form: detached, in a head process of its own.
            panel.locator(".tnb-Empty button").click()
            form = page.locator(".jp-Dialog .tnb-NewClusterForm")
            expect(form).to_be_visible()
            form.locator("input").nth(0).fill("panel-demo")  # name
            form.locator("input").nth(1).fill("1")  # workers
            page.screenshot(path=ARTIFACTS / "5-new-cluster-form.png")
            page.locator(".jp-Dialog-content").screenshot(path=DOCS_SHOTS / "lab-new-cluster.png")
            page.locator(".jp-Dialog .jp-mod-accept").click()
            created = panel.locator('.tnb-Cluster[data-cluster="panel-demo"]')
            expect(created.locator('div.tnb-Worker[data-state="joined"]')).to_have_count(
                2, timeout=SLOW_MS
            )
            # Detached: a head process of its own owns it, not the server, not a kernel.
            expect(created.locator(".tnb-Placement")).to_contain_text("head pid")
            # One zone only: nowhere to move its PS, and the button says why.
            move = created.locator(".tnb-MovePsButton")
            expect(move).to_be_disabled()
            expect(move).to_have_attribute("title", re.compile("start it with fallback zones"))
            # A run on it that no kernel owns (started through the head, from this process):
            # the panel shows it and stops it with its cluster.
            remote = connect("panel-demo")
            # Paced (tests/conftest.py::PACED): the cores go to the browser.
            run = train(
                remote,
                model="resnet8",
                data="digits",
                steps=1_000_000,
                eval_images=200,
                emulate=PACED,
            )
            expect(created.locator(".tnb-Training")).to_contain_text("Training", timeout=SLOW_MS)
            page.screenshot(path=ARTIFACTS / "6-created-from-panel.png")

            def ask(button: str, text: str) -> None:
                """Click a card's button, type into its dialog, accept."""
                created.locator(button).click()
                page.locator(".jp-Dialog input").fill(text)
                page.locator(".jp-Dialog .jp-mod-accept").click()

            # A second PS host from the panel: past four is refused by the head, with why;
            # two are taken, and the new host joins.
            ask(".tnb-PsButton", "5")
            refusal = page.locator(".jp-Dialog")
            expect(refusal).to_contain_text("at most 4 PS hosts", timeout=SLOW_MS)
            refusal.get_by_role("button", name="Close").click()
            expect(refusal).to_have_count(0)
            ask(".tnb-PsButton", "2")
            expect(created.locator('.tnb-Worker[data-worker="ps-1"]')).to_have_attribute(
                "data-state", "joined", timeout=SLOW_MS
            )
            page.screenshot(path=ARTIFACTS / "7-second-ps-host.png")

            # A policy from the panel: a bad goal is refused with what to type; a budget is
            # taken, and its first decision shows with the odds of losing workers.
            ask(".tnb-AdaptButton", "budget:lots")
            refusal = page.locator(".jp-Dialog")
            expect(refusal).to_contain_text("'budget:lots': write", timeout=SLOW_MS)
            expect(refusal).to_contain_text("budget:DOLLARS (e.g. budget:20)")
            refusal.get_by_role("button", name="Close").click()
            expect(refusal).to_have_count(0)
            ask(".tnb-AdaptButton", "budget:5")
            policy = created.locator(".tnb-Policy")
            expect(policy).to_contain_text("Policy: budget $5.00 · ", timeout=SLOW_MS)
            expect(policy).to_contain_text("expected $")
            expect(policy).to_contain_text("P(losing ≥1, ≥2, ≥3 workers within 1 h)")
            page.screenshot(path=ARTIFACTS / "8-policy-on.png")
            panel.screenshot(path=DOCS_SHOTS / "lab-panel-policy.png")
            created.locator(".tnb-StopButton").click()
            page.locator(".jp-Dialog .jp-mod-accept").click()
            expect(created).to_have_count(0, timeout=SLOW_MS)
            expect(panel.locator(".tnb-Empty")).to_be_visible()
            # The head stopped the run before it closed the cluster.
            assert wait_for_sync(lambda: run.reason, 60) == "stopped", run
            remote.close()
        except Exception:
            page.screenshot(path=ARTIFACTS / "failure.png")
            raise
        finally:
            browser.close()
