#!/usr/bin/env bash
# Runs on the GPU machine: prints what its image has that the dltrain build and benchmarks
# rely on (OS, GPU and driver, nvcc, CMake, compilers, Python + torch, and where cuDNN, cuBLAS(Lt)
# and NCCL headers and libraries live, system-wide or in pip's nvidia-* packages), and
# compute-sanitizer. Read-only; never fails (a missing tool prints "missing").
set -euo pipefail

# first N: the first N lines of stdin, reading all of it (a bare `head` would SIGPIPE the writer,
# which pipefail turns into a failure).
first() { awk -v n="${1:-1}" 'NR <= n'; }
section() { printf '\n== %s\n' "$1"; }
try() {  # try CMD...: run it, or say it is missing / failed, and carry on
  if ! command -v "$1" > /dev/null 2>&1; then
    echo "$1: missing"
    return 0
  fi
  "$@" 2>&1 || echo "($* failed with status $?)"
}
find_in() {  # find_in NAME-GLOB DIR...: files matching NAME-GLOB under the existing DIRs
  local name=$1
  shift
  local dirs=()
  for d in "$@"; do [[ -d $d ]] && dirs+=("$d"); done
  ((${#dirs[@]})) || return 0
  find "${dirs[@]}" -maxdepth 6 \( -type f -o -type l \) -name "$name" 2> /dev/null | sort -u
}

section "system"
grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release 2> /dev/null || echo "no /etc/os-release"
uname -srm
echo "cpus: $(nproc)   memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
echo "disk free here: $(df -h . | awk 'NR == 2 {print $4}')"
echo "user: $(id -un)   cwd: $PWD   OUT: ${OUT:-unset}"

section "GPU"
try nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap,clocks.sm,clocks.max.sm \
  --format=csv
try nvidia-smi -L

section "CUDA toolkit"
for t in nvcc cuobjdump compute-sanitizer ncu; do
  printf '%-18s %s\n' "$t:" "$(command -v "$t" || echo missing)"
done
try nvcc --version | tail -n 2
ls -d /usr/local/cuda* 2> /dev/null || echo "no /usr/local/cuda*"
[[ -n ${CUDA_HOME:-} ]] && echo "CUDA_HOME=$CUDA_HOME"
if [[ -z $(command -v compute-sanitizer || true) ]]; then
  find_in compute-sanitizer /usr/local /opt | first 3
fi

section "build tools"
try cmake --version | first 1
echo "cmake: $(command -v cmake || echo missing)"
try ninja --version
try make --version | first 1
try g++ --version | first 1
try c++ --version | first 1
try ccache --version | first 1
for t in dpkg dpkg-deb ar tar xz zstd; do printf '%-10s %s\n' "$t:" "$(command -v "$t" || echo missing)"; done

section "python + torch"
py=$(command -v python3 || true)
echo "python3: ${py:-missing}"
site=""
if [[ -n $py ]]; then
  python3 --version
  python3 - << 'PY' 2>&1 || true
import importlib, sysconfig
print("purelib:", sysconfig.get_paths()["purelib"])
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda,
          "cudnn", torch.backends.cudnn.version(), "gpu available", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("device:", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
    print("torch.compile:", hasattr(torch, "compile"))
except Exception as e:
    print("torch: not importable:", e)
for m in ("torchvision", "triton", "numpy"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        print(m + ": missing (" + type(e).__name__ + ")")
PY
  site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2> /dev/null || true)
fi

section "libraries (system: /usr/include, /usr/lib*, /usr/local/cuda*; pip: site-packages/nvidia)"
sys_inc=(/usr/include /usr/local/include /usr/local/cuda/include /usr/local/cuda/targets/x86_64-linux/include)
sys_lib=(/usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/lib /usr/local/cuda/lib64 /usr/local/cuda/lib
  /usr/local/cuda/targets/x86_64-linux/lib)
pip_nv=()
[[ -n $site && -d $site/nvidia ]] && pip_nv=("$site/nvidia")
for what in cudnn.h cudnn_version.h 'libcudnn.so*' 'libcudnn_graph.so*' cublasLt.h 'libcublasLt.so*' \
  'libcublas.so*' 'libcudart.so*' nccl.h 'libnccl.so*'; do
  echo "-- $what"
  { find_in "$what" "${sys_inc[@]}" "${sys_lib[@]}" "${pip_nv[@]}"; } | first 8
done
if [[ ${#pip_nv[@]} -gt 0 ]]; then
  echo "-- pip nvidia packages: $(find "$site/nvidia" -mindepth 1 -maxdepth 1 -printf '%f ')"
fi
echo "-- ldconfig: $(ldconfig -p 2> /dev/null | grep -cE 'libcudnn|libcublas|libnccl' || true) cuDNN/cuBLAS/NCCL entries"
ldconfig -p 2> /dev/null | grep -E 'libcudnn\.so|libcublasLt\.so|libnccl\.so' | first 6 || true

section "headers the build needs"
for h in eigen3/Eigen/Core catch2/catch.hpp; do
  found=$(find_in "$(basename "$h")" /usr/include /usr/local/include | grep -F "$h" | first 1)
  printf '%-22s %s\n' "$h:" "${found:-not installed (comes from .debs/gpu)}"
done
shopt -s nullglob
debs=(.debs/gpu/*.deb)
echo "carried .debs/gpu: ${#debs[@]} package(s) ${debs[*]:-(none: carry [\".debs\"])}"
