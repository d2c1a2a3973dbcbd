"""Wire dtypes: float32, float16 and bfloat16 gradients and weights, cast by torch.

numpy has no bfloat16, so a bfloat16 vector travels as its bits in an ``int16`` array (on the data
plane and on the Dask actor alike); :func:`from_wire` reads it back as a bfloat16 tensor without a
copy. bfloat16 keeps float32's range (a gradient entry of 1e-6 stays one; float16 makes 45% of real
gradients' entries subnormal and flushes those under 6e-8 to zero) at float16's size.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np
import torch

#: Wire formats of gradients and weights between trainers and the PS, and their torch dtypes.
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: ... and the numpy dtypes they travel as.
NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.int16}


@contextmanager
def _once(var: ContextVar[list[Any] | None], value: Any) -> Iterator[None]:
    """Offer ``value`` to the next :func:`to_wire` of this context through ``var``.

    A one-item list, so that the first reply that takes it (``pop``) leaves it used up for the
    rest of the context; the context's end restores whatever was offered before.
    """
    token = var.set([value])
    try:
        yield
    finally:
        var.reset(token)


#: Where the next reply may be written instead of a fresh buffer (see :func:`reply_into`).
_REPLY_INTO: ContextVar[list[np.ndarray] | None] = ContextVar("reply_into", default=None)


@contextmanager
def reply_into(buffer: np.ndarray) -> Iterator[None]:
    """Let the next :func:`to_wire` of this context write its copy into ``buffer`` (once, if
    the sizes and dtypes match) rather than into a fresh array.

    The data plane's server wraps a call with it, so that the PS's reply lands straight in the
    memory it shares with the trainer: one copy of the weights per reply instead of two. The
    call runs as a task on the PS's loop, which inherits this context; nothing else changes for
    the PS (its reply is still a buffer of its own, not its live weights).

    Examples
    --------
    >>> out = np.zeros(3, np.float32)
    >>> with reply_into(out):
    ...     a = to_wire(np.ones(3, np.float32), "float32")
    ...     b = to_wire(np.ones(3, np.float32), "float32")
    >>> a is out, np.shares_memory(b, out)
    (True, False)
    """
    with _once(_REPLY_INTO, buffer):
        yield


#: Whether the next float32 reply may be the PS's live array itself (see :func:`reply_live`).
_REPLY_LIVE: ContextVar[list[bool] | None] = ContextVar("reply_live", default=None)


@contextmanager
def reply_live() -> Iterator[None]:
    """Let the next float32 :func:`to_wire` of this context return its array itself, not a copy.

    For a caller that consumes the reply before the event loop runs anything else: the TLS data
    plane's server seals (encrypts) a float32 reply from the PS's own weights in the task that
    awaited the PS's call, with no ``await`` in between, so no other update can touch them
    meanwhile; that saves the copy of the weights the reply would otherwise be (a float16 or
    bfloat16 reply is a cast, made as before).

    Examples
    --------
    >>> w = np.ones(3, np.float32)
    >>> with reply_live():
    ...     a = to_wire(w, "float32")
    ...     b = to_wire(w, "float32")
    >>> a is w, b is w
    (True, False)
    """
    with _once(_REPLY_LIVE, True):
        yield


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A host tensor as a numpy array sharing its memory (bfloat16 as int16 bits).

    Examples
    --------
    >>> as_numpy(torch.ones(2, dtype=torch.bfloat16)).tolist()
    [16256, 16256]
    """
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy()


def to_wire(x: np.ndarray, wire_dtype: str) -> np.ndarray:
    """A fresh copy of ``x`` in the wire dtype (torch casts: numpy's float16 cast is ~400x slower).

    Examples
    --------
    >>> w = np.ones(3, np.float32)
    >>> out = to_wire(w, "float16")
    >>> out.dtype, np.shares_memory(out, w), np.shares_memory(to_wire(w, "float32"), w)
    (dtype('float16'), False, False)
    >>> to_wire(w, "bfloat16").dtype
    dtype('int16')
    """
    live = _REPLY_LIVE.get()
    if live and wire_dtype == "float32" and x.dtype == np.float32 and x.flags.c_contiguous:
        live.pop()  # once
        return x
    room = _REPLY_INTO.get()
    if room:
        out = room[0]
        if out.dtype == NUMPY_DTYPES[wire_dtype] and out.shape == x.shape:
            room.pop()  # once: a second copy in the same call gets a buffer of its own
            target = torch.from_numpy(out)
            if wire_dtype == "bfloat16":
                target = target.view(torch.bfloat16)
            target.copy_(torch.from_numpy(x))
            return out
    if wire_dtype == "float32":
        return x.copy()
    return as_numpy(torch.from_numpy(x).to(TORCH_DTYPES[wire_dtype]))


def from_wire(x: Any, wire_dtype: str) -> Any:
    """``x`` as it came off the wire, as something torch reads as numbers (no copy).

    A bfloat16 payload (int16 bits) becomes a bfloat16 tensor; anything else is returned as it is.

    Examples
    --------
    >>> b = to_wire(np.array([1.5, -2.0], np.float32), "bfloat16")
    >>> from_wire(b, "bfloat16").float().tolist()
    [1.5, -2.0]
    """
    if wire_dtype == "bfloat16" and isinstance(x, np.ndarray) and x.dtype == np.int16:
        return tensor(x).view(torch.bfloat16)
    return x


def tensor(x: Any) -> torch.Tensor:
    """A tensor over ``x``'s memory (a received frame may be read-only: it is only read)."""
    if isinstance(x, torch.Tensor):
        return x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.asarray(x))
