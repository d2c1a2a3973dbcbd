"""Data sets as numpy arrays, the paper's augmentation, and sharded batch streams.

Three data sources are supported, selected by a *data spec* string:

``"synthetic"`` / ``"synthetic:N"``
    A deterministic, learnable CIFAR-shaped (32x32x3, 10 classes) set generated on the
    fly, so demos and tests run without any download.
``"digits"``
    scikit-learn's bundled 8x8 hand-written digits (1,797 images), split 80/20.
``"cifar10:PATH-OR-URL"``
    CIFAR-10 in its python pickle format, read through fsspec from a folder or a
    ``.tar.gz`` archive, locally or from any fsspec URL (``gs://``, ``file://``, ...).

Images are held as ``uint8`` NHWC arrays and labels as ``int64``; :class:`BatchStream`
turns them into augmented, standardised NCHW float tensors.

Warning: CIFAR-10 batches are pickles. They are read with a restricted unpickler that
only accepts the numpy array reconstruction functions, but only point the loader at
data you trust.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import os
import pickle
import posixpath
import re
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

import fsspec
import numpy as np
import torch
from fsspec.core import url_to_fs

__all__ = [
    "CIFAR10_DIRNAME",
    "CIFAR10_LABEL_NAMES",
    "DATA_KINDS",
    "ArrayDataset",
    "BatchStream",
    "DataSpec",
    "check_data_spec",
    "load_dataset",
    "parse_data_spec",
    "to_tensor",
    "write_cifar10_files",
]

#: The ``kind`` values a :class:`DataSpec` can have.
DATA_KINDS: tuple[str, ...] = ("synthetic", "digits", "cifar10")

#: Folder name used inside the official CIFAR-10 python archive.
CIFAR10_DIRNAME = "cifar-10-batches-py"

CIFAR10_LABEL_NAMES: tuple[str, ...] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)

_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
_TEST_BATCH = "test_batch"
_META = "batches.meta"
_REQUIRED_MEMBERS = (*_TRAIN_BATCHES, _TEST_BATCH)
_CIFAR_SIDE = 32
_FORMAT_HINT = "not in CIFAR-10 python format: expected data_batch_1..5 and test_batch"

_SYNTHETIC_DEFAULT_SIZE = 10_000
_ACCEPTED_FORMS = (
    "'synthetic', 'synthetic:N' (N training images, default 10000), 'digits', "
    "'cifar10:PATH-OR-URL' (a folder or .tar.gz in CIFAR-10 python format, "
    "local or any fsspec URL)"
)


# --------------------------------------------------------------------------- data sets


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """An in-memory image classification set.

    ``eq=False`` because element-wise array comparison has no single truth value;
    instances compare (and hash) by identity.

    Attributes
    ----------
    images : numpy.ndarray
        ``(N, H, W, C)`` ``uint8`` images.
    labels : numpy.ndarray
        ``(N,)`` ``int64`` labels in ``[0, num_classes)``.
    name : str
        The canonical data spec the set was loaded from (see :class:`DataSpec`).
    num_classes : int
        Number of classes.
    pad : int
        Zero padding used by the random-crop augmentation for this set.
    flip : bool
        Whether random horizontal flips are a valid augmentation for this set.

    Examples
    --------
    >>> import numpy as np
    >>> ds = ArrayDataset(np.zeros((2, 8, 8, 3), np.uint8), np.array([0, 1]), "toy", 2, 1, False)
    >>> len(ds)
    2
    """

    images: np.ndarray
    labels: np.ndarray
    name: str
    num_classes: int
    pad: int
    flip: bool

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.images.dtype != np.uint8:
            raise ValueError(
                f"images must be a uint8 (N, H, W, C) array, got {self.images.dtype} "
                f"{self.images.shape}"
            )
        if self.labels.shape != (len(self.images),):
            raise ValueError(
                f"labels must have shape ({len(self.images)},), got {self.labels.shape}"
            )
        if self.pad < 0:
            raise ValueError(f"pad must be >= 0, got {self.pad}")

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class DataSpec:
    """A parsed data spec string (see :func:`parse_data_spec`).

    Attributes
    ----------
    kind : str
        One of :data:`DATA_KINDS`.
    location : str or None
        For ``cifar10``: a local absolute path (``~`` expanded) or an fsspec URL.
    size : int or None
        For ``synthetic``: the number of training images.

    Examples
    --------
    >>> str(DataSpec("synthetic", None, 500))
    'synthetic:500'
    """

    kind: str
    location: str | None = None
    size: int | None = None

    def __str__(self) -> str:
        if self.kind == "cifar10":
            return f"cifar10:{self.location}"
        if self.kind == "synthetic":
            return f"synthetic:{self.size}"
        return self.kind


def _bad_spec(spec: str, why: str = "") -> ValueError:
    detail = f" ({why})" if why else ""
    return ValueError(f"invalid data spec {spec!r}{detail}; accepted forms: {_ACCEPTED_FORMS}")


def parse_data_spec(spec: str) -> DataSpec:
    """Parse a data spec string, without touching any file.

    Parameters
    ----------
    spec : str
        ``"synthetic"``, ``"synthetic:N"``, ``"digits"`` or ``"cifar10:PATH-OR-URL"``.

    Returns
    -------
    DataSpec
        The parsed spec. Local CIFAR-10 paths are ``~``-expanded and made absolute,
        so the spec means the same thing in worker processes with another cwd.

    Raises
    ------
    ValueError
        If `spec` is not one of the accepted forms; the message names `spec`.

    Examples
    --------
    >>> parse_data_spec("synthetic:500")
    DataSpec(kind='synthetic', location=None, size=500)
    >>> parse_data_spec("cifar10:gs://bucket/cifar-10-python.tar.gz").location
    'gs://bucket/cifar-10-python.tar.gz'
    """
    if not isinstance(spec, str):
        raise _bad_spec(repr(spec), "not a string")
    # Split on the first colon only: URLs (gs://...) contain more.
    kind, sep, arg = spec.partition(":")
    if kind == "digits" and not sep:
        return DataSpec("digits")
    if kind == "synthetic":
        if not sep:
            return DataSpec("synthetic", size=_SYNTHETIC_DEFAULT_SIZE)
        if not re.fullmatch(r"[0-9_]+", arg) or int(arg) < 1:
            raise _bad_spec(spec, "N must be a positive integer")
        return DataSpec("synthetic", size=int(arg))
    if kind == "cifar10" and sep:
        if not arg.strip():
            raise _bad_spec(spec, "missing path or URL")
        if "://" not in arg:
            arg = os.path.abspath(os.path.expanduser(arg))
        return DataSpec("cifar10", location=arg)
    raise _bad_spec(spec)


# --------------------------------------------------------------------------- CIFAR-10 I/O


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickler that only rebuilds numpy arrays, bytes and plain containers."""

    _ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> Any:
        # The official files were written by Python 2 with numpy 1 (numpy.core); our
        # own writer under numpy 2 uses numpy._core. Both name the same functions.
        if module in ("numpy.core.multiarray", "numpy._core.multiarray") and name in (
            "_reconstruct",
            "scalar",
        ):
            return _multiarray_attr(name)
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name} from a CIFAR file")


