#!/usr/bin/env bash
# The first GPU run in ONE device call (issue 25): runs the binaries that scripts/gpu/build_here.sh
# built on the dev machine and a device call carried in .gpu-carry/ (xz-compressed: unpacked to a
# temporary folder and checked against MANIFEST's sha256 first); builds nothing. Every step
# runs under `timeout`, the whole script ends within BUDGET seconds (570: the call's 600 s less
# a margin), and everything is written to $OUT as it happens, so a hang or a crash still brings
# back what ran before it. Steps:
#   1. environment: OS, GPU, driver, nvcc, compute-sanitizer, torch and its CUDA/cuDNN, the pip
#      wheels' versions; LD_LIBRARY_PATH = the pip wheels' nvidia/*/lib folders (cuDNN, NCCL,
#      cuBLAS: the libraries PyTorch uses), then `ldd` on both binaries: a missing library stops
#      the run at once (exit 2);
#   2. test_cuda, one process per test file (Catch2 --filenames-as-tags, '[#test_foo_cuda]~[.]')
#      and one per hidden test ([.], by its quoted name: such as the one that loses the CUDA
#      context on purpose), TEST_JOBS (4) at a time, each under `timeout 90`, within
#      TEST_BUDGET; a table of files;
#   3. resnet50_synthetic and benchmarks/peers/pytorch_resnet50.py, train mode, batches 128 and
#      256, in three settings: TF32 NCHW, AMP bf16 channels-last, AMP f16 (GradScaler)
#      channels-last; dltrain then PyTorch per setting, sharing BENCH_BUDGET; each program
#      rewrites its JSON after every configuration;
#   4. compute-sanitizer memcheck with the time left: first on the first failing test file,
#      then on the kernel families of scripts/gpu/memcheck_families.txt, one process each;
#   5. the summary (the last lines of the output): tests, benchmark, memcheck coverage.
#
#   bash scripts/gpu/first_run.sh          # on the GPU machine, in the repo root
#   STEPS=tests,memcheck TEST_FILES="test_dnn_cuda test_loss_cuda" bash scripts/gpu/first_run.sh
#                                          # a follow-up call: some steps, some files
#   NVIDIA_SITE=.gpu-wheels/site OUT=/tmp/fr bash scripts/gpu/first_run.sh
#                                          # the rehearsal (scripts/gpu/rehearse_here.sh)
#
# Files in $OUT (8, the device tool's limit): first_run.log (everything, in order),
# memcheck.log, and the benchmark JSONs {dl,pt}_{tf32_nchw,bf16_cl,f16_cl}.json.
# Environment: OUT (default first-run-out/), CARRY (.gpu-carry), BUDGET (570), TEST_BUDGET (150),
# BENCH_BUDGET (220), TEST_JOBS (4), TEST_TIMEOUT (90), PYTHON (python3), NVIDIA_SITE (the
# folder holding nvidia/*/lib; default: PYTHON's site-packages), BENCH_ITERS (20), BENCH_WARMUP (5);
# for follow-up calls: STEPS (tests,bench,memcheck: the steps after the environment), TEST_FILES
# (test files by name, e.g. "test_dnn_cuda test_amp_cuda"; default: all), BENCH_SETTINGS
# (tf32_nchw bf16_cl f16_cl), MEMCHECK_FAMILIES ("family|filter;family|filter" instead of
# scripts/gpu/memcheck_families.txt).
# Exit status: 0 when every test file passed, every benchmark ran and memcheck found nothing;
# 1 otherwise; 2 when a library is missing; 3 when the carried binaries are missing or corrupt;
# 4 when no GPU was found (every test skipped: the rehearsal's case).
set -uo pipefail # not -e: a step that fails is recorded and the run goes on
t0=$SECONDS
cd "$(dirname "$0")/../.." || exit 3
steps=${STEPS:-tests,bench,memcheck}
want() { [[ ,$steps, == *,$1,* ]]; }
root=$PWD
out=${OUT:-$root/first-run-out}
carry=${CARRY:-$root/.gpu-carry}
budget=${BUDGET:-570}
test_budget=${TEST_BUDGET:-150}
bench_budget=${BENCH_BUDGET:-220}
test_jobs=${TEST_JOBS:-4}
test_timeout=${TEST_TIMEOUT:-90}
py=${PYTHON:-python3}
iters=${BENCH_ITERS:-20}
warmup=${BENCH_WARMUP:-5}
mkdir -p "$out"
log=$out/first_run.log
mlog=$out/memcheck.log
: > "$log"
: > "$mlog"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PYTHONUNBUFFERED=1

