"""The documentation site: it builds with warnings as errors, and every page's examples run.

- ``test_the_site_builds``: ``sphinx-build -W --keep-going -b html docs OUT`` (a fresh build:
  an incremental one does not repeat the warnings of pages it does not read again), then the
  generated reference pages hold what the package has: every public name, CLI subcommand, magic
  subcommand, event kind and configuration key.
- ``test_page_examples[PAGE]``: the page's Python, IPython and shell blocks, in order, in one
  IPython shell (as a notebook runs them), in a subprocess of their own whose files and clusters
  stay in a temporary folder, against the local backend. A block marked
  ``{.no-run reason="..."}`` is not run (it needs a cloud project, installs packages, or runs for
  minutes), and says why.
- The fast tests check the pages' blocks (each runs or says why; each compiles) and the pieces of
  the docs' own Sphinx extension.

Run a page's examples by hand with ``python -m tests.doc_pages docs/how-to/cli.md``
(:mod:`tests.doc_pages` reads the pages and runs their blocks).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import sphobjinv as soi
from IPython.core.inputtransformer2 import TransformerManager

import transient_nb
import transient_nb.eventlog.vocabulary as vocabulary
from tests.conftest import end_processes
from tests.doc_pages import DOCS, NOT_CODE, RUN, Page, pages, read_page, runnable_pages
from tests.warm import WarmPython
from transient_nb import config
from transient_nb.cli.parser import _parser
from transient_nb.notebook.magic_parsers import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(DOCS / "_ext"))  # the docs' own Sphinx extension

from transient_docs import config_keys, events, inventories, magic, public_api  # noqa: E402

#: Seconds a page's examples may take (a few tiny clusters on two busy cores).
PAGE_TIMEOUT_S = 420


# -- the pages' blocks: each runs or says why, and each compiles ------------------------------------
def test_every_block_runs_or_says_why() -> None:
    problems = []
    for page in pages():
        for b in page.blocks:
            where = f"{page.name}:{b.line}"
            if b.language not in RUN and b.language not in NOT_CODE:
                problems.append(f"{where}: language {b.language!r} is neither run nor a file")
            if b.reason is not None and not b.reason.strip():
                problems.append(f"{where}: a no-run block must say why (reason=...)")
            if b.reason is not None and b.language in NOT_CODE:
                problems.append(f"{where}: a {b.language} block never runs; drop its no-run")
    assert not problems, "\n".join(problems)


def test_every_python_block_compiles() -> None:
    """Also the blocks that do not run (a GCE example must still be valid Python)."""

    ipython = TransformerManager()
    problems = []
    for page in pages():
        for b in page.blocks:
            if b.language not in ("python", "ipython"):
                continue
            code = ipython.transform_cell(b.code) if b.language == "ipython" else b.code
            try:
                compile(code, f"{page.name}:{b.line}", "exec")
            except SyntaxError as e:
                problems.append(f"{page.name}:{b.line + (e.lineno or 0)}: {e.msg}")
    assert not problems, "\n".join(problems)


def test_the_no_run_marks_are_seen(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        '# P\n\n{.no-run reason="needs a cloud"}\n```python\nprint(1)\n```\n\n```bash\nls\n```\n'
    )
    read = read_page(page)
    assert [(b.language, b.reason, b.code) for b in read.blocks] == [
        ("python", "needs a cloud", "print(1)\n"),
        ("bash", None, "ls\n"),
    ]


# -- the docs' own extension ---------------------------------------------------------------------------
def test_the_docs_tools_are_in_the_test_extra() -> None:
    """CI installs ``.[test]`` only, and must build the docs."""
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(extras["docs"]) <= set(extras["test"])


def test_config_comments_are_the_lines_above_each_key() -> None:

    text = "transient:\n  # the backend\n  backend: local\n  gce:\n    # a project\n    # or none\n    project: null\n"
    assert config_keys.comments(text) == {
        ("transient",): "",
        ("transient", "backend"): "the backend",
        ("transient", "gce"): "",
        ("transient", "gce", "project"): "a project or none",
    }


def test_every_config_key_is_read_with_its_comment_and_type() -> None:

    keys, problems = config_keys.read(Path(config.DEFAULTS_FILE), Path(config.SCHEMA_FILE))
    assert not problems
    by_key = {k.dotted: k for k in keys}
    assert by_key["transient.replacement.at"].schema["enum"] == ["preempted", "notice", "ahead"]
    assert by_key["transient.gce.head-address"].env == "DASK_TRANSIENT__GCE__HEAD_ADDRESS"
    assert all(k.comment for k in keys), [k.dotted for k in keys if not k.comment]


def test_every_event_kind_is_read_with_its_group_and_comments() -> None:

    kinds = {k.name: k for k in events.read(Path(vocabulary.__file__))}
    assert list(kinds) == list(vocabulary.EVENTS)
    assert kinds["notice"].group.startswith("VM lifecycle")
    assert kinds["notice"].comment == "the provider announced a preemption"  # from LIFECYCLE
    assert kinds["drained"].comment == "drain hooks ran after a notice"  # beside the entry
    assert "quota" in kinds["quota-exceeded"].comment  # the line above
    assert "zones" in kinds["started"].field_notes  # beside a field
    assert kinds["train-finished"].field_notes["reason"].startswith("steps|accuracy")


def test_the_api_pages_are_every_public_name() -> None:

    names = public_api.public()
    assert set(names) == set(transient_nb.__all__) - {"__version__"}
    assert names["TransientCluster"] == "transient_nb.deploy.cluster"
    text = public_api.page("TransientCluster", names["TransientCluster"])
    assert ".. autoclass:: TransientCluster" in text
    assert ":inherited-members: SpecCluster, Cluster" in text  # Dask's own stay Dask's


def test_the_offline_inventories_build_and_hold_real_urls(tmp_path: Path) -> None:

    mapping = inventories.build(tmp_path)
    assert set(mapping) == set(inventories.PROJECTS)
    for name, (url, inv) in mapping.items():
        assert url.startswith("https://") and url.endswith("/")
        objects = soi.Inventory(fname_zlib=inv).objects
        assert objects, name
        assert all(not o.uri.startswith("http") for o in objects)  # relative to the base URL


def test_the_magic_parser_has_every_subcommand() -> None:

    sub = next(a for a in magic.parser()._actions if a.dest == "subcommand")
    assert list(sub.choices) == list(SUBCOMMANDS)  # type: ignore[arg-type]


def test_sphinx_roles_in_help_texts_become_code() -> None:
    """sphinx-argparse parses help texts with plain docutils, where a role stops the build."""

    p = argparse.ArgumentParser(description="see :func:`transient_nb.estimate`")
    sub = p.add_subparsers().add_parser("x", help="as :class:`~transient_nb.TransientCluster`")
    sub.add_argument("--y", help="a :py:attr:`z`")
    magic.plain(p)
    assert p.description == "see ``transient_nb.estimate``"
    assert sub.description is None
    assert sub._actions[-1].help == "a ``z``"
    choices = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    assert choices._choices_actions[0].help == "as ``transient_nb.TransientCluster``"


# -- the build ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_site_builds(tmp_path: Path) -> None:
    out = tmp_path / "html"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-b",
            "html",
            "-d",
            str(tmp_path / "doctrees"),
            str(DOCS),
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-6000:]

    def text(page: str) -> str:
        return (out / page).read_text()

    for name in set(transient_nb.__all__) - {"__version__"}:
        assert f'id="{getattr(transient_nb, name).__module__}.{name}"' in text(
            f"reference/api/{name}.html"
        )
    events = text("reference/events.html")
    assert all(f'id="event-{kind}"' in events for kind in vocabulary.EVENTS)
    keys, _ = config_keys.read(Path(config.DEFAULTS_FILE), Path(config.SCHEMA_FILE))
    configuration = text("reference/configuration.html")
    assert all(f'id="config-{"-".join(k.path)}"' in configuration for k in keys)
    cli = text("reference/cli.html")
    commands = next(a for a in _parser()._actions if a.dest == "command").choices
    assert all(f'id="transient-nb-{c}"' in cli for c in commands)  # type: ignore[union-attr]
    magic = text("reference/magic.html")
    assert all(f'id="transient_cluster-{c}"' in magic for c in SUBCOMMANDS)
    # Intersphinx links go to the projects' own sites, from the offline inventories.
    for link, page in (
        (
            "https://docs.python.org/3/library/functools.html#functools.partial",
            "tutorials/your-model",
        ),
        (
            "https://docs.dask.org/en/stable/api.html#dask.utils.parse_timedelta",
            "how-to/configuration",
        ),
        (
            "https://distributed.dask.org/en/stable/api.html#distributed.SpecCluster",
            "tutorials/quickstart",
        ),
        (
            "https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module",
            "tutorials/your-model",
        ),
        (
            "https://docs.bokeh.org/en/latest/docs/reference/embed.html#bokeh.embed.file_html",
            "how-to/cli",
        ),
    ):
        assert f'href="{link}"' in text(f"{page}.html"), (link, page)
    # A screenshot is shown where the browser tests took it, and its test is named where not.
    shots = DOCS / "_screenshots"
    for page in out.rglob("*.html"):
        html = page.read_text()
        for name in re.findall(r"The picture <code[^>]*><span[^>]*>([\w.-]+\.png)", html):
            assert not (shots / name).exists(), f"{name} exists but {page} does not show it"


# -- every page's examples -----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(PAGE_TIMEOUT_S + 60)
@pytest.mark.parametrize("page", runnable_pages(), ids=lambda p: p.name)
def test_page_examples(page: Page, tmp_path: Path, warm_python: WarmPython) -> None:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(
                os.pathsep
            ),
            "DASK_TRANSIENT__RUN_DIR": str(tmp_path / "runs"),
            "DASK_TRANSIENT__REGISTRY_DIR": str(tmp_path / "clusters"),
            "IPYTHONDIR": str(tmp_path / "ipython"),
            "TRANSIENT_NB_STRICT_EVENTS": "1",
        }
    )
    try:
        # A module of its own, light to import, run warm (tests/warm.py): torch, Dask, Bokeh and
        # the package imported once for every page, not once a page (3-4 s of a core each).
        proc = warm_python.run(
            ["-m", "tests.doc_pages", str(page.path)], env=env, cwd=tmp_path, timeout=PAGE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"{page.name}: examples still running after {PAGE_TIMEOUT_S} s\n{e.output[-6000:]}"
        )
    finally:
        _end_heads(tmp_path / "clusters")
    output = proc.stdout
    assert proc.returncode == 0, output[-8000:]
    assert "every example ran" in output, output[-8000:]


def _end_heads(registry: Path) -> None:
    """Detached heads the page left running (it failed before its ``down``): each by its pid."""
    for entry in registry.glob("*.json"):
        try:
            pid = int(json.loads(entry.read_text()).get("pid") or 0)
            head = psutil.Process(pid)
        except (ValueError, OSError, psutil.Error):
            continue
        if "transient_nb" not in " ".join(head.cmdline()):
            continue  # not a head this test started
        end_processes([head, *head.children(recursive=True)])
