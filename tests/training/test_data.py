"""Tests for transient_nb.training.data."""

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
import torch
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

from transient_nb.training import data as data_module
from transient_nb.training.data import (
    ArrayDataset,
    BatchStream,
    DataSpec,
    check_data_spec,
    load_dataset,
    parse_data_spec,
    to_tensor,
    write_cifar10_files,
)

torch.set_num_threads(1)

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


# --------------------------------------------------------------------------- specs


def test_parse_data_spec_accepted_forms() -> None:
    assert parse_data_spec("synthetic") == DataSpec("synthetic", size=10_000)
    assert parse_data_spec("synthetic:500") == DataSpec("synthetic", size=500)
    assert parse_data_spec("digits") == DataSpec("digits")
    url = "gs://bucket/dir/cifar-10-python.tar.gz"
    assert parse_data_spec(f"cifar10:{url}") == DataSpec("cifar10", location=url)
    home = parse_data_spec("cifar10:~/data/cifar")
    assert home.location == os.path.join(os.path.expanduser("~"), "data", "cifar")
    for spec in ("synthetic:500", "digits", f"cifar10:{url}"):
        assert str(parse_data_spec(spec)) == spec


@pytest.mark.parametrize(
    "bad",
    ["", "cifar", "cifar10", "cifar10:", "synthetic:abc", "synthetic:0", "digits:3", "imagenet"],
)
def test_malformed_spec_is_named_in_the_error(bad: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_data_spec(bad)
    assert repr(bad) in str(info.value)
    assert "cifar10:PATH-OR-URL" in str(info.value)
    with pytest.raises(ValueError):
        load_dataset(bad, train=True)


# --------------------------------------------------------------------------- CIFAR-10


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


# --------------------------------------------------------------------------- digits


def test_digits_split() -> None:
    train, test = load_dataset("digits", train=True), load_dataset("digits", train=False)
    assert len(train) + len(test) == 1797
    assert len(test) == 360
    for ds in (train, test):
        assert ds.images.shape[1:] == (8, 8, 3) and ds.images.dtype == np.uint8
        assert ds.labels.dtype == np.int64
        assert set(np.unique(ds.labels)) == set(range(10)) and ds.num_classes == 10
        assert (ds.pad, ds.flip) == (1, False)
        # Grey replicated into three channels, 0..16 scaled to 0..255.
        assert (ds.images[..., 0] == ds.images[..., 2]).all() and ds.images.max() == 255
    # Train and test partition the bundled set: together they hold each image once.
    original = np.round(load_digits().images * (255 / 16)).astype(np.uint8).reshape(1797, -1)
    both = np.concatenate([train.images[..., 0], test.images[..., 0]]).reshape(1797, -1)
    assert sorted(map(bytes, both)) == sorted(map(bytes, original))


def test_loaded_data_is_cached_and_read_only() -> None:
    first = load_dataset("digits", train=True)
    assert load_dataset(parse_data_spec("digits"), train=True) is first
    assert not first.images.flags.writeable and not first.labels.flags.writeable


# --------------------------------------------------------------------------- synthetic


def _features(ds: ArrayDataset) -> np.ndarray:
    # 4x4 average pooling to 8x8x3, then per-image standardisation.
    x = ds.images.astype(np.float32).reshape(len(ds), 8, 4, 8, 4, 3).mean(axis=(2, 4))
    x = x.reshape(len(ds), -1)
    return (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True)


def test_synthetic_is_deterministic_balanced_and_learnable() -> None:
    train = load_dataset("synthetic:1000", train=True)
    test = load_dataset("synthetic:1000", train=False)
    assert train.images.shape == (1000, 32, 32, 3) and test.images.shape == (200, 32, 32, 3)
    assert (train.num_classes, train.pad, train.flip) == (10, 4, True)
    assert np.bincount(train.labels, minlength=10).min() >= 90

    data_module._load_cached.cache_clear()
    again = load_dataset("synthetic:1000", train=True)
    assert again is not train
    np.testing.assert_array_equal(again.images, train.images)
    np.testing.assert_array_equal(again.labels, train.labels)

    # Different samples in train and test...
    assert not {bytes(im) for im in train.images} & {bytes(im) for im in test.images}
    # ...drawn from the same classes, so a linear model generalises well above chance.
    clf = LogisticRegression(max_iter=1000).fit(_features(train), train.labels)
    assert clf.score(_features(test), test.labels) > 0.5


# --------------------------------------------------------------------------- batches


def _indexed_dataset(n: int = 60, pad: int = 1, flip: bool = False) -> ArrayDataset:
    """Random images whose label is their index, so batches reveal what was drawn."""
    images = np.random.default_rng(7).integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8)
    return ArrayDataset(images, np.arange(n, dtype=np.int64), "indexed", n, pad, flip)


def test_batch_shapes_dtypes_and_standardisation() -> None:
    ds = load_dataset("synthetic:200", train=True)
    x, y = next(BatchStream(ds, 16, seed=0))
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (16,) and y.dtype == torch.int64
    torch.testing.assert_close(x.mean(dim=(1, 2, 3)), torch.zeros(16), atol=1e-5, rtol=0)
    std = x.std(dim=(1, 2, 3), correction=0)
    torch.testing.assert_close(std, torch.ones(16), atol=1e-4, rtol=0)


