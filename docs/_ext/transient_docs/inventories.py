"""Intersphinx without a network: small inventories kept in the repository.

Each ``docs/_inventories/NAME.txt`` is an inventory in sphobjinv's plain-text format (the lines of
the targets our pages reference, with the project's real URIs). At build time each one becomes an
``objects.inv`` that ``intersphinx_mapping`` reads from disk, so the build never fetches one.

A reference to one of those projects that its small inventory lacks is a warning (so an error
with ``-W``) that says which line to add, instead of a silent plain-text name
(:func:`warn_missing_reference`).

Refreshing (a person with a network, not CI)::

    python docs/_ext/transient_docs/inventories.py python https://docs.python.org/3/objects.inv

rewrites ``docs/_inventories/python.txt`` with today's lines for the names it already lists; to
add a name, add a line by hand first (the URI can be anything), then refresh.
"""

from __future__ import annotations

import builtins
import sys
from pathlib import Path
from typing import Any

#: Project -> (base URL of its documentation, first parts of its Python names).
PROJECTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "python": ("https://docs.python.org/3/", ()),  # the standard library: see _is_stdlib
    "dask": ("https://docs.dask.org/en/stable/", ("dask",)),
    "distributed": ("https://distributed.dask.org/en/stable/", ("distributed",)),
    "torch": ("https://docs.pytorch.org/docs/stable/", ("torch",)),
    "bokeh": ("https://docs.bokeh.org/en/latest/", ("bokeh",)),
}

HERE = Path(__file__).resolve().parents[2] / "_inventories"


def build(out: Path, sources: Path = HERE) -> dict[str, tuple[str, str]]:
    """Write ``out/NAME.inv`` for every ``sources/NAME.txt``; the ``intersphinx_mapping``."""
    import sphobjinv as soi

    out.mkdir(parents=True, exist_ok=True)
    mapping = {}
    for name, (url, _) in PROJECTS.items():
        inv = soi.Inventory(plaintext=(sources / f"{name}.txt").read_bytes())
        target = out / f"{name}.inv"
        data = soi.compress(inv.data_file(contract=True))
        if not target.exists() or target.read_bytes() != data:
            soi.writebytes(str(target), data)
        mapping[name] = (url, str(target))
    return mapping


def _is_stdlib(target: str) -> bool:
    first = target.split(".", 1)[0]
    return first in sys.stdlib_module_names or hasattr(builtins, first)


def _project_of(target: str) -> str | None:
    if _is_stdlib(target):
        return "python"
    first = target.split(".", 1)[0]
    for name, (_, prefixes) in PROJECTS.items():
        if first in prefixes:
            return name
    return None


def warn_missing_reference(app: Any, domain: Any, node: Any) -> bool | None:
    """``warn-missing-reference`` (``nitpicky`` is on): which unresolved Python names to report.

    A name of one of :data:`PROJECTS` is reported with the inventory line to add; a
    ``transient_nb`` name on a narrative page (not the API pages, whose docstrings also name
    modules that have no page) is reported as not documented. Every other Python name (``Any``,
    ``pd.DataFrame``, a private class in a signature) stays plain text, as without ``nitpicky``.
    Other domains (``doc``, ``ref``) are left to Sphinx, which reports them.
    """
    from sphinx.util import logging

    if domain is None or domain.name != "py":
        return None
    target = str(node.get("reftarget", "")).lstrip("~.")
    logger = logging.getLogger(__name__)
    project = _project_of(target)
    if project is not None:
        role = node.get("reftype", "obj")
        logger.warning(
            "%s is not in docs/_inventories/%s.txt: add a line such as `%s py:%s 1 PATH.html#$ -` "
            "(see docs/_ext/transient_docs/inventories.py)",
            target,
            project,
            target,
            "function" if role == "func" else role,
            location=node,
        )
    elif target.startswith("transient_nb") and not str(node.get("refdoc", "")).startswith(
        "reference/api/"
    ):
        logger.warning("%s has no page in the API reference", target, location=node)
    return True


def refresh(name: str, source: str, sources: Path = HERE) -> int:
    """Rewrite ``sources/NAME.txt`` from ``source`` (an objects.inv URL or file), keeping its names.

    Returns how many of the listed names the source no longer has (they are kept as they were).
    """
    import sphobjinv as soi

    path = sources / f"{name}.txt"
    ours = soi.Inventory(plaintext=path.read_bytes())
    if source.startswith(("http://", "https://")):
        theirs = soi.Inventory(url=source)
    else:
        theirs = soi.Inventory(fname_zlib=source)
    fresh = {(o.name, o.domain, o.role): o for o in theirs.objects}
    missing = 0
    for i, obj in enumerate(ours.objects):
        new = fresh.get((obj.name, obj.domain, obj.role))
        if new is None:
            missing += 1
            print(f"not in {source}: {obj.name} ({obj.domain}:{obj.role}); kept", file=sys.stderr)
        else:
            ours.objects[i] = new
    ours.project, ours.version = theirs.project, theirs.version
    path.write_bytes(ours.data_file(contract=True))
    return missing


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in PROJECTS:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(PROJECTS)}}} URL-OR-FILE-OF-objects.inv")
    refresh(sys.argv[1], sys.argv[2])
