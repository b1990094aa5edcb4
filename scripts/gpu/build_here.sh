#!/usr/bin/env bash
# Runs on the DEV machine (never on the GPU machine): builds test_cuda and resnet50_synthetic
# for the lent GPU machine, so that the one device call only runs them (scripts/gpu/first_run.sh).
#
#   bash scripts/gpu/build_here.sh            # configure + build + strip + checks
#   bash scripts/gpu/build_here.sh --check    # only the checks, on binaries already in .gpu-carry/
#
# The build: Release, CUDA on, sm_90 machine code only (90-real: the H100/H200; no PTX, no other
# GPU), the CUDA runtime linked statically (CMAKE_CUDA_RUNTIME_LIBRARY=Static), portable host
# code (DLTRAIN_NATIVE=OFF: the GPU host's CPU is not this one), no run path (the GPU machine's
# LD_LIBRARY_PATH decides), and none of the optional libraries the GPU image lacks: oneDNN, HDF5,
# TurboJPEG, MPI, protobuf (TensorBoard), libpng off. Every compile goes through the shared build
# lock (BUILD_LOCK, default /tmp/dltrain-build.lock) with at most JOBS (2) jobs.
#
# The two binaries, stripped and xz-compressed (their fatbins are stored uncompressed and shrink
# about tenfold: 63 MiB become about 7), go into .gpu-carry/ (git-ignored) with MANIFEST (commit,
# options, sha256 of each); a device call carries them with carry=[".gpu-carry"], and
# first_run.sh unpacks them (scripts/gpu/carry_lib.sh). The checks, on the unpacked copies (the
# script fails when one does):
#   - NEEDED holds only what the GPU image has: cuBLAS/cuBLASLt 13, cuDNN 9, NCCL 2 (from the
#     image's pip wheels), zlib, and the C/C++ runtimes; no libcudart (static), no oneDNN, HDF5,
#     MPI, JPEG, protobuf, PNG;
#   - the newest GLIBC_ / GLIBCXX_ symbol versions they need, against an Ubuntu 24.04 image
#     (glibc 2.39, GLIBCXX_3.4.33; anything up to GLIBC 2.39 and GLIBCXX 3.4.32 passes);
#   - sm_90 machine code is present and nothing else, no PTX (read off the .nv_fatbin section);
#   - what one device call carries: the tracked tree (git ls-files), untracked files git does
#     not ignore, and .gpu-carry/, under CARRY_LIMIT_MIB (58; the tool's limit is 64).
# Environment: BUILD_DIR (build-gpu-carry), JOBS (2), BUILD_LOCK, CARRY_LIMIT_MIB.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
build=${BUILD_DIR:-build-gpu-carry}
jobs=${JOBS:-2}
lock=${BUILD_LOCK:-/tmp/dltrain-build.lock}
carry=.gpu-carry
limit_mib=${CARRY_LIMIT_MIB:-58}
# shellcheck source=scripts/gpu/carry_lib.sh
source scripts/gpu/carry_lib.sh
targets=("${carry_names[@]}")
bins=(tests/test_cuda benchmarks/resnet50_synthetic)
check_only=0
while (($#)); do
  case $1 in
    --check) check_only=1 ;;
    -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    *) echo "build_here.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
say() { echo "build_here.sh: $*"; }
die() { echo "build_here.sh: error: $*" >&2; exit 1; }
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
# Relative paths in ccache's keys: another worktree's identical compiles hit.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}

