#!/usr/bin/env python3
"""Writes tests/reference/gnn_ops_reference.txt: inputs, outputs and gradients of the second
batch of issue-14 ops (scatter_reduce, index_add, segment_max, segment_softmax, logsumexp,
cumsum, prod, norm, sort, argsort, topk, nonzero, repeat, flip, roll, tril, triu) computed by
PyTorch in float64. Index and integer results are stored as float64 values.

Run with Debian's python3-torch: /usr/bin/python3 tests/reference/make_gnn_ops_reference.py
Format (read by tests/reference_file.hpp): one tensor per record, a header line
`name ndim d0 d1 ...` followed by one line of the row-major values (%.17g).
"""
import os

import torch

torch.manual_seed(1415)
torch.set_default_dtype(torch.float64)
out = {}


def put(name, t):
    out[name] = t.detach().to(torch.float64).contiguous()


def record(prefix, fn, inputs, consts=()):
    """Runs fn on leaves made from `inputs` (name -> tensor), backpropagates a random gy and
    stores inputs, y, gy and the gradient of every floating input not named in consts."""
    leaves = {}
    for k, v in inputs.items():
        v = v.clone()
        if v.is_floating_point() and k not in consts:
            v.requires_grad_()
        leaves[k] = v
    y = fn(**leaves)
    for k, v in leaves.items():
        put(prefix + "." + k, v)
    put(prefix + ".y", y)
    if y.requires_grad:
        gy = torch.randn_like(y)
        y.backward(gy)
        put(prefix + ".gy", gy)
        for k, v in leaves.items():
            if v.requires_grad:
                put(prefix + ".g" + k, v.grad)


# scatter_reduce along dim 0: index [6, 3] into x [5, 3] (row 4 receives nothing in column 0),
# src [6, 3] (torch 1.13 cannot backpropagate into a larger src). "ties" uses whole numbers so
# amax/amin have ties between src values and with x.
idx0 = torch.tensor([[0, 1, 2], [2, 1, 0], [0, 3, 3], [1, 1, 2], [3, 0, 4], [0, 2, 4]])
for data in ("rand", "ties"):
    for reduce in ("sum", "mean", "amax", "amin"):
        for inc in (True, False):
            if data == "rand":
                x, src = torch.randn(5, 3), torch.randn(6, 3)
            else:
                x = torch.randint(-2, 3, (5, 3)).double()
                src = torch.randint(-2, 3, (6, 3)).double()
            record("scatter_reduce_%s_%s_%s" % (data, reduce, "self" if inc else "noself"),
                   lambda x, src, index: x.scatter_reduce(0, index, src, reduce,
                                                          include_self=inc),
                   dict(x=x, src=src, index=idx0))
# along dim 1
idx1 = torch.tensor([[0, 3, 3, 1, 0], [2, 2, 2, 2, 1], [1, 0, 1, 0, 3]])
for reduce in ("sum", "mean", "amax", "amin"):
    record("scatter_reduce_dim1_%s" % reduce,
           lambda x, src, index: x.scatter_reduce(1, index, src, reduce, include_self=False),
           dict(x=torch.randn(3, 4), src=torch.randn(3, 5), index=idx1))

# index_add (repeated indices, alpha) along dim 0 and 1
record("index_add_d0", lambda x, src, index: x.index_add(0, index, src, alpha=2.0),
       dict(x=torch.randn(5, 4), src=torch.randn(6, 4), index=torch.tensor([0, 4, 1, 0, 4, 2])))
record("index_add_d1", lambda x, src, index: x.index_add(1, index, src),
       dict(x=torch.randn(3, 5), src=torch.randn(3, 4), index=torch.tensor([4, 0, 4, 3])))

# segment_max / segment_softmax as PyG computes them (segment 3 empty)
ids = torch.tensor([0, 2, 1, 0, 4, 2, 2, 0])


def seg_max(src, ids):
    z = torch.zeros((5,) + src.shape[1:])
    return z.scatter_reduce(0, ids.view((-1,) + (1,) * (src.dim() - 1)).expand_as(src), src, "amax", include_self=False)


def seg_softmax(src, ids):
    m = seg_max(src.detach(), ids)
    e = (src - m.index_select(0, ids)).exp()
    s = torch.zeros((5,) + src.shape[1:]).index_add(0, ids, e) + 1e-16
    return e / s.index_select(0, ids)


record("segment_max", seg_max, dict(src=torch.randn(8, 3), ids=ids))
record("segment_softmax", seg_softmax, dict(src=torch.randn(8, 3) * 3, ids=ids))
record("segment_softmax_1d", seg_softmax, dict(src=torch.randn(8) * 3, ids=ids))

