#!/usr/bin/env bash
# Reproducer for a defect found in issue 16 (not run by ctest): the ResNet example with 2
# loader workers, signalled with SIGUSR1 right after its first step, aborted with heap
# corruption ("free(): invalid pointer", "corrupted size vs. prev_size") in about 4 runs in
# 100 while the signal handler ran on the computing threads: a signal delivered during one of
# oneDNN's JIT GEMM kernels (which point rsp into a heap buffer; oneDNN issue #4845) writes its
# frame into the heap. train::PreemptionHandler now blocks the signals there and takes them
# on a watcher thread (see docs/design.md, "Which thread takes the signal").
#
#   preempt_stress.sh BUILD_DIR IMAGE_DIR [RUNS] [SIGNAL_AFTER_STEP]
# IMAGE_DIR: an ImageNet-shaped folder (ctest's example_resnet50_data makes
# BUILD_DIR/examples/resnet50_images). Prints each bad run and the count; core files go to
# the current directory when `ulimit -c` allows. RESNET50 overrides the program (an ASan
# build); KEEP_LOGS=DIR keeps each bad run's whole log there.
set -uo pipefail
build=$1 images=$2 runs=${3:-100} after=${4:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bad=0
for i in $(seq 1 "$runs"); do
  rm -f "$work"/run.h5*
  "${RESNET50:-$build/examples/resnet50}" --data "$images" --arch resnet18 --image-size 32 --batch-size 4 \
    --num-workers 2 --test --test-nsteps 7 --checkpoint "$work/run.h5" > "$work/out.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 400); do
    grep -q "step $after/" "$work/out.log" 2> /dev/null && break
    sleep 0.01
  done
  kill -USR1 "$pid"
  wait "$pid"
  rc=$?
  if [[ $rc != 75 ]]; then
    bad=$((bad + 1))
    echo "run $i: exit status $rc: $(tail -n 1 "$work/out.log")"
    [[ -n "${KEEP_LOGS:-}" ]] && cp "$work/out.log" "$KEEP_LOGS/preempt_bad_$i.log"
  fi
done
echo "preempt_stress: $bad of $runs signalled runs did not exit with 75"
