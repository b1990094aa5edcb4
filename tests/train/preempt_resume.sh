#!/usr/bin/env bash
# Preemption end to end: an example (Fashion-MNIST, ResNet) is signalled (SIGUSR1, as Slurm's
# `--signal=USR1@T` does before the wall time) in the middle of an epoch, must save its state at
# the next step boundary and exit with 75 (train::kExitRequeue); the requeued run (--resume)
# must then end with exactly the weights, optimizer and scheduler state of a run that was
# never interrupted (compared bit for bit with dltrain-convert compare, tolerance 0).
#
#   preempt_resume.sh DLTRAIN_CONVERT WORK_DIR STEPS SIGNAL_AFTER EXAMPLE [ARGS...]
# Each run is `EXAMPLE ARGS --test --test-nsteps STEPS --checkpoint FILE`; the signal is sent
# once the example has logged step SIGNAL_AFTER. $PREEMPT_LAUNCHER, when set, prefixes each run
# (tests/mpi/mpirun.sh 2: the signal goes to mpirun, which forwards SIGUSR1 to the ranks).
# $PREEMPT_EXTRA_SECTIONS names further checkpoint sections to compare (extra/ema for --ema).
set -euo pipefail
convert=$1 work=$2 steps=$3 after=$4
shift 4
read -r -a launch <<< "${PREEMPT_LAUNCHER:-}"
common=("$@" --test --test-nsteps "$steps")
fail() {
  echo "preempt_resume: FAILED: $*" >&2
  for f in "$work"/*.log; do echo "--- $f" >&2; tail -n 15 "$f" >&2; done
  exit 1
}
rm -rf "$work"
mkdir -p "$work"

# 1. The reference: the same run, never interrupted.
"${launch[@]}" "${common[@]}" --checkpoint "$work/ref.h5" > "$work/ref.log" 2>&1 ||
  fail "the uninterrupted run failed"

# 2. Signalled once it has logged step $after.
"${launch[@]}" "${common[@]}" --checkpoint "$work/run.h5" > "$work/first.log" 2>&1 &
pid=$!
for _ in $(seq 1 1200); do
  grep -q "step $after/" "$work/first.log" 2> /dev/null && break
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.05
done
kill -USR1 "$pid" || fail "the run ended before it could be signalled"
set +e
wait "$pid"
rc=$?
set -e
[[ $rc == 75 ]] || fail "a signalled run must exit with 75 (train::kExitRequeue), got $rc"
line=$(grep "preempted by SIGUSR1" "$work/first.log") || fail "no 'preempted by SIGUSR1' line"
stopped=$(sed -E 's/.*, step ([0-9]+):.*/\1/' <<< "$line")
((stopped >= after && stopped < steps)) || fail "stopped at step $stopped, not mid-run"
echo "signalled after step $after: stopped and saved at step $stopped of $steps, exit status $rc"

# 3. The requeued job: resumes from the checkpoint and finishes.
"${launch[@]}" "${common[@]}" --checkpoint "$work/run.h5" --resume > "$work/resumed.log" \
  2>&1 || fail "the resumed run failed"
grep -q "resumed from .*step $stopped" "$work/resumed.log" || fail "the run did not resume"

# 4. Bit for bit the uninterrupted run's state.
read -r -a extra_sections <<< "${PREEMPT_EXTRA_SECTIONS:-}"
for section in model optimizer scheduler "${extra_sections[@]}"; do
  "$convert" compare "$work/ref.h5" "$work/run.h5" --section "$section" ||
    fail "the $section state differs from the uninterrupted run's"
done
echo "preempt_resume: resumed run identical to the uninterrupted one (model, optimizer," \
  "scheduler${extra_sections[*]:+, ${extra_sections[*]}})"
