"""Checkpoints of the parameter server: consistent, atomic, code-free, on any fsspec URL.

Every run has a folder of its own: ``URL/<run id>/`` under a ``checkpoint_url`` the user gave
(:func:`run_url`; several runs may share that URL), or the run's own folder of the run record when
none was given. One checkpoint is one folder per agreed version ``step-<step>/`` in it:

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
replace a newer one (each version has its own folder). The manifest names its run: the driver
loads (to resume, or to re-create a lost PS) only its own run's checkpoints, with the model and
layout it trains (:func:`check_owner`), and prunes only its own (:func:`prune`). Loading uses ``numpy.load`` with
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from transient_nb import config

#: Bumped when the layout changes; 1 was a pickle per shard (refused now).
FORMAT = 2
#: Arrays a shard file may hold.
ARRAYS = ("weights", "momentum", "decay_mask", "bn")
#: The name :func:`step_dir` gives a folder (at least 9 digits), and nothing else: a stray
#: ``copy-of-step-000000001`` or ``step-7`` is not a checkpoint, and prune must not act on it.
_STEP_DIR = re.compile(r"(?:^|/)step-(\d{9,})$")
#: What a run id looks like (``TrainingRun.id``): the name of a run's folder under a shared URL.
RUN_ID = re.compile(r"^run-[0-9a-f]{8}$")


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


#: Key prefix of a torch optimizer's per-parameter state in a checkpoint's shard file, and the
#: key of its JSON (param groups, base learning rates, scalar state): written here, not in
#: :mod:`~transient_nb.training.optim`, so that reading a checkpoint never imports torch.
STATE_PREFIX = "opt."
META_KEY = "opt_meta"


class NotOwned(ValueError):
    """A checkpoint that is not the expected run's (or model's, or layout's): never loaded."""


def _optimizer_key(key: str) -> bool:
    return key.startswith(STATE_PREFIX) or key == META_KEY


def step_dir(url: str, step: int) -> str:
    """The folder of version ``step`` under the run's checkpoint ``url``."""
    return f"{url.rstrip('/')}/step-{int(step):09d}"


def run_url(url: str, run_id: str) -> str:
    """The folder of run ``run_id`` under a ``checkpoint_url`` that several runs may share.

    Examples
    --------
    >>> run_url("gs://bucket/runs/", "run-1a2b3c4d")
    'gs://bucket/runs/run-1a2b3c4d'
    """
    return f"{url.rstrip('/')}/{run_id}"


def runs(url: str) -> list[str]:
    """The run ids that have a checkpoint folder under the shared ``url`` (sorted).

    Examples
    --------
    >>> _ = write_shard(run_url("memory://doc-runs", "run-0000000b"), 1, 0, {"weights": np.ones(1)})
    >>> runs("memory://doc-runs")
    ['run-0000000b']
    """
    fs, root = fsspec.core.url_to_fs(url)
    if not fs.exists(root):
        return []
    found = []
    for entry in fs.ls(root, detail=False):
        name = str(entry).rstrip("/").rsplit("/", 1)[-1]
        if RUN_ID.match(name) and steps(run_url(url, name)):
            found.append(name)
    return sorted(found)


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


