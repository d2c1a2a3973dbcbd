"""Checkpoints: consistent sets, atomic files, a manifest written last, and no code in them."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

from transient_nb.training import checkpoint


def _publish(url, step, shards=2, fill=None, run=None):
    files = [
        checkpoint.write_shard(
            url,
            step,
            i,
            {
                "weights": np.full(5, step if fill is None else fill, np.float32),
                "momentum": np.full(5, -step, np.float32),
                "decay_mask": np.ones(5, np.uint8),
                "bn": np.arange(3, dtype=np.float32) if i == 0 else None,
            },
        )
        for i in range(shards)
    ]
    meta = {"model": "resnet8", "counters": {"accepted": {"a": step}}}
    if run is not None:
        meta["run"] = run
    return checkpoint.write_manifest(url, step, meta, files)


@pytest.mark.parametrize("scheme", ["local", "memory"])
def test_round_trip_of_a_complete_set(tmp_path, scheme):
    url = str(tmp_path / "ckpt") if scheme == "local" else "memory://ckpt-round-trip"
    path = _publish(url, 42)
    assert path.endswith("step-000000042/manifest.json")
    ck = checkpoint.load_latest(url)
    assert ck is not None and ck.step == 42 and len(ck.shards) == 2
    assert ck.meta["model"] == "resnet8" and ck.meta["counters"] == {"accepted": {"a": 42}}
    np.testing.assert_array_equal(ck.shards[0]["weights"], np.full(5, 42, np.float32))
    np.testing.assert_array_equal(ck.shards[1]["momentum"], np.full(5, -42, np.float32))
    assert "bn" in ck.shards[0] and "bn" not in ck.shards[1]
    if scheme == "local":
        # Written under temporary names and renamed: no leftovers.
        assert sorted(os.listdir(tmp_path / "ckpt" / "step-000000042")) == [
            "manifest.json",
            "shard-0.npz",
            "shard-1.npz",
        ]


def test_a_set_without_its_manifest_or_with_a_changed_file_is_not_a_checkpoint(tmp_path):
    url = str(tmp_path)
    _publish(url, 10)
    # Step 20: every shard written, but the writer died before the manifest.
    for i in range(2):
        checkpoint.write_shard(url, 20, i, {"weights": np.zeros(5, np.float32)})
    assert checkpoint.load_latest(url).step == 10
    # Step 30: published, then one shard file replaced behind the manifest's back.
    _publish(url, 30)
    checkpoint.write_shard(url, 30, 1, {"weights": np.zeros(5, np.float32)})
    assert checkpoint.load_latest(url).step == 10
    # A torn manifest is no manifest.
    _publish(url, 40)
    with open(os.path.join(checkpoint.step_dir(url, 40), "manifest.json"), "w") as f:
        f.write('{"format": 2, "st')
    assert checkpoint.load_latest(url).step == 10


def test_an_older_checkpoint_never_replaces_a_newer_one(tmp_path):
    url = str(tmp_path)
    _publish(url, 9)
    _publish(url, 5)  # e.g. a late explicit checkpoint of an older state
    assert checkpoint.load_latest(url).step == 9
    assert checkpoint.steps(url) == [9, 5]


def test_prune_keeps_the_newest_complete_ones(tmp_path):
    url = str(tmp_path)
    for step in (1, 2, 3, 4):
        _publish(url, step)
    checkpoint.write_shard(url, 5, 0, {"weights": np.zeros(5, np.float32)})  # being written
    assert sorted(checkpoint.prune(url, keep=2)) == [1, 2]
    assert checkpoint.steps(url) == [5, 4, 3]
    assert checkpoint.load_latest(url).step == 4


def test_loading_refuses_anything_that_could_run_code(tmp_path):
    url = str(tmp_path)
    _publish(url, 3)
    folder = checkpoint.step_dir(url, 3)
    # An object array in a shard file: numpy would unpickle it; we refuse.
    buf = io.BytesIO()
    np.savez(buf, weights=np.array([{"x": 1}], dtype=object))
    data = buf.getvalue()
    with open(os.path.join(folder, "shard-0.npz"), "wb") as f:
        f.write(data)
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    import hashlib

    manifest["files"][0].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    with pytest.raises(ValueError, match="allow_pickle"):
        checkpoint.load_latest(url)


def _publish_in_format(url, fmt):
    """A checkpoint of step 3 whose manifest says it is in format ``fmt``."""
    _publish(url, 3)
    path = os.path.join(checkpoint.step_dir(url, 3), "manifest.json")
    manifest = json.load(open(path))
    manifest["format"] = fmt
    json.dump(manifest, open(path, "w"))


def test_unknown_format_is_refused_with_what_to_do(tmp_path):
    url = str(tmp_path)
    _publish_in_format(url, 999)
    with pytest.raises(ValueError, match=r"format 999.*checkpoint_url"):
        checkpoint.load_latest(url)


def test_unknown_arrays_are_refused(tmp_path):
    with pytest.raises(ValueError, match="Unknown checkpoint arrays"):
        checkpoint.write_shard(str(tmp_path), 1, 0, {"optimizer": np.zeros(1)})


@pytest.mark.slow
def test_a_writer_killed_midway_leaves_the_previous_complete_checkpoint(tmp_path):
    """Kill a process that writes big checkpoints one after the other, at an arbitrary moment:
    a reader then finds a complete one, whose every array holds its own step, never a torn one."""
    url = str(tmp_path / "ckpt")
    writer = textwrap.dedent(
        f"""
        import sys, numpy as np
        from transient_nb.training import checkpoint
        url = {url!r}
        for step in range(1, 10_000):
            files = [checkpoint.write_shard(url, step, i, {{"weights": np.full(2_000_000, step, np.float32),
                                                         "momentum": np.full(2_000_000, step, np.float32)}})
                     for i in range(2)]
            checkpoint.write_manifest(url, step, {{"model": "m"}}, files)
            print(step, flush=True)
        """
    )
    for delay in (0.0, 0.05, 0.13):
        proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        first = int(proc.stdout.readline())  # one checkpoint is complete
        time.sleep(delay)  # then kill it somewhere in the middle of the next ones
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        ck = checkpoint.load_latest(url)
        assert ck is not None and ck.step >= first
        for shard in ck.shards:
            assert (shard["weights"] == ck.step).all() and (shard["momentum"] == ck.step).all()


# -- what the mutation run (issue 17) showed unchecked ----------------------------------------------


def test_files_reach_their_final_name_only_by_an_atomic_rename_of_complete_bytes(
    tmp_path, monkeypatch
):
    """No file is ever opened for writing under its final name: a reader sees the old bytes
    (or none) until the rename, then the new ones whole."""
    url = str(tmp_path)
    renames = []
    real_replace = os.replace

    def replace(src, dst):
        assert src != dst and os.path.basename(src).startswith(os.path.basename(dst) + ".tmp-")
        assert not os.path.exists(dst)  # nothing written under the final name before
        with open(src, "rb") as f:
            renames.append((os.path.basename(dst), f.read()))
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", replace)
    path = _publish(url, 8)
    assert [name for name, _ in renames] == ["shard-0.npz", "shard-1.npz", "manifest.json"]
    assert renames[-1][1] == open(path, "rb").read()  # the manifest went whole
    assert sorted(os.listdir(checkpoint.step_dir(url, 8))) == [
        "manifest.json",
        "shard-0.npz",
        "shard-1.npz",
    ]
    assert checkpoint.latest_step(url) == 8


def test_the_manifest_records_the_step_format_meta_and_files_in_shard_order(tmp_path):
    url = str(tmp_path) + "/"  # a trailing slash changes nothing
    files = [
        checkpoint.write_shard(url, 3, i, {"weights": np.full(4, i, np.float32)}) for i in (1, 0)
    ]
    path = checkpoint.write_manifest(url, 3, {"model": "m", "counters": {"gaps": 1}}, files)
    assert path == os.path.join(str(tmp_path), "step-000000003", "manifest.json")
    manifest = json.load(open(path))
    assert manifest["format"] == checkpoint.FORMAT == 2 and manifest["step"] == 3
    assert [f["name"] for f in manifest["files"]] == ["shard-0.npz", "shard-1.npz"]
    assert [f["shard"] for f in manifest["files"]] == [0, 1]
    data = open(os.path.join(os.path.dirname(path), "shard-1.npz"), "rb").read()
    import hashlib

    assert manifest["files"][1]["bytes"] == len(data)
    assert manifest["files"][1]["sha256"] == hashlib.sha256(data).hexdigest()
    ck = checkpoint.load_latest(url)
    assert ck.meta == {"model": "m", "counters": {"gaps": 1}, "format": 2, "step": 3}
    assert ck.url == checkpoint.step_dir(str(tmp_path), 3)
    assert [float(s["weights"][0]) for s in ck.shards] == [0.0, 1.0]  # in shard order


def test_a_remote_manifest_path_keeps_its_scheme():
    # A fresh name: the memory filesystem lives as long as the process (and its forks).
    name = f"ckpt-remote-{uuid.uuid4().hex}-X"  # a trailing X is part of the name
    url = f"memory://{name}"
    files = [checkpoint.write_shard(url, 1, 0, {"weights": np.zeros(2, np.float32)})]
    assert (
        checkpoint.write_manifest(url, 1, {}, files)
        == f"memory://{name}/step-000000001/manifest.json"
    )
    assert checkpoint.load_latest(url).url == f"/{name}/step-000000001"
    assert (
        checkpoint.write_manifest(url + "/", 1, {}, files)
        == f"memory://{name}/step-000000001/manifest.json"
    )


def test_a_relative_local_url_gives_the_absolute_manifest_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    files = [checkpoint.write_shard("ckpt", 2, 0, {"weights": np.zeros(2, np.float32)})]
    path = checkpoint.write_manifest("ckpt", 2, {}, files)
    assert path == str(tmp_path / "ckpt" / "step-000000002" / "manifest.json")


def test_the_format_message_says_what_to_do(tmp_path):
    url = str(tmp_path)
    _publish_in_format(url, 1)
    with pytest.raises(ValueError) as info:
        checkpoint.load_latest(url)
    assert str(info.value) == (
        f"Checkpoint {checkpoint.step_dir(url, 3)} has format 1, expected 2: it was written by "
        "another version of transient_nb; start a new run or pass another checkpoint_url."
    )


def test_a_size_or_a_digest_that_does_not_match_alone_rejects_the_set(tmp_path):
    url = str(tmp_path)
    _publish(url, 1)
    for step, field, value in ((2, "bytes", 1), (3, "sha256", "0" * 64)):
        _publish(url, step)
        path = os.path.join(checkpoint.step_dir(url, step), "manifest.json")
        manifest = json.load(open(path))
        manifest["files"][1][field] = value
        json.dump(manifest, open(path, "w"))
        assert checkpoint.load_latest(url).step == 1
    # A shard file missing altogether.
    _publish(url, 4)
    os.remove(os.path.join(checkpoint.step_dir(url, 4), "shard-0.npz"))
    assert checkpoint.latest_step(url) == 1


def test_steps_lists_only_step_folders_and_nothing_for_a_missing_url(tmp_path):
    assert checkpoint.steps(str(tmp_path / "nowhere")) == []
    assert checkpoint.load_latest(str(tmp_path / "nowhere")) is None
    assert checkpoint.latest_step(str(tmp_path / "nowhere")) is None
    _publish(str(tmp_path), 12)
    _publish(str(tmp_path), 3)
    (tmp_path / "notes").mkdir()
    (tmp_path / "step-7.bak").mkdir()
    (tmp_path / "step-7").mkdir()  # not a name step_dir gives
    (tmp_path / "copy-of-step-000000003").mkdir()
    assert checkpoint.steps(str(tmp_path)) == [12, 3]
    assert checkpoint.latest_step(str(tmp_path)) == 12
    # prune acts on checkpoint folders only (it used to delete step 3 for the copy, then fail).
    assert checkpoint.prune(str(tmp_path), keep=1) == [3]
    assert sorted(os.listdir(tmp_path)) == [
        "copy-of-step-000000003",
        "notes",
        "step-000000012",
        "step-7",
        "step-7.bak",
    ]


def test_prune_by_default_keeps_two_and_deletes_torn_older_folders(tmp_path):
    url = str(tmp_path)
    _publish(url, 1)
    checkpoint.write_shard(url, 2, 0, {"weights": np.zeros(5, np.float32)})  # torn, older
    _publish(url, 3)
    _publish(url, 4)
    _publish(url, 5)
    assert checkpoint.prune(url) == [3, 2, 1]
    assert checkpoint.steps(url) == [5, 4]
    assert checkpoint.prune(url, keep=1) == [4]
    assert checkpoint.prune(url, keep=1) == []


def test_each_file_is_fsynced_before_its_rename_and_its_folder_after(tmp_path, monkeypatch):
    """After a power loss the final name points at complete bytes, and the rename itself holds:
    the data is fsync'ed under its temporary name, then renamed, then the folder is fsync'ed."""
    import stat

    url = str(tmp_path)
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        st = os.fstat(fd)
        target = os.readlink(f"/proc/self/fd/{fd}")
        if stat.S_ISDIR(st.st_mode):
            calls.append(("fsync-dir", target, None))
        else:
            calls.append(("fsync-file", target, st.st_size))
        real_fsync(fd)

    def replace(src, dst):
        calls.append(("replace", os.fspath(src), os.fspath(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    monkeypatch.setattr(checkpoint.os, "replace", replace)
    _publish(url, 9)
    folder = os.path.realpath(checkpoint.step_dir(url, 9))
    replaces = [c for c in calls if c[0] == "replace"]
    assert [os.path.basename(dst) for _, _, dst in replaces] == [
        "shard-0.npz",
        "shard-1.npz",
        "manifest.json",
    ]
    for _, src, dst in replaces:
        i = calls.index(("replace", src, dst))
        # Immediately before the rename: the temporary file's data, all of it, was fsync'ed.
        kind, target, size = calls[i - 1]
        assert (kind, target) == ("fsync-file", os.path.realpath(src))
        assert size == os.path.getsize(dst)
        # Immediately after: the folder holding the new name.
        assert calls[i + 1] == ("fsync-dir", folder, None)
    assert len(calls) == 3 * len(replaces)  # nothing else, nothing twice


# -- issue 30: checkpoints scoped to their run ----------------------------------------------------
@pytest.mark.parametrize(
    ("url", "fs"),
    [
        ("local:///tmp/transient-ckpt", "LocalFileSystem"),
        ("/tmp/transient-ckpt", "LocalFileSystem"),
        ("relative/ckpt", "LocalFileSystem"),
        ("file:///tmp/transient-ckpt", "LocalFileSystem"),
        ("memory://transient-ckpt", "MemoryFileSystem"),
        ("simplecache::file:///tmp/transient-ckpt", "LocalFileSystem"),
    ],
)
def test_a_host_local_url_is_refused_on_a_cloud_backend_whatever_its_spelling(url, fs, monkeypatch):
    """Judged by the file system fsspec resolves, not the prefix: ``local://`` passed before."""
    probed = []
    monkeypatch.setattr(checkpoint, "probe_checkpoint_url", probed.append)
    with pytest.raises(ValueError) as info:
        checkpoint.check_checkpoint_url(url, "gce")
    text = str(info.value)
    assert text.startswith(f"checkpoint_url={url!r}: on the gce backend")
    assert f"(this one is a {fs}, on this host alone)" in text
    # What to use instead: a bucket of the user's, with a folder per run under it.
    assert "checkpoint_url='gs://BUCKET/PREFIX'" in text and "PREFIX/<run id>/" in text
    assert "YOUR-BUCKET/transient-runs" not in text
    assert probed == []  # refused before any write
    checkpoint.check_checkpoint_url(url, "local")  # the local backend: the host is the cluster


