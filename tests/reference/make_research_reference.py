#!/usr/bin/env python3
"""Writes tests/reference/research_reference.txt: inputs, outputs and gradients of the issue-14
ops (conv_transpose2d, interpolate, pad, pixel_shuffle, activations, losses) computed by
PyTorch in float64.

Run with Debian's python3-torch: /usr/bin/python3 tests/reference/make_research_reference.py
Format (read by tests/reference_file.hpp): one tensor per record, a header line
`name ndim d0 d1 ...` followed by one line of the row-major values (%.17g).
"""
import os

import torch
import torch.nn.functional as F

torch.manual_seed(1414)
torch.set_default_dtype(torch.float64)
out = {}


def put(name, t):
    out[name] = t.detach().to(torch.float64).contiguous()


def record(prefix, fn, inputs, grad=True, consts=()):
    """Runs fn on leaves made from `inputs` (name -> tensor), backpropagates a random gy and
    stores inputs, y, gy and the gradient of every input not named in consts under prefix."""
    leaves = {k: v.clone().requires_grad_(grad and k not in consts) for k, v in inputs.items()}
    y = fn(**leaves)
    for k, v in leaves.items():
        put(prefix + "." + k, v)
    put(prefix + ".y", y)
    if grad:
        gy = torch.randn_like(y)
        y.backward(gy)
        put(prefix + ".gy", gy)
        for k, v in leaves.items():
            if k not in consts:
                put(prefix + ".g" + k, v.grad)


# conv_transpose2d: stride 2, padding 1, output_padding 1, groups 2, bias
record("convt_a", lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1,
                                                     output_padding=1, groups=2),
       dict(x=torch.randn(2, 4, 5, 4), w=torch.randn(4, 3, 3, 3), b=torch.randn(6)))
# non-square: stride (2, 3), padding (0, 1), output_padding (1, 2), dilation (2, 1), no bias
record("convt_b", lambda x, w: F.conv_transpose2d(x, w, None, stride=(2, 3), padding=(0, 1),
                                                  output_padding=(1, 2), dilation=(2, 1)),
       dict(x=torch.randn(2, 3, 4, 3), w=torch.randn(3, 2, 3, 2)))
# output_padding >= stride (allowed because it is below the dilation)
record("convt_c", lambda x, w, b: F.conv_transpose2d(x, w, b, stride=1, padding=1,
                                                     output_padding=1, dilation=2),
       dict(x=torch.randn(1, 2, 4, 5), w=torch.randn(2, 3, 3, 3), b=torch.randn(3)))

# interpolate
x = torch.randn(2, 3, 4, 5)
record("interp_nearest_s2", lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), dict(x=x))
record("interp_nearest_size", lambda x: F.interpolate(x, size=(7, 3), mode="nearest"), dict(x=x))
record("interp_bilinear_size", lambda x: F.interpolate(x, size=(7, 9), mode="bilinear",
                                                       align_corners=False), dict(x=x))
record("interp_bilinear_s2", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear",
                                                     align_corners=False), dict(x=x))
record("interp_bilinear_down", lambda x: F.interpolate(x, size=(3, 2), mode="bilinear",
                                                       align_corners=False), dict(x=x))
record("interp_bilinear_ac", lambda x: F.interpolate(x, size=(7, 9), mode="bilinear",
                                                     align_corners=True), dict(x=x))

# pad (left, right, top, bottom)
record("pad_constant", lambda x: F.pad(x, (1, 2, 0, 1), mode="constant", value=0.5), dict(x=x))
record("pad_reflect", lambda x: F.pad(x, (2, 1, 1, 3), mode="reflect"), dict(x=x))
record("pad_replicate", lambda x: F.pad(x, (3, 1, 2, 0), mode="replicate"), dict(x=x))
record("pad_constant_neg", lambda x: F.pad(x, (-1, 2, 1, -2), mode="constant"), dict(x=x))

# pixel_shuffle
record("pixel_shuffle", lambda x: F.pixel_shuffle(x, 2), dict(x=torch.randn(2, 8, 3, 2)))

# activations and unary math on values that include the piecewise edges
a = torch.cat([torch.linspace(-6, 6, 25), torch.tensor([-3.0, 3.0, 0.0, 25.0, -25.0]),
               torch.randn(10)])
record("silu", lambda x: F.silu(x), dict(x=a))
record("softplus", lambda x: F.softplus(x), dict(x=a))
record("softplus_b2", lambda x: F.softplus(x, beta=2.0, threshold=5.0), dict(x=a))
record("elu", lambda x: F.elu(x), dict(x=a))
record("elu_a05", lambda x: F.elu(x, alpha=0.5), dict(x=a))
record("mish", lambda x: F.mish(x), dict(x=a))
record("hardswish", lambda x: F.hardswish(x), dict(x=a))
record("sin", lambda x: torch.sin(x), dict(x=a))
record("cos", lambda x: torch.cos(x), dict(x=a))
record("sign", lambda x: torch.sign(x), dict(x=a))
p = torch.rand(40) * 3 - 0.9
record("log1p", lambda x: torch.log1p(x), dict(x=p))
record("expm1", lambda x: torch.expm1(x), dict(x=a / 4))

