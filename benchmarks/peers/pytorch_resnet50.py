#!/usr/bin/env python3
"""PyTorch peer of benchmarks/resnet50_synthetic: the convnet-benchmarks protocol on one GPU.

Random images [B, 3, 224, 224] (f32) and int64 labels are made once on the device; for each
batch size and mode ("forward": train-mode forward under no_grad; "train": forward +
cross-entropy + backward + SGD(lr 0.1, momentum 0.9, weight_decay 1e-4), zero_grad every step)
a fresh torchvision ResNet (seed 0) runs --warmup untimed then --iters timed iterations, each
between two CUDA events on the current stream, read after one synchronize. Peak memory is
torch.cuda.max_memory_allocated after reset_peak_memory_stats before the warm-up. Eager always;
with --compile also torch.compile (a failure is reported, not raised). --amp runs forward and
loss under torch.autocast (f16 by default, --amp-dtype bf16), f16 training with a
torch.amp.GradScaler, as resnet50_synthetic --amp. --json is rewritten after every
configuration (with "running" naming the one under way), so a crash or a time-out keeps the
configurations already done.

    python3 benchmarks/peers/pytorch_resnet50.py --json torch.json \\
        --compare dltrain.json     # dltrain.json from: resnet50_synthetic --json dltrain.json
    python3 benchmarks/peers/pytorch_resnet50.py --load torch.json --compare dltrain.json
                                   # only the comparison, from saved results (no GPU needed)

Needs only torch; without torchvision it builds the same ResNet itself (torchvision's
architecture and initialisation, zero_init_residual off).
"""
import argparse
import json
import math
import sys
import time
import traceback

# torch is imported inside the functions that need it, so --help and --load work without it.


# --- ResNet without torchvision (a faithful copy of torchvision.models.resnet) -------------