def load_latest(
    url: str,
    *,
    run: str | None = None,
    model: str | None = None,
    layout: Sequence[Any] | None = None,
) -> Checkpoint | None:
    """The newest complete checkpoint under ``url``, or None if there is none.

    With ``run`` (and ``model``, ``layout``), it must be that run's, of that model and layout:
    :func:`check_owner` refuses it otherwise (a ValueError), so another run's weights are never
    loaded in its place.

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
            if run is not None:
                check_owner(ck, run, model=model, layout=layout)
            return ck
    return None


def _first_difference(given: Sequence[Any], recorded: Sequence[Any]) -> str:
    for a, b in zip(given, recorded, strict=False):
        if a != b:
            return f"{b[0] if b else '?'} is {b[1:3] if b else b}, expected {a[1:3] if a else a}"
    return f"{len(recorded)} entries, expected {len(given)}"


def check_owner(
    ck: Checkpoint,
    run: str,
    *,
    model: str | None = None,
    layout: Sequence[Any] | None = None,
) -> None:
    """Refuse ``ck`` unless its manifest names run ``run`` (and ``model``, ``layout`` if given).

    What a driver loads (to resume, or to re-create a lost PS) must be its own run's weights:
    a checkpoint folder that holds another run's (a shared URL, a folder copied or named by
    mistake) is an error that says whose it is, never weights silently swapped.

    Raises
    ------
    NotOwned
        A ValueError: the manifest names another run (or none), another model, or another
        layout.

    Examples
    --------
    >>> ck = Checkpoint(step=5, meta={"run": "run-0000000a"}, url="gs://b/runs/run-0000000a/step-000000005")
    >>> check_owner(ck, "run-0000000a")
    >>> check_owner(ck, "run-0000000b")
    Traceback (most recent call last):
    ...
    transient_nb.training.checkpoint.NotOwned: The checkpoint gs://b/runs/run-0000000a/step-000000005 is run 'run-0000000a''s, not run 'run-0000000b''s: refused, its weights are not loaded. Each run keeps its checkpoints in a folder of its own (CHECKPOINT_URL/RUN_ID/); to continue run-0000000a, pass resume='run-0000000a'.
    """
    owner = ck.meta.get("run")
    if owner != run:
        hint = (
            f"to continue {owner}, pass resume={owner!r}."
            if owner
            else "it was not written by a transient_nb run."
        )
        raise NotOwned(
            f"The checkpoint {ck.url} is run {owner!r}'s, not run {run!r}'s: refused, its "
            "weights are not loaded. Each run keeps its checkpoints in a folder of its own "
            f"(CHECKPOINT_URL/RUN_ID/); {hint}"
        )
    recorded = ck.meta.get("model")
    if model is not None and recorded is not None and recorded != model:
        raise NotOwned(
            f"The checkpoint {ck.url} of run {run} holds model {recorded!r}'s weights, not "
            f"{model!r}'s: refused. Resume with the model the run trained."
        )
    entries = ck.meta.get("layout")
    if layout and entries:
        # The manifest went through JSON (tuples became lists): compare in that form.
        given = json.loads(json.dumps(list(layout)))
        if given != entries:
            raise NotOwned(
                f"The checkpoint {ck.url} of run {run} was written for another layout of the "
                f"model ({_first_difference(given, entries)}): refused. Resume with the model "
                "the run trained."
            )


def load_step(url: str, step: int) -> Checkpoint | None:
    """The complete checkpoint of version ``step`` under ``url``, or None (missing or torn)."""
    fs, root = fsspec.core.url_to_fs(url)
    return _read_complete(fs, root, step)


def latest_step(url: str) -> int | None:
    """The step of the newest complete checkpoint, or None."""
    ck = load_latest(url)
    return None if ck is None else ck.step


def _owner(fs: Any, folder: str) -> str | None:
    """The run a step folder's manifest names; "" when it has none (torn, or being written)."""
    try:
        with fs.open(f"{folder}/manifest.json", "rb") as f:
            manifest = json.loads(f.read())
    except (FileNotFoundError, json.JSONDecodeError):
        return ""
    return str(manifest.get("run")) if isinstance(manifest, dict) and manifest.get("run") else None


