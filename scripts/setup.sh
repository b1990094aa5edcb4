#!/usr/bin/env bash
# Installs every Debian package dltrain needs to build and test, idempotently.
# Usage: scripts/setup.sh [--peers]   (--peers adds PyTorch/torchvision: Debian's python3-torch
# 1.13 for /usr/bin/python3, which the reference-file generators use for golden values, and a
# current PyPI torch + torchvision (oneDNN + MKL, the fair speed peer) + onnx + onnxruntime (the
# ONNX export test) in the virtual environment .venv-peers, made with the `python3` first on
# PATH; several GB)
set -euo pipefail

pkgs=(cmake g++ make ccache pkg-config libeigen3-dev catch2 libhdf5-dev libturbojpeg0-dev libjpeg62-turbo-dev
      libopenmpi-dev openmpi-bin libdnnl-dev zlib1g-dev dataset-fashion-mnist
      nlohmann-json3-dev libcli11-dev libprotobuf-dev protobuf-compiler libisal-dev libpng-dev python3-venv python3-pip
      libonnx-dev  # onnx/onnx.proto for io::export_onnx (src/io/onnx_write.cpp)
      python3-matplotlib  # tools/dltrain-plot
      python3-h5py  # tests/io/h5py_reads.py: checkpoints and packed shards read by h5py
      lua5.4  # luac -p on the Lmod modulefile (tests/packaging)
      clang-14 libclang-rt-14-dev)  # clang: the sanitizer + libFuzzer tree (scripts/sanitize.sh)
if [[ "${1:-}" == "--peers" ]]; then
  pkgs+=(python3-torch python3-torchvision python3-numpy)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
peers_venv() {
  [[ "${1:-}" == "--peers" ]] || return 0
  local venv
  venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-peers"
  if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "import torch, torchvision, onnx, onnxruntime" 2>/dev/null; then
    echo "setup: $venv has torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
    return 0
  fi
  echo "setup: installing PyPI torch + torchvision + onnx + onnxruntime into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  # onnx + onnxruntime: tests/io/onnx_runtime_check.py runs the files io::export_onnx writes.
  "$venv/bin/pip" install -q torch torchvision numpy onnx onnxruntime
}
# oneDNN 3.x for the CPU convolutions, batch norm and pooling: PyPI's onednn-devel-cpu-gomp
# (oneDNN 3.2.0, built on GNU OpenMP like Debian's, so dltrain's parallel_for shares its thread
# team) into the git-ignored prefix .deps/onednn, which CMake takes before Debian's libdnnl-dev
# (2.6, installed above and the fallback when PyPI cannot be reached). PyPI's newer `onednn`
# wheels are SYCL + TBB builds and do not fit (docs/design.md, "CPU ops"). Uses Debian's
# /usr/bin/python3 (its pip; --prefix installs nothing into that Python), whatever python3 is
# first on PATH.
onednn_prefix() {
  local prefix py=/usr/bin/python3 pkgs=(onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0)
  prefix="$(cd "$(dirname "$0")/.." && pwd)/.deps/onednn"
  if [[ -f $prefix/lib/libdnnl.so.3 && -f $prefix/lib/cmake/dnnl/dnnl-config.cmake ]]; then
    echo "setup: oneDNN $(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")/\1/p' \
      "$prefix/lib/cmake/dnnl/dnnl-config-version.cmake") in $prefix"
    return 0
  fi
  echo "setup: installing ${pkgs[*]} from PyPI into $prefix with $py -m pip"
  # DEB_PYTHON_INSTALL_LAYOUT: Debian's pip would otherwise put a --prefix install under
  # $prefix/local/.
  if ! DEB_PYTHON_INSTALL_LAYOUT=deb_system "$py" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
    --no-deps --ignore-installed --prefix "$prefix" "${pkgs[@]}" ||
    [[ ! -f $prefix/lib/cmake/dnnl/dnnl-config.cmake ]]; then
    echo "setup: WARNING: could not install oneDNN 3 from PyPI; builds use Debian's libdnnl-dev 2.6"
  fi
}
# .venv-tb: TensorBoard's own event reader (and pillow to decode the images) for the test that
# reads dltrain's event files back (tests/train/read_events.py); about 180 MB, no GPU libraries.
tb_venv() {
  local venv
  venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-tb"
  if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "import tensorboard, PIL" 2>/dev/null; then
    return 0
  fi
  echo "setup: installing tensorboard + pillow into $venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q tensorboard pillow
}
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#pkgs[@]} packages present"
  onednn_prefix
  tb_venv
  peers_venv "${1:-}"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
onednn_prefix
tb_venv
peers_venv "${1:-}"
