"""Data-plane candidates: one PS round trip (gradient up, update, weights down) on each carrier.

What is measured
----------------
A server process holds a flat float32 vector (the 1.86M model by default) and applies the PS's
update (``momentum_sgd_``, one thread) to every gradient it receives, then replies with a fresh
copy of the weights; one client process pushes as fast as it can for ``--seconds`` after
``--warmup``. Per carrier: round trips/s, and CPU ms per round trip of the server and of the
client (user + system, every thread). The in-process update alone is given for scale.
Carriers (each secured as it would be deployed, unless said otherwise):

* ``unix``: ours, ``transient_nb.training.wire`` over a Unix socket (0700 folder, 0600 socket);
* ``tls``: ours over TCP with TLS (``ssl``), mutually authenticated with a cluster CA's
  certificates (the cross-host path);
* ``dask-tcp`` / ``dask-tls`` / ``dask-tls12``: distributed's comm (``distributed.comm``
  ``listen``/``connect``, numpy frames through ``to_serialize``): without TLS (not deployable:
  a reference), with TLS as Dask configures it, and TLS tuned (TLS 1.2, ECDHE-ECDSA-AES128-GCM);
* ``zmq-curve``: pyzmq REQ/REP with CURVE (the client's key authorised by ZAP), zero-copy frames;
* ``grpc-tls``: grpcio, a generic unary method on raw bytes, TLS with client certificates;
* ``gloo``: ``torch.distributed`` send/recv on a Gloo group of 2 (plain TCP, no
  authentication, a fixed world: a reference for what the membership of a run would cost).

Run
---
    python benchmarks/dataplane_candidates.py                  # all carriers, 1.86M, float32
    python benchmarks/dataplane_candidates.py --tiny           # seconds (CI)
    python benchmarks/dataplane_candidates.py --carriers unix tls --n 466906
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import fmt, log, md_table

CARRIERS = ["unix", "tls", "dask-tcp", "dask-tls", "dask-tls12", "zmq-curve", "grpc-tls", "gloo"]
TLS12_CIPHERS = "ECDHE-ECDSA-AES128-GCM-SHA256"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_certs(folder: str) -> dict[str, str]:
    """A CA and a server and a client pair (EC P-256) with SAN 127.0.0.1/localhost, as files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> Any:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("bench-ca"))
        .issuer_name(name("bench-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    import ipaddress

    paths = {"ca": os.path.join(folder, "ca.pem")}
    with open(paths["ca"], "wb") as f:
        f.write(ca.public_bytes(serialization.Encoding.PEM))
    for role in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(f"bench-{role}"))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    ]
                ),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        paths[f"{role}_cert"] = os.path.join(folder, f"{role}.pem")
        paths[f"{role}_key"] = os.path.join(folder, f"{role}.key")
        with open(paths[f"{role}_cert"], "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        with open(paths[f"{role}_key"], "wb") as f:
            f.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
    return paths


def security(certs: dict[str, str], role: str, tuned: bool = False) -> Any:
    import ssl

    from distributed.security import Security

    extra: dict[str, Any] = {}
    if tuned:
        extra = {"tls_max_version": ssl.TLSVersion.TLSv1_2, "tls_ciphers": TLS12_CIPHERS}
    return Security(
        require_encryption=True,
        tls_ca_file=certs["ca"],
        tls_worker_cert=certs[f"{role}_cert"],
        tls_worker_key=certs[f"{role}_key"],
        **extra,
    )


class Updater:
    """The PS's work per round trip: the update, then a fresh copy of the weights."""

    def __init__(self, n: int):
        import numpy as np

        self.w = (np.random.default_rng(0).standard_normal(n) * 0.05).astype(np.float32)
        self.v = np.zeros_like(self.w)
        self.decay = np.full(n, 1e-4, np.float32)
        self.version = 0

    def __call__(self, grad: Any) -> Any:
        from transient_nb.training.optim import momentum_sgd_
        from transient_nb.training.wire.codec import tensor

        # (a received frame may be read-only; it is only read)
        momentum_sgd_(self.w, self.v, tensor(grad), self.decay, 0.01, 0.9)
        self.version += 1
        return self.w.copy()

    # the PS's coroutines, for the wire's server
    async def push_pull(self, *, grad: Any, **_: Any) -> tuple[Any, None, int]:
        return self(grad), None, self.version

    async def pull(self, trainer: Any = None) -> tuple[Any, None, int]:
        return self.w.copy(), None, self.version


# -- servers (each in a process of its own) ---------------------------------------------------------
def serve(carrier: str, n: int, certs: dict[str, str], info: Any, stop: Any) -> None:
    import torch

    torch.set_num_threads(1)
    up = Updater(n)
    if carrier in ("unix", "tls"):
        import ssl  # noqa: F401

        from transient_nb.training.wire.server import DataServer
        from transient_nb.training.wire.transport import tls_contexts

        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
        server_tls = tls_contexts(security(certs, "server"))[0] if carrier == "tls" else None
        server = DataServer(up, loop, carrier, "bench", server_tls=server_tls)
        info.put(server.endpoint)
        stop.wait()
        server.close()
    elif carrier.startswith("dask"):
        from distributed.comm import listen
        from distributed.protocol import to_serialize

        async def main() -> None:
            async def handle(comm: Any) -> None:
                try:
                    while True:
                        msg = await comm.read()
                        await comm.write({"w": to_serialize(up(msg["g"]))})
                except Exception:
                    pass

            if carrier == "dask-tcp":
                listener = listen("tcp://127.0.0.1:0", handle)
            else:
                sec = security(certs, "server", tuned=carrier == "dask-tls12")
                listener = listen("tls://127.0.0.1:0", handle, **sec.get_listen_args("worker"))
            await listener.start()
            info.put(listener.contact_address)
            while not stop.is_set():
                await asyncio.sleep(0.1)
            listener.stop()

        asyncio.run(main())
    elif carrier == "zmq-curve":
        import numpy as np
        import zmq
        from zmq.auth.thread import ThreadAuthenticator

        ctx = zmq.Context()
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        auth = ThreadAuthenticator(ctx)
        auth.start()

        class Members:  # ZAP: only the client's public key gets in
            def callback(self, domain: str, key: bytes) -> bool:
                return key == client_public  # z85, as the authenticator passes it

        auth.configure_curve_callback(domain="*", credentials_provider=Members())
        sock = ctx.socket(zmq.REP)
        sock.curve_secretkey, sock.curve_publickey, sock.curve_server = (
            server_secret,
            server_public,
            True,
        )
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        info.put((port, server_public, client_public, client_secret))
        sock.RCVTIMEO = 200
        while not stop.is_set():
            try:
                frame = sock.recv(copy=False)
            except zmq.Again:
                continue
            w = up(np.frombuffer(frame.buffer, np.float32))
            sock.send(w, copy=False)
        sock.close(0)
        auth.stop()
        ctx.term()
    elif carrier == "grpc-tls":
        from concurrent import futures

        import grpc
        import numpy as np

        def call(request: bytes, context: Any) -> bytes:
            return up(np.frombuffer(request, np.float32)).tobytes()

        handler = grpc.method_handlers_generic_handler(
            "ps", {"PushPull": grpc.unary_unary_rpc_method_handler(call)}
        )
        big = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=1), options=big)
        server.add_generic_rpc_handlers((handler,))
        read = lambda k: open(certs[k], "rb").read()  # noqa: E731
        creds = grpc.ssl_server_credentials(
            [(read("server_key"), read("server_cert"))],
            root_certificates=read("ca"),
            require_client_auth=True,
        )
        port = server.add_secure_port("127.0.0.1:0", creds)
        server.start()
        info.put(port)
        stop.wait()
        server.stop(0)
    elif carrier == "gloo":
        import torch.distributed as dist

        port = free_port()
        info.put(port)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2)
        grad = torch.empty(n)
        while True:
            dist.recv(grad, src=1)
            if torch.isnan(grad[0]):
                break
            dist.send(torch.from_numpy(up(grad.numpy())), dst=1)
        dist.destroy_process_group()


