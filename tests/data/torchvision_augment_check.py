#!/usr/bin/env python3
"""Compares dltrain's augmentations (data/augment.hpp) with torchvision's, op by op.

Runs the hidden Catch2 case "[.augment_fixture]" of test_data, which writes two input images
(61x83, RGB and grayscale), the output of every op on fixed parameters (raw u8 HWC) and
cases.json describing the call; then makes each call with torchvision's functional API on the
uint8 CHW tensor (v1 functional and autoaugment._apply_op, the code the v1 and v2
transforms share for these ops on tensors) and compares:

- photometric ops: every pixel within 1 grey level (augment.hpp: truncations and roundings
  where float32 summation order differs);
- geometric ops (affine, rotate, Shear/Translate/Rotate): every pixel equal, except where the
  sampled source coordinate, computed here in float64 from torchvision's own inverse matrix,
  lies within 1e-3 pixel of a .5 tie in x or y. Bound: the float32 grid holds about 7
  significant digits, the normalised coordinate is a sum of three products of size <= 4
  (ulp 4.8e-7 each), and unnormalising multiplies by at most w/2 = 41.5: an error below
  3 * 4.8e-7 * 41.5 = 6e-5 pixel, well inside 1e-3;
- the augmentation spaces of TrivialAugmentWide (31 and 11 bins), RandAugment (31 bins on
  224x224 and 61x83, 17 bins) and AutoAugment (10 bins), and the ImageNet policy table,
  exactly (float32 values).

Prints, per op family, the cases, the pixels compared, those off by one level and the tie
pixels. Exits 1 on any disagreement, 4 (ctest's SKIP_RETURN_CODE) when the Python with torch
and torchvision is missing.

Usage: torchvision_augment_check.py --writer PATH/test_data [--python PATH/.venv-peers/bin/python]
"""
import argparse
import collections
import json
import math
import os
import subprocess
import sys
import tempfile

