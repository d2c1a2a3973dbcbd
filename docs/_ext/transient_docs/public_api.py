"""The public API's pages, one per name of ``transient_nb.__all__``, written at each build.

The root package is lazy (a module ``__getattr__``), so each object is documented where it is
defined (``transient_nb.deploy.cluster.TransientCluster``), found through its ``__module__``.
A name added to ``__all__`` gets its page at the next build; nobody keeps a list by hand.
References to the short names (``transient_nb.TransientCluster``, as the docstrings write them)
are resolved to those pages by :func:`resolve_short_name`.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

#: Where the pages go, under the source folder (ignored by git: see docs/.gitignore).
FOLDER = "reference/api"

#: Classes whose constructor takes ``*args, **kwargs`` and hands them to another callable: the
#: signature shown is that callable's (less the names listed), then the class's own keywords.
FORWARDED = {
    "transient_nb.deploy.cluster.TransientCluster": (
        "transient_nb.deploy.settings.ClusterSettings.from_arguments",
        ("cluster_id",),
    ),
}


def public() -> dict[str, str]:
    """Public name -> the module that defines it, for every name of ``transient_nb.__all__``."""
    import transient_nb

    out = {}
    for name in transient_nb.__all__:
        if name.startswith("_"):
            continue
        obj = getattr(transient_nb, name)
        out[name] = obj.__module__
    return out


def page(name: str, module: str) -> str:
    obj = getattr(importlib.import_module(module), name)
    title = f"{name}\n{'=' * len(name)}\n\n.. currentmodule:: {module}\n\n"
    if inspect.isclass(obj):
        # Members inherited from Dask's classes (and their bases) are Dask's to document.
        theirs = [b.__name__ for b in inspect.getmro(obj)[1:] if not _ours(b)]
        inherited = f"   :inherited-members: {', '.join(theirs)}\n" if theirs != ["object"] else ""
        return f"{title}.. autoclass:: {name}\n   :members:\n{inherited}   :show-inheritance:\n"
    return f"{title}.. autofunction:: {name}\n"


def _ours(cls: type) -> bool:
    return cls.__module__.split(".", 1)[0] == "transient_nb"


class _Text:
    """An annotation written as it is in the source (``repr`` without quotes)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _signature(func: Any, drop: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    out = []
    for p in inspect.signature(func).parameters.values():
        if p.name in ("self", "cls", *drop) or p.name.startswith("_"):
            continue
        if p.kind in (p.VAR_POSITIONAL,):
            continue
        if isinstance(p.annotation, str):
            p = p.replace(annotation=_Text(p.annotation))
        out.append(p)
    return out


def forwarded_signature(
    app: Any, what: str, name: str, obj: Any, options: Any, signature: Any, annotation: Any
) -> tuple[str, str | None] | None:
    """``autodoc-process-signature``: the real arguments of a class listed in :data:`FORWARDED`."""
    if what != "class" or name not in FORWARDED:
        return None
    path, drop = FORWARDED[name]
    module, owner, attr = path.rsplit(".", 2)
    target = getattr(getattr(importlib.import_module(module), owner), attr)
    params = _signature(target, drop)
    var_kw = [p for p in params if p.kind == p.VAR_KEYWORD]
    params = [p for p in params if p.kind != p.VAR_KEYWORD]
    names = {p.name for p in params}
    own = [
        p.replace(kind=p.KEYWORD_ONLY)
        for p in _signature(obj.__init__)
        if p.kind not in (p.VAR_KEYWORD,) and p.name not in names
    ]
    return str(inspect.Signature([*params, *own, *var_kw])), annotation


def write_pages(app: Any, config: Any) -> None:
    """``config-inited``: write ``reference/api/NAME.rst`` for each public name (when changed)."""
    folder = Path(app.srcdir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    names = public()
    for name, module in names.items():
        path = folder / f"{name}.rst"
        text = page(name, module)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    for stale in folder.glob("*.rst"):
        if stale.stem not in names:
            stale.unlink()


def resolve_short_name(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """``missing-reference``: ``transient_nb.NAME`` -> where NAME is defined."""
    target = str(node.get("reftarget", ""))
    if node.get("refdomain") != "py" or not target.startswith("transient_nb."):
        return None
    parts = target.split(".")
    names = public()
    if len(parts) < 2 or parts[1] not in names:
        return None
    full = ".".join((names[parts[1]], *parts[1:]))
    domain = env.get_domain("py")
    node["reftarget"] = full
    return domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], full, node, contnode
    )
