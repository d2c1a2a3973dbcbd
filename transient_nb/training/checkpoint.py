"""Checkpoints of the parameter server: complete, atomic, on any fsspec URL.

A checkpoint is a complete dict (weights, momentum, batch-norm statistics, step, hyperparameters,
model name, format version) per PS shard, written to a temporary name and then renamed, so a
reader never sees half a file (local disk, NFS, or ``gs://`` through gcsfs).
"""

from __future__ import annotations

import io
import os
import uuid
from typing import Any

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem

#: Bumped when the layout of a checkpoint dict changes.
FORMAT = 1


def shard_path(url: str, shard: int) -> str:
    """Where shard ``shard`` of a run's checkpoint lives."""
    return f"{url.rstrip('/')}/ps-shard{shard}.pt"


def save(url: str, state: dict[str, Any]) -> str:
    """Write one shard's state atomically under ``url``; returns the final path."""
    fs, root = fsspec.core.url_to_fs(url)
    fs.makedirs(root, exist_ok=True)
    buf = io.BytesIO()
    torch.save(state, buf)
    target = shard_path(root, int(state["shard"]))
    tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
    with fs.open(tmp, "wb") as f:
        f.write(buf.getvalue())
    if isinstance(fs, LocalFileSystem):
        os.replace(tmp, target)  # atomic on POSIX
    else:
        fs.mv(tmp, target)  # object stores make whole objects visible at once
    return target if "://" not in url else f"{url.rstrip('/')}/{os.path.basename(target)}"


def load(url: str, shard: int) -> dict[str, Any] | None:
    """The last checkpoint of shard ``shard`` under ``url``, or None if there is none."""
    fs, root = fsspec.core.url_to_fs(url)
    path = shard_path(root, shard)
    if not fs.exists(path):
        return None
    with fs.open(path, "rb") as f:
        data = f.read()
    # Our own files, holding numpy arrays, which weights_only loading refuses.
    state: dict[str, Any] = torch.load(io.BytesIO(data), weights_only=False)
    if state.get("format") != FORMAT:
        raise ValueError(f"Checkpoint {path} has format {state.get('format')}, expected {FORMAT}.")
    return state
