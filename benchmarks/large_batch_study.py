#!/usr/bin/env python3
"""The course's large-batch lesson, measured (issue 30): Fashion-MNIST with the example's CNN,
the same epochs for every run, four recipes, each over a small learning-rate grid and three
seeds, in dltrain (examples/fashion_mnist) and in PyTorch (benchmarks/peers/
pytorch_fashion_mnist.py, its SGD and LARS/LAMB written from the same pseudo-code as the
tests' references).

The protocol is fixed here, before any run (docs/performance.md, "Large batches"):

  recipe      batch                      optimizer                         lr grid
  sgd-128     128                        SGD, Nesterov 0.9                 0.05 0.1 0.2
  sgd-4096    4,096 (32 x 128 accum.)    SGD, Nesterov 0.9, linear scaling 1.6 3.2 6.4
  lars-4096   4,096 (32 x 128 accum.)    LARS (eta 0.001), momentum 0.9    2.5 5 10
  lamb-4096   4,096 (32 x 128 accum.)    LAMB (0.9, 0.999)                 0.01 0.02 0.04

  every run: 5 epochs (60,000 images each, drop_last), weight decay 5e-4 except on BatchNorm
  weights and biases and the linear bias (--no-bn-weight-decay), cosine decay to 0 per
  optimizer step, after a 1-epoch linear warm-up from lr/1000 for the 4,096 recipes (none at
  128), f32, test accuracy on the 10,000 test images after every epoch; seeds 0, 1, 2.
  sgd-4096's grid is sgd-128's times 32 (Goyal et al.'s linear scaling rule); LARS's and
  LAMB's are the usual ranges for their trust-ratio-normalised steps.

The best learning rate of a recipe is the one with the highest mean final test accuracy over
the seeds (there is no separate validation split: the figures are a lesson, not a tuned
result). PyTorch runs every recipe at dltrain's best learning rate with the same three seeds
(--peer-grid all runs its whole grid). dltrain's curve agrees with PyTorch's when, at every
epoch, the two means differ by at most twice the larger of the two seeds' standard deviations,
or by at most 0.3 points (one in 3,333 test images, below what three seeds resolve).

    python3 benchmarks/large_batch_study.py --out /tmp/lb [--jobs 2] [--threads 1]
        [--epochs 5] [--seeds 0 1 2] [--peer-grid best|all|none] [--recipes sgd-128 ...]
        [--sides both|pytorch] [--skip RECIPE:LR ...]

--sides pytorch runs PyTorch's whole grid alone and prints its final-accuracy table (PyTorch at
its own best learning rate, for a study whose dltrain side is already reported); --skip leaves
out grid points already measured (shown as "-").

Each run's JSON report is kept in --out; a second invocation reuses them (resumable), then
prints the tables and writes OUT/summary.json and OUT/summary.md.
"""
import argparse
import concurrent.futures as cf
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RECIPES = {
    "sgd-128": dict(args=["--batch-size", "128", "--optimizer", "sgd"],
                    grid=[0.05, 0.1, 0.2], batch=128),
    "sgd-4096": dict(args=["--batch-size", "128", "--accumulation-steps", "32",
                           "--optimizer", "sgd", "--warmup-epochs", "1"],
                     grid=[1.6, 3.2, 6.4], batch=4096),
    "lars-4096": dict(args=["--batch-size", "128", "--accumulation-steps", "32",
                            "--optimizer", "lars", "--warmup-epochs", "1"],
                      grid=[2.5, 5.0, 10.0], batch=4096),
    "lamb-4096": dict(args=["--batch-size", "128", "--accumulation-steps", "32",
                            "--optimizer", "lamb", "--warmup-epochs", "1"],
                      grid=[0.01, 0.02, 0.04], batch=4096),
}
COMMON = ["--wd", "5e-4", "--mom", "0.9", "--no-bn-weight-decay", "--lr-schedule", "cosine"]


