#!/usr/bin/env python3
"""PyTorch peer of examples/fashion_mnist: the same CNN (conv-BN-ReLU-pool x2, linear),
initialisation (PyTorch defaults), SGD (nesterov momentum, weight decay), OneCycleLR,
batch size, normalisation, drop_last shuffling and evaluation, timed the same way
(per-epoch training time, img/s). Batches are sliced from in-memory tensors (PyTorch's
fastest path; a DataLoader over a TensorDataset would be slower).

    /usr/bin/python3 benchmarks/peers/pytorch_fashion_mnist.py --threads 2 --json pt.json \
        [--channels-last] [--compare dl.json]   # dl.json from: fashion_mnist --json dl.json

--channels-last stores the weights and every batch channels-last (NHWC), as the example's
--channels-last does.

The large-batch flags are the example's: --optimizer sgd|lars|lamb, --lr-schedule
onecycle|cosine|poly, --warmup-epochs E, --no-bn-weight-decay, --accumulation-steps K (the
loss of each of K batches divided by the cycle's length, one optimizer step per cycle, the
epoch's last cycle short). PyTorch has no LARS or LAMB: the classes below are written from the
papers' pseudo-code exactly as the reference of tests/optim/test_lars_lamb.cpp is (the variants
optim/lars.hpp and optim/lamb.hpp implement), in f32 like dltrain's state.
"""
import argparse
import gzip
import json
import os
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(root, split):
    def find(stem):
        for name in (stem, stem + ".gz"):
            if os.path.exists(os.path.join(root, name)):
                return os.path.join(root, name)
        raise SystemExit(f"missing {stem}[.gz] in {root}")
    x = read_idx(find(f"{split}-images-idx3-ubyte"))
    y = read_idx(find(f"{split}-labels-idx1-ubyte"))
    x = (torch.from_numpy(x.copy()).float().div_(255.0).sub_(0.2860).div_(0.3530)).unsqueeze(1)
    return x, torch.from_numpy(y.astype(np.int64))


class LARS(torch.optim.Optimizer):
    """You et al. 2017, Algorithm 1: v = m v + lr * ratio * (g + wd w), w -= v, with ratio =
    eta |w| / (|g| + wd |w| + eps) when both norms are positive and the group adapts, else 1."""

    def __init__(self, groups, lr, momentum=0.9, weight_decay=0.0, trust_coefficient=0.001,
                 eps=0.0):
        super().__init__(groups, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient, eps=eps,
                                      trust_ratio=True))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                d, wd = p.grad, g["weight_decay"]
                ratio = 1.0
                if g["trust_ratio"]:
                    wn, gn = p.norm().item(), d.norm().item()
                    if wn > 0 and gn > 0:
                        ratio = g["trust_coefficient"] * wn / (gn + wd * wn + g["eps"])
                u = d.add(p, alpha=wd) if wd != 0 else d.clone()
                st = self.state[p]
                if "momentum_buffer" not in st:
                    st["momentum_buffer"] = torch.zeros_like(p)
                v = st["momentum_buffer"]
                v.mul_(g["momentum"]).add_(u, alpha=g["lr"] * ratio)
                p.sub_(v)


