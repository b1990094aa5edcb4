#!/usr/bin/env python3
"""Writes tests/reference/optim_reference.txt: PyTorch's optimizers, LR schedulers and gradient
clipping on small float64 problems, for tests/optim.

Run with Debian's python3-torch: /usr/bin/python3 tests/reference/make_optim_reference.py
Format (read by tests/reference_file.hpp): one tensor per record, a header line
`name ndim d0 d1 ...` followed by one line of the row-major values (%.17g).

Contents
- optim.init.{w,b}: initial parameters (w 3x4, b 4), shared by every optimizer config.
- optim.grad.<k>.{w,b}: the gradient fed at step k (k = 0..4), fixed random tensors that do not
  depend on the parameters, so the C++ test feeds the same ones. A config whose name ends in
  "_skip" gives b no gradient at step 2 (the optimizer must skip it).
- optim.<config>.<k>.{w,b}: the parameters after step k.
- sched.<name>.lr: [steps+1, groups] learning rates, get_last_lr() after construction and after
  each step; sched.<name>.momentum (OneCycleLR): momentum or beta1 of each group, same rows.
- clip.*: gradients, total norms and clipped gradients of clip_grad_norm_ / clip_grad_value_.
"""
import math
import os
import warnings

import torch

warnings.filterwarnings("ignore")  # scheduler steps without optimizer steps are intended here
torch.manual_seed(4321)
torch.set_default_dtype(torch.float64)
out = {}
STEPS = 5


def put(name, t):
    # clone: a parameter stepped later must not change what was recorded
    out[name] = torch.as_tensor(t).detach().to(torch.float64).contiguous().clone()


# --- optimizers ----------------------------------------------------------------------------
w0 = torch.randn(3, 4)
b0 = torch.randn(4)
put("optim.init.w", w0)
put("optim.init.b", b0)
grads = [(torch.randn(3, 4), torch.randn(4)) for _ in range(STEPS)]
for k, (gw, gb) in enumerate(grads):
    put("optim.grad.%d.w" % k, gw)
    put("optim.grad.%d.b" % k, gb)

O = torch.optim
configs = {
    "sgd_plain": lambda p: O.SGD(p, lr=0.1),
    "sgd_momentum": lambda p: O.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "sgd_nesterov": lambda p: O.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "sgd_maximize": lambda p: O.SGD(p, lr=0.1, momentum=0.5, maximize=True),
    "sgd_skip": lambda p: O.SGD(p, lr=0.1, momentum=0.8),
    "adam_wd": lambda p: O.Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.1),
    "adam_amsgrad": lambda p: O.Adam(p, lr=0.02, amsgrad=True),
    "adam_maximize": lambda p: O.Adam(p, lr=0.01, maximize=True, eps=1e-6),
    "adam_skip": lambda p: O.Adam(p, lr=0.05),
    "adamw": lambda p: O.AdamW(p, lr=0.01, weight_decay=0.05),
    "adamw_amsgrad": lambda p: O.AdamW(p, lr=0.03, betas=(0.85, 0.95), weight_decay=0.1,
                                       amsgrad=True),
    # two param groups: w overrides lr and weight_decay, b takes the defaults
    "sgd_groups": lambda p: O.SGD([{"params": [p[0]], "lr": 0.2, "weight_decay": 0.05},
                                   {"params": [p[1]]}], lr=0.01, momentum=0.9),
    "adam_groups": lambda p: O.Adam([{"params": [p[0]]},
                                     {"params": [p[1]], "lr": 0.05, "weight_decay": 0.2}],
                                    lr=0.01),
}
for name, make in configs.items():
    w = w0.clone().requires_grad_()
    b = b0.clone().requires_grad_()
    opt = make([w, b])
    for k, (gw, gb) in enumerate(grads):
        w.grad = gw.clone()
        b.grad = None if (name.endswith("_skip") and k == 2) else gb.clone()
        opt.step()
        put("optim.%s.%d.w" % (name, k), w)
        put("optim.%s.%d.b" % (name, k), b)

# --- LR schedulers -------------------------------------------------------------------------
S = torch.optim.lr_scheduler
SCHED_STEPS = 30


def sgd2():
    """SGD with two groups (lr 0.1 and 0.02) and momentum 0.9."""
    p = [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)]
    return O.SGD([{"params": [p[0]]}, {"params": [p[1]], "lr": 0.02}], lr=0.1, momentum=0.9)


def adam2():
    p = [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)]
    return O.Adam([{"params": [p[0]]}, {"params": [p[1]], "lr": 0.02}], lr=0.1)


def record(name, opt, sched, steps=SCHED_STEPS, momentum=None):
    lrs = [list(sched.get_last_lr())]
    moms = []

    def mom():
        if momentum == "beta1":
            return [g["betas"][0] for g in opt.param_groups]
        return [g["momentum"] for g in opt.param_groups]

    if momentum:
        moms.append(mom())
    for _ in range(steps):
        opt.step()
        sched.step()
        lrs.append(list(sched.get_last_lr()))
        if momentum:
            moms.append(mom())
    put("sched.%s.lr" % name, torch.tensor(lrs))
    if momentum:
        put("sched.%s.momentum" % name, torch.tensor(moms))


