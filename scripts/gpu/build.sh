#!/usr/bin/env bash
# Runs on the GPU machine (no network), for the later calls that build there (the first run
# carries binaries built by build_here.sh instead): unpacks the carried .debs/gpu/*.deb (Eigen,
# Catch2) into .gpu-prefix/, finds cuDNN (system first, then pip's nvidia-cudnn package that PyTorch uses),
# configures build-gpu/ (Release, CUDA on, sm_90, no HDF5/JPEG/MPI/examples/tools) and builds.
#
#   bash scripts/gpu/build.sh                 # targets test_cuda and resnet50_synthetic
#   bash scripts/gpu/build.sh --all           # everything (the CPU test binaries too, for ctest)
#   bash scripts/gpu/build.sh --target NAME   # NAME instead (repeatable)
#   bash scripts/gpu/build.sh --examples      # configure with the examples and tools on
#   bash scripts/gpu/build.sh --jpeg --target dataloader
#                                             # JPEG on (needs fetch_deps.sh libturbojpeg0
#                                             # libturbojpeg0-dev libjpeg62-turbo
#                                             # libjpeg62-turbo-dev run here first)
#   bash scripts/gpu/build.sh --configure-only
#   bash scripts/gpu/build.sh --env-only      # only find the libraries and write env.sh (for
#                                             # binaries built elsewhere and carried here)
#
# Writes .gpu-prefix/env.sh (LD_LIBRARY_PATH for libraries that came from pip), which the calls
# in scripts/gpu/README.md source. The full build log goes to $OUT/build.log
# (build-gpu/build.log without OUT); the console gets a summary, and the errors when the build fails.
# Environment: BUILD_DIR (build-gpu), JOBS (nproc), CUDA_ARCH (90), CUDNN_ROOT (skip the search),
# CUDNN_FROM (auto: system first, then pip; or system, or pip), NATIVE (ON: -march=native; OFF
# for binaries that must run on another machine's CPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
build=${BUILD_DIR:-build-gpu}
jobs=${JOBS:-$(nproc)}
arch=${CUDA_ARCH:-90}
prefix=$root/.gpu-prefix
targets=()
all=0
examples=OFF
jpeg=OFF
configure_only=0
env_only=0
while (($#)); do
  case $1 in
    --all) all=1 ;;
    --target) targets+=("$2"); shift ;;
    --examples) examples=ON ;;
    --jpeg) jpeg=ON ;;
    --configure-only) configure_only=1 ;;
    --env-only) env_only=1 ;;
    -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
