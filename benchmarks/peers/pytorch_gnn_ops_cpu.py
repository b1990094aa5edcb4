#!/usr/bin/python3
"""PyTorch CPU peer of benchmarks/gnn_ops_cpu.cpp: the same cases (segment_sum as index_add,
segment_max as scatter_reduce amax with include_self=False, PyG's softmax, sort, topk,
cumsum, logsumexp, vector_norm; forward + backward, f32), median ms over --iters runs after
two warm-ups, the same JSON schema. With --compare DLTRAIN_JSON it prints both side by side
and the ratio dltrain / pytorch (lower is better for dltrain). Use a current torch
(.venv-peers, scripts/setup.sh --peers).

  .venv-peers/bin/python benchmarks/peers/pytorch_gnn_ops_cpu.py --threads 2 --compare dl.json
"""
import torch
from peer_bench import OpBench


def leaf(*shape):
    return torch.randn(*shape).requires_grad_()


def segment_max(src, ids, n):
    z = torch.zeros((n,) + src.shape[1:])
    idx = ids.view((-1,) + (1,) * (src.dim() - 1)).expand_as(src)
    return z.scatter_reduce(0, idx, src, "amax", include_self=False)


def segment_softmax(src, ids, n):
    m = segment_max(src.detach(), ids, n)
    e = (src - m.index_select(0, ids)).exp()
    s = torch.zeros((n,) + src.shape[1:]).index_add(0, ids, e) + 1e-16
    return e / s.index_select(0, ids)


def main():
    bench = OpBench(__doc__.splitlines()[0])
    run = bench.run

    N, E, F = 10000, 80000, 64
    dst = (torch.rand(E) * N).long()
    msg, att, x = leaf(E, F), leaf(E, 4), leaf(N, F)
    run("segment_sum E80k F64 -> N10k",
        lambda: torch.zeros(N, F).index_add(0, dst, msg).sum().backward())
    run("index_add E80k F64 -> N10k", lambda: x.index_add(0, dst, msg).sum().backward())
    run("segment_max E80k F64 -> N10k", lambda: segment_max(msg, dst, N).sum().backward())
    run("segment_softmax E80k H4",
        lambda: (segment_softmax(att, dst, N) * att).sum().backward())
    s = leaf(1024, 1024)
    run("sort 1024x1024 dim -1", lambda: torch.sort(s, dim=-1, stable=True)[0].sum().backward())
    run("topk k16 1024x1024 dim -1", lambda: torch.topk(s, 16, -1)[0].sum().backward())
    c = leaf(256, 4096)
    run("cumsum 256x4096 dim -1", lambda: torch.cumsum(c, -1).sum().backward())
    run("cumsum 256x4096 dim 0", lambda: torch.cumsum(c, 0).sum().backward())
    run("logsumexp 256x4096 dim -1", lambda: torch.logsumexp(c, -1).sum().backward())
    run("norm 2 256x4096 dim -1",
        lambda: torch.linalg.vector_norm(c, 2, -1).sum().backward())
    bench.finish()


if __name__ == "__main__":
    main()
