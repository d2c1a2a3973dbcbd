"""CIFAR-10 in its python pickle format: read, checked and written through fsspec.

A folder (the batches themselves, or the parent of ``cifar-10-batches-py``) or a ``.tar.gz``
archive, locally or at any fsspec URL (``gs://``, ``file://``, ...); :func:`write_cifar10_files`
writes exactly that format (the tests' and the benchmarks' CIFAR-10).

Warning: CIFAR-10 batches are pickles. They are read with a restricted unpickler that
only accepts the numpy array reconstruction functions, but only point the loader at
data you trust.
"""

from __future__ import annotations

import io
import os
import pickle
import posixpath
import tarfile
from collections.abc import Mapping
from typing import IO, Any

import fsspec
import numpy as np
from fsspec.core import url_to_fs

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
    _read_cifar_archive(fs, path, location, ())  # reads the members' names, loads none


def check_cifar10(location: str) -> None:
    """Check that ``location`` holds CIFAR-10 in its python format, without loading it (see
    :func:`~transient_nb.training.data.check_data_spec`)."""
    fs, path, archive = _locate_cifar(location)
    if archive:
        _check_archive(fs, path, location)
    else:
        _check_folder(fs, path, location)


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
                if seen.issuperset(_REQUIRED_MEMBERS):  # the names asked for are among them
                    break
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ValueError(f"CIFAR-10 archive {location!r} is corrupt: {exc}") from exc
    # Report against all required members, so a test-only load still flags a broken
    # archive the same way check_data_spec would.
    missing = [m for m in _REQUIRED_MEMBERS if m not in seen]
    if missing:
        raise ValueError(_missing_message(location, [f"{CIFAR10_DIRNAME}/{m}" for m in missing]))
    return batches


def cifar10_arrays(location: str, train: bool) -> tuple[np.ndarray, np.ndarray]:
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
    >>> from transient_nb.training.data import load_dataset
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