SKIP = 4
TIE_TOL = 1e-3
GEOMETRIC = {"affine", "rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--writer", required=True)
    ap.add_argument("--python", default="")
    args = ap.parse_args()

    if args.python and os.path.realpath(sys.prefix) != os.path.realpath(
        os.path.dirname(os.path.dirname(args.python))
    ):
        if not os.path.exists(args.python):
            print(f"torchvision_augment_check.py: SKIPPED: {args.python} does not exist; run "
                  "scripts/setup.sh --peers, which creates .venv-peers with torch and torchvision",
                  file=sys.stderr)
            return SKIP
        return subprocess.call([args.python, __file__, "--writer", args.writer])

    try:
        import numpy as np
        import torch
        import torchvision
        import torchvision.transforms.functional as F
        from torchvision.transforms import InterpolationMode, autoaugment
    except ImportError as e:
        print(f"torchvision_augment_check.py: SKIPPED: {e} for {sys.executable}; run "
              "scripts/setup.sh --peers (pip install torch torchvision)", file=sys.stderr)
        return SKIP
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}")
    torch.set_num_threads(1)

    failures = []
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, DLTRAIN_AUGMENT_FIXTURE=d)
        r = subprocess.run([args.writer, "[.augment_fixture]"], env=env)
        if r.returncode != 0:
            print(f"the fixture failed (exit {r.returncode})", file=sys.stderr)
            return 1
        with open(os.path.join(d, "cases.json")) as f:
            spec = json.load(f)
        H, W = spec["height"], spec["width"]

        def load(name, h, w, c):
            a = np.fromfile(os.path.join(d, name), dtype=np.uint8).reshape(h, w, c)
            return torch.from_numpy(a.copy()).permute(2, 0, 1).contiguous()

        inputs = {"rgb": load("rgb.bin", H, W, 3), "gray": load("gray.bin", H, W, 1)}

        # --- the tables ---
        def check_space(key, ref):
            ours = spec[key]
            names = list(ref.keys())
            if [e["op"] for e in ours] != names:
                failures.append(f"{key}: ops {[e['op'] for e in ours]} != torchvision's {names}")
                return
            for e in ours:
                mags, signed = ref[e["op"]]
                want = [] if mags.ndim == 0 else [float(v) for v in mags.tolist()]
                if e["magnitudes"] != want or e["signed"] != bool(signed):
                    failures.append(f"{key} {e['op']}: ours {e['magnitudes']} signed "
                                    f"{e['signed']}, torchvision {want} signed {signed}")

        ta = autoaugment.TrivialAugmentWide
        check_space("trivial_space_31", ta(31)._augmentation_space(31))
        check_space("trivial_space_11", ta(11)._augmentation_space(11))
        ra = autoaugment.RandAugment()
        check_space("rand_space_31_224", ra._augmentation_space(31, (224, 224)))
        check_space("rand_space_31_hw", ra._augmentation_space(31, (H, W)))
        check_space("rand_space_17_hw", ra._augmentation_space(17, (H, W)))
        aa = autoaugment.AutoAugment(autoaugment.AutoAugmentPolicy.IMAGENET)
        check_space("auto_space_224", aa._augmentation_space(10, (224, 224)))
        ref_policy = [[list(s) for s in sub] for sub in aa.policies]
        if spec["auto_policy"] != ref_policy:
            failures.append("the ImageNet AutoAugment policy table differs from torchvision's")
        print(f"tables: 6 augmentation spaces and the ImageNet policy compared exactly, "
              f"{len(failures)} differences")

        # --- the ops ---
        def reference(img, call):
            fn = call["fn"]
            if fn == "op":
                fill = call["fill"]
                if fill is not None:
                    fill = [float(v) for v in fill] if len(fill) > 1 else [float(fill[0])] * img.shape[0]
                return autoaugment._apply_op(img, call["op"], call["magnitude"],
                                             InterpolationMode.NEAREST, fill)
            if fn == "rotate":
                return F.rotate(img, call["args"][0], InterpolationMode.NEAREST,
                                fill=call["fill"])
            if fn == "affine":
                return F.affine(img, call["angle"], call["translate"], call["scale"],
                                call["shear"], InterpolationMode.NEAREST, fill=call["fill"],
                                center=call["center"])
            if fn == "erase":
                i, j, h, w = call["box"]
                v = torch.tensor(call["value"], dtype=torch.uint8).view(-1, 1, 1)
                return F.erase(img, i, j, h, w, v)
            if fn == "gaussian_blur":
                return F.gaussian_blur(img, call["args"][0], call["args"][1])
            if fn == "color_jitter":
                fns = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
                for k in call["order"]:
                    f = call["factors"][k]
                    if f is not None and not math.isnan(f):
                        img = fns[k](img, f)
                return img
            return getattr(F, fn)(img, *call["args"])

        def source_coords(img, call):
            """Float64 source coordinates (x, y) torchvision samples for every output pixel."""
            c, h, w = img.shape
            fn = call["fn"]
            if fn == "rotate":
                m = F._get_inverse_affine_matrix([0.0, 0.0], -call["args"][0], [0.0, 0.0], 1.0,
                                                 [0.0, 0.0])
            else:
                if fn == "op":
                    op, mag = call["op"], call["magnitude"]
                    angle, translate, scale, shear, center = 0.0, [0, 0], 1.0, [0.0, 0.0], None
                    if op == "ShearX":
                        shear, center = [math.degrees(math.atan(mag)), 0.0], [0, 0]
                    elif op == "ShearY":
                        shear, center = [0.0, math.degrees(math.atan(mag))], [0, 0]
                    elif op == "TranslateX":
                        translate = [int(mag), 0]
                    elif op == "TranslateY":
                        translate = [0, int(mag)]
                    elif op == "Rotate":
                        return source_coords(img, {"fn": "rotate", "args": [mag]})
                else:
                    angle, translate, scale = call["angle"], call["translate"], call["scale"]
                    shear, center = call["shear"], call["center"]
                cf = [0.0, 0.0] if center is None else [1.0 * (cc - s * 0.5)
                                                         for cc, s in zip(center, [w, h])]
                m = F._get_inverse_affine_matrix(cf, angle, [1.0 * t for t in translate], scale,
                                                 shear)
            ys, xs = np.meshgrid(np.arange(h) - h * 0.5 + 0.5, np.arange(w) - w * 0.5 + 0.5,
                                 indexing="ij")
            sx = m[0] * xs + m[1] * ys + m[2] + w * 0.5 - 0.5
            sy = m[3] * xs + m[4] * ys + m[5] + h * 0.5 - 0.5
            return sx, sy

        stats = collections.OrderedDict()
        for case in spec["cases"]:
            call = case["call"]
            img = inputs[case["input"]]
            ours = load(case["file"], case["height"], case["width"], case["channels"])
            ref = reference(img.clone(), call)
            family = call["op"] if call["fn"] == "op" else call["fn"]
            key = f"{family} ({case['input']})"
            st = stats.setdefault(key, [0, 0, 0, 0, 0])  # cases, pixels, off-by-one, ties, maxdiff
            st[0] += 1
            if tuple(ref.shape) != tuple(ours.shape):
                failures.append(f"{key} {call}: shape {tuple(ours.shape)} != {tuple(ref.shape)}")
                continue
            diff = (ours.to(torch.int32) - ref.to(torch.int32)).abs()
            st[1] += diff.numel()
            if family in GEOMETRIC:
                bad = (diff > 0).any(dim=0).numpy()
                if bad.any():
                    sx, sy = source_coords(img, call)
                    fx = np.abs(np.abs(sx - np.floor(sx)) - 0.5)
                    fy = np.abs(np.abs(sy - np.floor(sy)) - 0.5)
                    tie = (fx < TIE_TOL) | (fy < TIE_TOL)
                    not_tie = bad & ~tie
                    st[3] += int(bad.sum())
                    if not_tie.any():
                        yy, xx = np.argwhere(not_tie)[0]
                        failures.append(f"{key} {call}: {int(not_tie.sum())} pixels differ away "
                                        f"from a tie, first at (y {yy}, x {xx}): ours "
                                        f"{ours[:, yy, xx].tolist()}, torchvision "
                                        f"{ref[:, yy, xx].tolist()}, source ({sx[yy, xx]:.6f}, "
                                        f"{sy[yy, xx]:.6f})")
            else:
                m = int(diff.max())
                st[2] += int((diff == 1).sum())
                st[4] = max(st[4], m)
                if m > 1:
                    failures.append(f"{key} {call}: max difference {m} grey levels "
                                    f"({int((diff > 1).sum())} values above 1)")

        print(f"{'op (input)':32s} {'cases':>6s} {'values':>9s} {'off by 1':>9s} "
              f"{'tie px':>7s} {'max':>4s}")
        for key, (n, px, off, ties, mx) in stats.items():
            print(f"{key:32s} {n:6d} {px:9d} {off:9d} {ties:7d} {mx:4d}")
        print(f"{len(spec['cases'])} cases")

    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
