"""The suite's warm interpreters (:mod:`tests.warm`): a run is ``python SCRIPT`` or ``python -m
MODULE`` in its own process, folder, environment and configuration, with its own exit status, and
nothing it started outlives it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_for_sync
from tests.warm import WarmPython

pytestmark = pytest.mark.timeout(120)


def test_a_run_is_its_own_process_with_its_argv_folder_environment_and_exit_status(
    tmp_path: Path, warm_python: WarmPython
) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, dask
            print("argv", sys.argv[1:], "cwd", os.getcwd(), "path0", sys.path[0])
            print("run-dir", dask.config.get("transient.run-dir"), "pid", os.getpid())
            print("to stderr", file=sys.stderr)
            sys.exit(3)
            """
        )
    )
    env = {**os.environ, "DASK_TRANSIENT__RUN_DIR": str(tmp_path / "runs")}
    proc = warm_python.run([str(script), "a", "b"], env=env, cwd=tmp_path, timeout=60, merged=False)
    assert proc.returncode == 3
    assert f"argv ['a', 'b'] cwd {tmp_path} path0 {tmp_path}" in proc.stdout
    assert f"run-dir {tmp_path / 'runs'}" in proc.stdout  # read from this run's environment
    assert proc.stderr == "to stderr\n"
    pid = int(proc.stdout.split("pid ")[1])
    assert pid not in (os.getpid(), warm_python.proc.pid)

    # A module, as python -m runs it; an exception is a failure with its traceback.
    (tmp_path / "failing.py").write_text("raise ValueError('the page failed')\n")
    proc = warm_python.run(
        ["-m", "failing"], env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path, timeout=60
    )
    assert proc.returncode == 1 and "ValueError: the page failed" in proc.stdout


def test_a_run_past_its_timeout_is_killed_with_what_it_started(
    tmp_path: Path, warm_python: WarmPython
) -> None:
    script = tmp_path / "hangs.py"
    script.write_text(
        textwrap.dedent(
            """
            import subprocess, time
            child = subprocess.Popen(["sleep", "600"])
            print("child", child.pid, flush=True)
            time.sleep(600)
            """
        )
    )
    with pytest.raises(subprocess.TimeoutExpired) as e:
        warm_python.run([str(script)], env=os.environ, cwd=tmp_path, timeout=10)
    child = int(str(e.value.output).split()[1])
    wait_for_sync(lambda: not psutil.pid_exists(child), timeout=10)


def test_the_shim_runs_scripts_warm_and_anything_else_in_a_real_interpreter(
    tmp_path: Path, warm_python: WarmPython
) -> None:
    shim = warm_python.shim(tmp_path)
    (tmp_path / "script.py").write_text(
        "import sys\nprint('out', sys.argv[1:])\nprint('err', file=sys.stderr)\nsys.exit(4)\n"
    )
    proc = subprocess.run(
        [shim, "script.py", "x"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (4, "out ['x']\n", "err\n")
    # A program on stdin (a shell script's here-document) runs in a plain interpreter.
    proc = subprocess.run(
        [shim, "-", "y"],
        input="import sys; print(sys.argv[1:], sys.executable)",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout == f"['y'] {sys.executable}\n"
