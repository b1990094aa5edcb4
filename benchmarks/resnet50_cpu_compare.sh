#!/usr/bin/env bash
# The three CPU configurations of the course (f32 NCHW, f32 channels-last, bf16 autocast
# channels-last), dltrain and PyTorch side by side, same threads, same batch. Prints one table.
#   benchmarks/resnet50_cpu_compare.sh [BUILD_DIR] [extra flags for both, e.g. --batch 8]
# PyTorch: the venv that `scripts/setup.sh --peers` makes (.venv-peers), or PYTHON=...
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
py=${PYTHON:-.venv-peers/bin/python}
threads=${THREADS:-2}
out=${OUT:-bench-out}
mkdir -p "$out"
configs=("f32-nchw:" "f32-cl:--channels-last" "bf16-cl:--channels-last --amp")
for c in "${configs[@]}"; do
  name=${c%%:*} flags=${c#*:}
  # shellcheck disable=SC2086
  "$build/benchmarks/resnet50_cpu" --threads "$threads" $flags "$@" --json "$out/r50_dl_$name.json" > /dev/null
  # shellcheck disable=SC2086
  "$py" benchmarks/peers/pytorch_resnet50_cpu.py --threads "$threads" $flags "$@" \
    --json "$out/r50_pt_$name.json" > /dev/null
done
"$py" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print(f"{'configuration':16}{'dltrain img/s':>15}{'pytorch img/s':>15}{'ratio':>8}")
base = None
for name in ["f32-nchw", "f32-cl", "bf16-cl"]:
    d = json.load(open(f"{out}/r50_dl_{name}.json"))
    p = json.load(open(f"{out}/r50_pt_{name}.json"))
    base = base or d["img_per_s"]
    print(f"{name:16}{d['img_per_s']:15.2f}{p['img_per_s']:15.2f}{d['img_per_s'] / p['img_per_s']:8.2f}")
print(f"(pytorch {p['framework']}; dltrain bf16-cl / f32-nchw = "
      f"{json.load(open(f'{out}/r50_dl_bf16-cl.json'))['img_per_s'] / base:.2f}x)")
PY
