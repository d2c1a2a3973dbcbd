"""The fault matrix: run the chaos suite (real training runs, real faults) and print, per fault,
the outcome, the steps lost, the gradients lost and the time to recover.

    python benchmarks/fault_matrix.py            # the whole suite (~5 min on 2 cores)
    python benchmarks/fault_matrix.py --tiny     # one fault (the preemption notice)

"Time to recover" is from the fault (or the resume, for a freeze) until the cluster trains at
full strength again: the replacement's, the resumed trainer's or the new run's first accepted
update, or the PS's recovery event.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="one fault only (CI's smoke run)")
    parser.add_argument("-k", default=None, help="pytest -k expression to pick faults")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "matrix.jsonl"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(ROOT / "tests" / "chaos"),
        ]
        k = "notice" if args.tiny else args.k
        if k:
            cmd += ["-k", k]
        env = {**os.environ, "TRANSIENT_NB_FAULT_MATRIX": str(out)}
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        tail = [ln for ln in proc.stdout.splitlines() if ln.strip()][-1:] if proc.stdout else []
        rows = [json.loads(ln) for ln in out.read_text().splitlines()] if out.exists() else []
    print("| fault | outcome | steps lost | gradients lost | time to recover (s) |")
    print("|---|---|---|---|---|")
    for r in rows:
        recover = r.get("recover_s")
        if recover is None and r.get("stop_s") is not None:
            when = f"stopped after {r['stop_s']:.1f}"
        else:
            when = "-" if recover is None else f"{recover:.1f}"
        print(
            f"| {r['fault']} | {r['outcome']} | {r['steps_lost']} | {r['gradients_lost']} | {when} |"
        )
    print(f"\npytest: {' '.join(tail)}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
