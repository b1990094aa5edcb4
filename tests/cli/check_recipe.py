#!/usr/bin/env python3
"""Checks resnet50's --recipe mlperf against the recipe's own formulas (issue 30).

  check_recipe.py RESNET50 DATA_DIR WORK_DIR

1. ResNet-18 on the small generated folder, `--recipe mlperf --epochs 4` (4 optimizer steps an
   epoch, so 16 steps: 8 of warm-up, 8 of decay), `--metrics` CSV: the learning rate logged
   after every step equals MLPerf's schedule, LinearLR from 1/1000 over the 2 warm-up epochs,
   then (11 - 1e-4) (1 - u/8)^2 + 1e-4, to 1e-9 relative (the schedulers' recursive forms
   round a few ulps of a double per step). The chosen steps the issue names are among them:
   the first, the end of the warm-up, mid-decay, the last.
2. ResNet-50 with the recipe (one test step): its no-decay group holds exactly 107 tensors,
   the 53 BatchNorm weights and biases and the classifier's bias.
"""
import csv
import os
import re
import subprocess
import sys


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"check_recipe.py: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout


def main():
    exe, data, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    metrics = os.path.join(work, "mlperf_lr.csv")
    if os.path.exists(metrics):
        os.remove(metrics)
    out = run([exe, "--data", data, "--arch", "resnet18", "--image-size", "32", "--batch-size", "8",
               "--num-workers", "0", "--recipe", "mlperf", "--epochs", "4", "--metrics", metrics])
    if "optimizer: LARS, poly schedule after a 2-epoch warm-up" not in out:
        sys.exit("check_recipe.py: the recipe's optimizer line is missing:\n" + out)
    lrs = {}
    with open(metrics) as f:
        for row in csv.DictReader(f):
            if row["tag"] == "train/lr":
                lrs[int(row["step"])] = float(row["value"])
    steps_per_epoch, epochs, warm_epochs = 4, 4, 2
    total, warm = steps_per_epoch * epochs, steps_per_epoch * warm_epochs
    base, end = 11.0, 1e-4
    if sorted(lrs) != list(range(1, total + 1)):
        sys.exit(f"check_recipe.py: logged steps {sorted(lrs)}, want 1..{total}")
    bad = 0
    for t in range(1, total + 1):
        if t <= warm:
            want = base * (1e-3 + (1 - 1e-3) * t / warm)
        else:
            want = (base - end) * (1 - (t - warm) / (total - warm)) ** 2 + end
        ok = abs(lrs[t] - want) <= 1e-9 * max(abs(want), 1e-12)
        bad += not ok
        mark = " <- first / end of warm-up / mid-decay / last" if t in (1, warm, warm + (total - warm) // 2, total) else ""
        print(f"{'ok ' if ok else 'BAD'} step {t:2d}: lr {lrs[t]:.12g}, recipe {want:.12g}{mark}")
    out = run([exe, "--data", data, "--arch", "resnet50", "--image-size", "32", "--batch-size", "4",
               "--num-workers", "0", "--recipe", "mlperf", "--test", "--test-nsteps", "1"])
    m = re.search(r"no weight decay on (\d+) norm/bias tensors", out)
    n = int(m.group(1)) if m else -1
    print(f"{'ok ' if n == 107 else 'BAD'} resnet50's no-decay group: {n} tensors (want 107)")
    bad += n != 107
    print(f"{bad} failure(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
