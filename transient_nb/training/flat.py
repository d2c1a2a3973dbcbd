"""A model laid flat: parameters, gradients and batch-norm statistics as views into one buffer each.

The trainer moves the whole model through the PS every step. With the parameters and their
gradients as views into two flat device buffers, backward writes the gradient straight into the
buffer that goes on the wire and new weights land with one copy: no concatenation, no
per-parameter copies, no allocation per step. On a GPU the host side is pinned memory, copied on
a side stream with ``non_blocking`` copies; gradients use two host buffers in turn, so that a push
still in flight (pipelined trainers) is never overwritten by the next step's gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from transient_nb.training.wire.codec import TORCH_DTYPES, as_numpy, from_wire, tensor


def flat_layout(model: torch.nn.Module) -> tuple[list[torch.nn.Parameter], list[torch.Tensor]]:
    """The model's parameters and its float batch-norm buffers, in a fixed order."""
    params = [p for p in model.parameters() if p.requires_grad]
    buffers = [b for name, b in model.named_buffers() if b.dtype.is_floating_point]
    return params, buffers


class FlatModel:
    """``model``'s parameters, gradients and batch-norm statistics as views into flat buffers.

    Parameters
    ----------
    model
        The model, already on its device; its tensors become views (its values are kept).
    wire_dtype
        dtype of the gradients handed out by :meth:`grads` ("float32", "float16" or
        "bfloat16", the last as int16 bits: numpy has no bfloat16).
    slots
        Host gradient buffers used in turn (2: one may be in flight while the next is filled).

    Examples
    --------
    >>> net = torch.nn.Linear(3, 2)
    >>> flat = FlatModel(net)
    >>> flat.load([np.arange(8, dtype=np.float32)], [(0, 8)])
    >>> net.bias.tolist()
    [6.0, 7.0]
    """

    def __init__(self, model: torch.nn.Module, wire_dtype: str = "float32", slots: int = 2):
        self.params, self.buffers = flat_layout(model)
        device = self.params[0].device
        self.cuda = device.type == "cuda"
        n = sum(p.numel() for p in self.params)
        nb = sum(b.numel() for b in self.buffers)
        self.w = torch.empty(n, device=device)
        self.g = torch.zeros(n, device=device)
        self.b = torch.empty(nb, device=device)
        with torch.no_grad():
            o = 0
            for p in self.params:
                k = p.numel()
                self.w[o : o + k].copy_(p.detach().reshape(-1))
                p.data = self.w[o : o + k].view_as(p)
                p.grad = self.g[o : o + k].view_as(p)
                o += k
            o = 0
            for buf in self.buffers:
                k = buf.numel()
                self.b[o : o + k].copy_(buf.detach().reshape(-1))
                buf.data = self.b[o : o + k].view_as(buf)
                o += k
        self.wire_dtype = wire_dtype
        wire = TORCH_DTYPES[wire_dtype]
        self._grad_host = [torch.empty(n, dtype=wire, pin_memory=self.cuda) for _ in range(slots)]
        self._bn_host = [torch.empty(nb, pin_memory=self.cuda) for _ in range(slots)]
        self._bn_before = torch.empty(nb, device=device)
        self._bn_delta = torch.empty(nb, device=device)
        self._slot = 0
        self._stream = torch.cuda.Stream(device) if self.cuda else None

    def mark_statistics(self) -> None:
        """Remember the batch-norm statistics before a step (the PS gets their change)."""
        self._bn_before.copy_(self.b)

    def grads(self) -> tuple[np.ndarray, np.ndarray | None]:
        """This step's gradient (in the wire dtype) and statistics change, on the host.

        The arrays are views of this object's host buffers, valid until the ``slots``-th next
        call.
        """
        slot = self._slot
        self._slot = (slot + 1) % len(self._grad_host)
        grad, bn = self._grad_host[slot], self._bn_host[slot]
        torch.sub(self.b, self._bn_before, out=self._bn_delta)
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self._stream):
                grad.copy_(self.g, non_blocking=True)
                bn.copy_(self._bn_delta, non_blocking=True)
            self._stream.synchronize()
        else:
            grad.copy_(self.g)
            bn.copy_(self._bn_delta)
        return as_numpy(grad), (bn.numpy() if self.buffers else None)

    def load(
        self,
        pieces: Sequence[np.ndarray],
        bounds: Sequence[tuple[int, int]],
        bn: np.ndarray | None = None,
    ) -> None:
        """Set the weights from the shards' replies (any float dtype) and, if given, the
        statistics."""
        with torch.no_grad():
            for piece, (a, b) in zip(pieces, bounds, strict=True):
                self.w[a:b].copy_(tensor(from_wire(piece, self.wire_dtype)), non_blocking=True)
            if bn is not None and self.buffers:
                self.b.copy_(tensor(bn), non_blocking=True)
        if self.cuda:
            torch.cuda.current_stream().synchronize()  # the host arrays may go after this

    def weights(self) -> np.ndarray:
        """A host copy of the flat weights."""
        return self.w.detach().cpu().numpy().copy()


def decay_mask(model: torch.nn.Module) -> np.ndarray:
    """1 for entries that get weight decay (weights of convs and dense layers), else 0."""
    params, _ = flat_layout(model)
    return np.concatenate(
        [np.full(p.numel(), 1 if p.dim() > 1 else 0, dtype=np.uint8) for p in params]
    )


def get_flat(tensors: Sequence[torch.Tensor]) -> np.ndarray:
    """Concatenate tensors into one float32 numpy vector (on the host)."""
    if not tensors:
        return np.zeros(0, dtype=np.float32)
    return torch.cat([t.detach().reshape(-1) for t in tensors]).float().cpu().numpy()


def set_flat(tensors: Sequence[torch.Tensor], flat: np.ndarray) -> None:
    """Copy a flat vector back into tensors (any device)."""
    src = torch.from_numpy(np.ascontiguousarray(flat, dtype=np.float32))
    device = tensors[0].device if tensors else "cpu"
    src = src.to(device, non_blocking=True)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(src[offset : offset + n].view_as(t))
            offset += n
