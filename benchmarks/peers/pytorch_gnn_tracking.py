#!/usr/bin/python3
"""PyTorch CPU peer of examples/gnn_tracking: the same interaction network (node and edge
encoder MLPs, K interaction layers with index_add_ aggregation to both ends of each edge,
residual updates, edge classifier MLP, BCE with logits, Adam), trained on the very events the
example generated (`gnn_tracking --dump-events events.safetensors`), batched the same way
(disjoint union, node offsets added to edge_index). Plain torch, no PyG.

It times training steps (forward + loss + backward + Adam step + loss.item(); batches collated
beforehand) and prints the median step in ms and graphs/s. With --compare DLTRAIN_JSON (the
example's --json report, run with the same --batch-size, --hidden and --iterations) it prints
both sides and the ratio of graphs/s, dltrain / pytorch (higher is better for dltrain).

  build/examples/gnn_tracking --threads 2 --epochs 1 --dump-events ev.safetensors --json dl.json
  .venv-peers/bin/python benchmarks/peers/pytorch_gnn_tracking.py ev.safetensors --threads 2 \
      --compare dl.json
"""
import argparse
import json
import random
import statistics
import struct
import time

import numpy as np
import torch
from torch import nn

DTYPES = {"F32": np.float32, "I64": np.int64, "F64": np.float64, "I32": np.int32}


def load_safetensors(path):
    """The safetensors format by hand (8-byte header length, JSON header, raw data)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        a = np.frombuffer(data[b:e], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        out[name] = torch.from_numpy(a.copy())
    return out, meta


def mlp(i, h, o, final_relu):
    layers = [nn.Linear(i, h), nn.ReLU(), nn.Linear(h, o)]
    if final_relu:
        layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Interaction(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.edge_mlp = mlp(3 * h, h, h, True)
        self.node_mlp = mlp(3 * h, h, h, True)

    def forward(self, x, edge_index, e):
        src, dst = edge_index[0], edge_index[1]
        m = self.edge_mlp(torch.cat([x.index_select(0, src), x.index_select(0, dst), e], 1))
        zero = torch.zeros_like(x)
        agg_in = zero.index_add(0, dst, m)
        agg_out = zero.index_add(0, src, m)
        return x + self.node_mlp(torch.cat([x, agg_in, agg_out], 1)), e + m


class InteractionNetwork(nn.Module):
    def __init__(self, h, k):
        super().__init__()
        self.node = mlp(3, h, h, True)
        self.edge = mlp(4, h, h, True)
        self.layers = nn.ModuleList([Interaction(h) for _ in range(k)])
        self.net = mlp(3 * h, h, 1, False)

    def forward(self, x, edge_index, edge_attr):
        x, e = self.node(x), self.edge(edge_attr)
        for layer in self.layers:
            x, e = layer(x, edge_index, e)
        src, dst = edge_index[0], edge_index[1]
        return self.net(torch.cat([x.index_select(0, src), x.index_select(0, dst), e], 1)).squeeze(1)


def collate(events):
    xs, eis, eas, ys, off = [], [], [], [], 0
    for ev in events:
        xs.append(ev["x"])
        eis.append(ev["edge_index"] + off)
        eas.append(ev["edge_attr"])
        ys.append(ev["y"])
        off += ev["x"].shape[0]
    return torch.cat(xs), torch.cat(eis, 1), torch.cat(eas), torch.cat(ys)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("events")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--steps", type=int, default=60, help="timed steps (after 3 warm-ups)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compare", help="the example's --json report")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    tensors, meta = load_safetensors(a.events)
    n = int(meta["events"])
    events = [{k: tensors[f"event_{i}.{k}"] for k in ("x", "edge_index", "edge_attr", "y")}
              for i in range(n)]
    rng = random.Random(a.seed)
    order = list(range(n))
    batches = []
    while len(batches) < a.steps + 3:
        rng.shuffle(order)
        for b in range(0, n - a.batch_size + 1, a.batch_size):
            batches.append(collate([events[i] for i in order[b:b + a.batch_size]]))
    batches = batches[:a.steps + 3]
    model = InteractionNetwork(a.hidden, a.iterations)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    times, losses = [], []
    for i, (x, ei, ea, y) in enumerate(batches):
        t0 = time.perf_counter()
        loss = nn.functional.binary_cross_entropy_with_logits(model(x, ei, ea), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if i >= 3:
            times.append(time.perf_counter() - t0)
    step_ms = 1e3 * statistics.median(times)
    gps = a.batch_size / (step_ms / 1e3)
    edges = statistics.mean(ev["y"].numel() for ev in events)
    print(f"pytorch {torch.__version__}, {torch.get_num_threads()} threads: {n} events "
          f"({meta.get('detector', '?')}), {edges:.0f} edges per event, batch {a.batch_size}, "
          f"hidden {a.hidden}, {a.iterations} iterations, "
          f"{sum(p.numel() for p in model.parameters())} parameters")
    print(f"pytorch: step {step_ms:.2f} ms (median of {len(times)}), {gps:.1f} graphs/s, "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if a.compare:
        with open(a.compare) as f:
            dl = json.load(f)
        s = dl["step_ms"]
        dl_ms = s["forward"] + s["backward"] + s["optimizer"]
        dl_gps = dl["batch_size"] / (dl_ms / 1e3)
        print(f"dltrain: step {dl_ms:.2f} ms (forward {s['forward']:.2f} + backward "
              f"{s['backward']:.2f} + optimizer {s['optimizer']:.2f}; data {s['data']:.2f} "
              f"apart), {dl_gps:.1f} graphs/s, {dl['threads']} threads")
        print(f"ratio (dltrain graphs/s / pytorch graphs/s): {dl_gps / gps:.2f}")


if __name__ == "__main__":
    main()