if ((!check_only)); then
  command -v nvcc > /dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] || die "nvcc not found"
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  mkdir -p "$build"
  log=$build/build_here.log
  : > "$log"
  cmake_args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc"
    -DDLTRAIN_CUDA=ON -DDLTRAIN_CUDA_ARCHITECTURES=90-real -DCMAKE_CUDA_RUNTIME_LIBRARY=Static
    -DDLTRAIN_NATIVE=OFF -DDLTRAIN_CPU_ARCH= -DCMAKE_SKIP_RPATH=ON
    -DDLTRAIN_DNNL=OFF -DDLTRAIN_HDF5=OFF -DDLTRAIN_JPEG=OFF -DDLTRAIN_MPI=OFF
    -DDLTRAIN_PROTOBUF=OFF -DCMAKE_DISABLE_FIND_PACKAGE_PNG=ON -DDLTRAIN_SHARED=OFF
    -DDLTRAIN_BUILD_TESTS=ON -DDLTRAIN_BUILD_BENCHMARKS=ON -DDLTRAIN_BUILD_EXAMPLES=OFF
    -DDLTRAIN_BUILD_TOOLS=OFF -DDLTRAIN_SANITIZE= -DDLTRAIN_FUZZ=OFF)
  if command -v ccache > /dev/null; then
    cmake_args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  if [[ ! -f $build/CMakeCache.txt ]] && command -v ninja > /dev/null; then
    cmake_args+=(-G Ninja)
  fi
  # One lock for the configure (its compiler probes) and the build; the time waited for it is
  # reported apart from the time the build took.
  exec 9> "$lock"
  t_wait=$SECONDS
  say "waiting for $lock" && flock 9
  waited=$((SECONDS - t_wait))
  t_conf=$SECONDS
  if ! cmake "${cmake_args[@]}" >> "$log" 2>&1; then
    tail -n 30 "$log"
    die "configure failed (log: $log)"
  fi
  grep -E '^-- dltrain:' "$log" || true
  conf_s=$((SECONDS - t_conf))
  t_build=$SECONDS
  if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" >> "$log" 2>&1; then
    grep -nE 'error|undefined reference' "$log" | head -n 30 || true
    tail -n 20 "$log"
    die "build failed after $((SECONDS - t_build)) s (log: $log)"
  fi
  build_s=$((SECONDS - t_build))
  flock -u 9
  exec 9>&-
  warnings=$(grep -ciE 'warning[: ]' "$log" || true)
  say "configured in ${conf_s} s and built ${targets[*]} in ${build_s} s with -j$jobs" \
    "(waited ${waited} s for the lock), $warnings warning line(s); log: $log"
  ((warnings == 0)) || grep -m 10 -iE 'warning[: ]' "$log"

  rm -rf "$carry"
  mkdir -p "$carry" "$build/carry"
  for b in "${bins[@]}"; do
    n=$(basename "$b")
    strip --strip-all -o "$build/carry/$n" "$build/$b"
    xz -T"$jobs" -6 -c "$build/carry/$n" > "$carry/$n.xz"
  done
  {
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) by scripts/gpu/build_here.sh"
    echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- . 2> /dev/null || echo ' (+ uncommitted changes)')"
    echo "nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), $(c++ --version | head -n 1)"
    echo "options Release, sm 90-real, cudart static, DLTRAIN_NATIVE=OFF, no oneDNN/HDF5/JPEG/MPI/protobuf/PNG"
    echo "build ${build_s} s with -j$jobs on $(nproc) cores"
    for b in "${bins[@]}"; do
      n=$(basename "$b")
      echo "sha256 $(sha256sum "$build/carry/$n" | cut -d' ' -f1) $n"
    done
  } > "$carry/MANIFEST"
fi