o = sgd2(); record("step", o, S.StepLR(o, step_size=7, gamma=0.5))
o = sgd2(); record("multistep", o, S.MultiStepLR(o, milestones=[5, 12, 12, 20], gamma=0.3))
o = sgd2(); record("cosine", o, S.CosineAnnealingLR(o, T_max=10, eta_min=0.001))
o = sgd2(); record("linear", o, S.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=8))
o = sgd2(); record("linear_decay", o, S.LinearLR(o, start_factor=1.0, end_factor=0.1,
                                                  total_iters=10))
o = sgd2(); record("constant", o, S.ConstantLR(o, factor=0.5, total_iters=4))
o = sgd2(); record("exponential", o, S.ExponentialLR(o, gamma=0.9))
o = sgd2(); record("lambda", o, S.LambdaLR(o, lambda e: 1.0 / (1.0 + 0.5 * e)))
# OneCycleLR: total_steps=30 allows 30 steps after construction (the 31st raises)
o = sgd2(); record("onecycle_cos", o, S.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=30),
                   momentum="momentum")
o = adam2(); record("onecycle_linear", o,
                    S.OneCycleLR(o, max_lr=0.3, total_steps=30, pct_start=0.25,
                                 anneal_strategy="linear", div_factor=10.0,
                                 final_div_factor=100.0, base_momentum=0.8, max_momentum=0.9),
                    momentum="beta1")
o = sgd2(); record("onecycle_three", o,
                   S.OneCycleLR(o, max_lr=0.8, total_steps=30, three_phase=True),
                   momentum="momentum")
o = sgd2(); record("onecycle_nomom", o,
                   S.OneCycleLR(o, max_lr=0.8, total_steps=30, cycle_momentum=False),
                   momentum="momentum")
o = sgd2()
warm = S.LinearLR(o, start_factor=0.1, total_iters=5)
cos = S.CosineAnnealingLR(o, T_max=25, eta_min=1e-4)
record("sequential", o, S.SequentialLR(o, [warm, cos], milestones=[5]))
o = sgd2()
s1 = S.LinearLR(o, start_factor=0.1, total_iters=5)
s2 = S.StepLR(o, step_size=4, gamma=0.5)
s3 = S.CosineAnnealingLR(o, T_max=10)
record("sequential3", o, S.SequentialLR(o, [s1, s2, s3], milestones=[5, 15]))
o = sgd2()
record("chained", o, S.ChainedScheduler([S.LinearLR(o, start_factor=0.2, total_iters=4),
                                         S.ExponentialLR(o, gamma=0.9)]))

# past total_steps: PyTorch raises on the 31st step of a 30-step OneCycleLR
o = sgd2()
oc = S.OneCycleLR(o, max_lr=1.0, total_steps=30)
for _ in range(30):
    oc.step()
try:
    oc.step()
    raise SystemExit("OneCycleLR did not raise past total_steps")
except ValueError:
    pass

# --- gradient clipping ---------------------------------------------------------------------
g1 = torch.randn(3, 4)
g2 = torch.randn(5)
put("clip.g1", g1)
put("clip.g2", g2)
for tag, max_norm, norm_type in [("l2", 1.0, 2.0), ("inf", 0.5, math.inf), ("l1", 2.0, 1.0),
                                 ("l3", 1.5, 3.0), ("noclip", 100.0, 2.0)]:
    p1 = torch.zeros(3, 4, requires_grad=True)
    p2 = torch.zeros(5, requires_grad=True)
    p3 = torch.zeros(2, requires_grad=True)  # no gradient: skipped
    p1.grad = g1.clone()
    p2.grad = g2.clone()
    total = torch.nn.utils.clip_grad_norm_([p1, p2, p3], max_norm, norm_type=norm_type)
    put("clip.%s.max_norm" % tag, torch.tensor(max_norm))
    put("clip.%s.norm_type" % tag, torch.tensor(norm_type if norm_type != math.inf else -1.0))
    put("clip.%s.total" % tag, total)
    put("clip.%s.g1" % tag, p1.grad)
    put("clip.%s.g2" % tag, p2.grad)
p1 = torch.zeros(3, 4, requires_grad=True)
p1.grad = g1.clone()
torch.nn.utils.clip_grad_value_([p1], 0.5)
put("clip.value.g1", p1.grad)

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim_reference.txt")
with open(path, "w") as f:
    f.write("# generated by make_optim_reference.py with torch %s\n" % torch.__version__)
    for name, t in out.items():
        f.write("%s %d %s\n" % (name, t.dim(), " ".join(str(s) for s in t.shape)))
        f.write(" ".join("%.17g" % v for v in t.reshape(-1).tolist()) + "\n")
print("wrote", path, len(out), "tensors")