el() { echo $((SECONDS - t0)); }
left() { echo $((budget - (SECONDS - t0))); }
# say: to the console and the log; note: to the log only.
say() { echo "[+$(el)s] $*" | tee -a "$log"; }
note() { cat >> "$log"; }
section() { printf '\n==== %s\n' "$1" | tee -a "$log"; }
min() { (($1 < $2)) && echo "$1" || echo "$2"; }
# Line-buffered stdout where stdbuf exists (Catch2 writes through C stdio): a killed process
# leaves its last lines in the log.
lb=()
command -v stdbuf > /dev/null && lb=(stdbuf -oL -eL)
# run_capped SECONDS LOGFILE CMD...: CMD under timeout (TERM, then KILL 10 s later), its output
# appended to LOGFILE; returns CMD's status (124 or 137 when stopped).
run_capped() {
  local s=$1 f=$2
  shift 2
  ((s >= 1)) || s=1
  timeout -k 10 "$s" "${lb[@]}" "$@" >> "$f" 2>&1
}

section "first_run.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${budget} s, OUT=$out"
summary_env=()

# --- 1. environment -----------------------------------------------------------------------------
section "1. environment"
{
  grep -E '^PRETTY_NAME=' /etc/os-release 2> /dev/null || echo "no /etc/os-release"
  uname -srm
  echo "cpus $(nproc), memory $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)," \
    "glibc $(ldd --version 2> /dev/null | head -n 1 | awk '{print $NF}')"
} 2>&1 | tee -a "$log"
gpu_line="" gpu_ok=0
if command -v nvidia-smi > /dev/null; then
  gpu_line=$(timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap \
    --format=csv,noheader 2>&1 | head -n 1)
  if timeout 20 nvidia-smi -L > /dev/null 2>&1; then gpu_ok=1; fi
fi
say "GPU: ${gpu_line:-none} $( ((gpu_ok)) || echo '(nvidia-smi failed or missing: no GPU)')"
((gpu_ok)) && timeout 20 nvidia-smi 2>&1 | note
summary_env+=("GPU: ${gpu_line:-none}")
nvcc_v=$( (timeout 20 nvcc --version || timeout 20 /usr/local/cuda/bin/nvcc --version) 2> /dev/null |
  sed -n 's/.*release \([0-9.]*\).*/\1/p')