# -- clients ------------------------------------------------------------------------------------------
def client_loop(
    carrier: str, n: int, certs: dict[str, str], contact: Any, seconds: float, mark: Any = None
) -> Any:
    """Round trips for ``seconds``; returns (round trips, CPU s of this process). ``mark()`` is
    called as the timed loop starts (the parent samples the server's CPU then)."""
    mark = mark or (lambda: None)
    import numpy as np
    import torch

    torch.set_num_threads(1)
    grad = (np.random.default_rng(1).standard_normal(n) * 1e-4).astype(np.float32)
    stop_at = [0.0]

    def timed(one: Any) -> tuple[int, float]:
        for _ in range(3):  # warm
            one()
        mark()
        cpu0, count = time.process_time(), 0
        stop_at[0] = time.monotonic() + seconds
        while time.monotonic() < stop_at[0]:
            one()
            count += 1
        return count, time.process_time() - cpu0

    if carrier in ("unix", "tls"):
        from transient_nb.training.wire.client import DataClient
        from transient_nb.training.wire.transport import tls_contexts

        client_tls = tls_contexts(security(certs, "client"))[1] if carrier == "tls" else None
        client = DataClient(contact, client_tls)
        assert client.transport == carrier, client.transport

        def one() -> None:
            client.push_pull(trainer="t", grad=grad, base_version=0, local_step=1).result(30)

        out = timed(one)
        client.close()
        return out
    if carrier.startswith("dask"):
        from distributed.comm import connect
        from distributed.protocol import to_serialize

        async def main() -> tuple[int, float]:
            kwargs = {}
            if carrier != "dask-tcp":
                sec = security(certs, "client", tuned=carrier == "dask-tls12")
                kwargs = sec.get_connection_args("worker")
            comm = await connect(contact, **kwargs)
            for _ in range(3):
                await comm.write({"g": to_serialize(grad)})
                await comm.read()
            mark()
            cpu0, count = time.process_time(), 0
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                await comm.write({"g": to_serialize(grad)})
                await comm.read()
                count += 1
            cpu = time.process_time() - cpu0
            await comm.close()
            return count, cpu

        return asyncio.run(main())
    if carrier == "zmq-curve":
        import zmq

        port, server_public, client_public, client_secret = contact
        ctx = zmq.Context()
        sock = ctx.socket(zmq.REQ)
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (
            server_public,
            client_public,
            client_secret,
        )
        sock.connect(f"tcp://127.0.0.1:{port}")

        def one() -> None:
            sock.send(grad, copy=False)
            np.frombuffer(sock.recv(copy=False).buffer, np.float32)

        out = timed(one)
        sock.close(0)
        ctx.term()
        return out
    if carrier == "grpc-tls":
        import grpc

        read = lambda k: open(certs[k], "rb").read()  # noqa: E731
        creds = grpc.ssl_channel_credentials(read("ca"), read("client_key"), read("client_cert"))
        big = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        channel = grpc.secure_channel(f"localhost:{contact}", creds, options=big)
        stub = channel.unary_unary("/ps/PushPull")

        def one() -> None:
            np.frombuffer(stub(grad.tobytes()), np.float32)

        out = timed(one)
        channel.close()
        return out
    if carrier == "gloo":
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{contact}", rank=1, world_size=2
        )
        g, w = torch.from_numpy(grad), torch.empty(n)

        def one() -> None:
            dist.send(g, dst=0)
            dist.recv(w, src=0)

        out = timed(one)
        dist.send(torch.full((n,), float("nan")), dst=0)
        dist.destroy_process_group()
        return out
    raise ValueError(carrier)


