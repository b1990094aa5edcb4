#!/usr/bin/env python3
"""PyTorch peer of `examples/vae --bench`: the same convolutional VAE (Conv2d 1->32->64 with
stride 2, Linear heads to mu/logvar, Linear -> ConvTranspose2d 64->32->1 with stride 2 ->
sigmoid), the same loss (BCE on probabilities summed + closed-form KL, per image), Adam, the
same batch (the first --batch-size Fashion-MNIST training images, pixels in [0, 1]) and the same
timing: 5 warm-up steps, then the median of --steps whole training steps (forward, loss,
zero_grad, backward, optimizer step, loss.item()). Module names match the example's state-dict
keys (encoder.0.0.weight, encoder.1.mu.weight, decoder.fc.weight, decoder.up1.weight, ...).

    .venv-peers/bin/python benchmarks/peers/pytorch_vae.py --threads 2 --json pt.json \
        [--compare dl.json]   # dl.json from: vae --bench --threads 2 --json dl.json
"""
import argparse
import gzip
import json
import os
import statistics
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


class GaussianHeads(nn.Module):
    def __init__(self, n_in, latent):
        super().__init__()
        self.mu = nn.Linear(n_in, latent)
        self.logvar = nn.Linear(n_in, latent)

    def forward(self, h):
        return self.mu(h), self.logvar(h)


class Decoder(nn.Module):
    def __init__(self, latent):
        super().__init__()
        self.fc = nn.Linear(latent, 64 * 7 * 7)
        self.up1 = nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1)
        self.up2 = nn.ConvTranspose2d(32, 1, 4, stride=2, padding=1)

    def forward(self, z):
        h = F.relu(self.fc(z)).view(z.shape[0], 64, 7, 7)
        return torch.sigmoid(self.up2(F.relu(self.up1(h))))


class VAE(nn.Module):
    def __init__(self, latent):
        super().__init__()
        trunk = nn.Sequential(nn.Conv2d(1, 32, 4, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 4, 2, 1),
                              nn.ReLU(), nn.Flatten())
        self.encoder = nn.Sequential(trunk, GaussianHeads(64 * 7 * 7, latent))
        self.decoder = Decoder(latent)

    def forward(self, x):
        mu, logvar = self.encoder(x)
        z = mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)
        return self.decoder(z), mu, logvar


def vae_loss(recon, x, mu, logvar):
    bce = F.binary_cross_entropy(recon, x, reduction="sum")
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return (bce + kl) / x.shape[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--latent", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--channels-last", action="store_true",
                   help="model and batch in NHWC (PyTorch's faster CPU convolution path)")
    p.add_argument("--amp", action="store_true",
                   help="forward under torch.autocast('cpu', bfloat16), the loss in f32 "
                        "(as examples/vae --amp)")
    p.add_argument("--json")
    p.add_argument("--compare")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    path = os.path.join(a.data, "train-images-idx3-ubyte")
    if not os.path.exists(path):
        path += ".gz"
    x = torch.from_numpy(read_idx(path)[:a.batch_size].copy()).float().div_(255.0).unsqueeze(1)
    model = VAE(a.latent)
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    model.train()
    times = []
    for i in range(a.steps + 5):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp):
            recon, mu, logvar = model(x)
        loss = vae_loss(recon.float(), x, mu.float(), logvar.float())
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        if i >= 5:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    res = {"framework": "pytorch", "torch": torch.__version__, "threads": a.threads,
           "channels_last": a.channels_last, "amp": a.amp,
           "batch_size": a.batch_size, "latent": a.latent, "steps": a.steps,
           "step_ms_median": 1e3 * med, "img_per_s": a.batch_size / med}
    print("pytorch %s: median step %.2f ms, %.0f img/s (batch %d, %d threads), loss %.2f"
          % (torch.__version__, 1e3 * med, a.batch_size / med, a.batch_size, a.threads,
             loss.item()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)
    if a.compare:
        with open(a.compare) as f:
            dl = json.load(f)
        print("%-10s %12s %10s" % ("", "step (ms)", "img/s"))
        print("%-10s %12.2f %10.0f" % ("dltrain", dl["step_ms_median"], dl["img_per_s"]))
        print("%-10s %12.2f %10.0f" % ("pytorch", res["step_ms_median"], res["img_per_s"]))
        print("ratio (dltrain img/s / pytorch img/s): %.2f" % (dl["img_per_s"] / res["img_per_s"]))


if __name__ == "__main__":
    main()
