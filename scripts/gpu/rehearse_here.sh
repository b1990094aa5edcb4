#!/usr/bin/env bash
# Runs on the DEV machine (no GPU): the rehearsal of the first GPU run. Downloads the pip wheels
# the GPU image takes cuDNN, NCCL and cuBLAS from (never carried: about 1 GB, only used here)
# into .gpu-wheels/ (git-ignored), unpacks them, and runs the binaries that build_here.sh put in
# .gpu-carry/ with ONLY those wheels on LD_LIBRARY_PATH, as first_run.sh will there:
#   1. ldd: every library found, and cuBLAS/cuBLASLt/cuDNN/NCCL resolved to the wheels' copies,
#      not this machine's /usr/local/cuda (LD_DEBUG=libs confirms what the loader opened);
#   2. every library in the wheels finds its own dependencies (ldd on each);
#   3. test_cuda starts and skips visibly (exit 4, "SKIPPED: no CUDA device visible"); its test
#      list and the memcheck family filters work without a GPU; resnet50_synthetic starts and says
#      "skipped: no CUDA device" (exit 0, a JSON saying so);
#   4. scripts/gpu/first_run.sh itself, end to end, with NVIDIA_SITE=.gpu-wheels/site: every step
#      must run and skip, the summary must come last, and $OUT must hold at most 8 files.
#
#   bash scripts/gpu/rehearse_here.sh          # after scripts/gpu/build_here.sh
#
# Environment: WHEELS (the pip requirement list; default: the versions that PyPI's torch 2.11.0,
# the GPU image's torch, requires: nvidia-cudnn-cu13==9.19.0.56 nvidia-nccl-cu13==2.28.9
# nvidia-cublas==13.1.0.3, read off `pip install --dry-run --report` for torch==2.11.0).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
w=$root/.gpu-wheels
carry=$root/.gpu-carry
read -r -a pins <<< "${WHEELS:-nvidia-cudnn-cu13==9.19.0.56 nvidia-nccl-cu13==2.28.9 nvidia-cublas==13.1.0.3}"
say() { echo "rehearse_here.sh: $*"; }
status=0
fail() { echo "rehearse_here.sh: CHECK FAILED: $*" >&2; status=1; }
# The carried files, unpacked as first_run.sh will (scripts/gpu/carry_lib.sh).
# shellcheck source=scripts/gpu/carry_lib.sh
source scripts/gpu/carry_lib.sh
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
unpack_carry "$carry" "$bin" ||
  { echo "rehearse_here.sh: run scripts/gpu/build_here.sh first" >&2; exit 1; }

# --- the wheels ----------------------------------------------------------------------------------
mkdir -p "$w/dl"
if [[ $(cat "$w/pins" 2> /dev/null) != "${pins[*]}" ]]; then
  say "downloading ${pins[*]} into $w/dl (about 1 GB)"
  rm -rf "$w/dl" "$w/site"
  mkdir -p "$w/dl"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_18_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$w/dl" "${pins[@]}"
  echo "${pins[*]}" > "$w/pins"
