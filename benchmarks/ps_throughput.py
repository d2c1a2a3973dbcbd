"""PS throughput: global steps/s of the parameter server when trainers do no compute.

What is measured
----------------
Trainers that compute nothing push a gradient of the model's size and get the new weights back
(one round trip per global step) as fast as they can, for ``--seconds`` after ``--warmup``;
global steps/s is the number of round trips completed by all trainers per second, MB/s the model
payload moved (gradient up plus weights down). Grid: canonical ResNet-32 (0.46M parameters) and
the paper's (Tensor2Tensor, 1.86M), 1 and 2 PS shards, float32 and float16 on the wire, 1 and 4
trainers. Each configuration runs on two systems, one after the other, ``--repeats`` times
interleaved (medians and min-max are reported):

* ``dask``: ours. A local :class:`~transient_nb.TransientCluster` (real ``dask worker`` processes,
  no provisioning delay); the :class:`~transient_nb.training.ps.ParameterServer` shards are actors
  on the ``ps`` worker, created exactly as ``run.py`` creates them; each trainer is a task on its
  own ``gpu`` worker that calls ``push_pull`` on every shard the way ``Trainer._call_all`` does
  (all shards at once, then wait) with the same arguments (gradient slice, version, step, loss,
  images, batch-norm delta, final).
* ``rpc``: the peer a PyTorch user would write (pytorch/examples ``distributed/rpc`` parameter
  server style): one PS process owning every shard as an ``RRef``'d object, trainer processes
  (``torch.multiprocessing`` spawn) calling ``rpc_async(ps, ParameterServer.push_pull, ...)`` on
  every shard and waiting; TensorPipe over TCP on 127.0.0.1 (``--rpc-transport auto`` lets
  TensorPipe use shared memory instead). Same update (momentum SGD, L2 on weights, the same
  learning-rate schedule) in torch on one thread, same arguments.

Every process gets one torch/BLAS thread. Both PSs run their update single-threaded, in a process
of their own. The machine's load matters: run it on an otherwise idle machine, or repeat.

Run
---
    python benchmarks/ps_throughput.py            # full grid, ~10 minutes on 2 cores
    python benchmarks/ps_throughput.py --tiny     # seconds-long smoke configuration (CI)
    python benchmarks/ps_throughput.py --models resnet32-t2t --shards 1 2 --trainers 4
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from typing import Any, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
from _common import fmt, log, md_table, median, spread

#: ``--path`` -> ``HParams.data_plane`` of ours.
PATHS = {"default": "auto", "cross-host": "tls", "actor": "dask"}
#: The transport each path must use (a run that fell back to another is an error, not a figure).
EXPECTED = {"default": "unix", "cross-host": "tls", "actor": "dask"}
#: The paper's single PS saturated at about this many global steps/s (1.86M model; Li et al. §3).
PAPER_PS_STEPS_S = 45.0
BATCH = 128  # images counted per push (only reported to the PS)
#: The columns of the table it prints.
COLUMNS = [
    "model",
    "params",
    "shards",
    "wire",
    "trainers",
    "dask steps/s",
    "dask range",
    "dask ms/step",
    "dask MB/s",
    "dask PS cpu ms/step",
    "rpc steps/s",
    "rpc range",
    "rpc MB/s",
    "rpc PS cpu ms/step",
    "dask/rpc",
    "dask/45",
]


def model_sizes(name: str) -> tuple[int, int]:
    """Number of trainable parameters and of float batch-norm buffer entries."""
    from transient_nb.training.models import build_model
    from transient_nb.training.trainer import flat_layout

    params, buffers = flat_layout(build_model(name))
    return sum(p.numel() for p in params), sum(b.numel() for b in buffers)


class Loop(NamedTuple):
    """A no-compute trainer's loop, on either peer: its name, the shards' bounds in the flat
    gradient, the batch norm's size, the wire dtype and the wall-time window it pushes in."""

    name: str
    bounds: list[tuple[int, int]]
    n_bn: int
    wire: str
    start_at: float
    stop_at: float


