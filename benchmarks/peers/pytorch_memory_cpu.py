#!/usr/bin/env python3
"""PyTorch peer of benchmarks/memory: peak tensor bytes and step time of a torchvision ResNet
training step with activation checkpointing off and on, on the CPU.

The checkpointing is dltrain's ResNet::checkpoint_segments, written with torch.utils.checkpoint
(non-reentrant): the stem (conv1, bn1, relu, maxpool) checkpointed, then the residual blocks of
layer1..layer4 as one chain through checkpoint_sequential with N segments. Each round runs one
step (forward, cross-entropy, backward, SGD-momentum step) per configuration, configurations
interleaved, after an untimed round. PyTorch keeps no live-bytes counter for CPU tensors, so
the peak comes from one extra step per configuration under torch.profiler with
profile_memory=True: the running sum, over its events in the order they started, of each
event's own allocations minus frees (self_cpu_memory_usage), added to the bytes live before the
step (weights, momentum buffers, the batch) - dltrain's max_memory_allocated, except that an
op's transient scratch freed inside it may be missed (op granularity).

    .venv-peers/bin/python benchmarks/peers/pytorch_memory_cpu.py --threads 2 --json pt.json
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.checkpoint import checkpoint, checkpoint_sequential


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--segments", default="0,2,4,8")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json")
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    configs = [int(s) for s in a.segments.split(",")]
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.arch)()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(a.batch, 3, a.size, a.size)
    y = torch.randint(0, 1000, (a.batch,))
    blocks = torch.nn.Sequential(*[b for layer in (model.layer1, model.layer2, model.layer3,
                                                   model.layer4) for b in layer])

    def stem(t):
        return model.maxpool(model.relu(model.bn1(model.conv1(t))))

    def forward(segments):
        if segments == 0:
            return model(x)
        h = checkpoint(stem, x, use_reentrant=False)
        h = checkpoint_sequential(blocks, segments, h, use_reentrant=False)
        return model.fc(torch.flatten(model.avgpool(h), 1))

    def step(segments):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(forward(segments), y).backward()
        opt.step()

    times = {c: [] for c in configs}
    for r in range(a.rounds + 1):
        for c in configs:
            t0 = time.perf_counter()
            step(c)
            if r > 0:  # round 0 warms up every configuration
                times[c].append(1e3 * (time.perf_counter() - t0))

    def live_bytes():
        ts = [p for p in model.parameters()] + [b for b in model.buffers()] + [x, y]
        for st in opt.state.values():
            ts += [v for v in st.values() if torch.is_tensor(v)]
        return sum(t.numel() * t.element_size() for t in ts)

    peaks = {}
    for c in configs:
        opt.zero_grad(set_to_none=True)
        base = live_bytes()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    profile_memory=True) as prof:
            step(c)
        # Each event's own allocations minus frees (self_cpu_memory_usage; a "[memory]" event
        # is an allocation outside any op), in the order the events started.
        mem = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events())
        cur = peak = 0
        for _, d in mem:
            cur += d
            peak = max(peak, cur)
        peaks[c] = base + peak

    base_ms = statistics.median(times[configs[0]])
    print(f"PyTorch {torch.__version__} {a.arch} training step, batch {a.batch}, "
          f"{a.size}x{a.size}, NCHW, {torch.get_num_threads()} threads, median of {a.rounds} rounds")
    print(f"  {'segments':<10} {'peak MiB':>14} {'x base':>8} {'step ms':>12} {'x base':>8}")
    rows = []
    for c in configs:
        ms = statistics.median(times[c])
        print(f"  {c:<10} {peaks[c] / 2**20:14.1f} {peaks[c] / peaks[configs[0]]:8.3f} "
              f"{ms:12.1f} {ms / base_ms:8.3f}")
        rows.append({"segments": c, "peak_tensor_bytes": peaks[c],
                     "peak_ratio": peaks[c] / peaks[configs[0]], "step_ms": ms,
                     "time_ratio": ms / base_ms})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"framework": "pytorch", "version": torch.__version__, "arch": a.arch,
                       "batch": a.batch, "size": a.size, "threads": torch.get_num_threads(),
                       "rounds": a.rounds, "configs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