def test_to_tensor_matches_tensorflow_per_image_standardization() -> None:
    images = np.random.default_rng(0).integers(0, 256, size=(3, 8, 8, 3), dtype=np.uint8)
    images[1] = 42  # constant image: the std floor avoids dividing by zero
    x = to_tensor(images)
    flat = images.reshape(3, -1).astype(np.float64)
    floor = 1 / np.sqrt(flat.shape[1])
    expected = (flat - flat.mean(1, keepdims=True)) / np.maximum(flat.std(1, keepdims=True), floor)
    expected_nchw = expected.reshape(3, 8, 8, 3).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(x.numpy(), expected_nchw, atol=1e-5)
    assert (x[1] == 0).all()


def test_shards_are_disjoint_and_each_epoch_covers_the_shard() -> None:
    ds = _indexed_dataset(60)
    seen = []
    for index in range(3):
        stream = BatchStream(ds, 5, seed=index, shard=(index, 3))
        epoch1 = np.concatenate([next(stream)[1].numpy() for _ in range(4)])
        epoch2 = np.concatenate([next(stream)[1].numpy() for _ in range(4)])
        np.testing.assert_array_equal(np.sort(epoch1), stream.indices)
        np.testing.assert_array_equal(np.sort(epoch2), stream.indices)
        assert not np.array_equal(epoch1, epoch2)  # reshuffled every epoch
        seen.append(set(epoch1))
    assert len(seen[0] | seen[1] | seen[2]) == 60
    assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])


def test_batches_straddle_epochs_without_repeats() -> None:
    stream = BatchStream(_indexed_dataset(20), 7, seed=0)
    drawn = np.concatenate([next(stream)[1].numpy() for _ in range(3)])  # 21 draws
    np.testing.assert_array_equal(np.sort(drawn[:20]), np.arange(20))
    assert stream.epoch == 2


def test_same_seed_same_batches_different_seed_different() -> None:
    ds = load_dataset("synthetic:200", train=True)
    a, b, c = (BatchStream(ds, 8, seed=s) for s in (1, 1, 2))
    for _ in range(3):
        (xa, ya), (xb, yb), (xc, yc) = next(a), next(b), next(c)
        torch.testing.assert_close(xa, xb, rtol=0, atol=0)
        assert torch.equal(ya, yb)
    assert not torch.equal(ya, yc) or not torch.equal(xa, xc)


@pytest.mark.parametrize(("pad", "flip"), [(1, False), (4, True)])
def test_augmentation_is_a_zero_padded_crop_and_optional_flip(pad: int, flip: bool) -> None:
    ds = _indexed_dataset(12, pad=pad, flip=flip)
    stream = BatchStream(ds, 12, seed=3)
    used_flip, used_shift = False, False
    for _ in range(4):
        x, y = next(stream)
        for out, label in zip(x, y.tolist(), strict=True):
            padded = np.pad(ds.images[label], ((pad, pad), (pad, pad), (0, 0)))
            candidates = [
                (dy, dx, f)
                for dy in range(2 * pad + 1)
                for dx in range(2 * pad + 1)
                for f in ((False, True) if flip else (False,))
            ]
            crops = np.stack(
                [
                    padded[dy : dy + 8, dx : dx + 8][:, ::-1]
                    if f
                    else padded[dy : dy + 8, dx : dx + 8]
                    for dy, dx, f in candidates
                ]
            )
            errors = (to_tensor(crops) - out).abs().amax(dim=(1, 2, 3))
            best = int(errors.argmin())
            assert errors[best] < 1e-5
            dy, dx, f = candidates[best]
            used_flip |= f
            used_shift |= (dy, dx) != (pad, pad)
    assert used_shift and used_flip == flip


def test_no_augmentation_returns_standardised_originals() -> None:
    ds = _indexed_dataset(10)
    x, y = next(BatchStream(ds, 10, seed=0, augment=False))
    torch.testing.assert_close(x, to_tensor(ds.images[y.numpy()]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 8, "shard": (3, 3)}, "shard"),
        ({"batch_size": 8, "shard": (0, 0)}, "shard"),
        ({"batch_size": 8, "shard": (0, 11)}, "shards"),
        ({"batch_size": 6, "shard": (0, 2)}, "batch_size"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_batch_stream_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BatchStream(_indexed_dataset(10), seed=0, **kwargs)


def test_the_digits_split_is_scikit_learns_without_importing_it():
    """The digits are read from scikit-learn's bundled file with numpy and split as
    ``train_test_split(test_size=0.2, stratify=y, random_state=0)`` would, without the 1-3 s
    import of scikit-learn in a replacement trainer's start."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from transient_nb.training.data import _digits, stratified_test_indices

    bunch = load_digits()
    grey = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    labels = bunch.target.astype(np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=0.2, stratify=labels, random_state=0
    )
    for train, idx in ((True, train_idx), (False, test_idx)):
        images, got = _digits(train)
        idx = np.sort(idx)
        assert np.array_equal(got, labels[idx])
        assert np.array_equal(images, np.repeat(grey[idx][..., None], 3, axis=-1))
    rng = np.random.default_rng(3)
    for n, classes, fraction, seed in ((50, 3, 0.3, 1), (97, 7, 0.2, 5), (200, 2, 0.25, 0)):
        y = rng.integers(0, classes, n)
        y[:classes] = np.arange(classes)  # every class at least twice
        y[classes : 2 * classes] = np.arange(classes)
        _, expected = train_test_split(
            np.arange(n), test_size=fraction, stratify=y, random_state=seed
        )
        assert stratified_test_indices(y, fraction, seed).tolist() == sorted(expected.tolist())
    code = (
        "import sys; from transient_nb.training.data import load_dataset; "
        "load_dataset('digits', train=True); print('sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
