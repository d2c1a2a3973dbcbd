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
turns them into augmented, standardised NCHW float tensors. Each source has a module of its
own (``synthetic``, ``digits``, ``cifar``), and the batches theirs (``batches``); this module
reads the spec and loads the set.

Warning: CIFAR-10 batches are pickles. They are read with a restricted unpickler that
only accepts the numpy array reconstruction functions, but only point the loader at
data you trust.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

import numpy as np

from transient_nb.training.batches import BatchStream, to_tensor
from transient_nb.training.cifar import (
    CIFAR10_DIRNAME,
    CIFAR10_LABEL_NAMES,
    check_cifar10,
    cifar10_arrays,
    write_cifar10_files,
)
from transient_nb.training.digits import digits_arrays
from transient_nb.training.synthetic import SYNTHETIC_CLASSES, synthetic_arrays

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
        check_cifar10(parsed.location)
    return parsed


@functools.lru_cache(maxsize=16)
def _load_cached(spec: DataSpec, train: bool) -> ArrayDataset:
    if spec.kind == "synthetic":
        assert spec.size is not None
        images, labels = synthetic_arrays(spec.size, train)
        pad, flip, classes = 4, True, SYNTHETIC_CLASSES
    elif spec.kind == "digits":
        images, labels = digits_arrays(train)
        # Flipping would turn some digits into others (or into non-digits).
        pad, flip, classes = 1, False, 10
    else:
        assert spec.kind == "cifar10" and spec.location is not None
        images, labels = cifar10_arrays(spec.location, train)
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