def build_resnet(depth, num_classes=1000):
    """torchvision's resnet18..152: v1.5 (stride on the 3x3 conv of Bottleneck), kaiming_normal
    fan_out/relu conv init, BN weight 1 / bias 0, default Linear init, no zero-init residual."""
    import torch.nn as nn

    def conv3x3(i, o, stride=1):
        return nn.Conv2d(i, o, kernel_size=3, stride=stride, padding=1, bias=False)

    def conv1x1(i, o, stride=1):
        return nn.Conv2d(i, o, kernel_size=1, stride=stride, bias=False)

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = conv3x3(inplanes, planes, stride)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = conv3x3(planes, planes)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample
            self.stride = stride

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            return self.relu(out + identity)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            width = planes
            self.conv1 = conv1x1(inplanes, width)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = conv3x3(width, width, stride)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = conv1x1(width, planes * self.expansion)
            self.bn3 = nn.BatchNorm2d(planes * self.expansion)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample
            self.stride = stride

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            return self.relu(out + identity)

    class ResNet(nn.Module):
        def __init__(self, block, layers):
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            self.layer1 = self._make_layer(block, 64, layers[0])
            self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
            self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
            self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512 * block.expansion, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                    nn.init.constant_(m.weight, 1)
                    nn.init.constant_(m.bias, 0)

        def _make_layer(self, block, planes, blocks, stride=1):
            downsample = None
            if stride != 1 or self.inplanes != planes * block.expansion:
                downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                           nn.BatchNorm2d(planes * block.expansion))
            layers = [block(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes * block.expansion
            layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
            return nn.Sequential(*layers)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    specs = {18: (BasicBlock, [2, 2, 2, 2]), 34: (BasicBlock, [3, 4, 6, 3]),
             50: (Bottleneck, [3, 4, 6, 3]), 101: (Bottleneck, [3, 4, 23, 3]),
             152: (Bottleneck, [3, 8, 36, 3])}
    block, layers = specs[depth]
    return ResNet(block, layers)


def make_model(depth, source):
    if source == "torchvision":
        import torchvision
        return getattr(torchvision.models, f"resnet{depth}")()
    return build_resnet(depth)


def model_source(requested):
    if requested != "auto":
        return requested
    try:
        import torchvision  # noqa: F401
        return "torchvision"
    except Exception:  # ImportError, or a torchvision built for another torch
        return "builtin"


# --- the protocol ---------------------------------------------------------------------------

def amp_dtype(a):
    """The autocast dtype (torch), or None without --amp."""
    import torch
    if not a.amp:
        return None
    return torch.bfloat16 if a.amp_dtype == "bf16" else torch.float16


def precision(a):
    """resnet50_synthetic's name for the setting: f32, amp-bf16 or amp-f16."""
    return ("amp-bf16" if a.amp_dtype == "bf16" else "amp-f16") if a.amp else "f32"


def run_config(a, src, batch, mode, backend, images, labels, device):
    import torch
    import torch.nn.functional as F

    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(0)
    model = make_model(a.depth, src).to(device).to(memory_format=fmt)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    if backend == "compile":
        try:  # a fresh model per configuration: start each from an empty compile cache
            torch._dynamo.reset()
        except AttributeError:
            pass
        net = torch.compile(model)
    else:
        net = model
    x, y = images[:batch], labels[:batch]
    train = mode == "train"
    loss = None
    dt = amp_dtype(a)
    # f16 scales the loss; otherwise the scaler is a pass-through (enabled=False).
    scaler = torch.amp.GradScaler("cuda", enabled=dt == torch.float16)

    def region():
        return torch.autocast("cuda", dtype=dt or torch.float16, enabled=dt is not None)

    def step():
        nonlocal loss
        if train:
            opt.zero_grad(set_to_none=True)
            with region():
                loss = F.cross_entropy(net(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            with torch.no_grad(), region():
                net(x)

    tw = time.perf_counter()
    for _ in range(a.warmup):  # torch.compile compiles here, on the first call
        step()
    torch.cuda.synchronize(device)
    warmup_s = time.perf_counter() - tw
    start = [torch.cuda.Event(enable_timing=True) for _ in range(a.iters)]
    stop = [torch.cuda.Event(enable_timing=True) for _ in range(a.iters)]
    t0 = time.perf_counter()
    for i in range(a.iters):
        start[i].record()
        step()
        stop[i].record()
    torch.cuda.synchronize(device)
    t1 = time.perf_counter()
    per_iter = sorted(s.elapsed_time(e) for s, e in zip(start, stop))
    n = len(per_iter)
    med = per_iter[n // 2] if n % 2 else 0.5 * (per_iter[n // 2 - 1] + per_iter[n // 2])
    ms = start[0].elapsed_time(stop[-1]) / a.iters
    r = dict(batch=batch, mode=mode, backend=backend, ms_per_iter=ms, median_ms=med,
             wall_ms_per_iter=1e3 * (t1 - t0) / a.iters, img_per_s=1e3 * batch / ms,
             peak_mib=torch.cuda.max_memory_allocated(device) / 2**20, warmup_s=warmup_s)
    if train:
        v = loss.item()
        r["last_loss"] = v if math.isfinite(v) else None
    return r


def run_all(a, on_progress=None):
    """Every configuration; on_progress(report), when given, is called with the report so far
    before each configuration (its "running" key names it) and after the last."""
    try:
        import torch
    except ImportError as e:
        print(f"pytorch_resnet50: skipped: torch is not importable ({e})")
        return dict(benchmark="resnet50_synthetic", framework="pytorch (missing)",
                    skipped="torch not importable", results=[])
    if not torch.cuda.is_available():
        print("pytorch_resnet50: skipped: no CUDA device")
        return dict(benchmark="resnet50_synthetic", framework="pytorch " + torch.__version__,
                    skipped="no CUDA device", results=[])
    device = torch.device("cuda", a.device)
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = not a.no_tf32
    torch.backends.cudnn.allow_tf32 = not a.no_tf32
    torch.backends.cudnn.benchmark = a.cudnn_benchmark
    src = model_source(a.model_source)
    name = torch.cuda.get_device_name(device)
    backends = ["eager"] + (["compile"] if a.compile else [])
    print(f"pytorch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN "
          f"{torch.backends.cudnn.version()}), resnet{a.depth} from {src}, {name}, "
          f"{a.size}x{a.size}, {'channels-last' if a.channels_last else 'NCHW'}, "
          f"precision {precision(a)}, loss scaling "
          f"{'on' if amp_dtype(a) == torch.float16 else 'off'}, "
          f"tf32 {'off' if a.no_tf32 else 'on'}, cudnn benchmark "
          f"{'on' if a.cudnn_benchmark else 'off'}, {a.warmup} warm-up + {a.iters} timed",
          flush=True)

    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    torch.manual_seed(0)
    bmax = max(a.batch_sizes)
    images = torch.randn(bmax, 3, a.size, a.size, device=device).contiguous(memory_format=fmt)
    labels = torch.randint(0, 1000, (bmax,), device=device)
    results = []

    def report(running=None):
        out = dict(benchmark="resnet50_synthetic", framework="pytorch " + torch.__version__,
                   cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                   arch=f"resnet{a.depth}", model_source=src, device=name, image_size=a.size,
                   warmup=a.warmup, iters=a.iters, tf32=not a.no_tf32,
                   cudnn_benchmark=a.cudnn_benchmark, channels_last=a.channels_last,
                   precision=precision(a))
        if running:
            out["running"] = running
        out["results"] = list(results)
        return out

    for backend in backends:
        if backend == "compile" and not hasattr(torch, "compile"):
            for batch in a.batch_sizes:
                for mode in a.modes:
                    results.append(dict(batch=batch, mode=mode, backend=backend,
                                        error=f"torch {torch.__version__} has no torch.compile"))
            print(f"  torch.compile: not available in torch {torch.__version__}", flush=True)
            continue
        for batch in a.batch_sizes:
            for mode in a.modes:
                if on_progress:
                    on_progress(report(f"{backend} batch {batch} {mode}"))
                try:
                    r = run_config(a, src, batch, mode, backend, images, labels, device)
                    extra = f"  loss {num(r['last_loss'], '.4f')}" if mode == "train" else ""
                    print(f"  {backend:7} batch {batch:4} {mode:8} {r['ms_per_iter']:9.2f} ms/iter "
                          f"(median {r['median_ms']:.2f}, wall {r['wall_ms_per_iter']:.2f}) "
                          f"{r['img_per_s']:9.1f} img/s {r['peak_mib']:9.0f} MiB peak "
                          f"(warm-up {r['warmup_s']:.1f} s){extra}", flush=True)
                except Exception as e:  # noqa: BLE001 -- report (OOM, compile failure), go on
                    msg = f"{type(e).__name__}: {e}".strip().splitlines()
                    msg = msg[0] if msg else type(e).__name__
                    if a.verbose:
                        traceback.print_exc()
                    print(f"  {backend:7} batch {batch:4} {mode:8} FAILED: {msg}", flush=True)
                    r = dict(batch=batch, mode=mode, backend=backend, error=msg)
                    torch.cuda.empty_cache()
                results.append(r)
    out = report()
    if on_progress:
        on_progress(out)
    return out


# --- output ---------------------------------------------------------------------------------

def num(v, spec):
    """format(v, spec), or a dash as wide as spec says when v is missing."""
    if v is None:
        return "-".rjust(int(spec.split(".")[0] or 0))
    return format(v, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def print_table(out):
    rows = out.get("results", [])
    if not rows:
        return
    print(f"\n{'backend':8}{'batch':>6}  {'mode':8}{'ms/iter':>10}{'median':>10}{'img/s':>10}"
          f"{'peak MiB':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['backend']:8}{r['batch']:6}  {r['mode']:8}  failed: {r['error'][:70]}")
        else:
            print(f"{r['backend']:8}{r['batch']:6}  {r['mode']:8}{r['ms_per_iter']:10.2f}"
                  f"{r['median_ms']:10.2f}{r['img_per_s']:10.1f}{r['peak_mib']:10.0f}")


def compare(ours, theirs):
    """Side by side: dltrain against PyTorch eager (and torch.compile when it ran)."""
    print(f"\ndltrain: {ours.get('framework', '?')} on {ours.get('device', '?')}   "
          f"peer: {theirs.get('framework', '?')} on {theirs.get('device', '?')}")
    for key in ("arch", "image_size", "tf32", "cudnn_benchmark", "channels_last", "precision",
                "iters", "warmup", "device"):
        if ours.get(key) not in (None, "") and theirs.get(key) not in (None, "") \
                and ours[key] != theirs[key]:
            print(f"WARNING: settings differ: {key} = {ours[key]!r} (dltrain) vs "
                  f"{theirs[key]!r} (pytorch)")
    if ours.get("skipped") or theirs.get("skipped"):
        print(f"(skipped: dltrain {ours.get('skipped', 'ran')}, "
              f"pytorch {theirs.get('skipped', 'ran')})")
    peer = {(r["batch"], r["mode"], r.get("backend", "eager")): r
            for r in theirs.get("results", [])}
    if not ours.get("results"):
        print("(no dltrain results to compare)")
        return
    has_compile = any(k[2] == "compile" and "error" not in r for k, r in peer.items())
    head = (f"{'batch':>6}  {'mode':8}{'dltrain':>10}{'torch':>10}{'ratio':>7}"
            + (f"{'compile':>10}{'ratio':>7}" if has_compile else "")
            + f"   {'dltrain':>9}{'torch':>9}{'ratio':>7}")
    print(f"\n{'':16}{'img/s':^27}" + (f"{'torch.compile':^17}" if has_compile else "")
          + f"   {'peak MiB':^25}")
    print(head)
    for r in ours.get("results", []):
        b, m = r["batch"], r["mode"]
        e = peer.get((b, m, "eager"), {})
        c = peer.get((b, m, "compile"), {})
        d_ips, e_ips, c_ips = r.get("img_per_s"), e.get("img_per_s"), c.get("img_per_s")
        d_mem, e_mem = r.get("peak_mib"), e.get("peak_mib")
        line = (f"{b:6}  {m:8}{num(d_ips, '10.1f')}{num(e_ips, '10.1f')}"
                f"{num(ratio(d_ips, e_ips), '7.2f')}")
        if has_compile:
            line += f"{num(c_ips, '10.1f')}{num(ratio(d_ips, c_ips), '7.2f')}"
        line += (f"   {num(d_mem, '9.0f')}{num(e_mem, '9.0f')}{num(ratio(d_mem, e_mem), '7.2f')}")
        for who, x in (("dltrain", r), ("pytorch", e)):
            if "error" in x:
                line += f"  ({who} failed: {x['error'][:50]})"
        print(line)
    print("(ratios are dltrain / pytorch: img/s wants >= 1 (target >= 0.8 of eager), "
          "peak MiB wants <= 1)")


def parse_args(argv=None):
    def int_list(s):
        v = [int(t) for t in s.split(",") if t]
        if not v or min(v) < 1:
            raise argparse.ArgumentTypeError("want a comma-separated list of positive integers")
        return v

    def mode_list(s):
        v = [t for t in s.split(",") if t]
        if not v or any(t not in ("forward", "train") for t in v):
            raise argparse.ArgumentTypeError("want modes from: forward, train")
        return v

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", type=int_list, default=[64, 128, 256])
    p.add_argument("--modes", type=mode_list, default=["forward", "train"])
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--depth", type=int, default=50, choices=[18, 34, 50, 101, 152])
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--no-tf32", action="store_true", help="disable TF32 for matmul and cuDNN")
    p.add_argument("--cudnn-benchmark", dest="cudnn_benchmark", action="store_true",
                   default=True, help="torch.backends.cudnn.benchmark = True (default)")
    p.add_argument("--no-cudnn-benchmark", dest="cudnn_benchmark", action="store_false")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--amp", action="store_true",
                   help="forward and loss under torch.autocast (f16 + GradScaler by default)")
    p.add_argument("--amp-dtype", choices=["f16", "bf16"],
                   help="the autocast dtype (default f16; needs --amp)")
    p.add_argument("--compile", action="store_true", help="also run torch.compile(model)")
    p.add_argument("--model-source", choices=["auto", "torchvision", "builtin"], default="auto",
                   help="torchvision.models or the script's own copy (auto: torchvision if found)")
    p.add_argument("--json", help="write results here")
    p.add_argument("--compare", metavar="DLTRAIN_JSON",
                   help="print a side-by-side table against resnet50_synthetic's --json output")
    p.add_argument("--load", metavar="TORCH_JSON",
                   help="do not run: read results this script wrote earlier (for --compare)")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    a = p.parse_args(argv)
    if a.warmup < 0 or a.iters < 1:
        p.error("--warmup must be >= 0 and --iters >= 1")
    if a.amp_dtype and not a.amp:
        p.error("--amp-dtype needs --amp; add --amp or drop it")
    return a


def write_json(path, out):
    """Writes out to path through a temporary file renamed over it (never half a file)."""
    import os
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=2)
    os.replace(tmp, path)


def main(argv=None):
    a = parse_args(argv)
    if a.load:
        with open(a.load) as f:
            out = json.load(f)
    else:
        out = run_all(a, (lambda o: write_json(a.json, o)) if a.json else None)
        print_table(out)
    if a.json and not a.load:
        write_json(a.json, out)
    failed = any("error" in r and r.get("backend", "eager") == "eager"
                 for r in out.get("results", []))
    if a.compare:
        with open(a.compare) as f:
            compare(json.load(f), out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
