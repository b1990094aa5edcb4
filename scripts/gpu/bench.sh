#!/usr/bin/env bash
# Runs on the GPU machine: resnet50_synthetic (dltrain), then the PyTorch peer with the same
# settings, then the side-by-side table (printed last). Builds resnet50_synthetic first when
# build-gpu lacks it (a fresh machine: the build takes minutes).
#
#   bash scripts/gpu/bench.sh                    # batches 64,128,256; forward + train; 10 + 50 its
#   bash scripts/gpu/bench.sh --quick            # batch 64 only, 3 + 10 iterations
#   bash scripts/gpu/bench.sh --compile          # the peer also runs torch.compile (slow: minutes)
#   bash scripts/gpu/bench.sh --channels-last    # other arguments go to both programs
#                                                # (--batch-sizes, --modes, --iters, --no-tf32, ...)
#
# Results: $OUT/dltrain.json, $OUT/torch.json, $OUT/bench.log (bench-out/ without OUT).
# Environment: BUILD_DIR (build-gpu), BENCH_TIMEOUT (most seconds per program, default 270),
# BENCH_BUDGET (seconds for the whole script, default 570: the device tool's 600 s limit less a
# margin; after a build, the two programs share what is left).
set -euo pipefail
t_start=$SECONDS
cd "$(dirname "$0")/../.."
root=$PWD
build=${BUILD_DIR:-build-gpu}
out=${OUT:-$root/bench-out}
common=()
peer_only=()
while (($#)); do
  case $1 in
    --quick) common+=(--batch-sizes 64 --warmup 3 --iters 10) ;;
    --compile) peer_only+=(--compile) ;;
    -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    *) common+=("$1") ;;
  esac
  shift
done
mkdir -p "$out"
log=$out/bench.log
: > "$log"
bin=$build/benchmarks/resnet50_synthetic
if [[ ! -x $bin ]]; then
  echo "bench.sh: $bin missing: building it"
  bash scripts/gpu/build.sh --target resnet50_synthetic
fi
# shellcheck disable=SC1091
[[ -f .gpu-prefix/env.sh ]] && source .gpu-prefix/env.sh
budget=${BENCH_BUDGET:-570}
limit=${BENCH_TIMEOUT:-270}
left() { echo $((budget - (SECONDS - t_start))); }
export PYTHONUNBUFFERED=1

echo "==== dltrain: $bin ${common[*]}" | tee -a "$log"
rc_dl=0
rm -f "$out/dltrain.json" "$out/torch.json"
lim_dl=$(( ($(left) - 20) / 2 ))
((lim_dl < limit)) || lim_dl=$limit
((lim_dl > 10)) || { echo "bench.sh: no time left (BENCH_BUDGET=$budget)" >&2; exit 1; }
timeout "$lim_dl" "$bin" --json "$out/dltrain.json" "${common[@]}" 2>&1 | tee -a "$log" || rc_dl=$?

echo "==== pytorch: benchmarks/peers/pytorch_resnet50.py ${common[*]} ${peer_only[*]}" | tee -a "$log"
rc_pt=0
lim_pt=$(( $(left) - 15 ))
((lim_pt < limit)) || lim_pt=$limit
((lim_pt > 10)) || lim_pt=10
timeout "$lim_pt" python3 benchmarks/peers/pytorch_resnet50.py --json "$out/torch.json" \
  "${common[@]}" "${peer_only[@]}" 2>&1 | tee -a "$log" || rc_pt=$?

echo | tee -a "$log"
if [[ -f $out/dltrain.json && -f $out/torch.json ]]; then
  python3 benchmarks/peers/pytorch_resnet50.py --load "$out/torch.json" \
    --compare "$out/dltrain.json" 2>&1 | tee -a "$log" || true
else
  echo "bench.sh: no comparison: $( [[ -f $out/dltrain.json ]] || echo 'dltrain.json missing ')$( [[ -f $out/torch.json ]] || echo 'torch.json missing')" | tee -a "$log"
fi
echo "bench.sh: dltrain exit $rc_dl (limit $lim_dl s), pytorch exit $rc_pt (limit $lim_pt s)," \
  "124 = timed out; $((SECONDS - t_start)) s in all; files in $out" | tee -a "$log"
((rc_dl == 0 && rc_pt == 0))