def _multiarray_attr(name: str) -> Any:
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray  # type: ignore[no-redef]
    return getattr(multiarray, name)


def _unpickle(fileobj: IO[bytes], where: str) -> dict[bytes, Any]:
    try:
        # encoding="bytes" keeps Python 2 str objects (keys, file names) as bytes,
        # which is how the official CIFAR-10 files are meant to be read.
        obj = _ArrayUnpickler(fileobj, encoding="bytes").load()
    except Exception as exc:  # corrupt or foreign file: report which one
        raise ValueError(f"{where}: {_FORMAT_HINT} (cannot unpickle: {exc})") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: {_FORMAT_HINT} (pickle holds {type(obj).__name__})")
    return obj


def _batch_arrays(batch: Mapping[bytes, Any], where: str) -> tuple[np.ndarray, np.ndarray]:
    """Convert one CIFAR batch dict into NHWC uint8 images and int64 labels."""
    if b"data" not in batch or b"labels" not in batch:
        raise ValueError(f"{where}: {_FORMAT_HINT} (batch lacks b'data' or b'labels')")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    side = _CIFAR_SIDE
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * side * side:
        raise ValueError(
            f"{where}: {_FORMAT_HINT} (b'data' is {data.dtype} {data.shape}, "
            f"expected uint8 (N, {3 * side * side}))"
        )
    if labels.shape != (len(data),):
        raise ValueError(f"{where}: {len(labels)} labels for {len(data)} images")
    # Rows are channel-major (1024 red, 1024 green, 1024 blue values, each row-major).
    images = data.reshape(-1, 3, side, side).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def _locate_cifar(location: str) -> tuple[fsspec.AbstractFileSystem, str, bool]:
    """Resolve `location` to (filesystem, path, is_archive), checking it exists.

    A folder may be the batches folder itself or its parent holding
    ``cifar-10-batches-py`` (what the official archive extracts to).
    """
    try:
        fs, path = url_to_fs(location)
    except Exception as exc:  # unknown protocol, missing optional dependency, ...
        raise ValueError(f"CIFAR-10 location {location!r} cannot be opened: {exc}") from exc
    if not fs.exists(path):
        raise ValueError(f"CIFAR-10 location {location!r} does not exist")
    if fs.isdir(path):
        nested = posixpath.join(path, CIFAR10_DIRNAME)
        if not fs.exists(posixpath.join(path, _TEST_BATCH)) and fs.isdir(nested):
            path = nested
        return fs, path, False
    return fs, path, True


