#!/usr/bin/env bash
# The GPU suite: every figure that only a GPU machine can give, in one run (~12 min on one H200,
# predicted: the data-plane steps were added in round thirteen without a GPU machine to time them).
#
#   bash benchmarks/gpu_suite.sh OUT_DIR          # on a machine with a CUDA GPU ([gpu] extra installed)
#   bash benchmarks/gpu_suite.sh OUT_DIR --tiny   # seconds-long CPU smoke run (what CI runs)
#
# Writes OUT_DIR/<step>.md (each script's table and notes), OUT_DIR/<step>.log (progress) and
# OUT_DIR/suite.json (every table as rows, plus each step's exit status and wall time).
# Steps: worker efficiency on CUDA at batch 128 for resnet32 and resnet32-t2t (plain and pipelined
# trainers); gpu_scaling (1, 2, 4 trainers through the PS against 1, 2, 4 plain processes); a short
# real training run on dask-cuda workers that checks which device (and which data plane) each
# trainer used; the PS data plane against the torch.distributed.rpc peer on its default path (a
# Unix socket and shared memory) and its cross-host path (TLS), and its carriers side by side.
set -uo pipefail
out="${1:?usage: gpu_suite.sh OUT_DIR [--tiny]}"
tiny="${2:-}"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$out"
py="${PYTHON:-python}"
status=0

step() {  # step NAME SCRIPT ARGS...
    local name="$1"; shift
    local t0=$SECONDS
    echo "== $name: $*" >&2
    "$py" "$here/$@" >"$out/$name.md" 2>"$out/$name.log"
    local rc=$?
    echo "$name $rc $((SECONDS - t0))" >>"$out/steps.txt"
    [ $rc -eq 0 ] || { status=1; echo "   $name failed (rc $rc); see $out/$name.log" >&2; }
}

: >"$out/steps.txt"
if [ "$tiny" = "--tiny" ]; then
    step efficiency-pipelined worker_efficiency.py --tiny --pipeline
    step scaling gpu_scaling.py --tiny
    step devices gpu_devices.py --tiny
    step dataplane ps_throughput.py --tiny
    # The torch.rpc peer is the same on either path (--path is ours): measured once, above.
    step dataplane-cross-host ps_throughput.py --tiny --path cross-host --systems dask
    step carriers dataplane_candidates.py --tiny
else
    for model in resnet32 resnet32-t2t; do
        step "efficiency-$model" worker_efficiency.py --device cuda --model "$model" --batch 128 --repeats 1 --seconds 10
        step "efficiency-$model-pipelined" worker_efficiency.py --device cuda --model "$model" --batch 128 --repeats 1 --seconds 10 --pipeline
    done
    step scaling gpu_scaling.py --trainers 1 2 4
    step devices gpu_devices.py
    # ~2 min each on 16 cores (predicted, not measured: no GPU machine was lent so far).
    for path in default cross-host; do
        step "dataplane-$path" ps_throughput.py --path "$path" --models resnet32-t2t --shards 1 --wire float32 bfloat16 --trainers 1 4 --repeats 1
    done
    step carriers dataplane_candidates.py --carriers unix tls dask-tls --repeats 1
fi

"$py" - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
suite = {"steps": {}}
for line in (out / "steps.txt").read_text().splitlines():
    name, rc, seconds = line.split()
    text = (out / f"{name}.md").read_text()
    rows = [l.strip() for l in text.splitlines() if l.strip().startswith("|")]
    table = []
    if len(rows) >= 2:
        head = [c.strip() for c in rows[0].strip("|").split("|")]
        table = [dict(zip(head, (c.strip() for c in r.strip("|").split("|")))) for r in rows[2:]]
    notes = [l for l in text.splitlines() if l.strip() and not l.strip().startswith("|")]
    suite["steps"][name] = {"exit": int(rc), "seconds": int(seconds), "rows": table, "notes": notes}
(out / "suite.json").write_text(json.dumps(suite, indent=1))
print(f"wrote {out / 'suite.json'}")
PY
cat "$out"/*.md
exit $status