def run_one(side, recipe, lr, seed, a):
    path = os.path.join(a.out, f"{side}_{recipe}_lr{lr:g}_s{seed}.json")
    if os.path.exists(path):
        return path, 0.0, True
    flags = RECIPES[recipe]["args"] + COMMON + [
        "--lr", repr(lr), "--seed", str(seed), "--epochs", str(a.epochs),
        "--threads", str(a.threads), "--json", path + ".part"]
    if side == "dltrain":
        cmd = [a.dltrain] + flags
    else:
        cmd = [a.python, os.path.join(ROOT, "benchmarks/peers/pytorch_fashion_mnist.py")] + flags
    t0 = time.time()
    log = path[:-5] + ".log"
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}); see {log}")
    os.replace(path + ".part", path)
    return path, time.time() - t0, False


def curves(a, side, recipe, lr):
    """Per seed, the test accuracy after each epoch (None if a run is missing)."""
    out = []
    for seed in a.seeds:
        path = os.path.join(a.out, f"{side}_{recipe}_lr{lr:g}_s{seed}.json")
        if not os.path.exists(path):
            return None
        out.append([e["test_acc"] for e in json.load(open(path))["epochs"]])
    return out


def mean_sd(v):
    return statistics.mean(v), (statistics.stdev(v) if len(v) > 1 else 0.0)


