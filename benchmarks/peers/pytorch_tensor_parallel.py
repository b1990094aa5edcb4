"""PyTorch's side of benchmarks/tensor_parallel.cpp: the same MLP block (Linear h -> 4h, exact
GELU, Linear 4h -> h, f32) trained one step at a time against a fixed output gradient, as one
process and split over the ranks with DTensor's tensor parallelism (ColwiseParallel on the first
layer, RowwiseParallel on the second: the Megatron pair, one all-reduce forward, one backward),
on CPU ranks over gloo. Run under mpirun like the dltrain program, with the same flags:

    mpirun -np 2 .venv-peers/bin/python benchmarks/peers/pytorch_tensor_parallel.py \\
        [--hidden 1024] [--tokens 512] [--rounds 7] [--threads 1] [--json PATH]

Each round, as in dltrain's program: one process on rank 0 with --threads threads while the
others wait at a barrier, the same with the threads of every rank, one all-reduce of tokens x h,
and the tensor-parallel step on every rank; the first round untimed; medians, the maximum over
ranks. The rendezvous is MASTER_ADDR:MASTER_PORT (default 127.0.0.1:29517); rank and size come
from Open MPI's (or Slurm's) variables.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def env_int(*names, default):
    for n in names:
        if n in os.environ:
            return int(os.environ[n])
    return default


class MLP(torch.nn.Module):
    def __init__(self, h):
        super().__init__()
        self.linear1 = torch.nn.Linear(h, 4 * h)
        self.linear2 = torch.nn.Linear(4 * h, h)

    def forward(self, x):
        return self.linear2(torch.nn.functional.gelu(self.linear1(x)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--json")
    a = ap.parse_args()
    rank = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK", default=0)
    size = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "WORLD_SIZE", default=1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(size)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    torch.set_num_threads(a.threads)
    h, p = a.hidden, size
    if (4 * h) % p:
        ap.error("--hidden: 4 x %d must be divisible by the %d ranks" % (h, p))

    torch.manual_seed(0)
    single = MLP(h)
    tp = MLP(h)
    tp.load_state_dict(single.state_dict())
    mesh = init_device_mesh("cpu", (p,))
    tp = parallelize_module(tp, mesh, {"linear1": ColwiseParallel(), "linear2": RowwiseParallel()})
    g = torch.Generator().manual_seed(1)
    x = torch.randn(a.tokens, h, generator=g)
    gy = torch.randn(a.tokens, h, generator=g)
    buf = torch.randn(a.tokens, h, generator=g)

    def step(m):
        m.zero_grad(set_to_none=True)
        xi = x.detach().requires_grad_()
        (m(xi) * gy).sum().backward()

    def timed(f):
        t0 = time.perf_counter()
        f()
        return (time.perf_counter() - t0) * 1e3

    rows = {"single": [], "single_all": [], "reduce": [], "tp": []}
    for r in range(a.rounds + 1):
        t_single = t_all = 0.0
        dist.barrier()
        if rank == 0:
            t_single = timed(lambda: step(single))
            torch.set_num_threads(a.threads * p)
            t_all = timed(lambda: step(single))
            torch.set_num_threads(a.threads)
        dist.barrier()
        t_reduce = timed(lambda: dist.all_reduce(buf))
        dist.barrier()
        t_tp = timed(lambda: step(tp))
        if r == 0:
            continue
        for k, v in (("single", t_single), ("single_all", t_all), ("reduce", t_reduce),
                     ("tp", t_tp)):
            rows[k].append(v)

    def worst(v):
        t = torch.tensor([statistics.median(v)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    res = {k: worst(v) for k, v in rows.items()}
    params = sum(q.numel() for q in single.parameters()) * 4 / 2**20
    local = sum(q.to_local().numel() if hasattr(q, "to_local") else q.numel()
                for q in tp.parameters()) * 4 / 2**20
    if rank == 0:
        print("PyTorch %s, MLP block d=%d, ffn=%d, GELU, %d tokens, f32, forward + backward; "
              "%d ranks (gloo), %d threads per rank; median of %d rounds, maximum over ranks:"
              % (torch.__version__, h, 4 * h, a.tokens, p, a.threads, a.rounds))
        print("  %-34s %10s %14s %12s" % ("mode", "step ms", "params MiB/rank", "x single"))
        print("  %-34s %10.2f %14.2f %12.2f" % ("single process", res["single"], params, 1.0))
        print("  %-34s %10.2f %14.2f %12.2f" % ("single process, %d threads" % (a.threads * p),
                                              res["single_all"], params,
                                              res["single"] / res["single_all"]))
        print("  %-34s %10.2f %14.2f %12.2f" % ("tensor parallel (DTensor)", res["tp"], local,
                                              res["single"] / res["tp"]))
        print("  all-reduce of %.2f MiB: %.3f ms" % (a.tokens * h * 4 / 2**20, res["reduce"]))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"benchmark": "tensor_parallel", "peer": "pytorch",
                           "torch": torch.__version__, "hidden": h, "ffn": 4 * h,
                           "tokens": a.tokens, "ranks": p, "threads_per_rank": a.threads,
                           "rounds": a.rounds, "single_ms": res["single"],
                           "single_all_threads_ms": res["single_all"],
                           "tensor_parallel_ms": res["tp"], "all_reduce_ms": res["reduce"],
                           "single_param_mib": params,
                           "tensor_parallel_param_mib_per_rank": local}, f, indent=1)
            print("wrote %s" % a.json)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
