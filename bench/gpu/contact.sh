#!/usr/bin/env bash
# The GPU contact kit: verify and measure neuron's whole GPU path in stages.
#
#   bash bench/gpu/contact.sh OUTDIR STAGE...
#
# Stages: env install tests models throughput pressure pool confirm simulator nccl ("all": the
# first eight, the three planned commands below; simulator and nccl are a fourth command). Each stage
# runs under its own `timeout`, writes <stage>.log and <stage>.json, never stops the stages after
# it, and prints a one-line verdict. OUTDIR receives just two files, rewritten after every stage (so a
# command killed at its limit still leaves what finished): contact-<stages>.tar.gz (every log,
# JSON and junit file) and summary-<stages>.json (the verdicts). A device machine returns at most
# 8 files from $OUT; two per command leaves room for the three commands' outputs side by side.
#
# Planned use on a fresh GPU machine (10 minutes per command):
#   bash bench/gpu/contact.sh $OUT env install tests
#   bash bench/gpu/contact.sh $OUT models throughput
#   bash bench/gpu/contact.sh $OUT pool pressure confirm
#   bash bench/gpu/contact.sh $OUT simulator nccl  # nccl: the one-GPU data-parallel path (240 s)
#   bash bench/gpu/contact.sh $OUT simulator       # simulated vs measured time (limit 300 s, its
#                                                  # GPU time not yet measured; not in "all": the
#                                                  # three above already take up to ~28 of a
#                                                  # session's 30 device minutes at their limits)
# then, here: python bench/gpu/import_results.py <the fetched folders or tarballs>
# The FreeLunch codec (fused kernels on a codec stream) is checked by `tests`
# (tests/gpu/test_cuda_codecs.py); its speed under pressure, once PyTorch's batches are known:
#   python -m bench.gpu.pressure --out $OUT --torch-batch 142 --torch-checkpoint-batch 238 \
#       --planners superneurons:compress=2,superneurons:compress=4
#
# Environment: PYTHON (default python3), NEURON_CONTACT_DEVICE=cpu and NEURON_CONTACT_SMOKE=1 run
# the kit's own logic on the CPU at tiny sizes (tests/bench/test_gpu_contact.py does), and
# TIMEOUT_<STAGE> (seconds) overrides a stage's limit (e.g. TIMEOUT_CONFIRM=580 to run confirm
# alone with time for all of its parts).
set -u
cd "$(dirname "$0")/../.."

if [ $# -lt 2 ]; then
    echo "usage: bash bench/gpu/contact.sh OUTDIR STAGE... (env install tests models throughput" \
         "pressure pool confirm simulator nccl, or all)" >&2
    exit 2
fi
OUTDIR=$1; shift
STAGES=("$@")
if [ "${STAGES[0]}" = "all" ]; then
    STAGES=(env install tests models throughput pressure pool confirm)
fi
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null 2>&1 || PY=python
DEV=${NEURON_CONTACT_DEVICE:-cuda}
SMOKE=()
[ -n "${NEURON_CONTACT_SMOKE:-}" ] && SMOKE=(--smoke)
export PYTHONUNBUFFERED=1
mkdir -p "$OUTDIR"
RAW=$(mktemp -d "${TMPDIR:-/tmp}/neuron_contact.XXXXXX")
LABEL=$(IFS=-; echo "${STAGES[*]}")
SUMMARY_LINES=()

# default limits (seconds): each planned command's stages sum to at most 570 of its 600
declare -A LIMIT=([env]=45 [install]=150 [tests]=330 [models]=190 [throughput]=380 [pool]=60
                  [pressure]=270 [confirm]=230 [simulator]=300 [nccl]=240)

pack() {
    # the summary first (the tarball holds it too), each written then moved: never half a file
    "$PY" - "$RAW" "$OUTDIR/summary-$LABEL.json" <<'EOF'
import json, os, sys
raw, dst = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(os.path.join(raw, "stages.jsonl"))] \
    if os.path.exists(os.path.join(raw, "stages.jsonl")) else []
with open(dst + ".tmp", "w") as f:
    json.dump({"kit": "gpu_contact", "stages": rows}, f, indent=1)
os.replace(dst + ".tmp", dst)
EOF
    cp "$OUTDIR/summary-$LABEL.json" "$RAW/summary-$LABEL.json"
    tar -czf "$OUTDIR/.contact.tmp" -C "$RAW" . && mv "$OUTDIR/.contact.tmp" "$OUTDIR/contact-$LABEL.tar.gz"
}

