#!/usr/bin/env bash
# The Slurm job files of examples/*/slurm, run with a fake srun and scontrol on PATH:
# each must ask for --cpus-per-task and --signal=USR1@..., hand its CPUs to srun
# (SRUN_CPUS_PER_TASK, which srun >= 22.05 needs), start one task per GPU with --mpi=pmix when
# there are several, and turn the program's exit 75 (state saved on a signal) into
# `scontrol requeue <job id>` and exit 0, any other failure into its own exit status.
# Usage: check_job_files.sh DIR [MIN_FILES (4)]
set -uo pipefail
dir=$1 min_files=${2:-4}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin"
cat > "$tmp/bin/srun" <<'X'
#!/usr/bin/env bash
echo "srun $* SRUN_CPUS_PER_TASK=${SRUN_CPUS_PER_TASK:-unset}" >> "$LOG"
exit "${FAKE_RC:-0}"
X
cat > "$tmp/bin/scontrol" <<'X'
#!/usr/bin/env bash
echo "scontrol $*" >> "$LOG"
X
chmod +x "$tmp/bin/srun" "$tmp/bin/scontrol"
fail=0
bad() { echo "FAIL $1: $2"; fail=1; }
files=("$dir"/*.slurm)
(( ${#files[@]} >= min_files )) || bad "$dir" "expected $min_files job files at least, found ${#files[@]}"
for f in "${files[@]}"; do
  name=$(basename "$f")
  bash -n "$f" || bad "$name" "bash -n"
  grep -q '^#SBATCH --cpus-per-task=[0-9]' "$f" || bad "$name" "no #SBATCH --cpus-per-task"
  grep -q '^#SBATCH --signal=USR1@[0-9]' "$f" || bad "$name" "no #SBATCH --signal=USR1@seconds"
  tasks=$(sed -n 's/^#SBATCH --ntasks-per-node=\([0-9]*\).*/\1/p' "$f")
  gpus=$(sed -n 's/^#SBATCH --gres=gpu:\([0-9]*\).*/\1/p' "$f")
  if [[ -n "$gpus" && "${tasks:-1}" != "$gpus" ]]; then
    bad "$name" "--ntasks-per-node=${tasks:-1} but --gres=gpu:$gpus: one task per GPU"
  fi
  for rc in 0 75 3; do
    export LOG="$tmp/log" FAKE_RC=$rc
    rm -f "$LOG"
    env PATH="$tmp/bin:$PATH" SLURM_JOB_ID=4242 SLURM_CPUS_PER_TASK=7 DSDIR=/datasets \
      bash "$f" > "$tmp/out" 2>&1
    got=$?
    grep -q "^srun .*SRUN_CPUS_PER_TASK=7$" "$LOG" || bad "$name" "srun did not get SRUN_CPUS_PER_TASK=7: $(cat "$LOG")"
    if [[ "${tasks:-1}" -gt 1 ]] && ! grep -q "^srun --mpi=pmix " "$LOG"; then
      bad "$name" "several tasks but srun without --mpi=pmix"
    fi
    case $rc in
      0) [[ $got == 0 ]] || bad "$name" "exit $got after a successful run" ;;
      75) [[ $got == 0 ]] && grep -q "^scontrol requeue 4242$" "$LOG" ||
            bad "$name" "exit 75 must requeue job 4242 and exit 0 (exit $got, log: $(cat "$LOG"))" ;;
      3) [[ $got == 3 ]] && ! grep -q scontrol "$LOG" ||
            bad "$name" "a failure (3) must be the job's exit status without requeue (exit $got)" ;;
    esac
  done
  echo "checked $name (tasks per node ${tasks:-1}, GPUs ${gpus:-0})"
done
exit $fail