def _client_child(queue: Any, args: tuple[Any, ...]) -> None:
    try:
        queue.put(("ok", client_loop(*args, mark=lambda: queue.put(("mark", None)))))
    except BaseException as e:
        queue.put(("error", repr(e)))


def _get(queue: Any, proc: Any, timeout: float) -> Any:
    """The next item of ``queue``, or an error as soon as ``proc`` died without one."""
    import queue as queues

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return queue.get(timeout=0.5)
        except queues.Empty:
            if not proc.is_alive():
                raise RuntimeError(f"process {proc.pid} exited ({proc.exitcode})") from None
    raise TimeoutError(f"nothing from process {proc.pid} within {timeout} s")


def measure(carrier: str, n: int, certs: dict[str, str], seconds: float) -> tuple[float, ...]:
    """(round trips/s, server CPU ms per round trip, client CPU ms per round trip)."""
    import psutil

    ctx = mp.get_context("spawn")
    info, stop, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    server = ctx.Process(target=serve, args=(carrier, n, certs, info, stop), daemon=True)
    server.start()
    try:
        contact = _get(info, server, 120)
        client = ctx.Process(
            target=_client_child, args=(out, (carrier, n, certs, contact, seconds)), daemon=True
        )
        proc = psutil.Process(server.pid)
        client.start()
        status, value = _get(out, client, 300)  # the client's imports and warm-up
        t0 = proc.cpu_times()
        if status == "mark":
            status, value = _get(out, client, seconds + 300)
        t1 = proc.cpu_times()
        if status != "ok":
            raise RuntimeError(f"{carrier}: {value}")
        count, client_cpu = value
        client.join(30)
    finally:
        stop.set()
        server.join(10)
        if server.is_alive():
            server.kill()
    # The server's CPU is sampled as the client's timed loop starts and ends.
    server_ms = 1000 * ((t1.user + t1.system) - (t0.user + t0.system)) / max(1, count)
    return count / seconds, server_ms, 1000 * client_cpu / max(1, count)