def trainer_loops(
    cfg: dict[str, Any], bounds: list[tuple[int, int]], n_bn: int, names: list[str]
) -> list[Loop]:
    """A :class:`Loop` for each trainer of ``names``, all in one window: ``cfg``'s start delay
    from now, then its warm-up and its measured seconds."""
    start_at = time.time() + cfg["start_delay"]
    stop_at = start_at + cfg["warmup"] + cfg["seconds"]
    return [Loop(name, bounds, n_bn, cfg["wire"], start_at, stop_at) for name in names]


def timed_loop(push: Any, loop: Loop) -> tuple[list[float], int]:
    """Call ``push(version, step)`` (one global step) in ``loop``'s window; completion times."""
    while time.time() < loop.start_at:
        time.sleep(0.0005)
    version, step, times = 0, 0, []
    while time.time() < loop.stop_at:
        step += 1
        version = push(version, step)
        times.append(time.time())
    return times, step


# -- ours: Dask actors ------------------------------------------------------------------------------
def dask_push_loop(
    shards: list[tuple[str, str]],
    loop: Loop,
    timeout: float,
    variant: str = "current",
    data_plane: str = "dask",
) -> tuple[list[float], str]:
    """A no-compute trainer (a task on a gpu worker): the Trainer's PS round trip in a loop,
    with its host-side work on the gradient and the weights (cast, split, merge), through the
    data plane as ``Trainer._connect`` opens it (or the actor, ``data_plane="dask"``); returns
    the completion times and the transport used."""
    import numpy as np
    import torch
    from _variants import cast_gradient, merge_replies
    from distributed import get_worker
    from distributed.actor import Actor

    from transient_nb.training.ps import ParameterServer
    from transient_nb.training.wire.client import connect_shards
    from transient_nb.training.wire.codec import TORCH_DTYPES

    name, bounds, n_bn, wire = loop.name, loop.bounds, loop.n_bn, loop.wire
    legacy = variant == "legacy"
    actors = [Actor(ParameterServer, addr, key) for addr, key in shards]
    links = None
    if data_plane != "dask":
        endpoints = [ps.data_endpoint().result(timeout=timeout) for ps in actors]
        links = connect_shards(endpoints, get_worker().security, timeout=5.0)
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    n = bounds[-1][1]
    grad32 = (rng.standard_normal(n) * 1e-4).astype(np.float32)
    bn_delta = np.zeros(n_bn, np.float32) if n_bn else None
    for ps in actors:
        ps.register(name, 0).result(timeout=timeout)
    weights = torch.zeros(n)  # the trainer's float32 weights (FlatModel.w)
    host = torch.empty(n, dtype=TORCH_DTYPES[wire])  # its gradient's host buffer

    def push(version: int, step: int) -> int:
        grad = cast_gradient(grad32, wire, legacy, host)  # as the Trainer, every step
        # As Trainer._send: every shard's call goes out before any reply is awaited.
        futures = [
            ps.push_pull(
                trainer=name,
                grad=grad[a:b],
                base_version=version,
                local_step=step,
                images=BATCH,
                bn_delta=bn_delta if i == 0 else None,
            )
            for i, (ps, (a, b)) in enumerate(zip(links or actors, bounds, strict=True))
        ]
        replies = [f.result(timeout=timeout) for f in futures]
        merge_replies(replies, wire, weights)  # as the Trainer's load
        return int(replies[0][2])

    times, _ = timed_loop(push, loop)
    for link in links or []:
        link.close()
    for ps in actors:
        ps.unregister(name, True).result(timeout=timeout)
    return times, links[0].transport if links else "dask"


def _warm_worker() -> bool:
    import _variants  # noqa: F401

    import transient_nb.training.ps  # noqa: F401

    return True


