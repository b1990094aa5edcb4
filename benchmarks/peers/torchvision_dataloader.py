#!/usr/bin/env python3
"""torchvision's ImageNet training input pipeline on a JPEG image folder, for comparison
with dltrain's benchmarks/dataloader.cpp: ImageFolder (PIL decode) + RandomResizedCrop(224)
+ RandomHorizontalFlip + PILToTensor (u8, no normalisation: dltrain's batches are u8 too)
through torch.utils.data.DataLoader with num_workers = threads, batch 64, shuffle,
drop_last, persistent workers. Reports the best epoch's images/s after a warm-up epoch.

--augment trivial|rand|imagenet inserts TrivialAugmentWide(), RandAugment() or
AutoAugment(IMAGENET) after the flip (on the PIL image, as torchvision's reference recipe),
--normalize ends with ConvertImageDtype(float) + Normalize(ImageNet mean, std) as the recipe
does; --threads 0 runs everything in the main process (one core).

Run with Debian's torch + torchvision + PIL (or .venv-peers/bin/python):
    /usr/bin/python3 benchmarks/peers/torchvision_dataloader.py --root DIR --threads 1,2 \\
        [--batch 64] [--epochs 3] [--json tv.json] [--compare dl.json] \\
        [--augment trivial] [--normalize]
--root defaults to the folder benchmarks/dataloader generated ($TMPDIR/dltrain_bench_images_*).
--compare reads dataloader's JSON and prints dltrain / torchvision per thread count.
"""
import argparse
import glob
import json
import os
import tempfile
import time

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


AUGMENT = {
    "trivial": lambda: transforms.TrivialAugmentWide(),
    "rand": lambda: transforms.RandAugment(),
    "imagenet": lambda: transforms.AutoAugment(transforms.AutoAugmentPolicy.IMAGENET),
}


def pipeline(augment, normalize):
    tf = [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip()]
    if augment != "none":
        tf.append(AUGMENT[augment]())
    tf.append(transforms.PILToTensor())
    if normalize:
        tf += [transforms.ConvertImageDtype(torch.float),
               transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])]
    return transforms.Compose(tf)


def run(root, threads, batch, epochs, augment="none", normalize=False):
    tf = pipeline(augment, normalize)
    dtype = torch.float32 if normalize else torch.uint8
    ds = datasets.ImageFolder(root, transform=tf)
    loader = DataLoader(ds, batch_size=batch, shuffle=True, drop_last=True,
                        num_workers=threads, persistent_workers=threads > 0,
                        prefetch_factor=2 if threads > 0 else None)
    best = 0.0
    for epoch in range(epochs + 1):  # epoch 0 starts the workers and warms the cache
        n = 0
        t0 = time.perf_counter()
        for x, y in loader:
            assert x.dtype == dtype and x.shape[1:] == (3, 224, 224)
            n += x.shape[0]
        dt = time.perf_counter() - t0
        if epoch > 0:
            best = max(best, n / dt)
    return len(ds), best


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default=None)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--compare", default=None, help="dltrain dataloader JSON to compare with")
    p.add_argument("--augment", default="none", choices=["none"] + sorted(AUGMENT))
    p.add_argument("--normalize", action="store_true")
    a = p.parse_args()
    root = a.root
    if root is None:
        found = sorted(glob.glob(os.path.join(tempfile.gettempdir(), "dltrain_bench_images_*")))
        if not found:
            raise SystemExit("no --root and no generated folder; run benchmarks/dataloader first")
        root = found[0]
    torch.set_num_threads(1)
    hw = os.cpu_count() or 1
    counts = sorted({hw if t == "N" else int(t) for t in a.threads.split(",")})
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}; ImageFolder {root}; "
          f"batch {a.batch}; {pipeline(a.augment, a.normalize)}".replace("\n", " "))
    print(f"{'workers':>8} {'img/s':>12} {'per worker':>12}")
    results = []
    for t in counts:
        n, ips = run(root, t, a.batch, a.epochs, a.augment, a.normalize)
        print(f"{t:>8} {ips:>12.1f} {ips / max(t, 1):>12.1f}", flush=True)
        results.append({"threads": t, "mode": "workers" if t > 0 else "one-core",
                        "images_per_s": ips})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "torchvision_dataloader", "root": root, "images": n,
                       "augment": a.augment, "normalize": a.normalize,
                       "batch": a.batch, "torch": torch.__version__,
                       "torchvision": torchvision.__version__, "results": results}, f, indent=2)
        print("wrote", a.json)
    if a.compare:
        with open(a.compare) as f:
            dl = json.load(f)
        ours = {}
        for r in dl["results"]:
            ours.setdefault(r["threads"], {})[r["mode"]] = r["images_per_s"]
        print(f"\n{'threads':>8} {'torchvision':>12} {'dltrain workers':>16} {'ratio':>7} "
              f"{'dltrain pool':>13} {'ratio':>7}")
        for r in results:
            t = r["threads"]
            if t not in ours:
                continue
            w, pl = ours[t].get("workers", 0.0), ours[t].get("pool", 0.0)
            tv = r["images_per_s"]
            print(f"{t:>8} {tv:>12.1f} {w:>16.1f} {w / tv:>6.2f}x {pl:>13.1f} {pl / tv:>6.2f}x")


if __name__ == "__main__":
    main()
