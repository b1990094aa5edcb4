#!/usr/bin/python3
"""PyTorch CPU peer of benchmarks/half_convert.cpp: x.half(), x.float() and copy_ of f32 into a
preallocated f16 tensor on 1M and 16M elements, median ms over --iters runs after two
warm-ups, the same JSON schema. With --compare DLTRAIN_JSON it prints GB/s (bytes read +
written per second) of dltrain's scalar loops, dltrain's F16C loops and PyTorch side by side.
Use a current torch (.venv-peers, scripts/setup.sh --peers).

  build/benchmarks/half_convert --threads 2 --json dl.json
  .venv-peers/bin/python benchmarks/peers/pytorch_half_convert.py --threads 2 --compare dl.json
"""
import argparse
import json
import statistics
import time

import torch


def median_ms(f, iters):
    f()
    f()
    t = []
    for _ in range(iters):
        t0 = time.perf_counter()
        f()
        t.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(t)


SIZES = {"1M": 1 << 20, "16M": 1 << 24}
BYTES = {"to f16": 6, "to f32": 6, "copy_ f32->f16": 6, "copy_scaled_ f32->f16": 6}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--compare")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    res = {}

    def run(name, f):
        res[name] = median_ms(f, a.iters)
        print("%-44s %9.3f ms" % (name, res[name]), flush=True)

    for size, n in SIZES.items():
        x = torch.randn(n)
        h = x.half()
        d = torch.empty(n, dtype=torch.float16)
        run("to f16 " + size, lambda: x.half())
        run("to f32 " + size, lambda: h.float())
        run("copy_ f32->f16 " + size, lambda: d.copy_(x))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"threads": a.threads, "torch": torch.__version__, "cases": res}, f,
                      indent=1)
    if a.compare:
        with open(a.compare) as f:
            dl = json.load(f)["cases"]
        print("\n%-30s %12s %12s %12s %9s" % ("GB/s (read + written)", "dl scalar", "dl F16C",
                                             "PyTorch", "F16C/PT"))
        for size, n in SIZES.items():
            for op, b in BYTES.items():
                name = op + " " + size
                gbs = {k: (b * n / 1e9) / (v / 1e3) for k, v in
                       (("s", dl.get(name + " scalar")), ("f", dl.get(name + " f16c")),
                        ("p", res.get(name))) if v}
                cell = lambda k: "%12.2f" % gbs[k] if k in gbs else "%12s" % "-"
                ratio = "%9.2f" % (gbs["f"] / gbs["p"]) if "f" in gbs and "p" in gbs else ""
                print("%-30s %s %s %s %s" % (name, cell("s"), cell("f"), cell("p"), ratio))


if __name__ == "__main__":
    main()
