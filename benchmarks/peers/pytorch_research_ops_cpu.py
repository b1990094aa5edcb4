#!/usr/bin/python3
"""PyTorch CPU peer of benchmarks/research_ops_cpu.cpp: the same cases (ConvTranspose2d,
interpolate, reflect pad, GroupNorm, SiLU, the VAE losses, a TransformerEncoderLayer; forward + backward, f32, NCHW and
channels-last), median ms over --iters runs after two warm-ups, the same JSON schema. With
--compare DLTRAIN_JSON it prints both side by side and the ratio dltrain / pytorch (lower is
better for dltrain). Use a current torch (.venv-peers, scripts/setup.sh --peers).

  .venv-peers/bin/python benchmarks/peers/pytorch_research_ops_cpu.py --threads 2 \\
      --compare dl.json
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from peer_bench import OpBench


def leaf(shape, cl):
    t = torch.randn(*shape)
    if cl:
        t = t.contiguous(memory_format=torch.channels_last)
    return t.requires_grad_()


def main():
    bench = OpBench(__doc__.splitlines()[0])
    run = bench.run

    for cl in (False, True):
        fmt = " CL" if cl else " NCHW"
        mf = torch.channels_last if cl else torch.contiguous_format
        dec_a = nn.ConvTranspose2d(64, 32, 4, 2, 1).to(memory_format=mf)
        dec_b = nn.ConvTranspose2d(32, 1, 4, 2, 1).to(memory_format=mf)
        x = leaf((64, 64, 7, 7), cl)
        run("convT decoder 64x7x7->1x28x28 b64" + fmt,
            lambda: dec_b(F.relu(dec_a(x))).sum().backward())
        up = nn.ConvTranspose2d(128, 64, 2, 2).to(memory_format=mf)
        x2 = leaf((8, 128, 32, 32), cl)
        run("convT 2x2/2 128->64 32x32 b8" + fmt, lambda: up(x2).sum().backward())
        u = leaf((8, 64, 32, 32), cl)
        run("bilinear x2 64x32x32 b8" + fmt,
            lambda: F.interpolate(u, scale_factor=2, mode="bilinear").sum().backward())
        run("nearest x2 64x32x32 b8" + fmt,
            lambda: F.interpolate(u, scale_factor=2).sum().backward())
        run("reflect pad 1 64x32x32 b8" + fmt,
            lambda: F.pad(u, (1, 1, 1, 1), mode="reflect").sum().backward())
        gn = nn.GroupNorm(8, 64)
        run("GroupNorm(8, 64) 64x32x32 b8" + fmt, lambda: gn(u).sum().backward())
        run("SiLU 64x32x32 b8" + fmt, lambda: F.silu(u).sum().backward())
    for p in (0.0, 0.1):
        layer = nn.TransformerEncoderLayer(256, 8, dim_feedforward=1024, dropout=p,
                                           batch_first=True)
        xt = leaf((32, 128, 256), False)
        run("TransformerEncoderLayer d256 h8 b32 L128 p%.1f" % p,
            lambda: layer(xt).sum().backward())
    logits = leaf((64, 1, 28, 28), False)
    target = torch.rand(64, 1, 28, 28)
    mu, logvar = leaf((64, 16), False), leaf((64, 16), False)

    def vae_loss():
        rec = F.binary_cross_entropy(torch.sigmoid(logits), target, reduction="sum")
        kl = -0.5 * torch.sum(1 + logvar - mu * mu - logvar.exp())
        (rec + kl).backward()

    run("BCE(sigmoid) + KL, b64 28x28 z16", vae_loss)
    bench.finish()


if __name__ == "__main__":
    main()