def test_a_local_path_under_a_share_every_host_mounts_is_shared_storage(tmp_path, monkeypatch):
    """An NFS or Filestore share mounted at the same path on every host
    (``transient.shared-paths``): a local URL under it passes the form and is probed; a path
    beside it, or one that climbs out of it, is still refused."""
    import dask.config

    probed: list[str] = []
    monkeypatch.setattr(checkpoint, "probe_checkpoint_url", probed.append)
    share = tmp_path / "share"
    with dask.config.set({"transient.shared-paths": [str(share)]}):
        checkpoint.check_checkpoint_url(f"file://{share}/runs", "gce")
        checkpoint.check_checkpoint_url(f"local://{share}", "gce")
        for outside in (f"file://{tmp_path}/other", f"{share}/../escape"):
            with pytest.raises(ValueError, match="on this host alone"):
                checkpoint.check_checkpoint_url(outside, "gce")
        with pytest.raises(ValueError, match="MemoryFileSystem"):
            checkpoint.check_checkpoint_url("memory://share", "gce")
    assert probed == [f"file://{share}/runs", f"local://{share}"]
    with pytest.raises(ValueError, match=r"transient\.shared-paths"):
        checkpoint.check_checkpoint_url(f"file://{share}/runs", "gce")  # not declared: refused


