"""The shared region: two mappings of one sealed memory file; anything else is refused."""

from __future__ import annotations

import fcntl
import os

import numpy as np
import pytest

from transient_nb.training.wire.region import ALIGN, SEALS, Region, aligned


def test_a_region_is_one_memory_for_both_ends_and_sealed():
    mine = Region.create(100)
    assert mine.size == aligned(100) == 128
    assert fcntl.fcntl(mine.fd, fcntl.F_GET_SEALS) & SEALS == SEALS
    with pytest.raises(PermissionError):  # sealed: it can neither shrink nor grow
        os.ftruncate(mine.fd, 64)
    theirs = Region.adopt(os.dup(mine.fd))
    theirs.close()  # the mapping outlives the descriptor
    mine.view(64, np.dtype(np.float32), 64)[:] = np.arange(16)
    assert theirs.view(64, np.dtype(np.float32), 64).tolist() == list(range(16))
    mine.close()
    mine.close()  # twice is fine


@pytest.mark.parametrize(
    "offset, nbytes",
    [(-64, 4), (3, 4), (64, 65), (128, 4)],
    ids=["neg", "unaligned", "long", "end"],
)
def test_views_outside_or_unaligned_are_refused(offset, nbytes):
    r = Region.create(128)
    with pytest.raises(ValueError):
        r.view(offset, np.dtype(np.uint8), nbytes)
    r.close()


def test_an_unsealed_memory_file_or_a_plain_file_is_not_adopted(tmp_path):
    fd = os.memfd_create("x", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, ALIGN)
    with pytest.raises(ValueError, match="sealed"):
        Region.adopt(fd)
    with pytest.raises(OSError):  # adopt closed it, refusal or not
        os.fstat(fd)
    path = tmp_path / "f"
    path.write_bytes(b"\0" * ALIGN)
    with pytest.raises((ValueError, OSError)):
        Region.adopt(os.open(path, os.O_RDWR))