# logsumexp (one row of large values for the max shift)
xl = torch.randn(3, 4, 5)
xl[1, 2] += 1000.0
record("logsumexp_d1", lambda x: torch.logsumexp(x, (1,)), dict(x=xl))
record("logsumexp_d02_keep", lambda x: torch.logsumexp(x, (0, 2), keepdim=True), dict(x=xl))
record("logsumexp_all", lambda x: torch.logsumexp(x, (0, 1, 2)), dict(x=xl))

# cumsum
xc = torch.randn(3, 4, 5)
record("cumsum_d1", lambda x: torch.cumsum(x, 1), dict(x=xc))
record("cumsum_dlast", lambda x: torch.cumsum(x, -1), dict(x=xc))
record("cumsum_int", lambda x: torch.cumsum(x, 0), dict(x=torch.randint(-5, 6, (4, 3))))

# prod with zeros (none, one, two in a row)
xp = torch.randn(4, 5)
xp[1, 2] = 0.0
xp[2, 0] = 0.0
xp[2, 3] = 0.0
record("prod_d1", lambda x: torch.prod(x, 1), dict(x=xp))
record("prod_d0_keep", lambda x: torch.prod(x, 0, keepdim=True), dict(x=xp))
record("prod_all", lambda x: torch.prod(x), dict(x=torch.randn(2, 3) + 0.5))

# norm
xn = torch.randn(3, 4, 5)
xn[2, 1] = 0.0
record("norm_2_all", lambda x: torch.linalg.vector_norm(x), dict(x=xn))
record("norm_2_d2", lambda x: torch.linalg.vector_norm(x, 2, (2,)), dict(x=xn))
record("norm_1_d1", lambda x: torch.linalg.vector_norm(x, 1, (1,)), dict(x=xn))
record("norm_inf_d02_keep", lambda x: torch.linalg.vector_norm(x, float("inf"), (0, 2), True),
       dict(x=xn))
record("norm_3_d2", lambda x: torch.linalg.vector_norm(x, 3, (2,)), dict(x=xn))
record("norm_0_d2", lambda x: torch.linalg.vector_norm(x, 0, (2,)), dict(x=xn), consts=("x",))

# sort / argsort / topk: ties (whole numbers) and NaN for sort; distinct values for topk
xs = torch.randint(-3, 4, (4, 6)).double()
xs[2, 1] = float("nan")
xs[2, 4] = float("nan")
for desc in (False, True):
    tag = "desc" if desc else "asc"
    record("sort_%s" % tag, lambda x: torch.sort(x, dim=1, descending=desc, stable=True)[0],
           dict(x=xs))
    put("sort_%s.i" % tag, torch.sort(xs, dim=1, descending=desc, stable=True)[1])
    put("sort_d0_%s.i" % tag, torch.sort(xs, dim=0, descending=desc, stable=True)[1])
xt = torch.randn(4, 6)
record("topk_largest", lambda x: torch.topk(x, 3, 1)[0], dict(x=xt))
put("topk_largest.i", torch.topk(xt, 3, 1)[1])
record("topk_smallest_d0", lambda x: torch.topk(x, 2, 0, largest=False)[0], dict(x=xt))
put("topk_smallest_d0.i", torch.topk(xt, 2, 0, largest=False)[1])

# nonzero
xz = torch.tensor([[0.0, 1.5, 0.0], [float("nan"), 0.0, -2.0]]).reshape(2, 3, 1).repeat(1, 1, 2)
xz[1, 2, 0] = 0.0
put("nonzero.x", xz)
put("nonzero.y", torch.nonzero(xz))

# repeat, flip, roll, tril, triu
record("repeat", lambda x: x.repeat(2, 1, 3), dict(x=torch.randn(2, 3)))
record("flip", lambda x: torch.flip(x, (0, 2)), dict(x=torch.randn(2, 3, 4)))
record("roll", lambda x: torch.roll(x, (1, -2), (0, 1)), dict(x=torch.randn(3, 4)))
record("roll_flat", lambda x: torch.roll(x, 5), dict(x=torch.randn(3, 4)))
xtr = torch.randn(2, 3, 4)
for k in (0, 1, -1):
    record("tril_%d" % k, lambda x: torch.tril(x, k), dict(x=xtr))
    record("triu_%d" % k, lambda x: torch.triu(x, k), dict(x=xtr))

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gnn_ops_reference.txt")
with open(path, "w") as f:
    f.write("# generated by make_gnn_ops_reference.py with torch %s\n" % torch.__version__)
    for name, t in out.items():
        f.write("%s %d %s\n" % (name, t.dim(), " ".join(str(s) for s in t.shape)))
        f.write(" ".join("%.17g" % v for v in t.reshape(-1).tolist()) + "\n")
print("wrote", path, len(out), "tensors")