def _missing_message(location: str, missing: list[str]) -> str:
    return f"CIFAR-10 location {location!r} is {_FORMAT_HINT}; missing: {', '.join(missing)}"


def _check_folder(fs: fsspec.AbstractFileSystem, path: str, location: str) -> None:
    missing = [m for m in _REQUIRED_MEMBERS if not fs.isfile(posixpath.join(path, m))]
    if missing:
        raise ValueError(_missing_message(location, missing))


def _open_tar(fileobj: IO[bytes], location: str) -> tarfile.TarFile:
    try:
        # Stream mode ("r|*") reads sequentially, so remote files are fetched once and
        # never seeked; "*" also accepts an uncompressed .tar.
        return tarfile.open(fileobj=fileobj, mode="r|*")
    except tarfile.TarError as exc:
        raise ValueError(
            f"CIFAR-10 location {location!r} is {_FORMAT_HINT} (not a readable tar archive: {exc})"
        ) from exc


def _member_key(name: str) -> str | None:
    """Map an archive member name to a required batch name, or None to skip it."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if len(parts) >= 2 and parts[-2] == CIFAR10_DIRNAME and parts[-1] in _REQUIRED_MEMBERS:
        return parts[-1]
    return None


def _check_archive(fs: fsspec.AbstractFileSystem, path: str, location: str) -> None:
    found: set[str] = set()
    with fs.open(path, "rb") as raw, _open_tar(raw, location) as tar:
        try:
            for member in tar:
                key = _member_key(member.name)
                if key is not None and member.isfile():
                    found.add(key)
                    if found.issuperset(_REQUIRED_MEMBERS):
                        break
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ValueError(f"CIFAR-10 archive {location!r} is corrupt: {exc}") from exc
    missing = [m for m in _REQUIRED_MEMBERS if m not in found]
    if missing:
        raise ValueError(_missing_message(location, [f"{CIFAR10_DIRNAME}/{m}" for m in missing]))


def check_data_spec(spec: str | DataSpec) -> DataSpec:
    """Parse `spec` and check that its data can be found, without loading it.

    For ``cifar10`` this checks that the location exists and is either a folder with
    ``data_batch_1`` .. ``data_batch_5`` and ``test_batch`` (or the parent of a
    ``cifar-10-batches-py`` folder with them), or a ``.tar.gz``/``.tgz``/``.tar``
    archive holding ``cifar-10-batches-py/`` with those members. Only the archive's
    member headers are examined, but a gzip archive has to be read through once to
    list them (about 160 MB for the real CIFAR-10). Other kinds need no check.

    Parameters
    ----------
    spec : str or DataSpec
        A data spec (see :func:`parse_data_spec`).

    Returns
    -------
    DataSpec
        The parsed spec.

    Raises
    ------
    ValueError
        If the spec is malformed, the location does not exist, or it is not in
        CIFAR-10 python format; the message names the path and what is missing.

    Examples
    --------
    >>> check_data_spec("digits")
    DataSpec(kind='digits', location=None, size=None)
    """
    parsed = spec if isinstance(spec, DataSpec) else parse_data_spec(spec)
    if parsed.kind == "cifar10":
        assert parsed.location is not None
        fs, path, archive = _locate_cifar(parsed.location)
        if archive:
            _check_archive(fs, path, parsed.location)
        else:
            _check_folder(fs, path, parsed.location)
    return parsed


def _read_cifar_folder(
    fs: fsspec.AbstractFileSystem, path: str, location: str, names: tuple[str, ...]
) -> dict[str, dict[bytes, Any]]:
    _check_folder(fs, path, location)
    batches = {}
    for name in names:
        with fs.open(posixpath.join(path, name), "rb") as f:
            batches[name] = _unpickle(f, f"{location}/{name}")
    return batches


def _read_cifar_archive(
    fs: fsspec.AbstractFileSystem, path: str, location: str, names: tuple[str, ...]
) -> dict[str, dict[bytes, Any]]:
    batches: dict[str, dict[bytes, Any]] = {}
    seen: set[str] = set()
    with fs.open(path, "rb") as raw, _open_tar(raw, location) as tar:
        try:
            for member in tar:
                key = _member_key(member.name)
                if key is None or not member.isfile():
                    continue
                seen.add(key)
                if key in names and key not in batches:
                    f = tar.extractfile(member)
                    assert f is not None  # regular file members always have data
                    batches[key] = _unpickle(f, f"{location}:{member.name}")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ValueError(f"CIFAR-10 archive {location!r} is corrupt: {exc}") from exc
    # Report against all required members, so a test-only load still flags a broken
    # archive the same way check_data_spec would.
    missing = [m for m in _REQUIRED_MEMBERS if m not in seen]
    if missing:
        raise ValueError(_missing_message(location, [f"{CIFAR10_DIRNAME}/{m}" for m in missing]))
    return batches


def _load_cifar10(location: str, train: bool) -> tuple[np.ndarray, np.ndarray]:
    names = _TRAIN_BATCHES if train else (_TEST_BATCH,)
    fs, path, archive = _locate_cifar(location)
    reader = _read_cifar_archive if archive else _read_cifar_folder
    batches = reader(fs, path, location, names)
    parts = [_batch_arrays(batches[n], f"{location}/{n}") for n in names]
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    if labels.size and (labels.min() < 0 or labels.max() >= len(CIFAR10_LABEL_NAMES)):
        raise ValueError(f"{location}: labels outside 0..9")
    return images, labels


def _pickle_bytes(obj: object) -> bytes:
    # Protocol 2 is what the official files use (written by Python 2).
    return pickle.dumps(obj, protocol=2)


def write_cifar10_files(
    folder: str | os.PathLike[str],
    train_images: np.ndarray,
    train_labels: np.ndarray,
    test_images: np.ndarray,
    test_labels: np.ndarray,
    *,
    tar_gz: bool = False,
) -> str:
    """Write a data set in exactly the CIFAR-10 python format.

    Creates ``<folder>/cifar-10-batches-py/`` with ``data_batch_1`` .. ``data_batch_5``
    (the training images split in order into five near-equal parts), ``test_batch``
    and ``batches.meta``, each a protocol-2 pickle of a dict with bytes keys, as in the
    official archive. With ``tar_gz=True`` the folder is also packed into
    ``<folder>/cifar-10-python.tar.gz`` (top-level directory ``cifar-10-batches-py``).

    Parameters
    ----------
    folder : str or os.PathLike
        Local folder or fsspec URL to write into; created if needed.
    train_images, test_images : numpy.ndarray
        ``(N, 32, 32, 3)`` ``uint8`` NHWC images.
    train_labels, test_labels : numpy.ndarray
        ``(N,)`` integer labels in ``0..9``.
    tar_gz : bool, optional
        Also write the ``.tar.gz`` archive, by default False.

    Returns
    -------
    str
        The ``cifar-10-batches-py`` folder, or the archive if `tar_gz`; usable as
        ``"cifar10:" + returned_path``. URLs keep their protocol.

    Raises
    ------
    ValueError
        If the arrays have the wrong shape, dtype or label range.

    Examples
    --------
    >>> import numpy as np, tempfile
    >>> x = np.zeros((10, 32, 32, 3), np.uint8); y = np.arange(10)
    >>> path = write_cifar10_files(tempfile.mkdtemp(), x, y, x[:5], y[:5])
    >>> load_dataset("cifar10:" + path, train=True).images.shape
    (10, 32, 32, 3)
    """
    splits = {"train": (train_images, train_labels), "test": (test_images, test_labels)}
    for split, (images, labels) in splits.items():
        side = _CIFAR_SIDE
        if images.dtype != np.uint8 or images.shape[1:] != (side, side, 3):
            raise ValueError(
                f"{split}_images must be uint8 (N, 32, 32, 3), got {images.dtype} {images.shape}"
            )
        if np.shape(labels) != (len(images),):
            raise ValueError(f"{split}_labels must have shape ({len(images)},)")
        if len(labels) and (np.min(labels) < 0 or np.max(labels) > 9):
            raise ValueError(f"{split}_labels must be in 0..9")

    def batch(images: np.ndarray, labels: np.ndarray, label: str, start: int) -> bytes:
        data = np.ascontiguousarray(images.transpose(0, 3, 1, 2)).reshape(len(images), -1)
        return _pickle_bytes(
            {
                b"batch_label": label.encode(),
                b"labels": [int(v) for v in labels],
                b"data": data,
                b"filenames": [f"image_{start + i:06d}.png".encode() for i in range(len(images))],
            }
        )

    members: dict[str, bytes] = {}
    bounds = np.linspace(0, len(train_images), len(_TRAIN_BATCHES) + 1).astype(int)
    for i, name in enumerate(_TRAIN_BATCHES):
        lo, hi = bounds[i], bounds[i + 1]
        members[name] = batch(
            train_images[lo:hi], train_labels[lo:hi], f"training batch {i + 1} of 5", lo
        )
    members[_TEST_BATCH] = batch(test_images, test_labels, "testing batch 1 of 1", 0)
    members[_META] = _pickle_bytes(
        {
            b"label_names": [n.encode() for n in CIFAR10_LABEL_NAMES],
            b"num_cases_per_batch": int(bounds[1] - bounds[0]),
            b"num_vis": 3 * _CIFAR_SIDE * _CIFAR_SIDE,
        }
    )

    root = os.fspath(folder)
    if "://" not in root:
        root = os.path.abspath(os.path.expanduser(root))
    fs, root_path = url_to_fs(root)
    batches_path = posixpath.join(root_path, CIFAR10_DIRNAME)
    fs.makedirs(batches_path, exist_ok=True)
    for name, payload in members.items():
        with fs.open(posixpath.join(batches_path, name), "wb") as f:
            f.write(payload)
    if not tar_gz:
        return _join(root, CIFAR10_DIRNAME)

    archive_name = "cifar-10-python.tar.gz"
    with (
        fs.open(posixpath.join(root_path, archive_name), "wb") as raw,
        tarfile.open(fileobj=raw, mode="w|gz") as tar,
    ):
        directory = tarfile.TarInfo(CIFAR10_DIRNAME)
        directory.type = tarfile.DIRTYPE
        directory.mode = 0o755
        tar.addfile(directory)
        for name, payload in members.items():
            info = tarfile.TarInfo(f"{CIFAR10_DIRNAME}/{name}")
            info.size = len(payload)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(payload))
    return _join(root, archive_name)


def _join(root: str, name: str) -> str:
    # Keep the caller's form (local path or URL with protocol) in the returned path.
    return posixpath.join(root, name) if "://" in root else os.path.join(root, name)


# --------------------------------------------------------------------------- other sources


def _smooth_noise(rng: np.random.Generator, count: int, side: int, cells: int) -> np.ndarray:
    """``count`` smooth random fields ``(count, side, side, 3)`` in roughly [-1, 1].

    Bilinear upsampling of a coarse ``cells x cells`` random grid gives low-frequency
    patterns, which survive the random crops of augmentation (like real objects do).
    """
    coarse = rng.uniform(-1.0, 1.0, size=(count, 3, cells, cells)).astype(np.float32)
    fine = torch.nn.functional.interpolate(
        torch.from_numpy(coarse), size=(side, side), mode="bilinear", align_corners=True
    )
    return fine.permute(0, 2, 3, 1).numpy()


# Seeds are fixed so every process and every call builds the same synthetic set; train
# and test use different sample seeds but share the class templates.
_SYNTHETIC_TEMPLATE_SEED = 20190616
_SYNTHETIC_SAMPLE_SEEDS = {True: 1, False: 2}
_SYNTHETIC_CLASSES = 10
_SYNTHETIC_SHIFT = 4


def _synthetic(size: int, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """Learnable CIFAR-shaped images: shifted class templates plus nuisances."""
    side, shift, k = _CIFAR_SIDE, _SYNTHETIC_SHIFT, _SYNTHETIC_CLASSES
    big = side + 2 * shift
    template_rng = np.random.default_rng(_SYNTHETIC_TEMPLATE_SEED)
    templates = _smooth_noise(template_rng, k, big, cells=8)
    n = size if train else max(1, size // 5)
    rng = np.random.default_rng(_SYNTHETIC_SAMPLE_SEEDS[train])
    labels = np.arange(n, dtype=np.int64) % k  # balanced, then shuffled
    rng.shuffle(labels)

    # Random translation of each image within the larger template.
    dy = rng.integers(0, 2 * shift + 1, size=n)
    dx = rng.integers(0, 2 * shift + 1, size=n)
    rows = (dy[:, None] + np.arange(side))[:, :, None]
    cols = (dx[:, None] + np.arange(side))[:, None, :]
    signal = templates[labels[:, None, None], rows, cols]  # (n, side, side, 3)

    # Nuisances keep the task from being trivial: a class-independent smooth
    # background, per-image contrast and brightness, and pixel noise.
    background = _smooth_noise(rng, n, side, cells=4)
    contrast = rng.uniform(0.5, 1.3, size=(n, 1, 1, 1)).astype(np.float32)
    brightness = rng.uniform(-0.3, 0.3, size=(n, 1, 1, 1)).astype(np.float32)
    noise = rng.normal(0.0, 0.35, size=signal.shape).astype(np.float32)
    x = contrast * signal + 0.7 * background + brightness + noise
    images = np.clip(127.5 + 60.0 * x, 0, 255).round().astype(np.uint8)
    return images, labels


def _digits_file() -> str:
    """scikit-learn's bundled ``digits.csv.gz``, found without importing scikit-learn (its
    import takes 1-3 s of a replacement trainer's start; the file is read in milliseconds)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("The 'digits' data set is scikit-learn's: pip install scikit-learn")
    return os.path.join(
        next(iter(spec.submodule_search_locations)), "datasets", "data", "digits.csv.gz"
    )