class DaskBench:
    """Ours: a TransientCluster with one ps worker and ``trainers`` gpu workers.

    ``variant="legacy"`` uses the previous round's PS path (``_variants.py``); ``shard_hosts > 0``
    starts the cluster with that many PS hosts (``TransientCluster(ps_hosts=...)``, each its own
    process) and puts shard i on host i, as ``train(shards=N)`` does.
    """

    def __init__(
        self,
        trainers: int,
        variant: str = "current",
        shard_hosts: int = 0,
        data_plane: str = "auto",
    ):
        from distributed import Client

        self.variant = variant
        self.data_plane = data_plane
        #: The transports the trainers used, per run (what the table's "path" column says).
        self.transports: list[set[str]] = []
        self.trainers = trainers
        self._cm = _common.transient_cluster(trainers, ps_hosts=max(1, shard_hosts))
        self.cluster = self._cm.__enter__()
        self.client = Client(self.cluster, set_as_default=False, direct_to_workers=True)
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        self.ps_addrs = sorted(a for a, w in info.items() if "ps" in w.get("resources", {}))
        self.ps_addr = self.ps_addrs[0]
        self.gpu_addrs = sorted(
            (a for a, w in info.items() if "gpu" in w.get("resources", {})),
            key=lambda a: str(info[a]["name"]),
        )
        self.ckpt = tempfile.mkdtemp(prefix="bench-ckpt-")
        self._i = 0
        # Imports happen once per worker process, before anything is timed.
        self.client.gather(
            [
                self.client.submit(_warm_worker, workers=[a], allow_other_workers=False, pure=False)
                for a in [*self.ps_addrs, *self.gpu_addrs]
            ]
        )

    def run(self, cfg: dict[str, Any]) -> list[list[float]]:
        import numpy as np
        from _variants import LegacyParameterServer

        from transient_nb.training.hparams import HParams
        from transient_nb.training.ps import ParameterServer, shard_bounds

        self._i += 1
        n, n_bn = cfg["n"], cfg["n_bn"]
        bounds = shard_bounds(n, cfg["shards"])
        rng = np.random.default_rng(0)
        w0 = (rng.standard_normal(n) * 0.05).astype(np.float32)
        mask = np.ones(n, np.uint8)
        hp = HParams(steps=10**9, wire_dtype=cfg["wire"], data_plane=self.data_plane).to_dict()
        cls = LegacyParameterServer if self.variant == "legacy" else ParameterServer
        hosts = self.ps_addrs
        futures = [
            self.client.submit(
                cls,
                f"bench-{self._i}",
                i,
                len(bounds),
                w0[a:b],
                mask[a:b],
                np.zeros(n_bn, np.float32) if i == 0 else None,
                hp,
                self.ckpt,
                model=cfg["model"],
                actor=True,
                workers=[hosts[i % len(hosts)]],
                allow_other_workers=False,
                pure=False,
                key=f"ps-bench-{self._i}-s{i}",
            )
            for i, (a, b) in enumerate(bounds)
        ]
        actors = [f.result(timeout=120) for f in futures]
        shards = [(a._address, a.key) for a in actors]
        addrs = self.gpu_addrs[: min(cfg["trainers"], self.trainers)]
        loops = [
            self.client.submit(
                dask_push_loop,
                shards,
                loop,
                60.0,
                self.variant,
                self.data_plane,
                workers=[addr],
                allow_other_workers=False,
                pure=False,
            )
            for loop, addr in zip(
                trainer_loops(cfg, bounds, n_bn, [f"t{k}" for k in range(len(addrs))]),
                addrs,
                strict=True,
            )
        ]
        out = self.client.gather(loops)
        del actors, futures, loops
        self.transports.append({path for _, path in out})
        return [times for times, _ in out]

    def ps_pids(self) -> list[int]:
        """The processes of the PS shards' hosts (for CPU accounting)."""
        import psutil

        info = self.client.scheduler_info(n_workers=-1)["workers"]
        names = {str(info[a]["name"]) for a in self.ps_addrs}
        pids = []
        for name in names:
            top = psutil.Process(self.cluster.workers[name].pid)
            pids += [top.pid, *(c.pid for c in top.children(recursive=True))]
        return pids

    def close(self) -> None:
        self.client.close()
        self._cm.__exit__(None, None, None)
        shutil.rmtree(self.ckpt, ignore_errors=True)