class LAMB(torch.optim.Optimizer):
    """You et al. 2019, Algorithm 2: Adam's bias-corrected moments, r = m^ / (sqrt(v^) + eps)
    + wd w, w -= lr * ratio * r with ratio = min(|w| / |r|, clip) when both norms are positive
    and the group adapts, else 1."""

    def __init__(self, groups, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
                 max_trust_ratio=float("inf")):
        super().__init__(groups, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      max_trust_ratio=max_trust_ratio, trust_ratio=True))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            b1, b2 = g["betas"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"], st["m"], st["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                st["m"].mul_(b1).add_(p.grad, alpha=1 - b1)
                st["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                r = (st["m"] / (1 - b1 ** t)) / ((st["v"] / (1 - b2 ** t)).sqrt() + g["eps"])
                if g["weight_decay"] != 0:
                    r.add_(p, alpha=g["weight_decay"])
                ratio = 1.0
                if g["trust_ratio"]:
                    wn, rn = p.norm().item(), r.norm().item()
                    if wn > 0 and rn > 0:
                        ratio = min(wn / rn, g["max_trust_ratio"])
                p.sub_(r, alpha=g["lr"] * ratio)


def make_optimizer(model, a):
    """The example's --optimizer over its groups: with --no-bn-weight-decay the BatchNorm
    weights and biases and every bias (the 1-d tensors here) get no decay and no trust ratio,
    as optim::param_groups_no_decay puts them."""
    if a.no_bn_weight_decay:
        decay = [p for p in model.parameters() if p.dim() > 1]
        rest = [p for p in model.parameters() if p.dim() <= 1]
        groups = [dict(params=decay), dict(params=rest, weight_decay=0.0, trust_ratio=False)]
    else:
        groups = [dict(params=list(model.parameters()))]
    if a.optimizer == "lars":
        return LARS(groups, lr=a.lr, momentum=a.mom, weight_decay=a.wd)
    if a.optimizer == "lamb":
        return LAMB(groups, lr=a.lr, betas=(a.mom, 0.999), weight_decay=a.wd)
    for g in groups:
        g.pop("trust_ratio", None)
    return torch.optim.SGD(groups, lr=a.lr, momentum=a.mom, weight_decay=a.wd, nesterov=True)


def make_schedule(opt, a, total, steps_per_epoch):
    """apps/common/optim_flags.hpp's make_schedule: onecycle, or cosine / poly (power 2, to 0)
    after a LinearLR warm-up from lr/1000, per optimizer step."""
    S = torch.optim.lr_scheduler
    if a.lr_schedule == "onecycle":
        return S.OneCycleLR(opt, a.lr, total_steps=max(total, 1))
    warm = max(min(round(a.warmup_epochs * steps_per_epoch), total - 1), 0)

    def decay(steps):
        steps = max(steps, 1)
        if a.lr_schedule == "cosine":
            return S.CosineAnnealingLR(opt, steps)
        return S.PolynomialLR(opt, steps, power=2.0)
    if warm == 0:
        return decay(total)
    ramp = S.LinearLR(opt, 1e-3, 1.0, warm)
    after = decay(total - warm)
    return S.SequentialLR(opt, [ramp, after], [warm])


def make_model():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 10))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--wd", type=float, default=5e-4)
    p.add_argument("--mom", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--test", action="store_true")
    p.add_argument("--test-nsteps", type=int, default=50)
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--optimizer", choices=["sgd", "lars", "lamb"], default="sgd")
    p.add_argument("--lr-schedule", choices=["onecycle", "cosine", "poly"], default="onecycle")
    p.add_argument("--warmup-epochs", type=float, default=0.0)
    p.add_argument("--no-bn-weight-decay", action="store_true")
    p.add_argument("--accumulation-steps", type=int, default=1)
    p.add_argument("--json")
    p.add_argument("--compare", help="dltrain JSON report to compare with")
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr, ytr = load(a.data, "train")
    xte, yte = load(a.data, "t10k")
    model = make_model()
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    if a.channels_last:
        model = model.to(memory_format=fmt)
        # a 1-channel batch is dense in both layouts: label it NHWC (its strides), as PyTorch
        # does for x.contiguous(memory_format=channels_last)
        xte = xte.contiguous(memory_format=fmt)
    opt = make_optimizer(model, a)
    batches_per_epoch = len(xtr) // a.batch_size
    K = a.accumulation_steps
    steps_per_epoch = (batches_per_epoch + K - 1) // K  # optimizer steps
    total = a.test_nsteps if a.test else steps_per_epoch * a.epochs
    sched = make_schedule(opt, a, total, steps_per_epoch)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    reports, step, done = [], 0, False
    fwd, bwd = [], []
    for epoch in range(a.epochs):
        if done:
            break
        model.train()
        g = torch.Generator().manual_seed(a.seed * 1000 + epoch)
        perm = torch.randperm(len(xtr), generator=g)
        t_epoch = time.perf_counter()
        loss_sum, seen, nb = 0.0, 0, 0
        for b in range(batches_per_epoch):
            idx = perm[b * a.batch_size:(b + 1) * a.batch_size]
            x, y = xtr[idx].contiguous(memory_format=fmt), ytr[idx]
            micro = b % K  # position in the accumulation cycle, and the cycle's length
            cycle = min(K, batches_per_epoch - (b - micro))
            t1 = time.perf_counter()
            loss = F.cross_entropy(model(x), y)
            t2 = time.perf_counter()
            if micro == 0:
                opt.zero_grad(set_to_none=True)
            (loss / cycle if cycle > 1 else loss).backward()
            if micro + 1 == cycle:
                opt.step()
                sched.step()
                step += 1
            l = loss.item()
            t3 = time.perf_counter()
            fwd.append(t2 - t1)
            bwd.append(t3 - t2)
            loss_sum += l
            seen += len(idx)
            nb += 1
            if a.test and micro + 1 == cycle and step >= a.test_nsteps:
                done = True
                break
        train_time = time.perf_counter() - t_epoch
        model.eval()
        correct, test_loss = 0, 0.0
        with torch.no_grad():
            for s in range(0, len(xte), 1000):
                logits = model(xte[s:s + 1000])
                test_loss += F.cross_entropy(logits, yte[s:s + 1000], reduction="sum").item()
                correct += (logits.argmax(1) == yte[s:s + 1000]).sum().item()
        r = dict(epoch=epoch + 1, time_s=train_time, train_loss=loss_sum / nb,
                 test_loss=test_loss / len(xte), test_acc=100.0 * correct / len(xte),
                 img_per_s=seen / train_time)
        reports.append(r)
        print("epoch %d/%d  time %.1f s  train loss %.4f  test loss %.4f  test acc %.2f%%  "
              "throughput %.0f img/s" % (r["epoch"], a.epochs, r["time_s"], r["train_loss"],
                                         r["test_loss"], r["test_acc"], r["img_per_s"]))
    med = lambda v: sorted(v)[len(v) // 2] * 1e3
    out = dict(framework="pytorch " + torch.__version__, threads=torch.get_num_threads(),
               batch_size=a.batch_size, lr=a.lr, seed=a.seed, optimizer=a.optimizer,
               lr_schedule=a.lr_schedule, warmup_epochs=a.warmup_epochs, accumulation_steps=K,
               global_batch=a.batch_size * K, channels_last=a.channels_last, steps=len(fwd),
               step_ms=dict(forward=med(fwd), backward=med(bwd)), epochs=reports)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    if a.compare:
        dl = json.load(open(a.compare))
        print(f"\n{'':24}{'dltrain':>12}{'pytorch':>12}{'ratio':>8}")
        rows = [("forward ms (median)", dl["step_ms"]["forward"], out["step_ms"]["forward"]),
                ("backward+step ms", dl["step_ms"]["backward"], out["step_ms"]["backward"])]
        for d, t in zip(dl["epochs"], out["epochs"]):
            rows.append((f"epoch {d['epoch']} img/s", d["img_per_s"], t["img_per_s"]))
            rows.append((f"epoch {d['epoch']} test acc %", d["test_acc"], t["test_acc"]))
        for name, d, t in rows:
            print(f"{name:24}{d:12.2f}{t:12.2f}{d / t:8.2f}")
        print("(ratio = dltrain / pytorch: higher is better for img/s and accuracy, "
              "lower for ms)")


if __name__ == "__main__":
    main()
