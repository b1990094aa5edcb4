#!/usr/bin/env python3
"""examples/model_parallel --checkpoint / --resume (issue 31): a pipeline run's checkpoint is
one ordinary checkpoint of the whole model and its AdamW state, which a single process loads
and resumes from, and from which a pipeline of another depth resumes. Each resumed run must end
where the uninterrupted 2-stage run ends:

  - resumed on 3 stages (same schedule, the same sums in the same order per micro-batch): the
    same model and optimizer state, bit for bit;
  - resumed in one process: the batch's gradient is summed whole instead of per micro-batch,
    which changes its rounding, and AdamW divides each gradient by its own running magnitude:
    where a gradient is rounding noise or near eps (the attention's key bias, whose exact
    gradient is 0; weights whose gradient cancels), two summation orders can move a weight by
    anything up to lr per step each way. The bound is that: |diff| <= 2 x 4 steps x lr = 8e-3
    per weight (a misloaded checkpoint differs by the weights' own size, ~0.1); the optimizer
    state is compared where the arithmetic is the same (above, and below).

A 2-stage run signalled (SIGUSR1 to mpirun, which forwards it to the ranks, as Slurm's
--signal=USR1@T does) in the middle of its epoch must save and exit 75; resumed with --resume
it must end with exactly the uninterrupted run's model and optimizer state (tolerance 0: the
same ops on the same rows in the same order).

And a run on 2 stages x 2 tensor-parallel shards (4 ranks) checkpoints the same ordinary
file (tensor-parallel blocks gathered, then the stages): resumed on the same layout it ends bit
for bit where the uninterrupted 2 x 2 run ends (model and optimizer), and one process resumes
from it too (to the one-process bound above).

  check_model_parallel_resume.py MPIRUN_SH MODEL_PARALLEL DLTRAIN_CONVERT WORKDIR
"""
import os
import re
import shutil
import subprocess
import sys

mpirun, prog, convert, work = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
common = ["--synthetic", "64", "--batch-size", "16", "--depth", "2", "--dim", "32"]
failed = False


def run(n, flags, expect_rc=0):
    cmd = ([prog] if n == 1 else [mpirun, str(n), prog]) + common + flags
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    if r.returncode != expect_rc:
        print(f"FAILED: {' '.join(cmd)}: exit {r.returncode} (want {expect_rc})\n{out[-2000:]}")
        sys.exit(1)
    return out


def path(name):
    return os.path.join(work, name)


run(2, ["--pipeline-stages", "2", "--epochs", "2", "--checkpoint", path("full.h5")])
run(2, ["--pipeline-stages", "2", "--epochs", "1", "--checkpoint", path("half.h5")])
shutil.copy(path("half.h5"), path("one.h5"))
shutil.copy(path("half.h5"), path("three.h5"))
for n, flags, name in [(1, [], "one.h5"), (3, ["--pipeline-stages", "3"], "three.h5")]:
    out = run(n, flags + ["--epochs", "2", "--resume", "--checkpoint", path(name)])
    ok = re.search(r"resumed from .*: epoch 2, step 4", out) is not None
    print(f"{'ok' if ok else 'FAILED'}: {n} rank(s) {' '.join(flags)} resumed at epoch 2, step 4")
    failed = failed or not ok



