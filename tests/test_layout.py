"""The house's layout holds: layers without cycles, a lazy root, module paths that import.

See ``docs/architecture.md``: the subpackages, what each owns, and who may import whom.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _graph():
    grimp = pytest.importorskip("grimp")
    return grimp.build_graph(
        "transient_nb", include_external_packages=False, exclude_type_checking_imports=True
    )


def test_no_module_imports_itself_back() -> None:
    """No import cycle among the package's modules, imports inside functions included."""
    graph = _graph()
    modules = sorted(graph.modules)
    cycles = []
    for m in modules:
        for d in graph.find_modules_directly_imported_by(m):
            # A path back from what m imports to m closes a cycle.
            chain = graph.find_shortest_chain(importer=d, imported=m)
            if chain:
                cycles.append(" -> ".join((m, *chain)))
    assert not cycles, "import cycles:\n" + "\n".join(sorted(set(cycles))[:20])


def test_the_layer_contracts_hold() -> None:
    """import-linter's contracts of pyproject.toml (surfaces above deploy above ... config)."""
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run(
        [str(lint) if lint.exists() else "lint-imports"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def _imported_by(code: str) -> set[str]:
    """The modules a fresh interpreter has imported after running ``code``."""
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


@pytest.mark.parametrize(
    "code",
    [
        "import transient_nb",
        "import transient_nb.worker.preload",
        "import transient_nb.backends.gce.preload",
        "import transient_nb.training.warmup",
    ],
)
def test_a_workers_preload_and_the_root_import_neither_pandas_nor_the_cluster(code: str) -> None:
    """The root package is lazy: a worker's preload pays for neither pandas, torch, the cluster
    nor ``connect`` (``python -X importtime`` figures: benchmarks/NOTES.md, round thirteen)."""
    loaded = _imported_by(code)
    heavy = {"pandas", "torch", "transient_nb.deploy.cluster", "transient_nb.deploy.connect"}
    assert not loaded & heavy, sorted(loaded & heavy)


def test_a_client_that_only_reads_runs_does_not_import_torch() -> None:
    """``transient-nb status``, ``list``, ``down`` and ``connect()`` read clusters and run records,
    and a detached cluster's head serves one: torch (a second of a core at every start) is for
    the processes that train or load weights."""
    loaded = _imported_by(
        "import transient_nb.cli.commands, transient_nb.deploy.connect, transient_nb.deploy.head"
    )
    assert "torch" not in loaded, sorted(m for m in loaded if m.startswith("transient_nb.training"))


def test_the_public_api_is_there_when_asked_for() -> None:
    import transient_nb

    for name in transient_nb.__all__:
        assert getattr(transient_nb, name) is not None, name
    assert transient_nb.TransientCluster.__module__ == "transient_nb.deploy.cluster"
    assert transient_nb.__version__ == importlib.import_module("transient_nb._version").__version__
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        transient_nb.nothing  # noqa: B018


#: Each old path imported from scratch, in a child forked per path from one process that holds the
#: third-party modules already (torch, pandas, Dask...): a fresh interpreter per path cost each
#: of the 35 about 1.5 s of a core to import them again.
_IMPORT_EACH_OLD_PATH = """
import importlib, json, os, sys, warnings
moved = json.loads(sys.argv[1])
for new in sorted(set(moved.values())):
    importlib.import_module("transient_nb." + new)
# Forget the package (its modules and its finder of old paths), keep what it imported.
for name in [m for m in sys.modules if m == "transient_nb" or m.startswith("transient_nb.")]:
    del sys.modules[name]
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "MovedFinder"]
for old, new in sorted(moved.items()):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module("transient_nb." + old)
        same = module is importlib.import_module("transient_nb." + new)
        said = [str(x.message) for x in caught if x.category is DeprecationWarning]
        os.write(w, json.dumps([same, said]).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        answer = f.read()
    os.waitpid(pid, 0)
    print(json.dumps({old: json.loads(answer) if answer else None}), flush=True)
"""


@pytest.fixture(scope="module")
def old_paths_imported() -> dict[str, tuple[bool, list[str]]]:
    """Each old module path's import: whether it is the new module, and the deprecation
    warnings it gave."""
    from transient_nb._moved import MOVED

    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH_OLD_PATH, json.dumps(MOVED)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    return {k: v for line in out.splitlines() for k, v in json.loads(line).items()}


@pytest.mark.parametrize("old", sorted(importlib.import_module("transient_nb._moved").MOVED))
def test_an_old_module_path_still_imports_with_a_warning_naming_the_new(
    old: str, old_paths_imported: dict[str, tuple[bool, list[str]]]
) -> None:
    from transient_nb._moved import MOVED

    answer = old_paths_imported[old]
    assert answer is not None, f"importing transient_nb.{old} failed"
    same, said = answer
    assert same, f"transient_nb.{old} is not transient_nb.{MOVED[old]}"
    assert any(f"transient_nb.{MOVED[old]}" in message for message in said), said


def test_from_the_root_an_old_module_name_is_the_new_module() -> None:
    import transient_nb
    from transient_nb.eventlog import bill

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from transient_nb import cost  # type: ignore[attr-defined]
    assert cost is bill
    assert any("transient_nb.eventlog.bill" in str(w.message) for w in caught)
    assert "cost" not in transient_nb.__all__


def _strings_naming_modules() -> set[str]:
    """Module paths the package names as text: preloads, ``python -m`` targets."""
    from transient_nb.worker.preload import WORKER_PRELOADS

    names = {*WORKER_PRELOADS, "transient_nb.backends.gce.preload"}
    for path in (ROOT / "transient_nb").rglob("*.py"):
        text = path.read_text()
        for marker in ('"-m", "', "-m "):
            start = 0
            while (i := text.find(marker + "transient_nb.", start)) >= 0:
                j = i + len(marker)
                k = j
                while k < len(text) and (text[k].isalnum() or text[k] in "._"):
                    k += 1
                names.add(text[j:k].rstrip("."))
                start = k
    return names


def test_every_module_named_as_text_imports() -> None:
    names = _strings_naming_modules()
    assert "transient_nb.deploy.head" in names and "transient_nb.deploy.head_vm" in names
    for name in sorted(names):
        spec = importlib.util.find_spec(name)
        assert spec is not None, f"{name} (named as text in the package) does not exist"


def test_the_cli_runs_as_a_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "transient_nb.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert proc.returncode == 0 and "transient-nb" in proc.stdout, proc.stderr


def test_the_gce_modules_names_are_still_found_on_its_package() -> None:
    from transient_nb.backends.gce import backend

    with pytest.warns(DeprecationWarning, match="transient_nb.backends.gce.backend.GCEBackend"):
        from transient_nb.backends.gce import GCEBackend  # type: ignore[attr-defined]
    assert GCEBackend is backend.GCEBackend