((${#targets[@]})) || targets=(test_cuda resnet50_synthetic)
logdir=${OUT:-$root/$build}
mkdir -p "$logdir" "$build"
log=$logdir/build.log
t_start=$SECONDS
say() { echo "build.sh: $*"; }
die() { echo "build.sh: error: $*" >&2; exit 1; }

# --- 1. header-only dependencies from the carried .debs ----------------------------------------
shopt -s nullglob
debs=("$root"/.debs/gpu/*.deb)
((${#debs[@]} || env_only)) || die "no .debs/gpu/*.deb here: run scripts/gpu/fetch_deps.sh on the dev machine" \
  "and pass carry [\".debs\"] to the device run"
mkdir -p "$prefix"
((env_only)) || rm -rf "${prefix:?}/usr"
((env_only)) && debs=()
for deb in "${debs[@]}"; do
  if command -v dpkg-deb > /dev/null; then
    dpkg-deb -x "$deb" "$prefix"
  else  # no dpkg: a .deb is an ar archive holding data.tar.{xz,zst,gz}
    tmp=$(mktemp -d)
    (cd "$tmp" && ar x "$deb")
    tar -xf "$tmp"/data.tar.* -C "$prefix"
    rm -rf "$tmp"
  fi
done
if ((!env_only)); then
  [[ -f $prefix/usr/share/eigen3/cmake/Eigen3Config.cmake ]] || die "Eigen3Config.cmake missing after unpacking"
  [[ -f $prefix/usr/lib/cmake/Catch2/Catch2Config.cmake ]] || die "Catch2Config.cmake missing after unpacking"
  [[ -f $prefix/usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake ]] ||
    die "nlohmann_jsonConfig.cmake missing after unpacking: re-run scripts/gpu/fetch_deps.sh (it now fetches nlohmann-json3-dev)"
  [[ -f $prefix/usr/include/CLI/CLI.hpp ]] ||
    die "CLI/CLI.hpp missing after unpacking: re-run scripts/gpu/fetch_deps.sh (it now fetches libcli11-dev)"
  say "unpacked ${#debs[@]} package(s) into $prefix/usr"
fi

# --- 2. CUDA toolkit, cuDNN, cuBLAS -------------------------------------------------------------
nvcc=$(command -v nvcc || true)
[[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
[[ -n $nvcc ]] || die "nvcc not found (PATH, /usr/local/cuda/bin)"
cuda_root=$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2> /dev/null || true)
ld_dirs=()

first_file() {  # first_file NAME DIR...: the first DIR/NAME that exists
  local name=$1 d
  shift
  for d in "$@"; do
    [[ -e $d/$name ]] && { echo "$d/$name"; return 0; }
  done
  return 1
}

inc_dirs=(/usr/include /usr/include/x86_64-linux-gnu "$cuda_root/include"
  "$cuda_root/targets/x86_64-linux/include" /usr/local/include)
lib_dirs=(/usr/lib/x86_64-linux-gnu /usr/lib64 "$cuda_root/lib64" "$cuda_root/lib"
  "$cuda_root/targets/x86_64-linux/lib" /usr/local/lib)
cudnn_h="" cudnn_lib=""
cudnn_from=${CUDNN_FROM:-auto}
if [[ -n ${CUDNN_ROOT:-} ]]; then
  cudnn_h=$(first_file cudnn.h "$CUDNN_ROOT/include") || die "no cudnn.h under CUDNN_ROOT=$CUDNN_ROOT"
  cudnn_lib=$(first_file libcudnn.so "$CUDNN_ROOT/lib64" "$CUDNN_ROOT/lib" ||
    first_file libcudnn.so.9 "$CUDNN_ROOT/lib64" "$CUDNN_ROOT/lib") || die "no libcudnn under $CUDNN_ROOT"
  cudnn_from="CUDNN_ROOT"
elif [[ $cudnn_from != pip ]] && cudnn_h=$(first_file cudnn.h "${inc_dirs[@]}") &&
  cudnn_lib=$(first_file libcudnn.so "${lib_dirs[@]}" || first_file libcudnn.so.9 "${lib_dirs[@]}"); then
  cudnn_from="system"
elif [[ $cudnn_from == system ]]; then
  die "no system cuDNN (cudnn.h + libcudnn.so*) in ${inc_dirs[*]} / ${lib_dirs[*]}"
else
  # PyTorch's wheel dependency nvidia-cudnn-cu13: nvidia/cudnn/{include,lib} (or nvidia/cu13/...).
  cudnn_h="" cudnn_lib=""
  if [[ -n $site && -d $site/nvidia ]]; then
    cudnn_h=$(find "$site/nvidia" -maxdepth 4 -name cudnn.h | sort | head -n 1 || true)
    cudnn_lib=$(find "$site/nvidia" -maxdepth 4 \( -name libcudnn.so -o -name 'libcudnn.so.9*' \) |
      sort | head -n 1 || true)
  fi
  [[ -n $cudnn_h && -n $cudnn_lib ]] || die "cuDNN not found: no cudnn.h + libcudnn.so* in" \
    "${inc_dirs[*]} / ${lib_dirs[*]} nor under ${site:-<no python3>}/nvidia; set CUDNN_ROOT"
  cudnn_from="pip ($site/nvidia)"
fi
# cuDNN 9 dlopens its sub-libraries (libcudnn_graph, _engines_*, _ops, ...) from the loader path.
ld_dirs+=("$(dirname "$(readlink -f "$cudnn_lib")")")
# FindCUDNN looks for the unversioned libcudnn.so; pip ships only libcudnn.so.9, so give it a
# directory of symlinks (and pass the exact paths, which skip FindCUDNN's search altogether).
shim=$prefix/cudnn
rm -rf "$shim"
mkdir -p "$shim/lib"
ln -s "$(dirname "$cudnn_h")" "$shim/include"
for f in "$(dirname "$(readlink -f "$cudnn_lib")")"/libcudnn*.so*; do
  ln -sf "$(readlink -f "$f")" "$shim/lib/$(basename "$f")"
done
[[ -e $shim/lib/libcudnn.so ]] || ln -s "$(readlink -f "$cudnn_lib")" "$shim/lib/libcudnn.so"
say "cuDNN from $cudnn_from: $cudnn_h, $cudnn_lib"

# cuBLAS / cuBLASLt come with the toolkit; if this one lacks them, fall back to pip's nvidia-cublas.
cmake_lib_path=""
if ! first_file libcublasLt.so "${lib_dirs[@]}" > /dev/null; then
  lt=""
  if [[ -n $site && -d $site/nvidia ]]; then
    lt=$(find "$site/nvidia" -maxdepth 4 -name 'libcublasLt.so*' | sort | head -n 1 || true)
  fi
  [[ -n $lt ]] || die "libcublasLt.so is in neither the CUDA toolkit ($cuda_root) nor pip's nvidia-cublas"
  mkdir -p "$prefix/lib"
  for f in "$(dirname "$lt")"/libcublas*.so.*; do
    base=$(basename "$f")
    ln -sf "$f" "$prefix/lib/${base%%.so.*}.so"
  done
  cmake_lib_path=$prefix/lib
  ld_dirs+=("$(dirname "$lt")")
  say "cuBLAS from pip: $(dirname "$lt")"
fi

# NCCL (the distributed NCCL group): the toolkit's or system's, else pip's nvidia-nccl; without
# it the build has MPI/NCCL stubs and the NCCL tests fail with "built without NCCL".
nccl_args=()
if ! first_file nccl.h "${inc_dirs[@]}" > /dev/null; then
  nh="" nl=""
  if [[ -n $site && -d $site/nvidia ]]; then
    nh=$(find "$site/nvidia" -maxdepth 4 -name nccl.h | sort | head -n 1 || true)
    nl=$(find "$site/nvidia" -maxdepth 4 -name 'libnccl.so*' | sort | head -n 1 || true)
  fi
  if [[ -n $nh && -n $nl ]]; then
    mkdir -p "$prefix/nccl"
    ln -sf "$(readlink -f "$nl")" "$prefix/nccl/libnccl.so"
    nccl_args=(-DNCCL_INCLUDE_DIR="$(dirname "$nh")" -DNCCL_LIBRARY="$prefix/nccl/libnccl.so")
    ld_dirs+=("$(dirname "$(readlink -f "$nl")")")
    say "NCCL from pip: $nh, $nl"
  else
    say "NCCL not found (no nccl.h in ${inc_dirs[*]} nor pip's nvidia/nccl): NCCL groups stubbed"
  fi
fi

# Runtime search path for libraries not in the loader's default dirs; the calls source it.
# The toolkit's own lib dirs come last (cudart, cuBLAS: binaries built on another machine carry
# that machine's RUNPATH).
# --jpeg: libturbojpeg/libjpeg unpacked from .debs/gpu (fetch_deps.sh libturbojpeg0 ...).
[[ $jpeg == ON ]] && ld_dirs+=("$prefix/usr/lib/x86_64-linux-gnu")
for d in "$cuda_root/lib64" "$cuda_root/lib" "$cuda_root/targets/x86_64-linux/lib"; do
  [[ -d $d ]] && ld_dirs+=("$(readlink -f "$d")")
done
ld_path=$(printf '%s\n' "${ld_dirs[@]}" | awk 'NF && !seen[$0]++' | paste -sd: -)
{
  echo "# written by scripts/gpu/build.sh"
  [[ -n $ld_path ]] && echo "export LD_LIBRARY_PATH=\"$ld_path\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
  echo "export DLTRAIN_GPU_BUILD=\"$root/$build\""
} > "$prefix/env.sh"
[[ -n $ld_path ]] && export LD_LIBRARY_PATH="$ld_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ((env_only)); then
  say "wrote $prefix/env.sh (--env-only): LD_LIBRARY_PATH=$ld_path"
  exit 0
fi

# --- 3. configure -----------------------------------------------------------------------------
command -v cmake > /dev/null || die "cmake not found"
cmake_args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDLTRAIN_CUDA=ON
  -DDLTRAIN_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$nvcc"
  -DDLTRAIN_HDF5=OFF -DDLTRAIN_JPEG="$jpeg" -DDLTRAIN_MPI=OFF
  -DDLTRAIN_BUILD_EXAMPLES="$examples" -DDLTRAIN_BUILD_TOOLS="$examples"
  -DDLTRAIN_NATIVE="${NATIVE:-ON}"
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DCUDNN_ROOT="$shim"
  -DCUDNN_INCLUDE_DIR="$(dirname "$cudnn_h")" -DCUDNN_LIBRARY="$shim/lib/libcudnn.so")
[[ -n $cmake_lib_path ]] && cmake_args+=(-DCMAKE_LIBRARY_PATH="$cmake_lib_path")
((${#nccl_args[@]})) && cmake_args+=("${nccl_args[@]}")
if [[ ! -f $build/CMakeCache.txt ]] && command -v ninja > /dev/null; then
  cmake_args+=(-G Ninja)
fi
cmake_major=$(cmake --version | awk 'NR == 1 {split($3, v, "."); print v[1]}')
# CMake 4 refuses packages whose config files declare policies older than 3.5.
((cmake_major >= 4)) && cmake_args+=(-DCMAKE_POLICY_VERSION_MINIMUM=3.5)

say "configuring $build ($(cmake --version | awk 'NR == 1'), nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), sm_$arch)"
if ! cmake "${cmake_args[@]}" > "$log" 2>&1; then
  tail -n 40 "$log"
  die "configure failed (full log: $log)"
fi
grep -E '^-- dltrain:' "$log" || true
if ((configure_only)); then
  say "configured $build (--configure-only); log: $log"
  exit 0
fi

# --- 4. build ---------------------------------------------------------------------------------
build_args=(--build "$build" -j "$jobs")
((all)) || build_args+=(--target "${targets[@]}")
say "building $( ((all)) && echo 'all targets' || echo "${targets[*]}") with -j$jobs"
t_build=$SECONDS
if ! cmake "${build_args[@]}" >> "$log" 2>&1; then
  echo "---- first errors:"
  grep -nE 'error|Error [0-9]|undefined reference' "$log" | head -n 40 || true
  echo "---- end of log:"
  tail -n 25 "$log"
  die "build failed after $((SECONDS - t_build)) s (full log: $log)"
fi
warnings=$(grep -c 'warning' "$log" || true)
say "built in $((SECONDS - t_build)) s ($((SECONDS - t_start)) s in all), $warnings warning line(s); log: $log"
if ((warnings)); then grep -m 10 'warning' "$log"; fi