def read_safetensors(file):
    """{name: (shape, [values])} of a safetensors file (F32, F64, I64, U8), without numpy."""
    import array
    import json
    import struct
    raw = open(file, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    codes = {"F32": "f", "F64": "d", "I64": "q", "U8": "B"}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        values = array.array(codes[info["dtype"]])
        values.frombytes(raw[8 + n + a:8 + n + b])
        out[name] = (info["shape"], list(values))
    return out


def compare(ref, name, section, rtol, atol):
    files = []
    for f in (ref, name):
        st = path(f"{f}.{section}.safetensors")
        subprocess.run([convert, "convert", path(f), st, "--section", section], check=True,
                       capture_output=True)
        files.append(read_safetensors(st))
    want, got = files
    if sorted(want) != sorted(got):
        return False, f"other tensors: {sorted(set(want) ^ set(got))}"
    worst, where = 0.0, ""
    for t, (shape, a) in want.items():
        if got[t][0] != shape:
            return False, f"{t}: shape {got[t][0]} (want {shape})"
        for i, (x, y) in enumerate(zip(a, got[t][1])):
            bound = atol + rtol * abs(x)
            if abs(x - y) > bound:
                return False, f"{t}[{i}]: {y} (want {x}, bound {bound:g})"
            if abs(x - y) > 0 and (bound == 0 or abs(x - y) / bound > worst):
                worst, where = abs(x - y) / bound if bound > 0 else float("inf"), t
    return True, (f"{len(want)} tensors, worst |diff| / bound {worst:.3g} ({where})" if where
                  else f"{len(want)} tensors, identical")


for name, section, atol in [("three.h5", "model", 0.0), ("three.h5", "optimizer", 0.0),
                            ("one.h5", "model", 8e-3)]:
    ok, msg = compare("full.h5", name, section, 0.0, atol)
    print(f"{'ok' if ok else 'FAILED'}: {section} of the run resumed from {name} against the "
          f"uninterrupted one (|diff| <= {atol:g}): {msg}")
    failed = failed or not ok

# Preemption mid-epoch: 4096 images, 256 steps of 16; the signal once step 10 is logged.
import signal
import time

long = ["--pipeline-stages", "2", "--epochs", "1", "--synthetic", "4096"]
run(2, long + ["--checkpoint", path("long_ref.h5")])
with open(path("first.log"), "w") as log:
    proc = subprocess.Popen([mpirun, "2", prog] + common + long +
                            ["--checkpoint", path("long.h5")], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(1200):
        if proc.poll() is not None or "step 10 " in open(path("first.log")).read():
            break
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(signal.SIGUSR1)
    rc = proc.wait(timeout=300)
first = open(path("first.log")).read()
m = re.search(r"preempted by SIGUSR1: saved .* at epoch 1, step ([0-9]+)", first)
ok = rc == 75 and m is not None and 10 <= int(m.group(1)) < 256
print(f"{'ok' if ok else 'FAILED'}: signalled after step 10: exit {rc}, "
      f"{'stopped at step ' + m.group(1) if m else 'no preempted line: ' + first[-500:]}")
failed = failed or not ok
if ok:
    out = run(2, long + ["--checkpoint", path("long.h5"), "--resume"])
    resumed = re.search(r"resumed from .*: epoch 1, step ([0-9]+), ([0-9]+) samples", out)
    ok = resumed is not None and resumed.group(1) == m.group(1) and \
        int(resumed.group(2)) == 16 * int(m.group(1))
    print(f"{'ok' if ok else 'FAILED'}: resumed mid-epoch at step {m.group(1)}")
    failed = failed or not ok
    for section in ("model", "optimizer"):
        r = subprocess.run([convert, "compare", path("long_ref.h5"), path("long.h5"),
                            "--section", section], capture_output=True, text=True)
        ok = r.returncode == 0
        print(f"{'ok' if ok else 'FAILED'}: {section} after the preempted and resumed run, bit "
              f"for bit the uninterrupted one's: {r.stdout.strip().splitlines()[-1]}")
        failed = failed or not ok

pt = ["--pipeline-stages", "2", "--tensor-parallel", "2"]
run(4, pt + ["--epochs", "2", "--checkpoint", path("pt_full.h5")])
run(4, pt + ["--epochs", "1", "--checkpoint", path("pt.h5")])
shutil.copy(path("pt.h5"), path("pt_one.h5"))
for n, flags, name in [(4, pt, "pt.h5"), (1, [], "pt_one.h5")]:
    out = run(n, flags + ["--epochs", "2", "--resume", "--checkpoint", path(name)])
    ok = re.search(r"resumed from .*: epoch 2, step 4", out) is not None
    print(f"{'ok' if ok else 'FAILED'}: {n} rank(s) {' '.join(flags)} resumed the 2 x 2 "
          f"(pipeline x tensor) checkpoint")
    failed = failed or not ok
for ref, name, section, atol in [("pt_full.h5", "pt.h5", "model", 0.0),
                                 ("pt_full.h5", "pt.h5", "optimizer", 0.0),
                                 ("pt_full.h5", "pt_one.h5", "model", 8e-3)]:
    ok, msg = compare(ref, name, section, 0.0, atol)
    print(f"{'ok' if ok else 'FAILED'}: {section} of the run resumed from {name} against the "
          f"uninterrupted 2 x 2 run (|diff| <= {atol:g}): {msg}")
    failed = failed or not ok
sys.exit(1 if failed else 0)