def _approximate_mode(counts: np.ndarray, draws: int, rng: np.random.RandomState) -> np.ndarray:
    # scikit-learn's ``_approximate_mode`` (model_selection._split): per-class draws, ties broken
    # at random; written out so that the split needs no scikit-learn import.
    continuous = counts / counts.sum() * draws
    floored = np.floor(continuous)
    need = int(draws - floored.sum())
    if need > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (inds,) = np.where(remainder == value)
            add = min(len(inds), need)
            floored[rng.choice(inds, size=add, replace=False)] += 1
            need -= add
            if need == 0:
                break
    return floored.astype(int)


def stratified_test_indices(labels: np.ndarray, test_fraction: float, seed: int) -> np.ndarray:
    """The sorted test indices of ``train_test_split(..., test_size=test_fraction,
    stratify=labels, random_state=seed)`` (scikit-learn's StratifiedShuffleSplit, one split),
    computed with numpy alone.

    Examples
    --------
    >>> stratified_test_indices(np.array([0, 0, 0, 0, 1, 1, 1, 1]), 0.5, 0).tolist()
    [0, 1, 5, 7]
    """
    n = len(labels)
    n_test = int(np.ceil(test_fraction * n))
    n_train = n - n_test
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    by_class = np.split(np.argsort(inverse, kind="stable"), np.cumsum(counts)[:-1])
    rng = np.random.RandomState(seed)
    n_i = _approximate_mode(counts, n_train, rng)
    t_i = _approximate_mode(counts - n_i, n_test, rng)
    test: list[int] = []
    for i in range(len(counts)):
        order = by_class[i].take(rng.permutation(counts[i]), mode="clip")
        test.extend(order[n_i[i] : n_i[i] + t_i[i]])
    return np.sort(np.asarray(test, dtype=np.int64))


