"""Sphinx configuration of transient_nb's documentation site.

Build it (what ``tests/test_docs.py`` runs, warnings as errors)::

    pip install -e ".[docs]"        # or ".[test]", which has the same tools
    sphinx-build -W --keep-going -b html docs docs/_build/html

Nothing is fetched from the network while building:

- Intersphinx reads small inventories kept in ``docs/_inventories/*.txt`` (sphobjinv's
  plain-text format: the targets these pages reference, with each project's real URIs), turned
  into ``objects.inv`` files at each build. A reference to Python, Dask, distributed, PyTorch
  or Bokeh that is not listed there fails the build with the line to add. To refresh a list
  from the project's published inventory (a person with a network, not CI)::

      python docs/_ext/transient_docs/inventories.py dask https://docs.dask.org/en/stable/objects.inv

  which rewrites ``docs/_inventories/dask.txt`` with today's URIs for the names it lists
  (likewise ``python``, ``distributed``, ``torch``, ``bokeh``: base URLs in ``PROJECTS`` there).
- The reference pages are generated from the package (``docs/_ext/transient_docs``): the API
  from ``transient_nb.__all__`` and the docstrings, the CLI and the magic from their argparse
  parsers (sphinx-argparse), the event vocabulary from ``EVENTS`` and its comments, the
  configuration keys from ``transient.yaml`` and its schema.
- Screenshots come from the browser tests (``docs/_screenshots/``, ignored by git); where they
  have not run, the pages say which test makes each picture.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

from transient_docs import inventories  # noqa: E402  (after the path above)

from transient_nb._version import __version__  # noqa: E402

project = "transient_nb"
author = "transient_nb developers"
copyright = "transient_nb developers"
version = release = __version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "numpydoc",
    "myst_parser",
    "sphinxarg.ext",
    "sphinx_copybutton",
    "transient_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_inventories", "_screenshots", "**/.ipynb_checkpoints"]

# -- MyST ------------------------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "attrs_block", "deflist"]
myst_heading_anchors = 3

# -- API reference ---------------------------------------------------------------------------------
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
python_maximum_signature_line_length = 88
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# -- Intersphinx, offline --------------------------------------------------------------------------
intersphinx_mapping = inventories.build(HERE / "_inventories" / "build")
# Every unresolved Python reference reaches transient_docs.inventories.warn_missing_reference,
# which reports the ones to the projects above and to our own API, and lets the others be.
nitpicky = True
intersphinx_cache_limit = -1
intersphinx_timeout = 1

# -- HTML ------------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"transient_nb {version}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_static_path: list[str] = []
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
