#!/usr/bin/python3
"""PyTorch CPU peer of benchmarks/ops_cpu.cpp.

Runs the same conv2d forward + backward (grad input and grad weight) on the
distinct ResNet-50 conv shapes (batch 8, 224x224, f32 NCHW) and the same
square f32 GEMM, with torch.set_num_threads(N), and writes the same JSON
schema. With --compare DLTRAIN_JSON it prints both side by side with the
ratio dltrain/pytorch of the times (lower is better for dltrain).

  /usr/bin/python3 benchmarks/peers/pytorch_ops_cpu.py --threads 2 --json pt.json
  /usr/bin/python3 benchmarks/peers/pytorch_ops_cpu.py --load pt.json --compare dl.json
"""
import argparse
import json
import statistics
import sys
import time

CONVS = [  # name, cin, cout, k, stride, pad, input hw  (keep in sync with ops_cpu.cpp)
    ("stem 7x7/2", 3, 64, 7, 2, 3, 224),
    ("l1 1x1 64-64", 64, 64, 1, 1, 0, 56),
    ("l1 3x3 64-64", 64, 64, 3, 1, 1, 56),
    ("l1 1x1 64-256", 64, 256, 1, 1, 0, 56),
    ("l1 1x1 256-64", 256, 64, 1, 1, 0, 56),
    ("l2 1x1 256-128", 256, 128, 1, 1, 0, 56),
    ("l2 3x3/2 128-128", 128, 128, 3, 2, 1, 56),
    ("l2 1x1 128-512", 128, 512, 1, 1, 0, 28),
    ("l2 ds 1x1/2 256-512", 256, 512, 1, 2, 0, 56),
    ("l2 1x1 512-128", 512, 128, 1, 1, 0, 28),
    ("l2 3x3 128-128", 128, 128, 3, 1, 1, 28),
    ("l3 1x1 512-256", 512, 256, 1, 1, 0, 28),
    ("l3 3x3/2 256-256", 256, 256, 3, 2, 1, 28),
    ("l3 1x1 256-1024", 256, 1024, 1, 1, 0, 14),
    ("l3 ds 1x1/2 512-1024", 512, 1024, 1, 2, 0, 28),
    ("l3 1x1 1024-256", 1024, 256, 1, 1, 0, 14),
    ("l3 3x3 256-256", 256, 256, 3, 1, 1, 14),
    ("l4 1x1 1024-512", 1024, 512, 1, 1, 0, 14),
    ("l4 3x3/2 512-512", 512, 512, 3, 2, 1, 14),
    ("l4 1x1 512-2048", 512, 2048, 1, 1, 0, 7),
    ("l4 ds 1x1/2 1024-2048", 1024, 2048, 1, 2, 0, 14),
    ("l4 1x1 2048-512", 2048, 512, 1, 1, 0, 7),
    ("l4 3x3 512-512", 512, 512, 3, 1, 1, 7),
]
QUICK = {"stem 7x7/2", "l1 3x3 64-64", "l2 ds 1x1/2 256-512", "l3 1x1 1024-256", "l4 3x3 512-512"}


def run(args):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    convs = [c for c in CONVS if args.shapes == "full" or c[0] in QUICK]
    b = args.batch
    for name, cin, cout, k, s, p, hw in convs:
        x = torch.randn(b, cin, hw, hw, requires_grad=True)
        w = (torch.randn(cout, cin, k, k) * 0.05).requires_grad_()
        ho = (hw + 2 * p - k) // s + 1
        gy = torch.randn(b, cout, ho, ho)
        tf, tb = [], []
        for it in range(args.iters + 1):
            x.grad = None
            w.grad = None
            t0 = time.perf_counter()
            y = F.conv2d(x, w, None, s, p)
            t1 = time.perf_counter()
            y.backward(gy)
            t2 = time.perf_counter()
            if it > 0:
                tf.append((t1 - t0) * 1e3)
                tb.append((t2 - t1) * 1e3)
        f, bw = statistics.median(tf), statistics.median(tb)
        flops = 3.0 * 2.0 * b * cout * ho * ho * cin * k * k
        rows.append({"name": name, "shape": f"{b}x{cin}x{hw}x{hw} k{k} s{s} -> {cout}",
                     "fwd_ms": f, "bwd_ms": bw, "ms": f + bw, "gflops": flops / ((f + bw) * 1e6)})
    n = args.gemm
    a, bm = torch.randn(n, n), torch.randn(n, n)
    t = []
    for it in range(args.iters + 1):
        t0 = time.perf_counter()
        torch.mm(a, bm)
        t1 = time.perf_counter()
        if it > 0:
            t.append((t1 - t0) * 1e3)
    ms = statistics.median(t)
    rows.append({"name": f"gemm {n}", "shape": f"{n}x{n}x{n}", "fwd_ms": ms, "bwd_ms": 0.0, "ms": ms,
                 "gflops": 2.0 * n ** 3 / (ms * 1e6)})
    return {"impl": f"pytorch {torch.__version__}", "threads": args.threads, "iters": args.iters,
            "batch": b, "rows": rows}


def print_table(res):
    print(f"{res['impl']} ops_cpu: {res['threads']} threads, {res['iters']} iters (median), batch {res['batch']}")
    print(f"{'layer':22} {'shape':26} {'fwd ms':>9} {'bwd ms':>9} {'ms':>9} {'GFLOP/s':>9}")
    for r in res["rows"]:
        print(f"{r['name']:22} {r['shape']:26} {r['fwd_ms']:9.2f} {r['bwd_ms']:9.2f} {r['ms']:9.2f} {r['gflops']:9.1f}")


def compare(dl, pt):
    ptrows = {r["name"]: r for r in pt["rows"]}
    print(f"dltrain ({dl['threads']} threads) vs {pt['impl']} ({pt['threads']} threads); "
          "ratio = dltrain ms / pytorch ms (< 1: dltrain faster)")
    print(f"{'layer':22} {'dl fwd':>8} {'pt fwd':>8} {'dl bwd':>8} {'pt bwd':>8} {'dl ms':>8} {'pt ms':>8} {'ratio':>6}")
    tot_dl = tot_pt = 0.0
    for r in dl["rows"]:
        q = ptrows.get(r["name"])
        if q is None:
            continue
        if not r["name"].startswith("gemm"):
            tot_dl += r["ms"]
            tot_pt += q["ms"]
        print(f"{r['name']:22} {r['fwd_ms']:8.2f} {q['fwd_ms']:8.2f} {r['bwd_ms']:8.2f} {q['bwd_ms']:8.2f} "
              f"{r['ms']:8.2f} {q['ms']:8.2f} {r['ms'] / q['ms']:6.2f}")
    if tot_pt > 0:
        print(f"{'conv total':22} {'':8} {'':8} {'':8} {'':8} {tot_dl:8.2f} {tot_pt:8.2f} {tot_dl / tot_pt:6.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--gemm", type=int, default=2048)
    ap.add_argument("--shapes", choices=["full", "quick"], default="full")
    ap.add_argument("--json", help="write the PyTorch results here")
    ap.add_argument("--load", help="read PyTorch results from this JSON instead of running")
    ap.add_argument("--compare", help="dltrain JSON (from ops_cpu --json) to compare against")
    args = ap.parse_args()
    if args.load:
        with open(args.load) as f:
            res = json.load(f)
    else:
        res = run(args)
        print_table(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    if args.compare:
        with open(args.compare) as f:
            dl = json.load(f)
        print()
        compare(dl, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