def _digits(train: bool) -> tuple[np.ndarray, np.ndarray]:
    data = np.loadtxt(_digits_file(), delimiter=",")  # as sklearn's load_digits reads it
    labels = data[:, -1].astype(np.int64)
    grey = np.round(data[:, :-1].reshape(-1, 8, 8) * (255.0 / 16.0)).astype(np.uint8)  # 0..16
    # The split of train_test_split(test_size=0.2, stratify=labels, random_state=0), sorted so
    # that it keeps the bundled order (shuffling is BatchStream's job).
    test = stratified_test_indices(labels, 0.2, 0)
    idx = test if not train else np.setdiff1d(np.arange(len(labels)), test)
    images = np.repeat(grey[idx][..., None], 3, axis=-1)
    return np.ascontiguousarray(images), labels[idx]


@functools.lru_cache(maxsize=16)
def _load_cached(spec: DataSpec, train: bool) -> ArrayDataset:
    if spec.kind == "synthetic":
        assert spec.size is not None
        images, labels = _synthetic(spec.size, train)
        pad, flip, classes = 4, True, _SYNTHETIC_CLASSES
    elif spec.kind == "digits":
        images, labels = _digits(train)
        # Flipping would turn some digits into others (or into non-digits).
        pad, flip, classes = 1, False, 10
    else:
        assert spec.kind == "cifar10" and spec.location is not None
        images, labels = _load_cifar10(spec.location, train)
        pad, flip, classes = 4, True, len(CIFAR10_LABEL_NAMES)
    # The arrays are shared by every caller in the process through the cache.
    images.setflags(write=False)
    labels.setflags(write=False)
    return ArrayDataset(images, labels, str(spec), classes, pad, flip)