# -- the peer: torch.distributed.rpc ----------------------------------------------------------------
class RpcParameterServer:
    """A parameter-server shard as a PyTorch user writes it for ``torch.distributed.rpc``."""

    def __init__(self, w: Any, decay: Any, bn: Any, hparams: dict[str, Any]):
        import torch

        from transient_nb.training.hparams import HParams

        self.hp = HParams.from_dict(hparams)
        self.w = w.clone()
        self.v = torch.zeros_like(self.w)
        self.decay = decay * self.hp.weight_decay
        self.bn = bn
        self.version = 0
        self.active: set[str] = set()
        # The reply's dtype (None: float32, a copy).
        self.wire = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(self.hp.wire_dtype)
        self.lock = threading.Lock()

    @staticmethod
    def push_pull(
        rref: Any,
        trainer: str,
        grad: Any,
        base_version: int,
        local_step: int,
        loss: float,
        images: int,
        bn_delta: Any,
        final: bool,
    ) -> tuple[Any, Any, int]:
        from transient_nb.training.optim import momentum_sgd_

        self = rref.local_value()
        with self.lock:  # TensorPipe serves requests on a thread pool
            self.active.add(trainer)
            lr = self.hp.lr_at(self.version, max(1, len(self.active)))
            # The same update as ours, the same function (numpy views of the tensors' memory).
            momentum_sgd_(
                self.w.numpy(),
                self.v.numpy(),
                grad,  # a tensor (float32, float16 or bfloat16, which numpy cannot hold)
                self.decay.numpy(),
                lr,
                self.hp.momentum,
            )
            if bn_delta is not None and self.bn is not None:
                self.bn += bn_delta
            self.version += 1
            out = self.w.to(self.wire) if self.wire is not None else self.w.clone()
            return out, None if self.bn is None else self.bn.clone(), self.version


def rpc_push_loop(rrefs: list[Any], loop: Loop) -> list[float]:
    """A no-compute trainer of the rpc peer (runs in a trainer process)."""
    import torch
    import torch.distributed.rpc as rpc

    name, bounds, n_bn, wire = loop.name, loop.bounds, loop.n_bn, loop.wire
    n = bounds[-1][1]
    g32 = torch.randn(n) * 1e-4
    dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16}
    bn_delta = torch.zeros(n_bn) if n_bn else None

    def push(version: int, step: int) -> int:
        g = g32.to(dtypes[wire]) if wire != "float32" else g32
        # Clones: rpc would send a view's whole storage.
        pieces = [g[a:b].clone() if len(bounds) > 1 else g for a, b in bounds]
        futures = [
            rpc.rpc_async(
                r.owner(),
                RpcParameterServer.push_pull,
                args=(r, name, pieces[i], version, step, 0.0, BATCH, bn_delta, False),
            )
            for i, r in enumerate(rrefs)
        ]
        replies = [f.wait() for f in futures]
        torch.cat([r[0].float() for r in replies])
        return int(replies[0][2])

    times, _ = timed_loop(push, loop)
    return times


def _rpc_run(cfg: dict[str, Any]) -> list[list[float]]:
    import torch
    import torch.distributed.rpc as rpc

    from transient_nb.training.hparams import HParams
    from transient_nb.training.ps import shard_bounds

    n, n_bn = cfg["n"], cfg["n_bn"]
    bounds = shard_bounds(n, cfg["shards"])
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(n, generator=gen) * 0.05
    hp = HParams(steps=10**9, wire_dtype=cfg["wire"]).to_dict()
    rrefs = [
        rpc.RRef(
            RpcParameterServer(
                w0[a:b], torch.ones(b - a), torch.zeros(n_bn) if i == 0 else None, hp
            )
        )
        for i, (a, b) in enumerate(bounds)
    ]
    names = [f"t{k}" for k in range(1, cfg["trainers"] + 1)]
    futures = [
        rpc.rpc_async(f"trainer{k}", rpc_push_loop, args=(rrefs, loop))
        for k, loop in enumerate(trainer_loops(cfg, bounds, n_bn, names), start=1)
    ]
    return [f.wait() for f in futures]


def _rpc_process(
    rank: int, world: int, port: int, transport: str, commands: Any, results: Any
) -> None:
    import warnings

    import torch
    import torch.distributed.rpc as rpc

    # torch's own deprecation notice about its rpc internals, once per process: not ours.
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")
    torch.set_num_threads(1)
    options: dict[str, Any] = {}
    if transport == "tcp":  # as between machines: libuv TCP, tensors in the same stream
        options = {"_transports": ["uv"], "_channels": ["basic"]}
    opts = rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=600, **options
    )
    name = "ps" if rank == 0 else f"trainer{rank}"
    rpc.init_rpc(name, rank=rank, world_size=world, rpc_backend_options=opts)
    if rank == 0:
        results.put(("ready", None))
        while (cfg := commands.get()) is not None:
            try:
                results.put(("ok", _rpc_run(cfg)))
            except Exception as e:
                results.put(("error", repr(e)))
    rpc.shutdown()


