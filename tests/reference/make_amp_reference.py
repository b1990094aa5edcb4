#!/usr/bin/env python3
"""Writes tests/reference/amp_reference.txt: PyTorch's GradScaler on scripted training runs with
inf/NaN injected into chosen gradients at chosen steps, for tests/amp/test_grad_scaler.cpp.

Run with Debian's python3-torch: /usr/bin/python3 tests/reference/make_amp_reference.py
Format (read by tests/reference_file.hpp): one tensor per record, a header line
`name ndim d0 d1 ...` followed by one line of the row-major values (%.17g).

The scaler is torch.cuda.amp.GradScaler's own Python code (torch 1.13: grad_scaler.py, the
state machine, the per-optimizer / per-device found-inf bookkeeping, step skipping and update).
That torch has no CPU kernels for the two device ops the scaler calls and disables itself
without CUDA, so this script (a) keeps it enabled, (b) drops the is_cuda assertions, and (c)
supplies the two ops in Python, written from their CUDA kernels
(aten/src/ATen/native/cuda/AmpKernels.cu):
  _amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale):
      per element v (in float): found_inf = 1 if not isfinite(v); v = v if inv_scale == 1 else
      v * inv_scale
  _amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, interval):
      if found_inf: scale *= backoff_factor; tracker = 0
      else: successful = tracker + 1
            if successful == interval: scale = scale * growth_factor if that is finite; tracker = 0
            else: tracker = successful
Everything else is PyTorch's. Every run trains f32 parameters w [3, 4] and b [4] on the linear
loss sum(w * G_k) + sum(b * H_k), so the unscaled gradients are exactly G_k and H_k; the
injected non-finite values are listed as masks (the file format has no inf/NaN literals).

Records, per scenario S (see SCENARIOS): S.G.<k>, S.H.<k> (gradients of step k, finite parts),
S.inject.<k>.{G,H} (0: none, 1: +inf, 2: -inf, 3: NaN at that element), S.scale [steps] (scale
after update k), S.tracker [steps], S.stepped [steps, n_opt] (1 when optimizer o stepped at k),
S.w.<k>, S.b.<k> (parameters after step k), S.norm [steps] (clip scenario: the norm returned by
clip_grad_norm_, -1 where it was not finite), S.init.{w,b}, and S.state (scale, growth_factor,
backoff_factor, growth_interval, _growth_tracker of state_dict() at the end).
"""
import math
import os

import torch
import torch.cuda.amp.grad_scaler as gs

torch.manual_seed(20240613)


# --- the two device ops, from the CUDA kernels -------------------------------------------------
def foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale):
    inv = float(inv_scale.item())
    for g in grads:
        if not bool(torch.isfinite(g).all()):
            found_inf.fill_(1.0)
        if inv != 1.0:
            g.mul_(inv)


def update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, interval):
    if float(found_inf.item()) > 0:
        scale.copy_(torch.tensor([float(scale.item()) * backoff_factor], dtype=torch.float32))
        growth_tracker.fill_(0)
    else:
        successful = int(growth_tracker.item()) + 1
        if successful == interval:
            grown = torch.tensor([float(scale.item()) * growth_factor], dtype=torch.float32)
            if bool(torch.isfinite(grown).all()):
                scale.copy_(grown)
            growth_tracker.fill_(0)
        else:
            growth_tracker.fill_(successful)
    return scale


torch._amp_foreach_non_finite_check_and_unscale_ = foreach_non_finite_check_and_unscale_
torch._amp_update_scale_ = update_scale_
gs.amp_definitely_not_available = lambda: False


def _replicator_init(self, master_tensor):  # the same, without the is_cuda assertion
    self.master = master_tensor
    self._per_device_tensors = {}


gs._MultiDeviceReplicator.__init__ = _replicator_init


class Scaler(gs.GradScaler):
    def scale(self, outputs):  # 1.13's scale() for one tensor, without the is_cuda assertion
        if not self._enabled:
            return outputs
        if self._scale is None:
            self._lazy_init_scale_growth_tracker(outputs.device)
        return outputs * self._scale.to(device=outputs.device, non_blocking=True)


