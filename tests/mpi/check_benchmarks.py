#!/usr/bin/env python3
"""Runs the MPI benchmarks (allreduce, ddp_overlap) briefly on 2 ranks and reads their JSON
back: every field the docs quote is there and consistent (busbw = algbw * 2(n-1)/n, bytes
growing x4, buckets ready in order and within the backward, bucket sizes adding up to the
gradients). A smoke test of the programs, not a speed test.

    check_benchmarks.py MPIRUN_SH ALLREDUCE DDP_OVERLAP OUT_DIR
"""
import json
import math
import os
import subprocess
import sys


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, timeout=600)


def main():
    mpirun, allreduce, ddp_overlap, out = sys.argv[1:5]
    os.makedirs(out, exist_ok=True)
    ar_json, ddp_json = os.path.join(out, "allreduce.json"), os.path.join(out, "ddp.json")
    for f in (ar_json, ddp_json):
        if os.path.exists(f):
            os.remove(f)
    run([mpirun, "2", allreduce, "--min-bytes", "4096", "--max-bytes", "262144", "--iters", "3",
         "--warmup", "1", "--json", ar_json])
    ar = json.load(open(ar_json))
    rows = ar["rows"]
    assert len(rows) == 4, rows  # 4 KiB, 16 KiB, 64 KiB, 256 KiB
    n = ar["ranks"]
    assert n == 2, ar
    for i, r in enumerate(rows):
        assert r["bytes"] == 4096 * 4 ** i, r
        assert r["algbw_gbs"] > 0 and math.isfinite(r["algbw_gbs"]), r
        assert abs(r["busbw_gbs"] - r["algbw_gbs"] * 2 * (n - 1) / n) <= 1e-9 * r["busbw_gbs"] + 1e-12, r

    run([mpirun, "2", ddp_overlap, "--arch", "resnet18", "--size", "32", "--batch", "2",
         "--iters", "2", "--warmup", "1", "--json", ddp_json])
    d = json.load(open(ddp_json))
    assert d["ranks"] == 2 and d["backend"] == "mpi", d
    ms = d["backward_ms"]
    assert all(ms[k] > 0 for k in ("alone", "ddp_overlap", "ddp_after")), ms
    assert d["hidden_fraction"] is not None and math.isfinite(d["hidden_fraction"]), d
    ready, mib = d["bucket_ready_ms"], d["bucket_mib"]
    assert len(ready) == len(mib) == d["buckets"] >= 2, d
    assert abs(sum(mib) - d["gradient_mib"]) < 1e-6 * d["gradient_mib"], (sum(mib), d)
    end = d["backward_from_first_gradient_ms"]
    # Rebuilt in ready order: each bucket complete no earlier than the one before it, the
    # last one when backward ends.
    assert all(0 <= a <= b for a, b in zip(ready, ready[1:])), ready
    assert 0 < ready[-1] <= end, (ready, end)
    print("benchmarks' JSON checked: allreduce %d sizes, ddp_overlap %d buckets" %
          (len(rows), len(ready)))


if __name__ == "__main__":
    main()
