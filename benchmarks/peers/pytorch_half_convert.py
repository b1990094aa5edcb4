#!/usr/bin/python3
"""PyTorch CPU peer of benchmarks/half_convert.cpp: x.half(), x.float() and copy_ of f32 into a
preallocated f16 tensor on 1M and 16M elements, median ms over --iters runs after two
warm-ups, the same JSON schema. With --compare DLTRAIN_JSON it prints GB/s (bytes read +
written per second) of dltrain's scalar loops, dltrain's F16C loops and PyTorch side by side.
Use a current torch (.venv-peers, scripts/setup.sh --peers).

  build/benchmarks/half_convert --threads 2 --json dl.json
  .venv-peers/bin/python benchmarks/peers/pytorch_half_convert.py --threads 2 --compare dl.json
"""
import torch
from peer_bench import OpBench

SIZES = {"1M": 1 << 20, "16M": 1 << 24}
BYTES = {"to f16": 6, "to f32": 6, "copy_ f32->f16": 6, "copy_scaled_ f32->f16": 6}


def main():
    bench = OpBench(__doc__.splitlines()[0])
    run, res = bench.run, bench.cases
    for size, n in SIZES.items():
        x = torch.randn(n)
        h = x.half()
        d = torch.empty(n, dtype=torch.float16)
        run("to f16 " + size, lambda: x.half())
        run("to f32 " + size, lambda: h.float())
        run("copy_ f32->f16 " + size, lambda: d.copy_(x))
    bench.finish(table=False)
    dl = bench.dltrain_cases()
    if dl is not None:
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
