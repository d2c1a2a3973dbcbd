"""The trained model, home: a ``state_dict`` that ``load_state_dict`` reads, from a run or its
checkpoints, on any machine.

The PS holds a run's trainable parameters as one flat vector (cut into shards) and its float
buffers (batch-norm statistics) as another; frozen parameters and integer buffers never leave the
model as the driver built it. The *layout* says, for every name of the model's ``state_dict``,
its shape and dtype and where its values are: an offset into the weights (``"w"``), into the
buffers (``"bn"``), or its own array among the fixed ones (``"fixed"``, written once beside the
checkpoints, :func:`~transient_nb.training.checkpoint.write_fixed`). Each checkpoint's manifest
records the layout, so a checkpoint alone (JSON and ``.npz``, no pickles) rebuilds the
``state_dict``: :func:`load_state_dict`; with the model's class or factory, the module itself:
:func:`load_model`.

Examples
--------
>>> from torch import nn
>>> net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
>>> entries = layout(net)
>>> [e[0] for e in entries][:3], entries[0][3:]
(['0.weight', '0.bias', '1.weight'], ['w', 0])
>>> weights = np.arange(15, dtype=np.float32)  # 6 + 3 + 3 + 3 trainable entries
>>> sd = assemble(entries, weights, np.zeros(6, np.float32), fixed_state(net))
>>> net.load_state_dict(sd)
<All keys matched successfully>
>>> net[0].bias.tolist()
[6.0, 7.0, 8.0]
"""

from __future__ import annotations

import io
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import fsspec
import numpy as np
import torch
from torch import nn

from transient_nb.training import checkpoint
from transient_nb.training import resume as resuming
from transient_nb.training.flat import flat_layout
from transient_nb.training.models import MODELS, build_model
from transient_nb.training.preflight import refusing
from transient_nb.training.workload import Workload, fixed_state, import_path

#: One entry of a layout: name, shape, dtype, source ("w", "bn" or "fixed"), offset.
Entry = list[Any]


def layout(model: nn.Module) -> list[Entry]:
    """Every ``state_dict`` name of ``model`` with its shape, dtype and source (module text).

    Tied parameters (one tensor under two names) point at the same offset.
    """
    params, buffers = flat_layout(model)
    where: dict[int, tuple[str, int]] = {}
    offset = 0
    for p in params:
        where[id(p)] = ("w", offset)
        offset += p.numel()
    offset = 0
    for b in buffers:
        where[id(b)] = ("bn", offset)
        offset += b.numel()
    out: list[Entry] = []
    for name, t in model.state_dict(keep_vars=True).items():
        if not isinstance(t, torch.Tensor):
            continue  # extra state that is not a tensor: not kept (see README)
        source, at = where.get(id(t), ("fixed", 0))
        out.append([name, list(t.shape), str(t.dtype).removeprefix("torch."), source, at])
    return out


def assemble(
    entries: Sequence[Entry],
    weights: np.ndarray,
    bn: np.ndarray | None,
    fixed: Mapping[str, np.ndarray],
) -> OrderedDict[str, torch.Tensor]:
    """The ``state_dict`` (CPU tensors, the model's order) from the PS's flat vectors and the
    fixed arrays, as :func:`layout` places them."""
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for name, shape, dtype, source, at in entries:
        n = int(np.prod(shape)) if shape else 1
        if source == "w":
            values = np.asarray(weights[at : at + n], dtype=np.float32)
        elif source == "bn":
            if bn is None:
                raise ValueError(f"{name!r} is a buffer of the PS, but it holds none.")
            values = np.asarray(bn[at : at + n], dtype=np.float32)
        else:
            if name not in fixed:
                raise ValueError(f"{name!r} is missing from the fixed arrays of the checkpoint.")
            values = np.asarray(fixed[name])
        tensor = torch.from_numpy(np.array(values, copy=True)).reshape(shape)
        out[name] = tensor.to(getattr(torch, dtype))
    return out


def flat_of(states: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray | None]:
    """The whole weight vector (the shards joined) and the statistics (shard 0's)."""
    weights = np.concatenate([np.asarray(s["weights"], dtype=np.float32) for s in states])
    bn = states[0].get("bn") if states else None
    return weights, None if bn is None else np.asarray(bn, dtype=np.float32)


def model_with(model: nn.Module, state: Mapping[str, torch.Tensor], what: str) -> nn.Module:
    """``model`` with ``state`` loaded (strict), on the CPU, in eval mode; a ValueError that
    names what does not match."""
    model = model.cpu()
    with refusing(
        f"the weights of {what} do not fit the model given",
        ": pass the same model (class or factory) the run trained.",
        catch=RuntimeError,
    ):
        model.load_state_dict(state)
    return model.eval()


def save(state: Mapping[str, torch.Tensor], path: str) -> str:
    """Write ``state`` with ``torch.save`` to a local path or any fsspec URL; returns the path.

    ``model.load_state_dict(torch.load(path))`` reads it back.
    """
    if "://" not in path:
        path = os.path.abspath(os.path.expanduser(path))
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with fsspec.open(path, "wb") as f:
        torch.save(dict(state), f)
    return path