fi
if [[ ! -d $w/site/nvidia ]]; then
  mkdir -p "$w/site"
  for f in "$w"/dl/*.whl; do python3 -m zipfile -e "$f" "$w/site/"; done
fi
shopt -s nullglob
dirs=("$w"/site/nvidia/*/lib)
((${#dirs[@]})) || { echo "rehearse_here.sh: no nvidia/*/lib in $w/site" >&2; exit 1; }
say "wheels: $(find "$w/dl" -name '*.whl' -printf '%f ' | sort)"
say "their library folders: ${dirs[*]#"$root/"}"
libpath=$(printf '%s\n' "${dirs[@]}" | paste -sd: -)
# Only the wheels: not this machine's LD_LIBRARY_PATH (its ld.so.cache still has
# /usr/local/cuda/lib, which is why every resolution is checked below).
run_w() { env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$libpath" "$@"; }

# --- 1. the binaries' libraries --------------------------------------------------------------------
for b in "$bin/test_cuda" "$bin/resnet50_synthetic"; do
  n=$(basename "$b")
  l=$(run_w ldd "$b")
  if echo "$l" | grep -q 'not found'; then fail "$n: $(echo "$l" | grep 'not found' | paste -sd ' ' -)"; fi
  # Each CUDA library the binary needs (resnet50_synthetic pulls in no NCCL code).
  for lib in $(readelf -d "$b" | sed -n 's/.*(NEEDED).*\[\(libcu[^]]*\|libnccl[^]]*\)\]/\1/p'); do
    at=$(echo "$l" | awk -v lib="$lib" '$1 == lib {print $3}')
    if [[ $at == "$w"/* ]]; then
      say "$n: $lib => ${at#"$root/"}"
    else
      fail "$n: $lib => ${at:-nothing}, not the wheels' copy"
    fi
  done
  if echo "$l" | grep -q libcudart; then fail "$n needs libcudart (the runtime should be static)"; fi
done
# What the loader really opened (ldd runs the same loader, but this is the program itself).
dbg=$w/ld_debug.txt
run_w env LD_DEBUG=libs "$bin/test_cuda" --list-tags > /dev/null 2> "$dbg" || true
opened=$(grep -oE 'calling init: \S+' "$dbg" | awk '{print $3}' | grep -E 'libcu|libnccl' || true)
[[ -n $opened ]] || fail "LD_DEBUG=libs shows no cuBLAS/cuDNN/NCCL opened (see $dbg)"
for p in $opened; do
  if [[ $p == "$w"/* ]]; then say "loader opened ${p#"$root/"}"; else fail "loader opened $p, outside the wheels"; fi
done

# --- 2. the wheels' own libraries ----------------------------------------------------------------
for d in "${dirs[@]}"; do
  for so in "$d"/*.so*; do
    nf=$(run_w ldd "$so" 2>&1 | grep 'not found' || true)
    [[ -z $nf ]] || fail "$(basename "$so") in the wheels: $(echo "$nf" | paste -sd ' ' -)"
  done
done
say "every library of the wheels finds its dependencies (dlopen'd ones, such as cuDNN's libnvrtc, are not checked)"

# --- 3. the programs start and skip -------------------------------------------------------------
rc=0
o=$(run_w "$bin/test_cuda" 2>&1) || rc=$?
if ((rc == 4)) && [[ $o == *"SKIPPED: no CUDA device visible"* ]]; then
  say "test_cuda: exit 4, '$o'"
else
  fail "test_cuda: exit $rc, '$o' (want 4 and 'SKIPPED: no CUDA device visible')"
fi
n=$(run_w "$bin/test_cuda" --list-test-names-only | grep -c . || true)
say "test_cuda lists $n tests without a GPU"
((n > 0)) || fail "test_cuda --list-test-names-only lists nothing"
fam=$(bash tests/cuda/check_memcheck_families.sh "$bin/test_cuda" scripts/gpu/memcheck_families.txt 2>&1) ||
  fail "memcheck family filters: $fam"
while IFS= read -r l; do echo "  $l"; done <<< "$fam"
j=$(mktemp -d)
rc=0
o=$(run_w "$bin/resnet50_synthetic" --batch-sizes 128 --amp --amp-dtype bf16 --channels-last \
  --json "$j/dl.json" 2>&1) || rc=$?
if ((rc == 0)) && [[ $o == *"skipped: no CUDA device"* ]] && grep -q '"skipped": "no CUDA device"' "$j/dl.json"; then
  say "resnet50_synthetic: exit 0, '$o', and its JSON says skipped"
else
  fail "resnet50_synthetic: exit $rc, '$o' (want 'skipped: no CUDA device' and a JSON)"
fi
rm -rf "$j"

# --- 4. first_run.sh end to end ----------------------------------------------------------------
o=$(mktemp -d)
say "first_run.sh with NVIDIA_SITE=.gpu-wheels/site OUT=$o (no GPU: every step must run and skip)"
t=$SECONDS
rc=0
env -u LD_LIBRARY_PATH NVIDIA_SITE="$w/site" OUT="$o" bash scripts/gpu/first_run.sh > "$o.console" 2>&1 || rc=$?
say "first_run.sh: exit $rc in $((SECONDS - t)) s; its last lines:"
((rc == 4)) || fail "first_run.sh exited $rc; without a GPU it must say so with 4"
tail -n 45 "$o.console" | sed 's/^/  | /'
files=$(find "$o" -type f | wc -l)
((files <= 8)) || fail "first_run.sh left $files files in OUT (the device tool brings back 8)"
grep -q '^==== SUMMARY' "$o.console" || fail "first_run.sh printed no SUMMARY"
grep -q 'ldd: every library found' "$o/first_run.log" || fail "first_run.sh's ldd check did not pass"
grep -qE 'SKIPPED \(no GPU\)' "$o/first_run.log" || fail "first_run.sh's test files did not skip visibly"
say "first_run.sh left $files file(s): $(find "$o" -type f -printf '%f ')"
rm -rf "$o" "$o.console"
((status == 0)) && say "OK: the carried binaries start with only the wheels' libraries"
exit "$status"