# --- checks on what is carried --------------------------------------------------------------
[[ -d $carry ]] || die "$carry/ missing: run scripts/gpu/build_here.sh without --check first"
status=0
fail() { echo "build_here.sh: CHECK FAILED: $*" >&2; status=1; }
# The checks run on what first_run.sh will run: the carried files, unpacked.
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
unpack_carry "$carry" "$unpacked" || die "the carried binaries do not unpack (above)"
# What the GPU image provides (pip wheels nvidia-cublas, nvidia-cudnn-cu13, nvidia-nccl-cu13;
# zlib and the C/C++ runtimes from the OS).
allowed='^(libcublas\.so\.13|libcublasLt\.so\.13|libcudnn\.so\.9|libnccl\.so\.2|libz\.so\.1|libstdc\+\+\.so\.6|libm\.so\.6|libgcc_s\.so\.1|libc\.so\.6|libdl\.so\.2|librt\.so\.1|libpthread\.so\.0|ld-linux-x86-64\.so\.2)$'
for b in "${bins[@]}"; do
  f=$unpacked/$(basename "$b")
  [[ -x $f ]] || { fail "$f missing"; continue; }
  needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  echo "$(basename "$f"): $(mib "$(stat -c %s "$f")"), NEEDED: $(echo "$needed" | paste -sd ' ' -)"
  bad=$(echo "$needed" | grep -vE "$allowed" || true)
  [[ -z $bad ]] || fail "$(basename "$f") needs $(echo "$bad" | paste -sd ' ' -), which the GPU image lacks"
  rp=$(readelf -d "$f" | grep -E 'RPATH|RUNPATH' || true)
  [[ -z $rp ]] || fail "$(basename "$f") has a run path ($rp): the rehearsal could find this machine's libraries"
  glibc=$(objdump -T "$f" | grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -n 1)
  glibcxx=$(objdump -T "$f" | grep -oE 'GLIBCXX_[0-9.]+' | sort -uV | tail -n 1)
  cxxabi=$(objdump -T "$f" | grep -oE 'CXXABI_[0-9.]+' | sort -uV | tail -n 1)
  echo "  newest symbol versions: $glibc $glibcxx $cxxabi (Ubuntu 24.04: GLIBC_2.39 GLIBCXX_3.4.33)"
  [[ $(printf '%s\n' "$glibc" GLIBC_2.39 | sort -V | tail -n 1) == GLIBC_2.39 ]] ||
    fail "$(basename "$f") needs $glibc, newer than Ubuntu 24.04's glibc 2.39"
  [[ -z $glibcxx || $(printf '%s\n' "$glibcxx" GLIBCXX_3.4.32 | sort -V | tail -n 1) == GLIBCXX_3.4.32 ]] ||
    fail "$(basename "$f") needs $glibcxx, newer than GLIBCXX_3.4.32"
  # The device code, read off the .nv_fatbin section (this machine has no cuobjdump): one
  # fatbin per .cu object, each a list of entries (kind 1 PTX, 2 ELF; the SM version at +28).
  dev=$(python3 - "$f" << 'PY'
import collections, struct, subprocess, sys
path = sys.argv[1]
off = size = None
for line in subprocess.run(["readelf", "-S", "-W", path], capture_output=True,
                           text=True).stdout.splitlines():
    if ".nv_fatbin" in line:
        f = line.split("]")[1].split()
        off, size = int(f[3], 16), int(f[4], 16)
if off is None:
    print("none none 0")
    sys.exit()
with open(path, "rb") as fh:
    fh.seek(off)
    data = fh.read(size)
pos, fatbins, entries = 0, 0, collections.Counter()
while pos + 16 <= len(data):
    magic, _, hsize, fsize = struct.unpack_from("<IHHQ", data, pos)
    if magic != 0xBA55ED50:
        pos += 8
        continue
    fatbins += 1
    e, end = pos + hsize, pos + hsize + fsize
    while e + 32 <= end:
        kind, _, ehsize, esize = struct.unpack_from("<HHIQ", data, e)
        sm = struct.unpack_from("<I", data, e + 28)[0]
        entries["ptx" if kind == 1 else f"sm_{sm}" if kind == 2 else f"kind{kind}"] += 1
        e += ehsize + esize
    pos = end
print(" ".join(sorted(k for k in entries if k != "ptx")) or "none", entries["ptx"], fatbins)
PY
)
  read -r archs ptx fatbins <<< "$dev"
  echo "  device code: $fatbins fatbin(s), machine code for $archs, $ptx PTX entries"
  [[ $archs == sm_90 ]] || fail "$(basename "$f"): machine code for '$archs', not sm_90 alone"
  [[ $ptx == 0 ]] || fail "$(basename "$f") carries PTX (90-real means none)"
done

# What one device call carries: tracked files, untracked files git does not ignore, .gpu-carry/.
sum_files() { xargs -0 -r stat -c %s -- 2> /dev/null | awk '{s += $1} END {print s + 0}'; }
tracked=$(git ls-files -z --cached | sum_files)
untracked=$(git ls-files -z --others --exclude-standard | sum_files)
carried=$(find "$carry" -type f -print0 | sum_files)
total=$((tracked + untracked + carried))
echo "carried by one call: tracked tree $(mib "$tracked"), untracked-not-ignored $(mib "$untracked")," \
  "$carry/ $(mib "$carried"): total $(mib "$total") (limit here ${limit_mib} MiB, the tool's 64 MiB)"
((total <= limit_mib * 1048576)) ||
  fail "over ${limit_mib} MiB: carry fewer binaries, or build with -DDLTRAIN_SHARED=ON and carry libdltrain.so beside them"
((untracked == 0)) || git ls-files --others --exclude-standard | sed 's/^/  untracked, travels too: /' | head -n 10
((status == 0)) && say "OK: carry=[\"$carry\"] (see scripts/gpu/README.md)"
exit "$status"