def load_dataset(spec: str | DataSpec, *, train: bool) -> ArrayDataset:
    """Load the training or test split of a data set.

    Results are cached per process (keyed on the parsed spec and `train`), since
    every trainer in a worker process asks for the same data. The returned arrays
    are read-only because they are shared.

    Parameters
    ----------
    spec : str or DataSpec
        A data spec (see :func:`parse_data_spec`).
    train : bool
        True for the training split, False for the test split.

    Returns
    -------
    ArrayDataset
        ``uint8`` NHWC images and ``int64`` labels. CIFAR-10: 50,000 / 10,000 images
        (or whatever the files hold), pad 4, flip. Synthetic: N / max(1, N // 5)
        32x32x3 images, 10 classes, pad 4, flip. Digits: 1,437 / 360 8x8x3 images
        (stratified 80/20 split, seed 0), pad 1, no flip.

    Raises
    ------
    ValueError
        If the spec is malformed or the CIFAR-10 data is missing or malformed.

    Examples
    --------
    >>> ds = load_dataset("digits", train=True)
    >>> ds.images.shape, ds.num_classes
    ((1437, 8, 8, 3), 10)
    """
    parsed = spec if isinstance(spec, DataSpec) else parse_data_spec(spec)
    return _load_cached(parsed, bool(train))


