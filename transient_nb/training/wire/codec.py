"""Wire dtypes: float32, float16 and bfloat16 gradients and weights, cast by torch.

numpy has no bfloat16, so a bfloat16 vector travels as its bits in an ``int16`` array (on the data
plane and on the Dask actor alike); :func:`from_wire` reads it back as a bfloat16 tensor without a
copy. bfloat16 keeps float32's range (a gradient entry of 1e-6 stays one; float16 makes 45% of real
gradients' entries subnormal and flushes those under 6e-8 to zero) at float16's size.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

#: Wire formats of gradients and weights between trainers and the PS, and their torch dtypes.
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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