ensure_built() {
    # a later command on a fresh machine: the extension of the install stage is gone
    "$PY" -c "import neuron.memory._heap" 2>/dev/null && return 0
    echo "[kit] building the heap extension first"
    "$PY" -m pip install --no-build-isolation --no-deps -e . \
        || "$PY" setup.py build_ext --inplace
}

stage_cmd() {
    local s=$1
    case $s in
        env)        "$PY" -m bench.gpu.env --out "$RAW" --device "$DEV" "${SMOKE[@]}" ;;
        install)    "$PY" -m bench.gpu.install --out "$RAW" --device "$DEV" "${SMOKE[@]}" ;;
        tests)      ensure_built && "$PY" -m bench.gpu.tests --out "$RAW" --device "$DEV" "${SMOKE[@]}" ;;
        models)     ensure_built && "$PY" -m bench.gpu.models --out "$RAW" --device "$DEV" "${SMOKE[@]}" ;;
        throughput) ensure_built && "$PY" -m bench.gpu.throughput --out "$RAW" --device "$DEV" "${SMOKE[@]}" ;;
        pressure)   ensure_built && "$PY" -m bench.gpu.pressure --out "$RAW" --device "$DEV" "${SMOKE[@]}" ;;
        pool)       ensure_built && "$PY" -m bench.gpu.pool_vs_malloc --out "$RAW" --device "$DEV" "${SMOKE[@]}" ;;
        confirm)    ensure_built && "$PY" -m bench.gpu.confirm --out "$RAW" --device "$DEV" "${SMOKE[@]}" ;;
        simulator)  ensure_built && "$PY" -m bench.gpu.simulator --out "$RAW" --device "$DEV" "${SMOKE[@]}" ;;
        nccl)       ensure_built && "$PY" -m bench.gpu.nccl --out "$RAW" --device "$DEV" "${SMOKE[@]}" ;;
        *)          echo "unknown stage $s"; return 2 ;;
    esac
}

for s in "${STAGES[@]}"; do
    var="TIMEOUT_${s^^}"
    lim=${!var:-${LIMIT[$s]:-300}}
    t0=$(date +%s)
    echo "=== stage $s (limit ${lim}s) ==="
    # export -f lets `timeout` run the shell function in a child bash
    export -f stage_cmd ensure_built
    export PY DEV RAW
    export NEURON_STAGE_LIMIT=$lim      # a stage with optional parts stops starting them in time
    export SMOKE_FLAG="${SMOKE[*]}"
    timeout --kill-after=10 "$lim" bash -c 'SMOKE=($SMOKE_FLAG); stage_cmd "$0"' "$s" \
        >"$RAW/$s.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - t0 ))
    verdict=$("$PY" - "$RAW/$s.json" "$rc" "$s" <<'EOF'
import json, os, sys
path, rc, stage = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if rc in (124, 137):
    why = "TIMEOUT"
elif rc != 0:
    why = f"CRASH (exit {rc})"
else:
    why = None
if os.path.exists(path):
    d = json.load(open(path))
    v = d.get("verdict", "?")
    print(f"{why}; last verdict: {v}" if why else v)
else:
    print(f"{why or 'NO RESULT'}: no {stage}.json (see {stage}.log)")
EOF
)
    ok=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1])).get('ok', False))" \
         "$RAW/$s.json" 2>/dev/null || echo False)
    [ "$rc" -ne 0 ] && ok=False
    "$PY" -c "import json,sys; print(json.dumps({'stage': sys.argv[1], 'rc': int(sys.argv[2]), 'seconds': int(sys.argv[3]), 'limit': float(sys.argv[4]), 'ok': sys.argv[5] == 'True', 'verdict': sys.argv[6]}))" \
        "$s" "$rc" "$secs" "$lim" "$ok" "$verdict" >>"$RAW/stages.jsonl"
    line="[$s] ${secs}s: $verdict"
    SUMMARY_LINES+=("$line")
    echo "$line"
    [ "$ok" = "True" ] || tail -n 25 "$RAW/$s.log" | sed "s/^/    $s| /"
    pack
done

echo
echo "=== gpu_contact summary ($LABEL) -> $OUTDIR/contact-$LABEL.tar.gz ==="
for l in "${SUMMARY_LINES[@]}"; do echo "$l"; done
rm -rf "$RAW"
exit 0