# losses
inp, tgt = torch.randn(3, 5), torch.randn(3, 5)
tgt[0, 0] = inp[0, 0]  # a zero difference (L1's subgradient 0)
for red in ("none", "mean", "sum"):
    record("l1_" + red, lambda x, t: F.l1_loss(x, t, reduction=red), dict(x=inp, t=tgt))
    record("smooth_l1_" + red, lambda x, t: F.smooth_l1_loss(x, t, reduction=red, beta=0.5),
           dict(x=inp, t=tgt))
    record("huber_" + red, lambda x, t: F.huber_loss(x, t, reduction=red, delta=0.7),
           dict(x=inp, t=tgt))
# beta 0 is l1; without the tie, where torch 1.13 returns a subgradient of -1 (its own l1_loss
# gives 0 there)
tgt_untied = tgt.clone()
tgt_untied[0, 0] += 0.5
record("smooth_l1_beta0", lambda x, t: F.smooth_l1_loss(x, t, beta=0.0), dict(x=inp, t=tgt_untied))
logp = F.log_softmax(torch.randn(4, 6), dim=1)
q = F.softmax(torch.randn(4, 6), dim=1)
q[0, 1] = 0.0  # a zero target probability contributes 0
for red in ("none", "mean", "sum", "batchmean"):
    record("kl_div_" + red, lambda x, t: F.kl_div(x, t, reduction=red), dict(x=logp, t=q),
           consts=("t",))
record("kl_div_logtarget", lambda x, t: F.kl_div(x, t, reduction="batchmean", log_target=True),
       dict(x=logp, t=F.log_softmax(torch.randn(4, 6), dim=1)))
prob = torch.rand(3, 4) * 0.98 + 0.01
btgt = torch.rand(3, 4)
bw = torch.rand(3, 4) + 0.5
for red in ("none", "mean", "sum"):
    record("bce_" + red, lambda x, t: F.binary_cross_entropy(x, t, reduction=red),
           dict(x=prob, t=btgt))
record("bce_weight", lambda x, t: F.binary_cross_entropy(x, t, weight=bw), dict(x=prob, t=btgt))
put("bce_weight.w", bw)
mu, y = torch.randn(4, 3), torch.randn(4, 3)
var = torch.rand(4, 3) + 0.1
var[0, 0] = 1e-8  # clamped to eps
for red in ("none", "mean", "sum"):
    record("gnll_" + red, lambda x, t, v: F.gaussian_nll_loss(x, t, v, reduction=red),
           dict(x=mu, t=y, v=var))
record("gnll_full", lambda x, t, v: F.gaussian_nll_loss(x, t, v, full=True, eps=1e-3),
       dict(x=mu, t=y, v=var))
record("gnll_var1", lambda x, t, v: F.gaussian_nll_loss(x, t, v), dict(x=mu, t=y, v=var[:, :1]))

# conv1d (appended last so the values above keep their random draws)
record("conv1d", lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1, dilation=2, groups=2),
       dict(x=torch.randn(2, 4, 11), w=torch.randn(6, 2, 3), b=torch.randn(6)))

# group_norm and instance_norm (with running statistics: training then eval)
record("group_norm", lambda x, w, b: F.group_norm(x, 3, w, b, eps=1e-5),
       dict(x=torch.randn(2, 6, 4, 3) * 2 + 1, w=torch.randn(6), b=torch.randn(6)))
xi = torch.randn(3, 4, 5, 5) * 1.5 - 0.5
rm, rv = torch.randn(4), torch.rand(4) + 0.5
put("instance_norm.running_mean_in", rm)
put("instance_norm.running_var_in", rv)
rm2, rv2 = rm.clone(), rv.clone()
record("instance_norm", lambda x, w, b: F.instance_norm(x, rm2, rv2, w, b, use_input_stats=True,
                                                        momentum=0.2, eps=1e-5),
       dict(x=xi, w=torch.randn(4), b=torch.randn(4)))
put("instance_norm.running_mean_out", rm2)
put("instance_norm.running_var_out", rv2)
xe = torch.randn(2, 4, 3, 3)
put("instance_norm_eval.x", xe)
put("instance_norm_eval.y", F.instance_norm(xe, rm2, rv2, None, None, use_input_stats=False))

# clamp with tensor bounds (broadcasting; min > max somewhere, where max wins)
record("clamp_tensor", lambda x, lo, hi: torch.clamp(x, min=lo, max=hi),
       dict(x=torch.randn(3, 4) * 2, lo=torch.randn(3, 1) - 0.5, hi=torch.randn(1, 4) + 0.5))

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "research_reference.txt")
with open(path, "w") as f:
    f.write("# generated by make_research_reference.py with torch %s\n" % torch.__version__)
    for name, t in out.items():
        f.write("%s %d %s\n" % (name, t.dim(), " ".join(str(s) for s in t.shape)))
        f.write(" ".join("%.17g" % v for v in t.reshape(-1).tolist()) + "\n")
print("wrote", path, len(out), "tensors")