def test_shared_storage_passes_the_form_and_is_probed(monkeypatch):
    import fsspec
    from fsspec.spec import AbstractFileSystem

    class Bucket(AbstractFileSystem):
        """Shared storage of another kind, as gcsfs is (only resolved here, never written)."""

        protocol = "bucket-i30"

    fsspec.register_implementation("bucket-i30", Bucket, clobber=True)
    assert checkpoint.host_local("bucket-i30://b/runs") is None
    assert checkpoint.host_local("nosuch://b/runs") is None  # the probe says what is wrong
    probed = []
    monkeypatch.setattr(checkpoint, "probe_checkpoint_url", probed.append)
    checkpoint.check_checkpoint_url("bucket-i30://b/runs", "gce")
    assert probed == ["bucket-i30://b/runs"]


def test_two_runs_on_one_url_each_prune_their_own_folder_only(tmp_path):
    shared = str(tmp_path / "runs")
    a, b = (checkpoint.run_url(shared, r) for r in ("run-0000000a", "run-0000000b"))
    assert a == f"{shared}/run-0000000a"
    for step in (10, 20, 30):
        _publish(a, step, run="run-0000000a")
        _publish(b, step + 1, run="run-0000000b")
    assert checkpoint.prune(a, keep=2, run="run-0000000a") == [10]
    assert checkpoint.steps(a) == [30, 20] and checkpoint.steps(b) == [31, 21, 11]
    assert checkpoint.prune(b, keep=2, run="run-0000000b") == [11]
    assert checkpoint.steps(a) == [30, 20] and checkpoint.steps(b) == [31, 21]
    assert checkpoint.runs(shared) == ["run-0000000a", "run-0000000b"]
    assert checkpoint.load_latest(a, run="run-0000000a").step == 30
    assert checkpoint.load_latest(b, run="run-0000000b").step == 31