# --------------------------------------------------------------------------- batches


def _standardize(x: torch.Tensor) -> torch.Tensor:
    """TensorFlow's ``per_image_standardization`` on an NCHW float batch."""
    per_image = x[0].numel()
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    # Population std, floored so constant images do not divide by zero.
    std = x.std(dim=(1, 2, 3), keepdim=True, correction=0)
    return (x - mean) / std.clamp(min=1.0 / per_image**0.5)


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """Convert ``uint8`` NHWC images to standardised NCHW float32, without augmentation.

    Each image is standardised like TensorFlow's ``per_image_standardization``:
    ``(x - mean) / max(std, 1 / sqrt(num_elements))`` over the image's pixels and
    channels (values taken in the 0..255 scale).

    Parameters
    ----------
    images : numpy.ndarray
        ``(N, H, W, C)`` ``uint8`` images.

    Returns
    -------
    torch.Tensor
        ``(N, C, H, W)`` float32 tensor.

    Examples
    --------
    >>> import numpy as np
    >>> to_tensor(np.zeros((2, 8, 8, 3), np.uint8)).shape
    torch.Size([2, 3, 8, 8])
    """
    if images.ndim != 4:
        raise ValueError(f"expected (N, H, W, C) images, got shape {images.shape}")
    array = np.ascontiguousarray(images)
    if not array.flags.writeable:
        # torch.from_numpy warns on read-only arrays (the cached data sets are).
        array = array.copy()
    x = torch.from_numpy(array).permute(0, 3, 1, 2).float()
    return _standardize(x)


