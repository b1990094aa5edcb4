#!/usr/bin/env bash
# Runs one libFuzzer target under ctest: FUZZER CORPUS_DIR SEED_DIR ARTIFACT_DIR SECONDS.
# New inputs go to CORPUS_DIR (kept between runs of the same build tree, so coverage grows);
# the seeds are read only. A finding leaves its input in ARTIFACT_DIR and fails the test with
# the command that reproduces it.
set -euo pipefail
fuzzer=$1 corpus=$2 seeds=$3 artifacts=$4 seconds=$5
mkdir -p "$corpus" "$artifacts"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp
if ! "$fuzzer" -max_total_time="$seconds" -malloc_limit_mb=2048 -rss_limit_mb=4096 \
  -timeout=20 -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts" \
  "$corpus" "$seeds" 2>&1 | tail -n 60; then
  echo "run_fuzz: $(basename "$fuzzer") found a problem; its input is in $artifacts" \
       "(reproduce: $fuzzer $artifacts<file>)" >&2
  exit 1
fi
