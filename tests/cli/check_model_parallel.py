#!/usr/bin/env python3
"""examples/model_parallel on every layout it offers against one process (issue 31): the
pipeline (1F1B and GPipe, 2 and 3 stages), tensor parallelism, and each combined with data
parallelism on 4 ranks must train the same model: the same final loss (f32, to 1e-4 relative:
the layouts only reorder sums, about 1e-6 relative per step over 16 steps) and the same test
accuracy of the gathered weights (to one image), and print their rank layout. The pipeline
with activation checkpointing and stages cut by measured forward time is one more such
layout (recomputation gives the same gradients). bf16 autocast (--amp) is compared with one
process under --amp: each layer's output is rounded to bf16 (2^-9 relative) and the pipeline's
micro-batches change the GEMM blocking, so the losses may differ by a few bf16 roundings per
step: 1e-2 relative over the 16 steps.

  check_model_parallel.py MPIRUN_SH MODEL_PARALLEL
"""
import re
import subprocess
import sys

mpirun, prog = sys.argv[1], sys.argv[2]
common = ["--synthetic", "256", "--epochs", "2"]
layouts = [
    (1, []),
    (2, ["--pipeline-stages", "2"]),
    (2, ["--pipeline-stages", "2", "--schedule", "gpipe", "--micro-batches", "3"]),
    (3, ["--pipeline-stages", "3", "--micro-batches", "8"]),
    (2, ["--tensor-parallel", "2"]),
    (4, ["--pipeline-stages", "2", "--batch-size", "16"]),
    (4, ["--tensor-parallel", "2", "--batch-size", "16"]),
    (4, ["--pipeline-stages", "2", "--tensor-parallel", "2"]),
    (2, ["--pipeline-stages", "2", "--checkpoint-activations", "--balance", "time"]),
]
amp_layouts = [(1, ["--amp"]), (2, ["--pipeline-stages", "2", "--amp"])]
ref = None
failed = False
for n, flags in layouts + amp_layouts:
    if flags == ["--amp"]:
        ref = None  # the bf16 runs against one process under --amp
    rtol = 1e-2 if "--amp" in flags else 1e-4
    cmd = ([prog] if n == 1 else [mpirun, str(n), prog]) + common + flags
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    loss = re.search(r"last loss ([0-9.]+)", out)
    acc = re.search(r"test accuracy of the gathered model .*: ([0-9.]+)% on ([0-9]+) images", out)
    layout = re.search(r"rank layout: (.*)", out)
    if r.returncode != 0 or not loss or not acc or (n > 1 and not layout):
        print(f"FAILED: {' '.join(cmd)}: exit {r.returncode}\n{out[-2000:]}")
        failed = True
        continue
    got = (float(loss.group(1)), float(acc.group(1)), int(acc.group(2)))
    if ref is None:
        ref = got
    ok = abs(got[0] - ref[0]) <= rtol * ref[0] and abs(got[1] - ref[1]) <= 100.0 / ref[2] + 1e-9
    print(f"{'ok' if ok else 'FAILED'}: {n} ranks {' '.join(flags) or '(one process)'}: "
          f"{layout.group(1) if layout else 'one process'}; last loss {got[0]} (one process "
          f"{ref[0]}), test accuracy {got[1]}% (one process {ref[1]}%)")
    failed = failed or not ok
sys.exit(1 if failed else 0)
