"""What an idle cluster costs: the CPU of a local cluster's VMs (nanny and worker) and of the
process that owns it (its scheduler) while nothing runs, with Dask's own settings against
``transient.cluster-dask``'s (no worker profiler, the event-loop check each 500 ms instead of
20 ms, the system monitor each 2 s instead of 0.5 s).

A VM spends this for as long as it lives: on a cloud cluster beside the trainer, on this machine
(where every VM shares the host's cores) beside every other VM. Each row is one cluster of
``--workers`` workers and its PS host, measured over ``--seconds`` once every VM has joined; the
two settings alternate ``--repeats`` times, so that a host that slows down slows both alike.

    python benchmarks/idle_vm.py                # 4 workers, 20 s windows, 2 repeats
    python benchmarks/idle_vm.py --tiny         # 1 worker, 2 s windows, 1 repeat (the test's)
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psutil
from _common import log, md_table, quiet, transient_cluster

#: The settings compared: Dask's own (an empty ``transient.cluster-dask``) and this package's.
SETTINGS = ("dask defaults", "transient.cluster-dask")


def vm_seconds(owner: psutil.Process) -> dict[int, float]:
    """CPU seconds so far of every process below ``owner`` (its zygote, the VMs' nannies and
    workers), by PID."""
    seconds = {}
    for proc in owner.children(recursive=True):
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        seconds[proc.pid] = times.user + times.system
    return seconds


def idle_cost(workers: int, seconds: float, settings: str) -> dict[str, Any]:
    """One cluster, idle for ``seconds``: its VMs' CPU (% of a core each) and the owner's."""
    import dask

    import transient_nb  # noqa: F401  (its defaults first: set() would insert, then drop, them)

    extra = {"transient.cluster-dask": {}} if settings == "dask defaults" else {}
    owner = psutil.Process()
    with dask.config.set(extra), transient_cluster(workers) as cluster:
        vms = workers + 1  # and the PS host
        time.sleep(2.0)  # the joins' own work (imports, the first heartbeats) settles first
        before, own0, t0 = vm_seconds(owner), time.process_time(), time.monotonic()
        time.sleep(seconds)
        after, own1, t1 = vm_seconds(owner), time.process_time(), time.monotonic()
        assert len(cluster.scheduler_info["workers"]) == vms, "a VM left while measured"
    used = sum(after[pid] - before[pid] for pid in after if pid in before)
    span = t1 - t0
    return {
        "settings": settings,
        "vms": vms,
        "vm": 100 * used / span / vms,
        "owner": 100 * (own1 - own0) / span,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="seconds-long smoke configuration")
    parser.add_argument("--workers", type=int, default=4, help="GPU workers of each cluster")
    parser.add_argument("--seconds", type=float, default=20.0, help="idle window measured")
    parser.add_argument("--repeats", type=int, default=2, help="times each setting is measured")
    args = parser.parse_args(argv)
    if args.tiny:
        args.workers, args.seconds, args.repeats = 1, 2.0, 1
    quiet()
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in SETTINGS}
    for repeat in range(args.repeats):
        for settings in SETTINGS:
            log(f"{settings}: {args.workers} workers idle for {args.seconds:g} s ({repeat + 1})")
            results[settings].append(idle_cost(args.workers, args.seconds, settings))
    rows = []
    for settings, runs in results.items():
        vm = [r["vm"] for r in runs]
        rows.append(
            [
                settings,
                runs[0]["vms"],
                f"{statistics.median(vm):.2f}",
                f"{min(vm):.2f}-{max(vm):.2f}",
                f"{statistics.median(r['owner'] for r in runs):.2f}",
            ]
        )
    columns = ["settings", "VMs", "% of a core per VM", "range", "owner %"]
    print(md_table(columns, rows))
    print()
    print(
        f"Idle clusters of {args.workers} workers and a PS host, {args.seconds:g} s windows, "
        f"{args.repeats} repeat(s) each. 'owner %': the process that owns the cluster (its "
        "scheduler, built under the same settings, and the cluster's own bookkeeping)."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
