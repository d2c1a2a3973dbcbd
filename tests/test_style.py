"""The house rules, enforced: ruff (lint and format) and mypy are clean, and the tests mirror
the modules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "transient_nb", "tests", "benchmarks", "docs"],
        ["ruff", "format", "--check", "transient_nb", "tests", "benchmarks", "docs"],
        ["mypy"],
        # The documentation's own Sphinx extension and configuration (docs/conf.py).
        ["mypy", "docs/_ext", "docs/conf.py"],
    ],
    ids=["ruff-check", "ruff-format", "mypy", "mypy-docs"],
)
def test_clean(command):
    proc = subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


#: Modules whose tests live in another module's file, and why (every other module
#: ``transient_nb/X/Y.py`` has ``tests/X/test_Y.py``).
TESTED_ELSEWHERE = {
    # The VM's half of enrolment (a key and a CSR made at boot) is a script run on the fake's VMs.
    "backends/gce/enroll.py": "tests/backends/test_tls.py",
    # The head VM's PS and its serving process only run inside a head VM on the fake.
    "backends/gce/head_ps.py": "tests/backends/gce/test_head.py",
    "deploy/head_vm.py": "tests/backends/gce/test_head.py",
    # A GCE VM is only ever driven by the backend, against the fake server.
    "backends/gce/vm.py": "tests/backends/gce/test_backend.py",
    # The server extension's app: the routes' tests start it in a real Jupyter server.
    "server/app.py": "tests/server/test_handlers.py",
    # A run handle of a detached cluster: started through a real head.
    "deploy/remote_run.py": "tests/deploy/test_head.py",
    # The launchers of detached clusters: a real head process, and a head VM on the fake.
    "deploy/detached.py": "tests/deploy/test_head.py",
    # connect(): the handles it returns are tested with real owners in other processes.
    "deploy/connect.py": "tests/deploy/test_remote.py",
    # The live part of every view widget: each view's tests drive it.
    "notebook/views/live.py": "tests/notebook/views/test_panel.py",
    # The lazy public API and the old module paths: the package's import-time tests.
    "_moved.py": "tests/test_layout.py",
    "_version.py": "tests/test_layout.py",
    # The driver's parts between its core (test_run_driver) and its loop (test_run_loop): their
    # functions are tested one by one with the core's doubles, in test_run_driver.
    "training/run_checkpoints.py": "tests/training/test_run_driver.py",
    "training/run_trainers.py": "tests/training/test_run_driver.py",
}


def test_tests_mirror_the_modules():
    """Each module has its test file at the same place (or one named in TESTED_ELSEWHERE)."""
    package = Path(ROOT) / "transient_nb"
    missing = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if (
            "labextension" in rel.parts
            or "__pycache__" in rel.parts
            or rel.name in ("__init__.py", "__main__.py")
        ):
            continue
        mirror = Path(ROOT) / "tests" / rel.parent / f"test_{rel.name}"
        elsewhere = TESTED_ELSEWHERE.get(rel.as_posix())
        if not mirror.exists() and not (elsewhere and (Path(ROOT) / elsewhere).exists()):
            missing.append(f"{rel.as_posix()} (want {mirror.relative_to(Path(ROOT))})")
    assert not missing, f"modules without a test file: {missing}"
    for module, tests in TESTED_ELSEWHERE.items():
        assert (package / module).exists(), f"{module} is gone: drop it from TESTED_ELSEWHERE"
        stem = module.rsplit("/", 1)[-1][:-3]
        assert stem in (Path(ROOT) / tests).read_text(), f"{tests} does not mention {stem}"
