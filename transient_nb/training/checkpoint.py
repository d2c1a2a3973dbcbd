"""Checkpoints of the parameter server: consistent, atomic, code-free, on any fsspec URL.

One checkpoint is one folder per agreed version ``step-<step>/`` under the run's URL:

- ``shard-<i>.npz``, one per PS shard: plain arrays (weights, momentum, decay mask, batch-norm
  statistics; with a user's ``torch.optim`` optimizer its state as ``opt.*`` arrays and its
  settings as JSON bytes), written by the shard itself to a temporary name, fsync'ed, then renamed;
- ``manifest.json``, written last by the driver, once every shard's file is in place: the step,
  the model, the hyperparameters, the counters, each shard file's size and SHA-256, and the
  model's ``layout`` (every state-dict name, its shape and where its values are).

Beside the step folders, ``fixed.npz`` (written once, when the run starts) holds what the PS never
changes: frozen parameters and integer buffers, by state-dict name. Together they make the
model's ``state_dict`` on any machine (:mod:`transient_nb.training.export`).

A reader takes the newest folder whose manifest exists and whose files match it, so a writer that
dies midway leaves the previous complete checkpoint in force, and an older checkpoint can never
replace a newer one (each version has its own folder). Loading uses ``numpy.load`` with
``allow_pickle=False`` and ``json``: a checkpoint in a shared bucket can carry numbers, never
code.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem

from transient_nb.training.optim import META_KEY, STATE_PREFIX

#: Bumped when the layout changes; 1 was a pickle per shard (refused now).
FORMAT = 2
#: Arrays a shard file may hold.
ARRAYS = ("weights", "momentum", "decay_mask", "bn")
#: The name :func:`step_dir` gives a folder (at least 9 digits), and nothing else: a stray
#: ``copy-of-step-000000001`` or ``step-7`` is not a checkpoint, and prune must not act on it.
_STEP_DIR = re.compile(r"(?:^|/)step-(\d{9,})$")


@dataclass
class Checkpoint:
    """A complete checkpoint: the manifest's metadata and every shard's arrays.

    Examples
    --------
    >>> ck = Checkpoint(step=3, meta={"model": "resnet8"}, shards=[{"weights": np.zeros(2)}])
    >>> ck.step, len(ck.shards)
    (3, 1)
    """

    step: int
    meta: dict[str, Any]
    shards: list[dict[str, np.ndarray]] = field(default_factory=list)
    url: str = ""


def _optimizer_key(key: str) -> bool:
    return key.startswith(STATE_PREFIX) or key == META_KEY


def step_dir(url: str, step: int) -> str:
    """The folder of version ``step`` under the run's checkpoint ``url``."""
    return f"{url.rstrip('/')}/step-{int(step):09d}"