def test_prune_of_one_run_never_deletes_another_runs_folders_in_a_shared_folder(tmp_path):
    """A folder written by two runs (the unscoped layout of before): each prune deletes only its
    own complete checkpoints, and no torn folder, which may be the other's write in progress."""
    url = str(tmp_path)
    for step in (1, 3, 5):
        _publish(url, step, run="run-0000000a")
    for step in (2, 4, 6):
        _publish(url, step, run="run-0000000b")
    _publish(url, 7)  # a manifest that names no run: not this run's either
    checkpoint.write_shard(url, 0, 0, {"weights": np.zeros(5, np.float32)})  # torn, whose?
    assert checkpoint.prune(url, keep=1, run="run-0000000a") == [3, 1]
    assert checkpoint.steps(url) == [7, 6, 5, 4, 2, 0]
    assert checkpoint.prune(url, keep=2, run="run-0000000b") == [2]
    assert checkpoint.steps(url) == [7, 6, 5, 4, 0]
    # In a run's own folder, torn folders older than its kept ones are its own: deleted.
    own = str(tmp_path / "own")
    _publish(own, 1, run="run-0000000a")
    checkpoint.write_shard(own, 2, 0, {"weights": np.zeros(5, np.float32)})
    _publish(own, 3, run="run-0000000a")
    assert checkpoint.prune(own, keep=1, run="run-0000000a") == [2, 1]


