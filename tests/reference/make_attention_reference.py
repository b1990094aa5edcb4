#!/usr/bin/env python3
"""Writes tests/reference/attention_reference.txt and tests/reference/attention/<case>.pth: the
PyTorch golden values for scaled_dot_product_attention, nn.MultiheadAttention,
nn.TransformerEncoderLayer / TransformerEncoder, nn.LSTM and nn.GRU.

For every module case the weights (a fixed seed, PyTorch's own initialisation, biases made
non-zero so they matter) are saved with torch.save(model.state_dict()) in float64, so the C++
test loads them through io::load_pth exactly as a user loads PyTorch weights. The inputs, the
outputs, a random output gradient and the gradients of every floating input and of every
parameter are recorded twice: computed in float64 ("<case>.y", ...) and in float32 from the
same weights and inputs rounded to float32 ("<case>.f32.y", ...). Modules run in training mode
with dropout 0 (deterministic; the eval-mode fast paths of PyTorch are not taken).

Run with Debian's python3-torch 1.13: /usr/bin/python3 tests/reference/make_attention_reference.py
Format (read by tests/reference_file.hpp): one tensor per record, a header line
`name ndim d0 d1 ...` followed by one line of the row-major values (%.17g); bool masks are
stored as 0/1.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(1416)
torch.set_default_dtype(torch.float64)
here = os.path.dirname(os.path.abspath(__file__))
os.makedirs(os.path.join(here, "attention"), exist_ok=True)
out = {}


def put(name, t):
    assert name not in out, name
    out[name] = t.detach().to(torch.float64).clone()  # not a view of a grad zeroed later


def run(prefix, model, fn, inputs, dtype):
    """Runs fn(model, **leaves) in `dtype`, backpropagates random output gradients and stores
    outputs, output gradients and the gradients of floating inputs and of the parameters."""
    tag = prefix if dtype == torch.float64 else prefix + ".f32"
    model = model.to(dtype) if model is not None else None
    leaves = {}
    for k, v in inputs.items():
        v = v.clone()
        if v.is_floating_point():
            v = v.to(dtype).requires_grad_()
        leaves[k] = v
    ys = fn(model, **leaves)
    ys = ys if isinstance(ys, tuple) else (ys,)
    loss = 0
    g = torch.Generator().manual_seed(7)
    for i, y in enumerate(ys):
        if y is None:
            continue
        gy = torch.randn(y.shape, generator=g, dtype=torch.float64).to(dtype)
        put("%s.y%d" % (tag, i), y)
        put("%s.gy%d" % (tag, i), gy)
        loss = loss + (y * gy).sum()
    loss.backward()
    for k, v in leaves.items():
        if v.requires_grad:
            put("%s.g%s" % (tag, k), v.grad)
    if model is not None:
        for k, p in model.named_parameters():
            put("%s.grad.%s" % (tag, k), p.grad)


def record(prefix, model, fn, inputs):
    for k, v in inputs.items():
        put(prefix + "." + k, v.double() if v.is_floating_point() else v.to(torch.float64))
    if model is not None:
        with torch.no_grad():  # non-zero biases and LayerNorm affines, so that they matter
            for k, p in model.named_parameters():
                if "bias" in k or k.startswith("norm") or ".norm" in k:
                    p.add_(0.1 * torch.randn_like(p))
        model.train()
        torch.save(model.state_dict(), os.path.join(here, "attention", prefix + ".pth"))
    run(prefix, model, fn, inputs, torch.float64)
    if model is not None:
        model.zero_grad()
    run(prefix, model, fn, inputs, torch.float32)


def randn(*s):
    return torch.randn(*s)


# --- scaled_dot_product_attention (torch 1.13's F._scaled_dot_product_attention: bool mask true
# = takes part, float mask added, is_causal top-left) ---------------------------------------------
def sdpa(mask=None, causal=False):
    def f(_, q, k, v, **kw):
        m = kw.get("mask", None)
        o, _w = F._scaled_dot_product_attention(q, k, v, m, 0.0, False, causal)
        return o
    return f


keep = torch.rand(5, 7) > 0.3
keep[:, 0] = True  # no fully masked row
record("sdpa_plain", None, sdpa(), dict(q=randn(2, 3, 5, 4), k=randn(2, 3, 7, 4),
                                       v=randn(2, 3, 7, 6)))
record("sdpa_bool", None, sdpa(), dict(q=randn(2, 3, 5, 4), k=randn(2, 3, 7, 4),
                                      v=randn(2, 3, 7, 6), mask=keep))
record("sdpa_float", None, sdpa(), dict(q=randn(2, 5, 4), k=randn(2, 7, 4), v=randn(2, 7, 3),
                                       mask=randn(2, 5, 7)))
record("sdpa_causal", None, sdpa(causal=True), dict(q=randn(2, 2, 6, 4), k=randn(2, 2, 6, 4),
                                                    v=randn(2, 2, 6, 4)))

# --- nn.MultiheadAttention ----------------------------------------------------------------------
E, H, L, S, N = 8, 2, 5, 6, 3


def mha_self(m, x, **kw):
    return m(x, x, x, need_weights=True)


record("mha_self", nn.MultiheadAttention(E, H), mha_self, dict(x=randn(L, N, E)))

kpm = torch.rand(N, S) > 0.6
kpm[:, 0] = False


def mha_kv(m, q, kv, attn_mask, key_padding_mask):
    return m(q, kv, kv, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
             average_attn_weights=False)


record("mha_kv_batch_first", nn.MultiheadAttention(E, H, batch_first=True), mha_kv,
       dict(q=randn(N, L, E), kv=randn(N, S, E), attn_mask=randn(L, S), key_padding_mask=kpm))

blocked = torch.rand(N * H, L, S) > 0.6
blocked[:, :, 1] = False


def mha_qkv(m, q, k, v, attn_mask):
    return m(q, k, v, attn_mask=attn_mask)


record("mha_kdim_vdim", nn.MultiheadAttention(E, H, kdim=5, vdim=7), mha_qkv,
       dict(q=randn(L, N, E), k=randn(S, N, 5), v=randn(S, N, 7), attn_mask=blocked))
record("mha_nobias", nn.MultiheadAttention(E, 4, bias=False), mha_qkv,
       dict(q=randn(L, N, E), k=randn(S, N, E), v=randn(S, N, E), attn_mask=blocked[:N * 4 // 2]
            .repeat(2, 1, 1)))

kpm1 = torch.tensor([False, True, False, False, True, False])


def mha_unbatched(m, q, k, v, key_padding_mask):
    return m(q, k, v, key_padding_mask=key_padding_mask)


record("mha_unbatched", nn.MultiheadAttention(E, H), mha_unbatched,
       dict(q=randn(L, E), k=randn(S, E), v=randn(S, E), key_padding_mask=kpm1))


# --- nn.TransformerEncoderLayer / TransformerEncoder -------------------------------------------
def enc(m, x, src_mask=None, src_key_padding_mask=None):
    return m(x, src_mask=src_mask, src_key_padding_mask=src_key_padding_mask)


causal = torch.triu(torch.full((L, L), float("-inf")), diagonal=1)
kpm_l = torch.rand(N, L) > 0.7
kpm_l[:, 0] = False
for norm_first in (False, True):
    for batch_first in (False, True):
        act = "gelu" if norm_first else "relu"
        name = "enc_%s_%s" % ("pre" if norm_first else "post", "bf" if batch_first else "sf")
        layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=0.0, activation=act,
                                           batch_first=batch_first, norm_first=norm_first)
        x = randn(N, L, E) if batch_first else randn(L, N, E)
        inputs = dict(x=x)
        if batch_first:  # masks on the batch-first cases
            inputs.update(src_mask=causal, src_key_padding_mask=kpm_l)
        record(name, layer, enc, inputs)

layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=0.0, layer_norm_eps=1e-6)
stack = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(E))
with torch.no_grad():  # the copies start equal (deepcopy): make the second layer differ
    for p in stack.layers[1].parameters():
        p.add_(0.05 * torch.randn_like(p))
record("encoder_2", stack, lambda m, x, mask: m(x, mask=mask),
       dict(x=randn(L, N, E), mask=causal))


# --- nn.LSTM / nn.GRU ---------------------------------------------------------------------------
def lstm_hc(m, x, h0, c0):
    y, (h, c) = m(x, (h0, c0))
    return y, h, c


def rnn_none(m, x):
    y, h = m(x)
    if isinstance(h, tuple):
        return (y,) + h
    return y, h


T, I, Hd = 6, 4, 5
record("lstm_2layer", nn.LSTM(I, Hd, num_layers=2), lstm_hc,
       dict(x=randn(T, N, I), h0=randn(2, N, Hd), c0=randn(2, N, Hd)))
record("lstm_bidir_bf_nobias", nn.LSTM(I, Hd, num_layers=2, bias=False, batch_first=True,
                                       bidirectional=True), rnn_none, dict(x=randn(N, T, I)))
record("lstm_unbatched", nn.LSTM(I, Hd, bidirectional=True), lstm_hc,
       dict(x=randn(T, I), h0=randn(2, Hd), c0=randn(2, Hd)))


def gru_h(m, x, h0):
    y, h = m(x, h0)
    return y, h


record("gru_2layer_bidir", nn.GRU(I, Hd, num_layers=2, bidirectional=True), gru_h,
       dict(x=randn(T, N, I), h0=randn(4, N, Hd)))
record("gru_bf_nobias", nn.GRU(I, Hd, bias=False, batch_first=True), rnn_none,
       dict(x=randn(N, T, I)))
record("gru_unbatched", nn.GRU(I, Hd, num_layers=2), gru_h, dict(x=randn(T, I), h0=randn(2, Hd)))

path = os.path.join(here, "attention_reference.txt")
with open(path, "w") as f:
    f.write("# written by tests/reference/make_attention_reference.py (torch %s)\n"
            % torch.__version__)
    for k in sorted(out):
        t = out[k]
        f.write("%s %d %s\n" % (k, t.dim(), " ".join(str(s) for s in t.shape)))
        f.write(" ".join("%.17g" % v for v in t.flatten().tolist()) + "\n")
print("wrote %d tensors to %s" % (len(out), path))
