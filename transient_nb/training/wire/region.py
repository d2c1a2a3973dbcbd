"""A memory region a trainer shares with the PS on its host: arrays cross without a socket copy.

On one host the gradient and the weights need not go through the kernel's socket buffers (a copy
in, a copy out, each way): the trainer makes an anonymous memory file (``memfd_create``), sealed so
that it can never shrink under the PS's feet, and hands its descriptor to the PS over their Unix
socket (``SCM_RIGHTS``); nothing in the file system names it, so only the two of them can map it.
The frames on the socket then only say where in the region each array lies. The trainer writes
its request there and reads the reply from there; the PS reads the gradient in place and writes
the reply there. One call at a time per connection keeps the two from writing at once: the
request part is written before the request is sent and not again before its reply is in; the
reply part is written by the PS before the reply frame goes out.

Examples
--------
>>> r = Region.create(100)
>>> a = r.view(64, np.dtype(np.float32), 16)
>>> a[:] = 2.0
>>> twin = Region.adopt(os.dup(r.fd))
>>> twin.view(64, np.dtype(np.float32), 16).tolist()
[2.0, 2.0, 2.0, 2.0]
>>> r.close(); twin.close()
"""

from __future__ import annotations

import fcntl
import mmap
import os
from typing import Any

import numpy as np

#: Alignment of every array in a region (cache lines; SIMD loads).
ALIGN = 64
#: The seals a region must carry: its size can neither shrink (a PS touching a page that is gone
#: would die of SIGBUS) nor grow.
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def aligned(n: int) -> int:
    """``n`` rounded up to :data:`ALIGN`.

    Examples
    --------
    >>> aligned(1), aligned(64), aligned(65)
    (64, 64, 128)
    """
    return -(-n // ALIGN) * ALIGN


class Region:
    """A mapped, sealed memory file of ``size`` bytes (see the module docstring)."""

    def __init__(self, fd: int, size: int):
        self.size = size
        self._map = mmap.mmap(fd, size)
        self.fd = fd
        self.bytes = np.frombuffer(self._map, np.uint8)

    @classmethod
    def create(cls, size: int) -> Region:
        """A new region of at least ``size`` bytes (the trainer's side)."""
        size = aligned(max(size, 1))
        fd = os.memfd_create("transient-nb-data", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            return cls(fd, size)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def adopt(cls, fd: int) -> Region:
        """Map a region received from a peer (the PS's side); ``ValueError`` if it is not one.

        The descriptor is owned by the region from here (closed with it, or now on refusal).
        """
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            if seals & SEALS != SEALS:
                raise ValueError("A shared region must be a sealed memory file.")
            size = os.fstat(fd).st_size
            if size <= 0 or size % ALIGN:
                raise ValueError(f"A shared region of {size} bytes is not one of ours.")
            return cls(fd, size)
        except BaseException:
            os.close(fd)
            raise

    def view(self, offset: int, dtype: np.dtype[Any], nbytes: int) -> np.ndarray:
        """The ``nbytes`` at ``offset`` as an array of ``dtype``; ``ValueError`` when outside."""
        if offset < 0 or offset % ALIGN or nbytes < 0 or offset + nbytes > self.size:
            raise ValueError(f"{nbytes} bytes at {offset} are outside a region of {self.size}.")
        return self.bytes[offset : offset + nbytes].view(dtype)

    def close(self) -> None:
        """Close the descriptor; the mapping goes once no array views it any more."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