def test_loading_refuses_a_manifest_of_another_run(tmp_path):
    url = checkpoint.run_url(str(tmp_path), "run-0000000a")
    _publish(url, 10, run="run-0000000a")
    _publish(url, 20, run="run-0000000b")  # another run's, newer, in this run's folder
    with pytest.raises(checkpoint.NotOwned) as info:
        checkpoint.load_latest(url, run="run-0000000a")
    assert str(info.value) == (
        f"The checkpoint {checkpoint.step_dir(url, 20)} is run 'run-0000000b''s, not run "
        "'run-0000000a''s: refused, its weights are not loaded. Each run keeps its checkpoints "
        "in a folder of its own (CHECKPOINT_URL/RUN_ID/); to continue run-0000000b, pass "
        "resume='run-0000000b'."
    )
    assert checkpoint.load_latest(url, run="run-0000000b").step == 20  # its own run's: loaded
    assert checkpoint.load_latest(url).step == 20  # no run asked for: as before
    _publish(url, 30)  # no run named at all
    with pytest.raises(checkpoint.NotOwned, match=r"is run None's.*not written by a transient_nb"):
        checkpoint.load_latest(url, run="run-0000000a")
    with pytest.raises(checkpoint.NotOwned, match="holds model 'resnet8''s weights"):
        _publish(url, 40, run="run-0000000a")
        checkpoint.load_latest(url, run="run-0000000a", model="resnet20")
