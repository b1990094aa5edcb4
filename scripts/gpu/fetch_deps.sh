#!/usr/bin/env bash
# Runs on the DEV machine (which reaches the Debian mirrors), never on the GPU machine: downloads
# into .debs/gpu/ the Debian packages the GPU build needs and the GPU image lacks, so that a
# device `run` with carry [".debs"] brings them along (the GPU machine reaches no registry).
# All are header-only, so Debian 12's packages work on the GPU image whatever its distribution:
#   libeigen3-dev  Eigen 3.4 (the CPU backend; required by CMakeLists.txt)
#   catch2         Catch2 v2 (the tests)
#   nlohmann-json3-dev  nlohmann/json (train/'s JSON output; required by CMakeLists.txt)
#   libcli11-dev   CLI11 (the flags of the examples, tools and benchmarks: apps/common/cli.hpp)
# Extra package names given as arguments are downloaded too. scripts/gpu/build.sh unpacks them
# with `dpkg -x` into .gpu-prefix/. No root needed: apt-get download writes into the cwd.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.debs/gpu
pkgs=(libeigen3-dev catch2 nlohmann-json3-dev libcli11-dev "$@")
limit_mib=64

if [[ $(uname -m) != x86_64 ]]; then
  echo "fetch_deps: warning: this machine is $(uname -m); the GPU machine is x86-64." \
       "Header-only packages still work, anything with binaries would not." >&2
fi
command -v apt-get > /dev/null || { echo "fetch_deps: apt-get not found" >&2; exit 1; }

mkdir -p "$dest"
rm -f "$dest"/*.deb
echo "fetch_deps: downloading ${pkgs[*]} into $dest/"
# APT::Sandbox::User=root: when run as root, apt's _apt user cannot write into the cwd.
(cd "$dest" && apt-get -q -o APT::Sandbox::User=root download "${pkgs[@]}")

shopt -s nullglob
debs=("$dest"/*.deb)
if (( ${#debs[@]} < ${#pkgs[@]} )); then
  echo "fetch_deps: expected ${#pkgs[@]} .deb files, found ${#debs[@]}" >&2
  exit 1
fi
ls -l "${debs[@]}"
deb_bytes=$(du -cb "${debs[@]}" | tail -1 | cut -f1)

# What a device call sends: tracked + untracked-not-ignored files, plus the carried .debs.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard |
  xargs -0 -r stat -c %s -- 2> /dev/null | awk '{s += $1} END {print s + 0}')
total=$((deb_bytes + tree_bytes))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "fetch_deps: .debs/gpu $(mib "$deb_bytes"), working tree $(mib "$tree_bytes")," \
     "total $(mib "$total") of the ${limit_mib} MiB a device call may carry"
if (( total > limit_mib * 1048576 * 9 / 10 )); then
  echo "fetch_deps: warning: within 10% of the ${limit_mib} MiB limit" >&2
fi
