#!/usr/bin/env python3
"""The ImageNet training input pipeline with TrivialAugmentWide, dltrain against
torchvision, per core, interleaved.

Each round runs, one after the other, dltrain's benchmarks/dataloader --one-core (num_workers
0, one pool thread: read + crop-aware decode + RandomResizedCrop(224) + flip +
TrivialAugmentWide + collate + to_float_batch normalisation, all on one core) and
benchmarks/peers/torchvision_dataloader.py --threads 0 (the same steps in the main process:
PIL decode, RandomResizedCrop(224), RandomHorizontalFlip, TrivialAugmentWide on the PIL image,
PILToTensor, ConvertImageDtype, Normalize, default collate), for each pipeline variant
(--variants: "trivial" and "none", the latter without the augmentation). Each side reports
its best epoch of --epochs (after a warm-up epoch for torchvision; dltrain's first epoch is
one of its timed ones); the table gives every round, the medians and dltrain / torchvision.
The CPU model (lscpu) goes into the output and the JSON.

    python3 benchmarks/peers/augment_pipeline_compare.py --dataloader build/benchmarks/dataloader \\
        [--python .venv-peers/bin/python] [--rounds 3] [--epochs 2] [--variants trivial,none] \\
        [--root DIR] [--json augment_compare.json]
Without --root, the folder benchmarks/dataloader generates (1,000 JPEGs of ~400 x 350) is used.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def one_core(results):
    for r in results:
        if r["mode"] == "one-core":
            return r["images_per_s"]
    raise SystemExit(f"no one-core result in {results}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataloader", required=True, help="dltrain's benchmarks/dataloader binary")
    ap.add_argument("--python", default=sys.executable, help="Python with torch and torchvision")
    ap.add_argument("--root", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--variants", default="trivial,none")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    model = cpu_model()
    print(f"CPU: {model}; one core per side; {a.rounds} interleaved rounds")
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        for rnd in range(a.rounds):
            for variant in a.variants.split(","):
                cmd = [a.dataloader, "--one-core", "--normalize", "--augment", variant,
                       "--epochs", str(a.epochs), "--json", out]
                if a.root:
                    cmd += ["--root", a.root]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                with open(out) as f:
                    dl = json.load(f)
                root = dl["root"]
                cmd = [a.python, os.path.join(HERE, "torchvision_dataloader.py"), "--root", root,
                       "--threads", "0", "--normalize", "--augment", variant, "--epochs",
                       str(a.epochs), "--json", out]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                with open(out) as f:
                    tv = json.load(f)
                ours, theirs = one_core(dl["results"]), one_core(tv["results"])
                rows.setdefault(variant, []).append((ours, theirs))
                print(f"round {rnd + 1} {variant:8s} dltrain {ours:8.1f} img/s  torchvision "
                      f"{theirs:8.1f} img/s  ratio {ours / theirs:5.2f}x", flush=True)
    print(f"\n{'pipeline (one core)':44s} {'dltrain img/s':>14s} {'torchvision img/s':>18s} "
          f"{'ratio':>7s}")
    summary = []
    for variant, rs in rows.items():
        o = statistics.median(r[0] for r in rs)
        t = statistics.median(r[1] for r in rs)
        name = "RRC(224) + flip" + (f" + {variant}" if variant != "none" else "") + " + normalise"
        print(f"{name:44s} {o:14.1f} {t:18.1f} {o / t:6.2f}x")
        summary.append({"variant": variant, "dltrain_images_per_s": o,
                        "torchvision_images_per_s": t, "ratio": o / t,
                        "rounds": [{"dltrain": r[0], "torchvision": r[1]} for r in rs]})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "augment_pipeline_compare", "cpu": model,
                       "epochs": a.epochs, "results": summary}, f, indent=2)
        print("wrote", a.json)


if __name__ == "__main__":
    main()
