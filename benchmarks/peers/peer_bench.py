"""The frame the op-benchmark peers share (pytorch_gnn_ops_cpu.py, pytorch_research_ops_cpu.py,
pytorch_half_convert.py): the flags --threads, --iters, --json and --compare, the median of
--iters timed runs after two warm-ups, one printed line per case, the JSON file in the schema
of the dltrain benchmarks ({"threads", "torch", "cases": {name: ms}}), and the side-by-side
table against dltrain's JSON with the ratio dltrain / pytorch (lower is better for dltrain).
"""
import argparse
import json
import statistics
import time

import torch


def median_ms(f, iters, warmup=2):
    """The median of `iters` timed calls of f, in ms, after `warmup` untimed ones."""
    for _ in range(warmup):
        f()
    t = []
    for _ in range(iters):
        t0 = time.perf_counter()
        f()
        t.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(t)


class OpBench:
    def __init__(self, description=None):
        ap = argparse.ArgumentParser(description=description)
        ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
        ap.add_argument("--iters", type=int, default=20, help="timed runs per case")
        ap.add_argument("--json", help="write the figures here")
        ap.add_argument("--compare", help="dltrain's JSON: print both side by side")
        self.args = ap.parse_args()
        if self.args.threads < 1 or self.args.iters < 1:
            ap.error("--threads and --iters must be at least 1")
        torch.set_num_threads(self.args.threads)
        torch.manual_seed(0)
        self.cases = {}

    def run(self, name, f):
        self.cases[name] = median_ms(f, self.args.iters)
        print("%-44s %9.3f ms" % (name, self.cases[name]), flush=True)

    def dltrain_cases(self):
        """dltrain's cases from --compare, or None."""
        if not self.args.compare:
            return None
        with open(self.args.compare) as f:
            return json.load(f)["cases"]

    def finish(self, table=True):
        """Writes --json; with table, prints the comparison with --compare's cases."""
        if self.args.json:
            with open(self.args.json, "w") as f:
                json.dump({"threads": self.args.threads, "torch": torch.__version__,
                           "cases": self.cases}, f, indent=1)
        dl = self.dltrain_cases()
        if table and dl is not None:
            print("\n%-44s %10s %10s %7s" % ("case", "dltrain", "pytorch", "ratio"))
            for k, v in self.cases.items():
                if k in dl:
                    print("%-44s %10.3f %10.3f %7.2f" % (k, dl[k], v, dl[k] / v))
