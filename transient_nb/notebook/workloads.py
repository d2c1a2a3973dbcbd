"""What the magics make of your own model and data: names of the notebook's namespace.

``%transient_cluster train --model net --data data --loss mse --metrics mae`` trains the objects
that the notebook's variables ``net`` and ``data`` (and the function ``mae``) hold; a name that is
not a variable is taken as it is (a built-in name, or an import path ``pkg.mod:attr``). The cell
form's ``train:`` mapping reads its values the same way. ``save`` and ``estimate`` are the
magics' forms of ``run.save(path)`` and :func:`transient_nb.estimate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: train() arguments that may name an object of the notebook.
BY_NAME = ("model", "data", "loss", "optimizer", "collate_fn")


def from_namespace(kwargs: Mapping[str, Any], namespace: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` with every value that names a variable of ``namespace`` replaced by it.

    ``metrics`` (text such as ``accuracy,mae``) and ``stop_at`` (``mae=0.3``) are read into
    their mappings.

    Examples
    --------
    >>> ns = {"net": object, "mae": abs}
    >>> out = from_namespace({"model": "net", "data": "digits", "metrics": "mae,accuracy"}, ns)
    >>> out["model"] is object, out["data"], out["metrics"]["mae"] is abs
    (True, 'digits', True)
    >>> from_namespace({"stop_at": "mae=0.3"}, {})["stop_at"]
    {'mae': '0.3'}
    """
    from transient_nb.training.spec import metrics_from_text, stop_at_from_text

    out = dict(kwargs)
    for key in BY_NAME:
        value = out.get(key)
        if isinstance(value, str) and value.isidentifier() and value in namespace:
            out[key] = namespace[value]
    metrics = out.get("metrics")
    if isinstance(metrics, str):
        if metrics.isidentifier() and isinstance(namespace.get(metrics), Mapping):
            out["metrics"] = namespace[metrics]
        else:
            out["metrics"] = metrics_from_text(metrics, namespace.get)
    if isinstance(out.get("stop_at"), str):
        out["stop_at"] = stop_at_from_text(out["stop_at"])
    return out


def save(run: Any, path: str) -> str:
    """Write ``run``'s trained state dict to ``path``; the sentence that says so."""
    written = run.save(path)
    return (
        f"Saved the trained weights of {run.id} to {written}; load them with "
        "model.load_state_dict(torch.load(PATH))."
    )