def update_ms(n: int) -> float:
    """CPU ms of the update and the reply copy in-process (what the carriers add to)."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    up = Updater(n)
    g = (np.random.default_rng(1).standard_normal(n) * 1e-4).astype(np.float32)
    up(g)
    t, k = time.process_time(), 50
    for _ in range(k):
        up(g)
    return 1000 * (time.process_time() - t) / k


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="seconds-long smoke run (CI)")
    p.add_argument("--carriers", nargs="+", default=CARRIERS, choices=CARRIERS)
    p.add_argument("--n", type=int, default=1_857_722, help="float32 entries (1.86M model)")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    if args.tiny:
        args.carriers, args.n, args.seconds, args.repeats = ["unix", "tls"], 100_000, 1.0, 1
    results: dict[str, list[tuple[float, ...]]] = {c: [] for c in args.carriers}
    with tempfile.TemporaryDirectory() as tmp:
        certs = make_certs(tmp)
        for rep in range(args.repeats):
            for c in args.carriers:
                r = measure(c, args.n, certs, args.seconds)
                results[c].append(r)
                log(
                    f"rep {rep + 1} {c}: {r[0]:.1f} round trips/s, server {r[1]:.2f} ms, "
                    f"client {r[2]:.2f} ms CPU per round trip"
                )
    base = update_ms(args.n)
    rows = []
    for c in args.carriers:
        rs = results[c]
        med = [statistics.median(r[i] for r in rs) for i in range(3)]
        rows.append([c, med[0], med[1], med[2], med[1] / base])
    print(
        md_table(
            ["carrier", "round trips/s", "server CPU ms", "client CPU ms", "server / update"],
            rows,
        )
    )
    mb = args.n * 4 / 1e6
    print(
        f"\n{args.n} float32 entries ({fmt(mb)} MB each way); medians of {args.repeats} x "
        f"{fmt(args.seconds)} s, one client; the update and reply copy alone: {fmt(base)} ms "
        "CPU in-process (server / update = the carrier's cost as a multiple of the work)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