class BatchStream(Iterator[tuple[torch.Tensor, torch.Tensor]]):
    """Endless stream of augmented training batches from one shard of a data set.

    The data set is split into ``count`` disjoint shards by a fixed permutation that
    does not depend on `seed`, so workers with different seeds and different shard
    indices never share images. Within the shard, images are drawn without
    replacement: each epoch is a fresh permutation, and epochs are concatenated so
    every batch is full (a batch may straddle two epochs).

    Augmentation (Li et al. / the TensorFlow CIFAR-10 recipe): zero-pad by
    ``dataset.pad`` pixels, random crop back to the original size, random horizontal
    flip if ``dataset.flip``, then per-image standardisation (see :func:`to_tensor`).

    Parameters
    ----------
    dataset : ArrayDataset
        The data set to draw from.
    batch_size : int
        Images per batch; at most the shard size.
    seed : int
        Seed for the shuffling and the augmentation; equal seeds give equal streams.
    augment : bool, optional
        Apply crop and flip augmentation, by default True. Standardisation is
        always applied.
    shard : tuple of (int, int), optional
        ``(index, count)``: use the `index`-th of `count` disjoint shards, by
        default ``(0, 1)`` (the whole data set).

    Attributes
    ----------
    indices : numpy.ndarray
        The sorted data set indices of this shard.
    epoch : int
        Number of epochs started over the shard (1 after the first batch).

    Examples
    --------
    >>> ds = load_dataset("digits", train=True)
    >>> x, y = next(BatchStream(ds, 32, seed=0, shard=(1, 4)))
    >>> tuple(x.shape), y.dtype
    ((32, 3, 8, 8), torch.int64)
    """

    # Fixed so that all workers agree on the shard boundaries whatever their seeds.
    _SHARD_SEED = 0

    def __init__(
        self,
        dataset: ArrayDataset,
        batch_size: int,
        *,
        seed: int,
        augment: bool = True,
        shard: tuple[int, int] = (0, 1),
    ) -> None:
        index, count = shard
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"shard must be (index, count) with 0 <= index < count, got {shard}")
        if count > len(dataset):
            raise ValueError(f"cannot split {len(dataset)} images into {count} shards")
        # A random (not strided) split keeps shards class-balanced even when a data
        # set is stored sorted by class.
        order = np.random.default_rng(self._SHARD_SEED).permutation(len(dataset))
        self.indices: np.ndarray = np.sort(order[index::count])
        if not 1 <= batch_size <= len(self.indices):
            raise ValueError(
                f"batch_size must be in 1..{len(self.indices)} (the shard size), got {batch_size}"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.augment = augment
        self.epoch = 0
        self._rng = np.random.default_rng(seed)
        self._queue = np.empty(0, dtype=np.int64)

    def __iter__(self) -> BatchStream:
        return self

    def _next_indices(self) -> np.ndarray:
        while len(self._queue) < self.batch_size:
            self._queue = np.concatenate([self._queue, self._rng.permutation(self.indices)])
            self.epoch += 1
        taken, self._queue = self._queue[: self.batch_size], self._queue[self.batch_size :]
        return taken

    def _augment(self, images: np.ndarray) -> np.ndarray:
        n, height, width = len(images), images.shape[1], images.shape[2]
        pad = self.dataset.pad
        padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))  # zeros
        top = self._rng.integers(0, 2 * pad + 1, size=n)
        left = self._rng.integers(0, 2 * pad + 1, size=n)
        rows = top[:, None] + np.arange(height)
        cols = left[:, None] + np.arange(width)
        if self.dataset.flip:
            flip = self._rng.random(n) < 0.5
            cols = np.where(flip[:, None], cols[:, ::-1], cols)
        # One gather does crop and flip for the whole batch.
        return padded[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self._next_indices()
        images = self.dataset.images[idx]
        if self.augment:
            images = self._augment(images)
        x = to_tensor(images)
        y = torch.from_numpy(np.asarray(self.dataset.labels[idx], dtype=np.int64))
        return x, y