def write_summary(a, stem, md, summary):
    """Prints the tables and writes OUT/STEM.md and OUT/STEM.json."""
    text = "\n".join(md) + "\n"
    print(text)
    with open(os.path.join(a.out, stem + ".md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, stem + ".json"), "w") as f:
        json.dump(summary, f, indent=1)
    return 0


def final_table(a, side, rows_of):
    """The final-accuracy table of one side: rows_of(recipe) = {lr: curves or None}."""
    md = [f"Final test accuracy (%) after {a.epochs} epochs, mean ± standard deviation over "
          f"seeds {', '.join(map(str, a.seeds))} ({side}):\n",
          "| recipe | global batch | " + " | ".join(["lr", "acc"] * 3) + " |",
          "| --- | ---: |" + " ---: |" * 6]
    best = {}
    for r in a.recipes:
        rows = {lr: c for lr, c in rows_of(r).items() if c is not None}
        best[r] = max(rows, key=lambda lr: statistics.mean(c[-1] for c in rows[lr])) if rows else None
        cells = []
        for lr in RECIPES[r]["grid"]:
            if lr not in rows:
                cells += [f"{lr:g}", "-"]
                continue
            m, sd = mean_sd([c[-1] for c in rows[lr]])
            mark = "**" if lr == best[r] else ""
            cells += [f"{lr:g}", f"{mark}{m:.2f} ± {sd:.2f}{mark}"]
        md.append(f"| {r} | {RECIPES[r]['batch']:,} | " + " | ".join(cells) + " |")
    return md, best


def peer_only(a, sweep, skip):
    """PyTorch's whole grid (but the skipped points) and its final-accuracy table."""
    jobs = [("pytorch", r, lr, s) for r in a.recipes for lr in RECIPES[r]["grid"]
            for s in a.seeds if (r, lr) not in skip]
    print(f"pytorch: {len(jobs)} runs", flush=True)
    sweep(jobs)
    rows = {r: {lr: curves(a, "pytorch", r, lr) for lr in RECIPES[r]["grid"]} for r in a.recipes}
    md, best = final_table(a, "pytorch", lambda r: rows[r])
    summary = {"epochs": a.epochs, "seeds": a.seeds,
               "recipes": {r: {"batch": RECIPES[r]["batch"], "best_lr_measured": best[r],
                               "pytorch": {f"{lr:g}": c for lr, c in rows[r].items()
                                           if c is not None}} for r in a.recipes}}
    return write_summary(a, "summary_pytorch", md, summary)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    p.add_argument("--peer-grid", choices=["best", "all", "none"], default="best")
    p.add_argument("--dltrain", default=os.path.join(ROOT, "build/examples/fashion_mnist"))
    p.add_argument("--python", default=os.path.join(ROOT, ".venv-peers/bin/python"))
    p.add_argument("--sides", choices=["both", "pytorch"], default="both")
    p.add_argument("--skip", nargs="*", default=[], metavar="RECIPE:LR")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    skip = set()
    for item in a.skip:
        r, _, lr = item.partition(":")
        if r not in RECIPES or not lr or float(lr) not in RECIPES[r]["grid"]:
            p.error(f"--skip {item}: not a recipe:lr of the grid")
        skip.add((r, float(lr)))

    def sweep(jobs):
        with cf.ThreadPoolExecutor(a.jobs) as ex:
            futs = {ex.submit(run_one, *j, a): j for j in jobs}
            for f in cf.as_completed(futs):
                path, dt, cached = f.result()
                if not cached:
                    print(f"  {os.path.basename(path)}  {dt:.0f} s", flush=True)

    if a.sides == "pytorch":
        return peer_only(a, sweep, skip)
    jobs = [("dltrain", r, lr, s, ) for r in a.recipes for lr in RECIPES[r]["grid"]
            for s in a.seeds if (r, lr) not in skip]
    print(f"dltrain: {len(jobs)} runs", flush=True)
    sweep(jobs)

    dl_rows = {r: {lr: curves(a, "dltrain", r, lr) for lr in RECIPES[r]["grid"]}
               for r in a.recipes}
    md, best = final_table(a, "dltrain", lambda r: dl_rows[r])
    summary = {"epochs": a.epochs, "seeds": a.seeds, "recipes": {}}
    for r in a.recipes:
        summary["recipes"][r] = {"batch": RECIPES[r]["batch"], "best_lr": best[r],
                                 "dltrain": {f"{lr:g}": c for lr, c in dl_rows[r].items()
                                             if c is not None}}
    if a.peer_grid != "none":
        pjobs = [("pytorch", r, lr, s) for r in a.recipes
                 for lr in (RECIPES[r]["grid"] if a.peer_grid == "all" else [best[r]])
                 for s in a.seeds if lr is not None and (r, lr) not in skip]
        print(f"pytorch: {len(pjobs)} runs", flush=True)
        sweep(pjobs)
        for r in a.recipes:
            summary["recipes"][r]["pytorch"] = {
                f"{lr:g}": curves(a, "pytorch", r, lr) for lr in RECIPES[r]["grid"]
                if curves(a, "pytorch", r, lr) is not None}

    if a.peer_grid != "none":
        md.append(f"\nTest accuracy (%) per epoch at each recipe's best learning rate, mean ± "
                  f"standard deviation over the seeds, dltrain beside PyTorch:\n")
        md.append("| recipe | lr | side | " +
                  " | ".join(f"epoch {e + 1}" for e in range(a.epochs)) + " | agree |")
        md.append("| --- | ---: | --- |" + " ---: |" * a.epochs + " --- |")
        agree_all = True
        for r in a.recipes:
            lr = best[r]
            dl = summary["recipes"][r]["dltrain"].get(f"{lr:g}")
            pt = summary["recipes"][r]["pytorch"].get(f"{lr:g}")
            if pt is None or dl is None:
                continue
            ok = True
            for e in range(a.epochs):
                (m1, s1), (m2, s2) = mean_sd([c[e] for c in dl]), mean_sd([c[e] for c in pt])
                if abs(m1 - m2) > max(2 * max(s1, s2), 0.3):
                    ok = False
            agree_all &= ok
            summary["recipes"][r]["agree"] = ok
            for side, c in (("dltrain", dl), ("pytorch", pt)):
                cells = [f"{mean_sd([x[e] for x in c])[0]:.2f} ± {mean_sd([x[e] for x in c])[1]:.2f}"
                         for e in range(a.epochs)]
                md.append(f"| {r} | {lr:g} | {side} | " + " | ".join(cells) + " | " +
                          (("yes" if ok else "**no**") if side == "pytorch" else "") + " |")
        summary["agree"] = agree_all
    return write_summary(a, "summary", md, summary)


if __name__ == "__main__":
    sys.exit(main())
