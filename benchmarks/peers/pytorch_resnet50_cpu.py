#!/usr/bin/env python3
"""PyTorch peer of benchmarks/resnet50_cpu: the same ResNet training step (forward + loss,
backward, SGD momentum step) on synthetic data, timed per phase, median of --iters.

    /usr/bin/python3 benchmarks/peers/pytorch_resnet50_cpu.py --threads 2 --json pt.json \
        [--compare dl.json]   # dl.json from: build/benchmarks/resnet50_cpu --json dl.json
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
import torchvision


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--amp", action="store_true", help="bf16 autocast for forward + loss")
    p.add_argument("--json")
    p.add_argument("--compare")
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = getattr(torchvision.models, a.arch)().to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(a.batch, 3, a.size, a.size).contiguous(memory_format=fmt)
    y = torch.randint(0, 1000, (a.batch,))
    fwd, bwd, stp, tot = [], [], [], []
    for it in range(a.warmup + a.iters):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp):
            loss = F.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if it >= a.warmup:
            fwd.append(1e3 * (t1 - t0)), bwd.append(1e3 * (t2 - t1))
            stp.append(1e3 * (t3 - t2)), tot.append(1e3 * (t3 - t0))
    med = lambda v: sorted(v)[len(v) // 2]
    out = dict(framework="pytorch " + torch.__version__, arch=a.arch, batch=a.batch, size=a.size,
               threads=torch.get_num_threads(), channels_last=a.channels_last,
               amp="bf16" if a.amp else None,
               forward_ms=med(fwd), backward_ms=med(bwd), step_ms=med(stp), total_ms=med(tot),
               img_per_s=1e3 * a.batch / med(tot))
    print(f"pytorch {torch.__version__} {a.arch} batch {a.batch} {a.size}x{a.size} "
          f"{'channels-last' if a.channels_last else 'NCHW'} {'bf16 autocast' if a.amp else 'f32'} "
          f"{out['threads']} threads: "
          f"{out['total_ms']:.1f} ms/step, {out['img_per_s']:.2f} img/s")
    if a.json:
        json.dump(out, open(a.json, "w"), indent=2)
    if a.compare:
        dl = json.load(open(a.compare))
        print(f"\n{'':16}{'dltrain':>12}{'pytorch':>12}{'ratio':>8}")
        for k in ["forward_ms", "backward_ms", "step_ms", "total_ms", "img_per_s"]:
            print(f"{k:16}{dl[k]:12.2f}{out[k]:12.2f}{dl[k] / out[k]:8.2f}")
        print("(img/s ratio = dltrain / pytorch: the target is >= 1.0)")


if __name__ == "__main__":
    main()
