"""Tests for transient_nb.training.cifar: CIFAR-10's python format, read, checked and written.

Loaded through the data spec (``cifar10:PATH-OR-URL``) as every run loads it.
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import numpy as np
import pytest

from transient_nb.training.cifar import write_cifar10_files
from transient_nb.training.data import check_data_spec, load_dataset

CifarArrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@pytest.fixture
def cifar_arrays() -> CifarArrays:
    rng = np.random.default_rng(123)
    train_x = rng.integers(0, 256, size=(50, 32, 32, 3), dtype=np.uint8)
    test_x = rng.integers(0, 256, size=(20, 32, 32, 3), dtype=np.uint8)
    return train_x, rng.integers(0, 10, 50), test_x, rng.integers(0, 10, 20)


@pytest.fixture
def memory_root() -> Iterator[str]:
    root = f"memory://cifar-{uuid.uuid4().hex}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def _assert_round_trip(spec: str, arrays: CifarArrays) -> None:
    train_x, train_y, test_x, test_y = arrays
    assert check_data_spec(spec).kind == "cifar10"
    train, test = load_dataset(spec, train=True), load_dataset(spec, train=False)
    np.testing.assert_array_equal(train.images, train_x)
    np.testing.assert_array_equal(train.labels, train_y)
    np.testing.assert_array_equal(test.images, test_x)
    np.testing.assert_array_equal(test.labels, test_y)
    assert train.images.dtype == np.uint8 and train.labels.dtype == np.int64
    assert (train.num_classes, train.pad, train.flip) == (10, 4, True)


@pytest.mark.parametrize("tar_gz", [False, True])
def test_cifar_round_trip_local_and_file_url(
    tmp_path: Path, cifar_arrays: CifarArrays, tar_gz: bool
) -> None:
    path = write_cifar10_files(tmp_path, *cifar_arrays, tar_gz=tar_gz)
    assert path.endswith("cifar-10-python.tar.gz" if tar_gz else "cifar-10-batches-py")
    _assert_round_trip(f"cifar10:{path}", cifar_arrays)
    _assert_round_trip(f"cifar10:file://{path}", cifar_arrays)


def test_cifar_folder_may_be_the_parent_of_the_batches(
    tmp_path: Path, cifar_arrays: CifarArrays
) -> None:
    write_cifar10_files(tmp_path, *cifar_arrays)
    _assert_round_trip(f"cifar10:{tmp_path}", cifar_arrays)


@pytest.mark.parametrize("tar_gz", [False, True])
def test_cifar_round_trip_memory_url(
    memory_root: str, cifar_arrays: CifarArrays, tar_gz: bool
) -> None:
    path = write_cifar10_files(memory_root, *cifar_arrays, tar_gz=tar_gz)
    assert path.startswith("memory://")
    _assert_round_trip(f"cifar10:{path}", cifar_arrays)


def test_written_files_are_in_the_official_format(
    tmp_path: Path, cifar_arrays: CifarArrays
) -> None:
    train_x, train_y, _, _ = cifar_arrays
    archive = write_cifar10_files(tmp_path, *cifar_arrays, tar_gz=True)
    folder = tmp_path / "cifar-10-batches-py"
    raw = (folder / "data_batch_1").read_bytes()
    assert raw[:2] == b"\x80\x02"  # pickle protocol 2
    batch = pickle.loads(raw, encoding="bytes")
    assert set(batch) == {b"batch_label", b"labels", b"data", b"filenames"}
    assert batch[b"data"].dtype == np.uint8 and batch[b"data"].shape == (10, 3072)
    # Channel-major rows: the first 1024 values are the red plane, row by row.
    np.testing.assert_array_equal(batch[b"data"][0, :1024], train_x[0, :, :, 0].ravel())
    assert batch[b"labels"] == [int(v) for v in train_y[:10]]
    meta = pickle.loads((folder / "batches.meta").read_bytes(), encoding="bytes")
    assert meta[b"label_names"][0] == b"airplane" and len(meta[b"label_names"]) == 10
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)} <= names
    assert "cifar-10-batches-py/test_batch" in names
    assert all(name.startswith("cifar-10-batches-py") for name in names)


def test_python2_numpy1_pickles_load(tmp_path: Path, cifar_arrays: CifarArrays) -> None:
    # The official files name numpy.core.multiarray (numpy 1); numpy 2 writes
    # numpy._core.multiarray. Rewrite ours to the old spelling.
    folder = Path(write_cifar10_files(tmp_path, *cifar_arrays))
    raw = (folder / "test_batch").read_bytes()
    old = raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert old != raw
    (folder / "test_batch").write_bytes(old)
    test = load_dataset(f"cifar10:{folder}", train=False)
    np.testing.assert_array_equal(test.images, cifar_arrays[2])


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (os.getcwd, ())


def test_pickles_that_call_functions_are_refused(tmp_path: Path, cifar_arrays: CifarArrays) -> None:
    folder = Path(write_cifar10_files(tmp_path, *cifar_arrays))
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": _Evil()}, protocol=2))
    with pytest.raises(ValueError, match="refusing to unpickle"):
        load_dataset(f"cifar10:{folder}", train=False)


def test_missing_location_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    for call in (check_data_spec, lambda s: load_dataset(s, train=True)):
        with pytest.raises(ValueError, match="does not exist") as info:
            call(f"cifar10:{missing}")
        assert str(missing) in str(info.value)


def test_folder_without_batches_is_rejected(tmp_path: Path, cifar_arrays: CifarArrays) -> None:
    (tmp_path / "readme.txt").write_text("hello")
    with pytest.raises(ValueError, match="not in CIFAR-10 python format") as info:
        check_data_spec(f"cifar10:{tmp_path}")
    assert str(tmp_path) in str(info.value) and "data_batch_1" in str(info.value)

    folder = Path(write_cifar10_files(tmp_path / "partial", *cifar_arrays))
    (folder / "data_batch_3").unlink()
    with pytest.raises(ValueError, match=r"missing: data_batch_3$"):
        check_data_spec(f"cifar10:{folder}")
    with pytest.raises(ValueError, match="data_batch_3"):
        load_dataset(f"cifar10:{folder}", train=True)


def test_tar_gz_without_batches_is_rejected(tmp_path: Path) -> None:
    archive = tmp_path / "other.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("cifar-10-batches-py/readme.html")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    for call in (check_data_spec, lambda s: load_dataset(s, train=False)):
        with pytest.raises(ValueError, match="not in CIFAR-10 python format") as info_:
            call(f"cifar10:{archive}")
        assert str(archive) in str(info_.value)
        assert "cifar-10-batches-py/test_batch" in str(info_.value)


def test_file_that_is_not_an_archive_is_rejected(tmp_path: Path) -> None:
    bogus = tmp_path / "cifar.tar.gz"
    bogus.write_bytes(b"this is not gzip")
    with pytest.raises(ValueError, match="not in CIFAR-10 python format") as info:
        check_data_spec(f"cifar10:{bogus}")
    assert str(bogus) in str(info.value)
