"""The cross-host data plane alone: CPU per round trip of the PS's TLS connection, by stream.

A :class:`~transient_nb.training.wire.server.DataServer` in TLS mode with the cluster CA's
certificates serves a stand-in PS (its update: one numpy pass over the weights) on an event loop
thread of this process; trainer processes push a float32 gradient of ``--params`` entries and
read the new weights back, ``--steps`` times each, over

* ``tls``: the frames in TLS records (``ssl``: 16 KiB records through OpenSSL), as before issue
  29's sealed stream;
* ``sealed``: what a trainer does now (:class:`~transient_nb.training.wire.client.DataClient`):
  keys agreed inside the TLS session, then 1 MiB AES-128-GCM records
  (:mod:`transient_nb.training.wire.sealed`).

Reported: round trips per second and the CPU (user + system) of the PS process and of one trainer
per round trip, interleaved ``--repeats`` times, medians. No Dask, no model update: this is the
wire's own cost (``benchmarks/ps_throughput.py --path cross-host`` measures the whole PS).

Run
---
    python benchmarks/dataplane_tls.py                      # 1.86M float32, 1 trainer
    python benchmarks/dataplane_tls.py --trainers 4 --params 466906
    python benchmarks/dataplane_tls.py --tiny               # seconds-long smoke configuration (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
from typing import Any

import numpy as np


class StandIn:
    """A PS whose update is one pass over its weights."""

    def __init__(self, n: int):
        self.w = np.zeros(n, np.float32)
        self.version = 0

    async def push_pull(self, *, grad: Any, **_: Any) -> tuple[Any, None, int]:
        self.w -= grad
        self.version += 1
        return self.w.copy(), None, self.version

    async def pull(self, trainer: Any = None) -> tuple[Any, None, int]:
        return self.w.copy(), None, self.version


def trainer(
    endpoint: dict[str, Any],
    files: dict[str, str],
    stream: str,
    n: int,
    steps: int,
    ready: Any,
    go: Any,
    out: Any,
) -> None:
    """One trainer process: ``steps`` round trips; puts its CPU seconds."""
    from transient_nb.backends.tls import security_from_files
    from transient_nb.training.wire import frame, transport
    from transient_nb.training.wire.client import DataClient

    ctx = transport.tls_contexts(security_from_files(files, "worker"))[1]
    grad = np.full(n, 1e-3, np.float32)
    if stream == "sealed":
        client = DataClient(endpoint, ctx, timeout=10)

        def push(i: int) -> None:
            client.push_pull(trainer="t", grad=grad, base_version=0, local_step=i).result(30)
    else:
        raw = socket.create_connection(tuple(endpoint["tls"]), timeout=10)
        transport.tune(raw)
        chan = frame.Channel(ctx.wrap_socket(raw, server_hostname=None))
        buffers = frame.Buffers()
        meta = {"trainer": "t", "base_version": 0, "local_step": 0}

        def push(i: int) -> None:
            frame.drive(chan, chan.send_frame(frame.PUSH_PULL, meta, [grad, None]), 30)
            frame.drive(chan, chan.recv_frame(buffers), 30)

    push(0)
    ready.put(True)
    go.wait()
    c0 = time.process_time()
    for i in range(steps):
        push(i + 1)
    out.put(time.process_time() - c0)


def run(stream: str, n: int, trainers: int, steps: int, server: Any, files: list[Any]) -> Any:
    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=trainer, args=(server.endpoint, files[i], stream, n, steps, ready, go, out)
        )
        for i in range(trainers)
    ]
    for p in procs:
        p.start()
    for _ in procs:  # each trainer imported, connected and made its first round trip
        ready.get(timeout=300)
    # The PS's CPU is this process's (its loop thread serves the trainers): process_time, not
    # os.times, whose 10 ms ticks read 0 for a short run.
    t0, c0 = time.perf_counter(), time.process_time()
    go.set()
    cpus = [out.get(timeout=600) for _ in procs]
    wall, ps_cpu = time.perf_counter() - t0, time.process_time() - c0
    for p in procs:
        p.join()
    total = steps * trainers
    return total / wall, 1000 * ps_cpu / total, 1000 * statistics.median(cpus) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=int, default=1_860_000)
    ap.add_argument("--trainers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--streams", nargs="+", default=["tls", "sealed"])
    ap.add_argument("--tiny", action="store_true", help="seconds-long smoke configuration")
    args = ap.parse_args()
    if args.tiny:
        args.params, args.steps, args.repeats = 100_000, 50, 1

    folder = tempfile.mkdtemp(prefix="dataplane-tls-")  # the cluster CA's keys: removed at the end
    try:
        _measure(args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _measure(args: argparse.Namespace, folder: str) -> None:
    from transient_nb.backends.tls import ClusterCA, security_from_files
    from transient_nb.training.wire import transport
    from transient_nb.training.wire.server import DataServer

    ca = ClusterCA.create("bench")
    ps_files = ca.write_files(os.path.join(folder, "ps"), "ps-0", role="ps")
    files = [
        ca.write_files(os.path.join(folder, f"w{i}"), f"w-{i}", role="worker")
        for i in range(args.trainers)
    ]
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    ps = StandIn(args.params)
    server_tls = transport.tls_contexts(security_from_files(ps_files, "worker"))[0]
    server = DataServer(ps, loop, "tls", "bench", server_tls=server_tls)
    results: dict[str, list[Any]] = {s: [] for s in args.streams}
    for _ in range(args.repeats):
        for stream in args.streams:
            results[stream].append(
                run(stream, args.params, args.trainers, args.steps, server, files)
            )
    server.close()
    mb = 2 * 4 * args.params / 1e6
    print(
        f"{args.params} float32 entries ({mb:.1f} MB per round trip), {args.trainers} "
        f"trainer(s), {args.steps} round trips each, {args.repeats} repeats, medians; "
        f"load {os.getloadavg()[0]:.2f}"
    )
    print("| stream | round trips/s | PS CPU ms/round trip | trainer CPU ms/round trip |")
    print("|---|---|---|---|")
    for stream, rows in results.items():
        rate, ps_cpu, tr_cpu = (statistics.median(r[i] for r in rows) for i in range(3))
        print(f"| {stream} | {rate:.1f} | {ps_cpu:.2f} | {tr_cpu:.2f} |")


if __name__ == "__main__":
    main()