class RpcBench:
    """The peer: one PS process (rank 0) and ``trainers`` trainer processes."""

    def __init__(self, trainers: int, transport: str):
        import torch.multiprocessing as tmp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = tmp.get_context("spawn")
        self.commands, self.results = ctx.Queue(), ctx.Queue()
        env = {
            "TP_SOCKET_IFNAME": "lo",
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        with _common.environ(env):
            self.ctx = tmp.spawn(
                _rpc_process,
                args=(trainers + 1, port, transport, self.commands, self.results),
                nprocs=trainers + 1,
                join=False,
            )
        self._get(timeout=300)

    def _get(self, timeout: float) -> Any:
        status, value = self.results.get(timeout=timeout)
        if status == "error":
            raise RuntimeError(f"rpc benchmark failed: {value}")
        return value

    def run(self, cfg: dict[str, Any]) -> list[list[float]]:
        self.commands.put(cfg)
        return self._get(timeout=cfg["start_delay"] + cfg["warmup"] + cfg["seconds"] + 300)

    def ps_pids(self) -> list[int]:
        return [self.ctx.processes[0].pid]

    def close(self) -> None:
        self.commands.put(None)
        self.ctx.join(120)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by these processes (gone ones count 0)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


# -- the grid -------------------------------------------------------------------------------------------
def measure(times: list[list[float]], cfg: dict[str, Any]) -> tuple[float, float]:
    """Global steps/s while every trainer was past its warm-up and still pushing, and one
    trainer's mean round trip in ms."""
    window = _common.steady_window(times, cfg["warmup"])
    if window is None:
        return math.nan, math.nan
    done = sum(1 for ts in times for t in ts if window[0] <= t <= window[1])
    rate = done / (window[1] - window[0])
    return rate, 1000.0 * len(times) / rate if rate > 0 else math.nan


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="seconds-long smoke configuration")
    p.add_argument("--models", nargs="+", default=["resnet32", "resnet32-t2t"])
    p.add_argument("--shards", nargs="+", type=int, default=[1, 2])
    p.add_argument("--wire", nargs="+", default=["float32", "float16"])
    p.add_argument("--trainers", nargs="+", type=int, default=[1, 4])
    p.add_argument("--seconds", type=float, default=4.0, help="measured time per configuration")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured start of each loop")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--systems", nargs="+", default=["dask", "rpc"], choices=["dask", "rpc"])
    p.add_argument(
        "--variant",
        default="current",
        choices=["current", "legacy"],
        help="legacy: the PS path before this round (_variants.py), for before/after figures",
    )
    p.add_argument(
        "--path",
        default="default",
        choices=list(PATHS),
        help="ours: the data plane's path. default: the local backend's (a Unix socket); "
        "cross-host: what GCE uses between VMs (TCP with mutually authenticated TLS, the "
        "cluster's certificates), here on one host; actor: the bytes on the Dask actor (the "
        "path before round thirteen)",
    )
    p.add_argument(
        "--shard-processes",
        action="store_true",
        help="ours: one PS host (a process of its own) per shard, ps_hosts=shards, as "
        "train() places them on such a cluster (default: one PS host holding every shard)",
    )
    p.add_argument(
        "--rpc-transport",
        default="tcp",
        choices=["tcp", "auto"],
        help="tcp: libuv TCP on 127.0.0.1 (as between machines); auto: TensorPipe's choice "
        "(shared memory on one machine)",
    )
    args = p.parse_args(argv)
    if args.tiny:
        args.models, args.seconds, args.warmup, args.repeats = ["resnet32"], 0.8, 0.2, 1
        grid = [(1, "float32", 1), (2, "float16", 1)]
    else:
        grid = [(s, w, t) for s in args.shards for w in args.wire for t in args.trainers]
    _common.quiet()
    sizes = {m: model_sizes(m) for m in args.models}
    configs = [
        {
            "model": m,
            "n": sizes[m][0],
            "n_bn": sizes[m][1],
            "shards": s,
            "wire": w,
            "trainers": t,
            "seconds": args.seconds,
            "warmup": args.warmup,
            "start_delay": 0.5,
        }
        for m in args.models
        for (s, w, t) in grid
    ]
    most = max(c["trainers"] for c in configs)
    benches: dict[str, Any] = {}
    results: dict[tuple[int, str], list[tuple[float, float]]] = {}
    try:
        t0 = time.time()
        if "dask" in args.systems:
            benches["dask"] = DaskBench(
                most,
                args.variant,
                max(c["shards"] for c in configs) if args.shard_processes else 0,
                PATHS[args.path],
            )
            log(f"dask cluster with {most} trainer workers up in {time.time() - t0:.1f} s")
        t0 = time.time()
        if "rpc" in args.systems:
            benches["rpc"] = RpcBench(most, args.rpc_transport)
            log(f"rpc world of {most + 1} processes up in {time.time() - t0:.1f} s")
        for rep in range(args.repeats):
            for i, cfg in enumerate(configs):
                for system in args.systems:
                    pids = benches[system].ps_pids()
                    cpu0 = cpu_seconds(pids)
                    times = benches[system].run(cfg)
                    steps = sum(len(ts) for ts in times)
                    cpu_ms = 1000 * (cpu_seconds(pids) - cpu0) / steps if steps else math.nan
                    rate, ms = measure(times, cfg)
                    results.setdefault((i, system), []).append((rate, ms, cpu_ms))
                    log(
                        f"rep {rep + 1}/{args.repeats} {system:4s} {cfg['model']} "
                        f"shards={cfg['shards']} {cfg['wire']} trainers={cfg['trainers']}: "
                        f"{rate:.0f} steps/s, {ms:.2f} ms/round trip, PS CPU {cpu_ms:.2f} ms/step"
                    )
        if "dask" in benches:
            used = set().union(*benches["dask"].transports)
            if used != {EXPECTED[args.path]}:
                raise RuntimeError(
                    f"--path {args.path} must use {EXPECTED[args.path]!r}; the trainers used "
                    f"{sorted(used)}"
                )
    finally:
        for b in benches.values():
            b.close()

    def stat(i: int, system: str) -> tuple[float, str, float, float]:
        runs = results.get((i, system), [])
        rates = [r[0] for r in runs]
        return (
            median(rates),
            spread(rates),
            median([r[1] for r in runs]),
            median([r[2] for r in runs]),
        )

    rows = []
    for i, cfg in enumerate(configs):
        d_rate, d_spread, d_ms, d_cpu = stat(i, "dask")
        r_rate, r_spread, _, r_cpu = stat(i, "rpc")
        mb = (2 * cfg["n"] * (2 if cfg["wire"] == "float16" else 4)) / 1e6
        rows.append(
            [
                cfg["model"],
                f"{cfg['n'] / 1e6:.2f}M",
                cfg["shards"],
                cfg["wire"],
                cfg["trainers"],
                d_rate,
                d_spread,
                d_ms,
                d_rate * mb,
                d_cpu,
                r_rate,
                r_spread,
                r_rate * mb,
                r_cpu,
                d_rate / r_rate if r_rate > 0 else math.nan,
                d_rate / PAPER_PS_STEPS_S,
            ]
        )
    print(md_table(COLUMNS, rows))
    print(
        f"\n{args.repeats} repeat(s) of {fmt(args.seconds)} s after {fmt(args.warmup)} s warm-up; "
        "medians; MB/s = model payload (gradient up + weights down); ms/step = one trainer's "
        "round trip; PS cpu ms/step = CPU time (user + system) of the PS process(es) per global "
        "step, warm-up included (1000 / it = the steps/s one free core could serve);"
        f" rpc transport {args.rpc_transport}; dask/45 = x the paper's saturated PS; "
        f"dask variant {args.variant}, data-plane path {args.path} "
        f"({EXPECTED[args.path]})"
        + (
            ", one PS host (process) per shard."
            if args.shard_processes
            else ", shards on one PS host."
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
