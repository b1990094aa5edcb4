#!/usr/bin/env bash
# ctest cuda.memcheck_families_select_tests: every kernel family that scripts/gpu/first_run.sh
# runs under compute-sanitizer (scripts/gpu/memcheck_families.txt, "family|Catch2 filter") must
# select at least one test of test_cuda, so that a renamed test or a wrong filter shows here, on a
# machine without a GPU (test_cuda lists its tests without one), rather than as "NOT covered" in
# the one GPU run.
#   check_memcheck_families.sh TEST_CUDA FAMILIES_FILE
set -euo pipefail
bin=$1
list=$2
pass=0
fails=0
while IFS= read -r line; do
  [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
  family=${line%%|*}
  filter=${line#*|}
  if [[ $family == "$line" || -z $filter ]]; then
    echo "FAIL  malformed line (want family|filter): $line"
    fails=$((fails + 1))
    continue
  fi
  # Catch2 v2 exits with the number of tests listed, so the count is read, not the status.
  n=$("$bin" --filenames-as-tags --list-test-names-only "$filter" 2> /dev/null | grep -c . || true)
  if ((n > 0)); then
    printf 'ok    %-24s %3d test(s)  %s\n' "$family" "$n" "$filter"
    pass=$((pass + 1))
  else
    printf 'FAIL  %-24s selects no test: %s\n' "$family" "$filter"
    fails=$((fails + 1))
  fi
done < "$list"
((pass + fails > 0)) || { echo "FAIL  no family in $list"; exit 1; }
echo "memcheck families: $pass passed, $fails failed"
((fails == 0))
