"""The reference workload's arithmetic, as a fingerprint to compare two checkouts.

One trainer against an in-process PS (no cluster, so nothing asynchronous): the built-in
``resnet8`` on ``digits`` and on ``synthetic:500``, 40 steps of the paper's SGD with its warm-up,
seeded; prints the SHA-256 of the PS's weights, momentum and batch-norm statistics. Equal
fingerprints from two checkouts mean the built-in path trains bit for bit the same.

    python benchmarks/reference_identity.py                          # this checkout
    PYTHONPATH=/path/to/other python /path/to/other/benchmarks/reference_identity.py
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import tempfile
import threading

import torch
from _common import md_table

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.training.doubles import PSDouble
from transient_nb.training.hparams import HParams
from transient_nb.training.models import build_model
from transient_nb.training.ps import ParameterServer
from transient_nb.training.trainer import Trainer, decay_mask, flat_layout, get_flat


def fingerprint(model: str, data: str, steps: int, loop: asyncio.AbstractEventLoop) -> str:
    hp = HParams(steps=steps, batch_size=16, warmup_steps=5, call_timeout_s=30, ps_lost_after_s=60)
    torch.manual_seed(0)
    net = build_model(model, num_classes=10)
    params, buffers = flat_layout(net)
    ps = ParameterServer(
        "r", 0, 1, get_flat(params), decay_mask(net), get_flat(buffers), hp.to_dict(),
        tempfile.mkdtemp(),
    )  # fmt: skip
    double = PSDouble(ps, loop)
    n = len(get_flat(params))
    trainer = Trainer(
        "r", model, data, hp.to_dict(), "v", [(0, n)], name="w-0", seed=3,
        locate=lambda timeout: (0, [double]),
    )  # fmt: skip
    trainer.train()
    assert ps.bn is not None
    return hashlib.sha256(ps.w.tobytes() + ps.v.tobytes() + ps.bn.tobytes()).hexdigest()[:16]


def main() -> None:
    tiny = "--tiny" in sys.argv
    torch.set_num_threads(1)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    steps = 5 if tiny else 40
    rows = [
        [model, data, steps, fingerprint(model, data, steps, loop)]
        for model, data in (("resnet8", "digits"), ("resnet8", "synthetic:500"))
    ]
    print(md_table(["model", "data", "steps", "sha256 of w, v, bn"], rows))


if __name__ == "__main__":
    main()