cs=$(command -v compute-sanitizer || true)
for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [[ -z $cs && -x $c ]] && cs=$c
done
cs_v=$([[ -n $cs ]] && timeout 20 "$cs" --version 2> /dev/null | grep -oE '[0-9]{4}\.[0-9.]+' | head -n 1)
say "nvcc ${nvcc_v:-missing}, compute-sanitizer ${cs_v:-missing}${cs:+ ($cs)}"
site=${NVIDIA_SITE:-$(timeout 20 "$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2> /dev/null)}
torch_line=$(timeout 60 "$py" - 2>&1 << 'PY' | tail -n 1
import importlib.metadata as md
v = []
for p in ("nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cublas", "nvidia-cuda-nvrtc"):
    try:
        v.append(f"{p.replace('nvidia-', '')} {md.version(p)}")
    except Exception:
        v.append(f"{p.replace('nvidia-', '')} -")
try:
    import torch
    c = torch.backends.cudnn.version() if torch.cuda.is_available() else "-"
    t = (f"torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {c}, "
         f"GPU {'yes' if torch.cuda.is_available() else 'no'})")
except Exception as e:
    t = f"torch not importable ({type(e).__name__})"
print(t + "; pip wheels: " + ", ".join(v))
PY
)
say "${torch_line:-python: no answer}"
summary_env+=("${torch_line:-python: no answer}")
[[ -f $carry/MANIFEST ]] && sed 's/^/carried: /' "$carry/MANIFEST" | tee -a "$log"

# LD_LIBRARY_PATH: every nvidia/*/lib folder of the pip wheels (cudnn/lib, nccl/lib, cu13/lib).
# Wheels hold no symbolic links; where a library exists only under a longer version name, a
# link with the SONAME the binaries ask for goes into a folder of our own.
shopt -s nullglob
lib_dirs=()
for d in "$site"/nvidia/*/lib; do lib_dirs+=("$(cd "$d" && pwd)"); done
shim=$tmp/libshim
mkdir -p "$shim"
# shellcheck source=scripts/gpu/carry_lib.sh
source scripts/gpu/carry_lib.sh
bindir=$tmp/bin
if ! unpack_carry "$carry" "$bindir" 2>&1 | tee -a "$log" | sed "s/^/[+$(el)s] /"; then
  say "STOP: the carried binaries are missing or corrupt (above): run scripts/gpu/build_here.sh" \
    "on the dev machine and call with carry=[\".gpu-carry\"]"
  exit 3
fi
bins=("$bindir/test_cuda" "$bindir/resnet50_synthetic")
for soname in $(readelf -d "${bins[@]}" 2> /dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u); do
  found=0
  for d in "${lib_dirs[@]}"; do [[ -e $d/$soname ]] && found=1; done
  ((found)) && continue
  for d in "${lib_dirs[@]}"; do
    cand=("$d/$soname".*)
    if ((${#cand[@]})); then
      ln -sf "${cand[0]}" "$shim/$soname"
      say "linked $shim/$soname -> ${cand[0]}"
      break
    fi
  done
done
ld_path=$(printf '%s\n' "${lib_dirs[@]}" "$shim" | paste -sd: -)
export LD_LIBRARY_PATH="$ld_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
((${#lib_dirs[@]})) || say "WARNING: no $site/nvidia/*/lib: the libraries must come from the system"
missing=0
for b in "${bins[@]}"; do
  l=$(timeout 30 ldd "$b" 2>&1)
  echo "$l" | sed "s|^|ldd $(basename "$b"): |" | note
  echo "$l" | grep -E 'libcu|libnccl|libz\.' | sed "s|^\s*|  $(basename "$b"): |" | tee -a "$log"
  if echo "$l" | grep -q 'not found'; then
    say "STOP: $(basename "$b") misses $(echo "$l" | grep 'not found' | awk '{print $1}' | paste -sd ' ' -)"
    missing=1
  fi
done
if ((missing)); then
  say "STOP: a library is missing (above); nothing else ran. Files: $log"
  exit 2
fi
say "ldd: every library found"

# --- 2. test_cuda, one process per test file ------------------------------------------------------
section "2. test_cuda, one process per file and per hidden test (${test_jobs} at a time, ${test_timeout} s each, ${test_budget} s in all)"
tc=$bindir/test_cuda
mapfile -t files < <(timeout 30 "$tc" --filenames-as-tags --list-tags 2> /dev/null |
  grep -oE '\[#[A-Za-z0-9_]+\]' | tr -d '[]#' | sort -u)
[[ -n ${TEST_FILES:-} ]] && read -r -a files <<< "$TEST_FILES"
list_failed=0
if want tests && ((${#files[@]} == 0)); then
  say "test_cuda --list-tags listed no test file: no test ran (see the log)"
  timeout 30 "$tc" --filenames-as-tags --list-tags 2>&1 | head -n 20 | note
  list_failed=1
fi
want tests || files=()
# Each file without its hidden tests ([.]: run only when named, e.g. the one that loses the CUDA
# context on purpose); each hidden test then runs in a process of its own, by its quoted name.
declare -A t_rc t_s t_line t_filter
for f in "${files[@]}"; do t_filter[$f]="[#$f]~[.]"; done
hidden=()
if want tests && [[ -z ${TEST_FILES:-} ]]; then
  mapfile -t hidden < <(timeout 30 "$tc" --list-test-names-only '[.]' 2> /dev/null | grep . | tr -d '"')
fi
k=0
for name in "${hidden[@]}"; do
  k=$((k + 1))
  t_filter[hidden_$k]="\"$name\""
  say "hidden_$k is the hidden test \"$name\""
done
# The slowest (the ResNet steps, checked against the CPU) first, so they overlap the others.
ordered=()
for f in "${files[@]}"; do [[ $f == *resnet* ]] && ordered+=("$f"); done
for f in "${files[@]}"; do [[ $f == *resnet* ]] || ordered+=("$f"); done
for ((j = 1; j <= k; j++)); do ordered+=("hidden_$j"); done
say "${#ordered[@]} test processes: ${ordered[*]}"
test_end=$(($(el) + test_budget))
first_failing=""
running=()
start_file() {
  local f=$1 s
  s=$(min "$test_timeout" $((test_end - $(el))))
  (
    # The CPU references of TEST_JOBS processes share the cores.
    threads=$(($(nproc) / test_jobs))
    export DLTRAIN_NUM_THREADS=${DLTRAIN_NUM_THREADS:-$((threads > 0 ? threads : 1))}
    t=$SECONDS
    run_capped "$s" "$tmp/$f.log" "$tc" --filenames-as-tags "${t_filter[$f]}" --reporter compact \
      --durations yes
    echo "$? $((SECONDS - t))" > "$tmp/$f.rc"
  ) &
  running+=("$f")
}
finish_file() {  # records a file whose job ended, appends its log
  local f=$1 rc s what line
  read -r rc s < "$tmp/$f.rc"
  line=$(grep -E '^(Passed|Failed|No tests ran)' "$tmp/$f.log" | tail -n 1)
  case $rc in
    0) what=passed ;;
    4) what="SKIPPED (no GPU)" ;;
    124 | 137) what="TIMED OUT" ;;
    *) what="FAILED (exit $rc)"
       ((rc > 128)) && what="CRASHED (signal $((rc - 128)))" ;;
  esac
  t_rc[$f]=$rc
  t_s[$f]=$s
  t_line[$f]="$what"
  {
    echo "---- $f: $what in ${s} s"
    cat "$tmp/$f.log"
  } | note
  say "$(printf '%-28s %-22s %4s s  %s' "$f" "$what" "$s" "${line:0:70}")"
}
i=0
while ((i < ${#ordered[@]} || ${#running[@]})); do
  while ((i < ${#ordered[@]} && ${#running[@]} < test_jobs && test_end - $(el) >= 5)); do
    start_file "${ordered[$i]}"
    i=$((i + 1))
  done
  ((${#running[@]})) || break
  wait -n 2> /dev/null || true
  still=()
  for f in "${running[@]}"; do
    if [[ -f $tmp/$f.rc ]]; then finish_file "$f"; else still+=("$f"); fi
  done
  running=("${still[@]}")
done
wait
for f in "${ordered[@]}"; do
  [[ -n ${t_line[$f]:-} ]] || t_line[$f]="NOT RUN (test budget spent)"
done
tests_table=()
n_pass=0 n_fail=0 n_skip=0 n_other=0
for f in "${ordered[@]}"; do
  tests_table+=("$(printf '  %-28s %-24s %s' "$f" "${t_line[$f]}" "${t_s[$f]:+${t_s[$f]} s}")")
  case ${t_rc[$f]:-x} in
    0) n_pass=$((n_pass + 1)) ;;
    4) n_skip=$((n_skip + 1)) ;;
    x) n_other=$((n_other + 1)) ;;
    *) n_fail=$((n_fail + 1))
       # The first failing file for memcheck: a failure or crash before a time-out.
       if [[ -z $first_failing && ${t_rc[$f]} != 124 && ${t_rc[$f]} != 137 ]]; then first_failing=$f; fi ;;
  esac
done
if [[ -z $first_failing ]]; then
  for f in "${ordered[@]}"; do
    case ${t_rc[$f]:-x} in 124 | 137) first_failing=$f; break ;; esac
  done
fi
section "test files: $n_pass passed, $n_fail failed, $n_skip skipped, $n_other not run"
printf '%s\n' "${tests_table[@]}" | tee -a "$log"

# --- 3. ResNet-50: dltrain beside PyTorch ----------------------------------------------------------
section "3. ResNet-50 synthetic, train, batches 128 and 256: dltrain then PyTorch per setting (${bench_budget} s in all)"
read -r -a settings <<< "${BENCH_SETTINGS:-tf32_nchw bf16_cl f16_cl}"
want bench || settings=()
declare -A flags=([tf32_nchw]="" [bf16_cl]="--amp --amp-dtype bf16 --channels-last"
  [f16_cl]="--amp --amp-dtype f16 --channels-last")
common=(--batch-sizes "128,256" --modes train --warmup "$warmup" --iters "$iters")
bench_end=$(($(el) + bench_budget))
declare -A b_rc
n_left=$((${#settings[@]} * 2))
for s in "${settings[@]}"; do
  if [[ -z ${flags[$s]+set} ]]; then
    say "unknown setting '$s' (BENCH_SETTINGS takes: ${!flags[*]})"
    b_rc[dl_$s]="unknown setting"
    n_left=$((n_left - 2))
    continue
  fi
  read -r -a extra <<< "${flags[$s]}"
  for who in dl pt; do
    # An equal share of what is left, but at least 30 s while that much is left (a program
    # spends its first seconds loading libraries and tuning cuDNN).
    rem=$((bench_end - $(el)))
    share=$((rem / n_left))
    ((share >= 30)) || share=$(min 30 "$rem")
    n_left=$((n_left - 1))
    json=$out/${who}_$s.json
    rm -f "$json"
    if ((share < 15)); then
      b_rc[${who}_$s]="not run"
      say "$who $s: not run (bench budget spent)"
      continue
    fi
    if [[ $who == dl ]]; then
      cmd=("$bindir/resnet50_synthetic" "${common[@]}" "${extra[@]}" --json "$json")
    else
      cmd=("$py" benchmarks/peers/pytorch_resnet50.py "${common[@]}" "${extra[@]}" --json "$json")
    fi
    say "$who $s (limit ${share} s): ${cmd[*]}"
    t=$SECONDS
    run_capped "$share" "$log" "${cmd[@]}"
    rc=$?
    b_rc[${who}_$s]=$rc
    rm -f "$json.tmp" # a report killed mid-write: the file before it stays
    say "$who $s: exit $rc in $((SECONDS - t)) s$( ((rc == 124 || rc == 137)) && echo ' (TIMED OUT)')"
  done
  if [[ -f $out/dl_$s.json && -f $out/pt_$s.json ]]; then
    timeout 30 "$py" benchmarks/peers/pytorch_resnet50.py --load "$out/pt_$s.json" \
      --compare "$out/dl_$s.json" 2>&1 | note
  fi
done
bench_table=$(timeout 30 "$py" - "$out" "${settings[@]}" 2>&1 << 'PY'
import json, os, sys
out, settings = sys.argv[1], sys.argv[2:]
def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except Exception as e:
        return {"_missing": f"{type(e).__name__}"}
print(f"  {'setting':10} {'batch':>5}  {'dltrain img/s':>13} {'torch img/s':>12} {'ratio':>6}"
      f"  {'dl MiB':>7} {'pt MiB':>7}  notes")
for s in settings:
    d, p = load(os.path.join(out, f"dl_{s}.json")), load(os.path.join(out, f"pt_{s}.json"))
    rows = {}
    for who, rep in (("dl", d), ("pt", p)):
        for r in rep.get("results", []):
            rows.setdefault(r["batch"], {})[who] = r
    notes = []
    for who, rep in (("dltrain", d), ("torch", p)):
        if "_missing" in rep:
            notes.append(f"{who}: no JSON")
        elif rep.get("skipped"):
            notes.append(f"{who} skipped: {rep['skipped']}")
        elif rep.get("running"):
            notes.append(f"{who} stopped during {rep['running']}")
    if not rows:
        print(f"  {s:10} {'-':>5}  {'-':>13} {'-':>12} {'-':>6}  {'-':>7} {'-':>7}  {'; '.join(notes)}")
    for b in sorted(rows):
        dl, pt = rows[b].get("dl", {}), rows[b].get("pt", {})
        f = lambda r, k, spec: format(r[k], spec) if isinstance(r.get(k), (int, float)) else "-"
        ratio = (f"{dl['img_per_s'] / pt['img_per_s']:.2f}"
                 if dl.get("img_per_s") and pt.get("img_per_s") else "-")
        n = list(notes)
        for who, r in (("dltrain", dl), ("torch", pt)):
            if "error" in r:
                n.append(f"{who} failed: {r['error'][:60]}")
            elif r.get("mode") == "train" and r.get("last_loss") is None and r:
                n.append(f"{who} loss not finite")
        print(f"  {s:10} {b:5}  {f(dl, 'img_per_s', '13.1f'):>13} {f(pt, 'img_per_s', '12.1f'):>12} "
              f"{ratio:>6}  {f(dl, 'peak_mib', '7.0f'):>7} {f(pt, 'peak_mib', '7.0f'):>7}  {'; '.join(n)}")
        notes = []
PY
)
section "benchmark (img/s of the training step, ratio = dltrain / torch)"
echo "$bench_table" | tee -a "$log"

# --- 4. compute-sanitizer memcheck ------------------------------------------------------------------
section "4. compute-sanitizer memcheck ($(($(left) - 15)) s left)"
declare -a mc_table=()
if [[ -n ${MEMCHECK_FAMILIES:-} ]]; then
  IFS=';' read -r -a fam_lines <<< "$MEMCHECK_FAMILIES"
else
  mapfile -t fam_lines < <(grep -vE '^\s*(#|$)' scripts/gpu/memcheck_families.txt)
fi
want memcheck || { fam_lines=(); first_failing=""; mc_table+=("  not run (STEPS=$steps)"); }
no_gpu=0
((gpu_ok)) || no_gpu=1
((n_skip > 0 && n_pass == 0 && n_fail == 0)) && no_gpu=1
mc_errors=0
# memcheck_run LABEL SECONDS FILTER: one process under memcheck; prints its verdict (the caller
# reads "ERROR" in it: this runs in a command substitution).
memcheck_run() {
  local label=$1 s=$2 filter=$3 rc n t
  t=$SECONDS
  echo "==== memcheck $label: $filter (limit $s s)" >> "$mlog"
  # No stdbuf here: its LD_PRELOAD would reach the sanitizer's own processes.
  timeout -k 10 "$s" "$cs" --tool memcheck --error-exitcode 99 --leak-check no \
    --print-limit 50 "$tc" --filenames-as-tags --reporter compact "$filter" >> "$mlog" 2>&1
  rc=$?
  n=$(tail -n 400 "$mlog" | grep -oE 'ERROR SUMMARY: [0-9]+' | tail -n 1 | grep -oE '[0-9]+$')
  case $rc in
    0) echo "covered, clean ($((SECONDS - t)) s)" ;;
    99) echo "covered, ${n:-some} memcheck ERROR(S) ($((SECONDS - t)) s)" ;;
    124 | 137) echo "NOT covered: timed out after $s s${n:+ (errors so far: $n)}" ;;
    4) echo "NOT covered: no GPU" ;;
    *) if [[ ${n:-} == 0 ]]; then
         echo "covered, clean, but tests failed under memcheck (exit $rc)"
       else
         echo "ERROR: exit $rc${n:+, $n memcheck error(s)}, coverage unknown ($((SECONDS - t)) s)"
       fi ;;
  esac
}
mc_end=$((budget - 15))
if [[ -n $cs ]] && ((!no_gpu)) && [[ -n $first_failing ]]; then
  s=$(((mc_end - $(el)) / 2))
  if ((s >= 15)); then
    say "memcheck on the first failing test file, $first_failing (limit $s s)"
    v=$(memcheck_run "$first_failing" "$s" "${t_filter[$first_failing]}")
    [[ $v == *ERROR* ]] && mc_errors=1
    mc_table+=("$(printf '  %-24s %s' "$first_failing" "$v")")
    say "  $first_failing: $v"
  fi
fi
if [[ -n $cs ]] && ((!no_gpu)); then
  k=${#fam_lines[@]}
  for line in "${fam_lines[@]}"; do
    fam=${line%%|*}
    filter=${line#*|}
    n=$(timeout 30 "$tc" --filenames-as-tags --list-test-names-only "$filter" 2> /dev/null | grep -c .)
    s=$(((mc_end - $(el)) / k))
    k=$((k - 1))
    if ((n == 0)); then
      v="NOT covered: the filter selects no test"
    elif ((s < 10)); then
      v="NOT covered: no time left"
    else
      v="$(memcheck_run "$fam" "$s" "$filter") [$n test(s)]"
      [[ $v == *ERROR* ]] && mc_errors=1
    fi
    mc_table+=("$(printf '  %-24s %s' "$fam" "$v")")
    say "  $fam: $v"
  done
else
  for line in "${fam_lines[@]}"; do
    mc_table+=("$(printf '  %-24s %s' "${line%%|*}" "NOT covered: $([[ -z $cs ]] && echo 'no compute-sanitizer' || echo 'no GPU')")")
  done
fi

# --- 5. summary ----------------------------------------------------------------------------------
section "SUMMARY (first_run.sh, $(el) s of ${budget} s)"
{
  printf '%s\n' "${summary_env[@]}"
  echo "ldd: every library found (LD_LIBRARY_PATH from ${site}/nvidia/*/lib)"
  echo "test files: $n_pass passed, $n_fail failed, $n_skip skipped, $n_other not run"
  printf '%s\n' "${tests_table[@]}"
  echo "benchmark (train step img/s, ratio = dltrain / torch; JSON per setting in OUT):"
  echo "$bench_table"
  echo "memcheck (compute-sanitizer --tool memcheck; log: memcheck.log):"
  printf '%s\n' "${mc_table[@]}"
  echo "files: $(cd "$out" && find . -maxdepth 1 -type f -printf '%f ' | sort)"
} | tee -a "$log"
status=0
((n_fail == 0 && n_other == 0 && list_failed == 0)) || status=1
for k in "${!b_rc[@]}"; do [[ ${b_rc[$k]} == 0 ]] || status=1; done
((mc_errors == 0)) || status=1
((status == 0 && no_gpu)) && status=4
exit "$status"