def prune(url: str, keep: int = 2, run: str | None = None) -> list[int]:
    """Delete all but the ``keep`` newest complete checkpoints (and torn ones older than them).

    Returns the steps deleted. Folders newer than the newest complete one are left alone: a
    writer may be filling them right now.

    With ``run``, only that run's checkpoints are counted and deleted: a complete checkpoint
    whose manifest names another run (or none) is never touched, and torn folders are deleted
    only when every manifest under ``url`` is ``run``'s (in a folder shared with another run, a
    torn folder may be that run's checkpoint being written).
    """
    fs, root = fsspec.core.url_to_fs(url)
    found = steps(url)
    # Each folder: True (complete, and ours), False (torn: no manifest), None (another run's).
    mine: dict[int, bool | None]
    if run is None:
        mine = {s: fs.exists(f"{step_dir(root, s)}/manifest.json") for s in found}
    else:
        owners = {s: _owner(fs, step_dir(root, s)) for s in found}
        mine = {s: True if o == run else (False if o == "" else None) for s, o in owners.items()}
    torn_are_ours = None not in mine.values()
    complete = 0
    deleted = []
    for step in found:
        if mine[step] is None:
            continue  # another run's checkpoint: never ours to count or delete
        if complete >= keep:
            if mine[step] or torn_are_ours:
                fs.rm(step_dir(root, step), recursive=True)
                deleted.append(step)
        elif mine[step]:
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
#: The protocols of fsspec's file systems that live on one host (a folder, or memory).
_HOST_LOCAL = {"file", "local", "memory"}


def host_local(url: str) -> str | None:
    """The name of the file system ``url`` resolves to when it lives on this host alone (a local
    folder or memory, whatever the spelling: ``/x``, ``file://``, ``local://``, ``memory://``,
    behind a ``dir::`` or ``simplecache::`` wrapper); None for any other (shared) storage.

    Examples
    --------
    >>> host_local("local:///tmp/x"), host_local("memory://x"), host_local("gs://bucket/runs")
    ('LocalFileSystem', 'MemoryFileSystem', None)
    """
    # No link of the chain names a local or memory file system: shared, without making one (a
    # cloud file system looks for credentials as it is made: 15 s off a cloud VM, for gcsfs).
    chain = {fsspec.core.split_protocol(part)[0] or "file" for part in url.split("::")}
    if not _HOST_LOCAL & chain:
        return None
    try:
        fs: Any = fsspec.core.url_to_fs(url)[0]
    except Exception:
        return None  # an unknown protocol or a missing driver: the probe says what is wrong
    for _ in range(8):  # wrappers hold the file system they wrap as .fs
        # fsspec's own local and memory file systems, by their protocol: a subclass registered
        # as another protocol is another storage (tests stand buckets in that way).
        protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
        if isinstance(fs, (LocalFileSystem, MemoryFileSystem)) and _HOST_LOCAL & set(protocols):
            return type(fs).__name__
        fs = getattr(fs, "fs", None)
        if fs is None:
            break
    return None


def _under_shared_path(url: str) -> bool:
    """Whether ``url``'s local path is under a folder of ``transient.shared-paths``."""
    path = os.path.realpath(fsspec.core.url_to_fs(url)[1])
    for folder in config.get("shared-paths") or []:
        root = os.path.realpath(os.path.expanduser(str(folder)))
        if os.path.commonpath([path, root]) == root:
            return True
    return False


def check_checkpoint_url(checkpoint_url: str | None, backend: str) -> None:
    """On a non-local ``backend``: refuse a missing or host-local ``checkpoint_url``, then probe it
    with a write (:func:`probe_checkpoint_url`). Nothing to check on the local backend.

    Host-local is judged by the file system fsspec resolves the URL to (:func:`host_local`), not
    by its spelling. :func:`~transient_nb.train` calls it before anything starts; the
    ``%%transient_cluster`` cell magic calls it before it creates the cluster.
    """
    if backend == "local":
        return
    local = None if checkpoint_url is None else host_local(checkpoint_url)
    if local == "LocalFileSystem" and _under_shared_path(str(checkpoint_url)):
        local = None  # a share every host mounts at the same path (transient.shared-paths)
    if checkpoint_url is None or local is not None:
        where = f" (this one is a {local}, on this host alone)" if local else ""
        raise ValueError(
            f"checkpoint_url={checkpoint_url!r}: on the {backend} backend the PS checkpoints must "
            f"live on storage that outlives the PS host and that every host can reach{where}; "
            "pass a bucket URL, checkpoint_url='gs://BUCKET/PREFIX' (any fsspec URL of shared "
            "storage), or a local path under a share every host mounts (transient.shared-paths). "
            "Each run writes under PREFIX/<run id>/, so runs may share one."
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
