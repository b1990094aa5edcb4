#!/usr/bin/env bash
# Installs every Debian package dltrain needs to build and test, idempotently.
# Usage: scripts/setup.sh [--peers]   (--peers adds PyTorch/torchvision for the benchmark peers
# and the reference-file generators)
set -euo pipefail

pkgs=(cmake g++ make ccache pkg-config libeigen3-dev catch2 libhdf5-dev libturbojpeg0-dev libjpeg62-turbo-dev
      libopenmpi-dev openmpi-bin zlib1g-dev dataset-fashion-mnist)
if [[ "${1:-}" == "--peers" ]]; then
  pkgs+=(python3-torch python3-torchvision python3-numpy)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