def _write_atomic(fs: Any, path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    if isinstance(fs, LocalFileSystem):
        # fsync before the rename: after a power loss the name points at complete bytes.
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # and the rename itself is durable
        finally:
            os.close(dir_fd)
    else:
        # Object stores (gs://, memory://) make an object visible whole, on close.
        with fs.open(path, "wb") as f:
            f.write(data)


def write_shard(
    url: str, step: int, shard: int, arrays: dict[str, np.ndarray | None]
) -> dict[str, Any]:
    """Write one shard's arrays of version ``step``; returns its manifest entry.

    Examples
    --------
    >>> entry = write_shard("memory://doc-ckpt", 5, 0, {"weights": np.ones(2, np.float32)})
    >>> entry["name"], entry["bytes"] > 0
    ('shard-0.npz', True)
    """
    unknown = {k for k in arrays if k not in ARRAYS and not _optimizer_key(k)}
    if unknown:
        raise ValueError(
            f"Unknown checkpoint arrays {sorted(unknown)}: use {ARRAYS} (and a torch "
            f"optimizer's {STATE_PREFIX}* and {META_KEY})."
        )
    fs, root = fsspec.core.url_to_fs(url)
    folder = step_dir(root, step)
    fs.makedirs(folder, exist_ok=True)
    buf = io.BytesIO()
    present: dict[str, Any] = {k: np.asarray(v) for k, v in arrays.items() if v is not None}
    np.savez(buf, **present)
    data = buf.getvalue()
    name = f"shard-{int(shard)}.npz"
    _write_atomic(fs, f"{folder}/{name}", data)
    return {
        "name": name,
        "shard": int(shard),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def write_manifest(url: str, step: int, meta: dict[str, Any], files: list[dict[str, Any]]) -> str:
    """Publish version ``step``: written last, after every shard file; returns its path.

    ``meta`` must be JSON (numbers, strings, lists, dicts).
    """
    fs, root = fsspec.core.url_to_fs(url)
    folder = step_dir(root, step)
    manifest = {
        **meta,
        "format": FORMAT,
        "step": int(step),
        "files": sorted(files, key=lambda f: f["shard"]),
    }
    path = f"{folder}/manifest.json"
    _write_atomic(fs, path, json.dumps(manifest, indent=1, sort_keys=True).encode())
    return path if "://" not in url else f"{step_dir(url, step)}/manifest.json"


def steps(url: str) -> list[int]:
    """The versions that have a folder under ``url`` (complete or not), newest first."""
    fs, root = fsspec.core.url_to_fs(url)
    if not fs.exists(root):
        return []
    found = []
    for entry in fs.ls(root, detail=False):
        m = _STEP_DIR.search(str(entry).rstrip("/"))
        if m:
            found.append(int(m.group(1)))
    return sorted(found, reverse=True)


def _read_complete(fs: Any, root: str, step: int) -> Checkpoint | None:
    folder = step_dir(root, step)
    try:
        with fs.open(f"{folder}/manifest.json", "rb") as f:
            manifest = json.loads(f.read())
    except (FileNotFoundError, json.JSONDecodeError):
        return None  # not published (yet), or torn by a writer that died
    if manifest.get("format") != FORMAT:
        raise ValueError(
            f"Checkpoint {folder} has format {manifest.get('format')!r}, expected {FORMAT}: "
            "it was written by another version of transient_nb; start a new run or pass another checkpoint_url."
        )
    shards = []
    for entry in manifest["files"]:
        try:
            with fs.open(f"{folder}/{entry['name']}", "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            return None
        # allow_pickle=False: object arrays (which could run code when loaded) are refused.
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            shards.append({k: npz[k] for k in npz.files})
    meta = {k: v for k, v in manifest.items() if k != "files"}
    return Checkpoint(step=int(manifest["step"]), meta=meta, shards=shards, url=folder)


def load_latest(url: str) -> Checkpoint | None:
    """The newest complete checkpoint under ``url``, or None if there is none.

    Examples
    --------
    >>> url = "memory://doc-latest"
    >>> files = [write_shard(url, 7, 0, {"weights": np.arange(3, dtype=np.float32)})]
    >>> _ = write_manifest(url, 7, {"model": "resnet8"}, files)
    >>> _ = write_shard(url, 9, 0, {"weights": np.zeros(3, np.float32)})  # no manifest: torn
    >>> ck = load_latest(url)
    >>> ck.step, ck.shards[0]["weights"].tolist()
    (7, [0.0, 1.0, 2.0])
    """
    fs, root = fsspec.core.url_to_fs(url)
    for step in steps(url):
        ck = _read_complete(fs, root, step)
        if ck is not None:
            return ck
    return None


def load_step(url: str, step: int) -> Checkpoint | None:
    """The complete checkpoint of version ``step`` under ``url``, or None (missing or torn)."""
    fs, root = fsspec.core.url_to_fs(url)
    return _read_complete(fs, root, step)


def latest_step(url: str) -> int | None:
    """The step of the newest complete checkpoint, or None."""
    ck = load_latest(url)
    return None if ck is None else ck.step


def prune(url: str, keep: int = 2) -> list[int]:
    """Delete all but the ``keep`` newest complete checkpoints (and torn ones older than them).

    Returns the steps deleted. Folders newer than the newest complete one are left alone: a
    writer may be filling them right now.
    """
    fs, root = fsspec.core.url_to_fs(url)
    complete = 0
    deleted = []
    for step in steps(url):
        if complete >= keep:
            fs.rm(step_dir(root, step), recursive=True)
            deleted.append(step)
        elif fs.exists(f"{step_dir(root, step)}/manifest.json"):
            complete += 1
    return deleted


#: The file beside the step folders with the frozen parameters and integer buffers.
FIXED = "fixed.npz"


def write_fixed(url: str, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Write what the PS never changes (state-dict name -> array) once, under the run's ``url``;
    returns its entry (name, bytes, SHA-256) for the manifests.

    Examples
    --------
    >>> entry = write_fixed("memory://doc-fixed", {"bn.num_batches_tracked": np.zeros((), np.int64)})
    >>> sorted(read_fixed("memory://doc-fixed", entry))
    ['bn.num_batches_tracked']
    """
    fs, root = fsspec.core.url_to_fs(url)
    fs.makedirs(root, exist_ok=True)
    buf = io.BytesIO()
    present: dict[str, Any] = {k: np.asarray(v) for k, v in arrays.items()}
    np.savez(buf, **present)
    data = buf.getvalue()
    _write_atomic(fs, f"{root.rstrip('/')}/{FIXED}", data)
    return {"name": FIXED, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_fixed(url: str, entry: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """The arrays of :func:`write_fixed` (checked against ``entry`` when given; {} if none)."""
    fs, root = fsspec.core.url_to_fs(url)
    path = f"{root.rstrip('/')}/{FIXED}"
    if not fs.exists(path):
        if entry:
            raise ValueError(f"{url}: {FIXED} is missing; the checkpoint is incomplete.")
        return {}
    with fs.open(path, "rb") as f:
        data = f.read()
    if entry and hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise ValueError(f"{url}/{FIXED} does not match its manifest (changed or torn).")
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


# -- where checkpoints go -------------------------------------------------------------------------
def check_checkpoint_url(checkpoint_url: str | None, backend: str) -> None:
    """On a non-local ``backend``: refuse a missing or host-local ``checkpoint_url``, then probe it
    with a write (:func:`probe_checkpoint_url`). Nothing to check on the local backend.

    :func:`~transient_nb.train` calls it before anything starts; the ``%%transient_cluster`` cell magic calls
    it before it creates the cluster.
    """
    if backend == "local":
        return
    if (
        checkpoint_url is None
        or "://" not in checkpoint_url
        or checkpoint_url.startswith(("file://", "memory://"))
    ):
        raise ValueError(
            f"checkpoint_url={checkpoint_url!r}: on the {backend} backend the PS checkpoints must "
            "live on storage that outlives the PS host and that every host can reach; pass e.g. "
            "checkpoint_url='gs://YOUR-BUCKET/transient-runs'."
        )
    probe_checkpoint_url(checkpoint_url)


def probe_checkpoint_url(url: str) -> None:
    """Write, read back and delete a small file under ``url``; a clear error if that fails."""
    probe = f"{url.rstrip('/')}/.transient-nb-probe-{uuid.uuid4().hex[:8]}"
    try:
        fs, path = fsspec.core.url_to_fs(probe)
        with fs.open(path, "wb") as f:
            f.write(b"ok")
        with fs.open(path, "rb") as f:
            ok = f.read() == b"ok"
        fs.rm(path)
    except Exception as e:
        raise ValueError(
            f"checkpoint_url={url!r} cannot be written ({type(e).__name__}: {e}). Check that the "
            "bucket exists and that your credentials (and the VMs' service account) may write to "
            "it, or pass another checkpoint_url."
        ) from e
    if not ok:
        raise ValueError(
            f"checkpoint_url={url!r}: a file written there did not read back the same."
        )