# --- scenarios ---------------------------------------------------------------------------------
# name: scaler settings, steps, optimizer layout, micro-batches, clipping, injections
# {step: [(tensor, flat index, kind)]} with kind 1 = +inf, 2 = -inf, 3 = NaN.
SCENARIOS = {
    # One SGD with momentum; growth every 3 finite steps; single and consecutive overflows.
    "single": dict(scaler=dict(init_scale=1024.0, growth_interval=3), steps=12, opts="sgd",
                   micro=1, clip=None,
                   inject={2: [("G", 6, 1)], 6: [("H", 0, 3)], 7: [("G", 0, 2)],
                           10: [("G", 11, 1), ("H", 3, 3)]}),
    # unscale_ then clip_grad_norm_ then step (PyTorch's documented order); default scale.
    "clip": dict(scaler=dict(growth_interval=2), steps=8, opts="sgd_plain", micro=1, clip=0.5,
                 inject={1: [("H", 2, 1)], 4: [("G", 3, 3)]}),
    # Two optimizers (SGD on w, Adam on b): each skips on its own found-inf, update() backs off
    # when either found one.
    "two_opt": dict(scaler=dict(init_scale=256.0, growth_interval=2), steps=8, opts="two",
                    micro=1, clip=None, inject={3: [("H", 1, 1)], 5: [("G", 2, 2)]}),
    # Gradient accumulation over 2 micro-batches (inf in the second one of step 2); growth by 4
    # every step from 2^120, so the scale reaches 2^126 and a further growth (2^128) is not
    # finite and not taken; backoff 0.25.
    "accum": dict(scaler=dict(init_scale=2.0 ** 120, growth_factor=4.0, backoff_factor=0.25,
                              growth_interval=1), steps=7, opts="sgd", micro=2, clip=None,
                  grad_scale=1e-3, inject={2: [("G", 5, 1)]}),
}

out = {}


def put(name, t):
    out[name] = torch.as_tensor(t).detach().to(torch.float64).contiguous().clone()


VALUES = {1: math.inf, 2: -math.inf, 3: math.nan}

for name, sc in SCENARIOS.items():
    steps, micro = sc["steps"], sc["micro"]
    w = torch.randn(3, 4, dtype=torch.float32, requires_grad=True)
    b = torch.randn(4, dtype=torch.float32, requires_grad=True)
    put(name + ".init.w", w)
    put(name + ".init.b", b)
    if sc["opts"] == "sgd":
        opts = [torch.optim.SGD([w, b], lr=0.1, momentum=0.9)]
    elif sc["opts"] == "sgd_plain":
        opts = [torch.optim.SGD([w, b], lr=0.05)]
    else:
        opts = [torch.optim.SGD([w], lr=0.1), torch.optim.Adam([b], lr=0.01)]
    scaler = Scaler(**sc["scaler"])
    scales, trackers, stepped, norms = [], [], [], []
    for k in range(steps):
        gscale = sc.get("grad_scale", 1.0)
        G = (torch.randn(micro, 3, 4) * gscale).to(torch.float32)
        H = (torch.randn(micro, 4) * gscale).to(torch.float32)
        put("%s.G.%d" % (name, k), G)
        put("%s.H.%d" % (name, k), H)
        mg, mh = torch.zeros(micro, 12), torch.zeros(micro, 4)
        for (which, idx, kind) in sc["inject"].get(k, []):
            # the last micro-batch receives the injection
            (mg if which == "G" else mh)[micro - 1, idx] = kind
            (G.view(micro, -1) if which == "G" else H)[micro - 1, idx] = VALUES[kind]
        put("%s.inject.%d.G" % (name, k), mg)
        put("%s.inject.%d.H" % (name, k), mh)
        for m in range(micro):
            loss = (w * G[m]).sum() + (b * H[m]).sum()
            scaler.scale(loss / micro if micro > 1 else loss).backward()
        if sc["clip"] is not None:
            scaler.unscale_(opts[0])
            n = torch.nn.utils.clip_grad_norm_([w, b], sc["clip"])
            norms.append(float(n) if math.isfinite(float(n)) else -1.0)
        row = []
        for o in opts:
            scaler.step(o)
            st = scaler._per_optimizer_states[id(o)]
            row.append(0.0 if sum(v.item() for v in st["found_inf_per_device"].values()) else 1.0)
        stepped.append(row)
        scaler.update()
        scales.append(scaler.get_scale())
        trackers.append(float(scaler._get_growth_tracker()))
        for o in opts:
            o.zero_grad(set_to_none=True)
        put("%s.w.%d" % (name, k), w)
        put("%s.b.%d" % (name, k), b)
    put(name + ".scale", scales)
    put(name + ".tracker", trackers)
    put(name + ".stepped", stepped)
    if norms:
        put(name + ".norm", norms)
    sd = scaler.state_dict()
    put(name + ".state", [sd["scale"], sd["growth_factor"], sd["backoff_factor"],
                          sd["growth_interval"], sd["_growth_tracker"]])

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "amp_reference.txt")
with open(path, "w") as f:
    f.write("# generated by make_amp_reference.py with torch %s\n" % torch.__version__)
    for key, t in out.items():
        f.write("%s %d %s\n" % (key, t.dim(), " ".join(str(s) for s in t.shape)))
        f.write(" ".join("%.17g" % v for v in t.reshape(-1).tolist()) + "\n")
print("wrote %s (%d records)" % (path, len(out)))