def state_bytes(state: Mapping[str, torch.Tensor]) -> bytes:
    """A state dict as ``.npz`` bytes: what travels from a detached cluster's head to a client,
    numbers only (:func:`state_of` reads them back).

    Examples
    --------
    >>> state_of(state_bytes({"w": torch.ones(2)}))["w"].tolist()
    [1.0, 1.0]
    """
    buf = io.BytesIO()
    arrays: dict[str, Any] = {k: v.detach().cpu().numpy() for k, v in state.items()}
    np.savez(buf, **arrays)
    return buf.getvalue()


def state_of(data: bytes) -> OrderedDict[str, torch.Tensor]:
    """The state dict of :func:`state_bytes` (torch tensors, in order)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return OrderedDict((k, torch.from_numpy(npz[k].copy())) for k in npz.files)


# -- from a checkpoint ------------------------------------------------------------------------------
def _checkpoint_of(run_or_url: str) -> tuple[checkpoint.Checkpoint, str]:
    """The newest complete checkpoint of a run id or a checkpoint URL, and its run's URL."""
    point = resuming.find(run_or_url)
    ck = checkpoint.load_latest(point.checkpoint_url, run=point.run_id or None)
    assert ck is not None  # find() refuses a URL without one
    return ck, point.checkpoint_url


def load_state_dict(run_or_url: str) -> OrderedDict[str, torch.Tensor]:
    """The ``state_dict`` of a run's newest complete checkpoint (no model needed).

    Parameters
    ----------
    run_or_url
        A run id (``"run-1a2b3c4d"``, looked up in the run records) or the run's checkpoint URL
        (its ``train-started`` event's ``checkpoint_url``, ``URL/<run id>``; any fsspec URL).
        The ``checkpoint_url`` runs share is taken when it holds one run; with several, the
        error lists them.

    Examples
    --------
    >>> import transient_nb
    >>> state = transient_nb.load_state_dict("run-1a2b3c4d")  # doctest: +SKIP
    >>> net.load_state_dict(state)  # doctest: +SKIP
    """
    return _state_of(*_checkpoint_of(run_or_url), run_or_url)


def _state_of(ck: checkpoint.Checkpoint, url: str, what: str) -> OrderedDict[str, torch.Tensor]:
    entries = ck.meta.get("layout")
    if not entries:
        raise ValueError(
            f"{what}: its checkpoint at {ck.url} records no layout (written by an older "
            "transient_nb): rebuild the model and set its weights by hand."
        )
    fixed = checkpoint.read_fixed(url, ck.meta.get("fixed"))
    weights, bn = flat_of([_as_state(sh) for sh in ck.shards])
    return assemble(entries, weights, bn, fixed)


def _as_state(shard: Mapping[str, np.ndarray]) -> dict[str, Any]:
    return {"weights": shard["weights"], "bn": shard.get("bn")}


def load_model(run_or_url: str, model: Any = None) -> nn.Module:
    """The trained model of a run (finished, failed, detached or running), from its newest
    complete checkpoint, on the CPU and in eval mode.

    Parameters
    ----------
    run_or_url
        A run id or a checkpoint URL (see :func:`load_state_dict`).
    model
        What builds the network: a class or zero-argument factory, an ``nn.Module`` (its weights
        are replaced), an import path ``"package.module:attr"`` or a built-in name. Optional when
        the run's model was a built-in name or an import path (the checkpoint records it); a
        model defined in a notebook travelled by value, so pass it here.

    Examples
    --------
    >>> import transient_nb
    >>> net = transient_nb.load_model("run-1a2b3c4d", model=Net)  # doctest: +SKIP
    >>> net(x).argmax(1)  # doctest: +SKIP
    """
    ck, url = _checkpoint_of(run_or_url)
    state = _state_of(ck, url, run_or_url)
    if model is None:
        model = ck.meta.get("model_ref")
        if not model:
            raise ValueError(
                f"{run_or_url}: its model ({ck.meta.get('model')}) was defined in a notebook and "
                "travelled by value; pass model= (its class or factory) to rebuild it, or take "
                "the weights alone with transient_nb.load_state_dict()."
            )
    return model_with(build(model, state), state, f"run {ck.meta.get('run') or run_or_url}")


def build(model: Any, state: Mapping[str, torch.Tensor] | None = None) -> nn.Module:
    """A fresh network from what :func:`load_model` takes (a built-in name sized by ``state``)."""
    if isinstance(model, str) and model in MODELS:
        classes = state["fc.bias"].shape[0] if state and "fc.bias" in state else 10
        return build_model(model, num_classes=int(classes))
    if isinstance(model, str):
        model = import_path(model, "model")
    if isinstance(model, Workload):
        return model.build_model()
    if isinstance(model, nn.Module):
        return model
    built = model()
    if not isinstance(built, nn.Module):
        raise ValueError(f"model= returned a {type(built).__name__}, not an nn.Module.")
    return built


__all__ = [
    "assemble",
    "build",
    "fixed_state",
    "flat_of",
    "layout",
    "load_model",
    "load_state_dict",
    "model_with",
    "save",
    "state_bytes",
    "state_of",
]
