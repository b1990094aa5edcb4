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

The same calls through torchvision.transforms.v2's functional API (and v2's
_apply_image_or_video_transform for the policies' ops) are compared too and reported in the
last columns (values off by one, tie pixels, other differences); they do not decide the exit
status: the v1 tensor path is the reference dltrain follows.

Prints, per op family, the cases, the pixels compared, those off by one level and the tie
pixels. Exits 1 on any disagreement with v1, 4 (ctest's SKIP_RETURN_CODE) when the Python with torch
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
        from torchvision.transforms import v2
        from torchvision.transforms.v2 import functional as F2
        from torchvision.transforms.v2._utils import _setup_fill_arg
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
        # v2's spaces, reported: Solarize there is a fraction of 255, applied as 255 * m.
        for key, t, args in [("trivial_space_31", v2.TrivialAugmentWide(), (31, None, None)),
                             ("rand_space_31_hw", v2.RandAugment(), (31, H, W)),
                             ("auto_space_224", v2.AutoAugment(), (10, 224, 224))]:
            notes = []
            for e in spec[key]:
                if e["op"] not in t._AUGMENTATION_SPACE:
                    continue
                fn, signed = t._AUGMENTATION_SPACE[e["op"]]
                vals = fn(*args)
                want = [] if vals is None or vals.ndim == 0 else [float(v) for v in vals.tolist()]
                if e["op"] == "Solarize":
                    want = [float(torch.tensor(v, dtype=torch.float64) * 255) for v in want]
                diff = [(i, a, b) for i, (a, b) in enumerate(zip(e["magnitudes"], want)) if a != b]
                if diff or len(want) != len(e["magnitudes"]):
                    notes.append(f"{e['op']} at bins {[d[0] for d in diff]} (ours {[d[1] for d in diff][:3]}, v2 "
                                 f"{[d[2] for d in diff][:3]})")
            print(f"v2 {key}: " + ("the same values" if not notes else "differs: " + "; ".join(notes)))

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

        def reference_v2(img, call):
            """The same call through torchvision.transforms.v2 (reported, not required)."""
            fn = call["fn"]
            if fn == "op":
                fill = call["fill"]
                if fill is not None:
                    fill = [float(v) for v in fill] if len(fill) > 1 else [float(fill[0])] * img.shape[0]
                t = v2.AutoAugment() if call["op"] == "Invert" else v2.TrivialAugmentWide()
                # v2's Solarize magnitude is a fraction of the dtype's maximum (its table is
                # linspace(1, 0, bins), multiplied by 255 when applied).
                mag = call["magnitude"] / 255.0 if call["op"] == "Solarize" else call["magnitude"]
                return t._apply_image_or_video_transform(img, call["op"], mag,
                                                         InterpolationMode.NEAREST,
                                                         _setup_fill_arg(fill))
            if fn == "rotate":
                return F2.rotate(img, call["args"][0], InterpolationMode.NEAREST,
                                 fill=call["fill"])
            if fn == "affine":
                return F2.affine(img, angle=call["angle"], translate=call["translate"],
                                 scale=call["scale"], shear=call["shear"],
                                 interpolation=InterpolationMode.NEAREST, fill=call["fill"],
                                 center=call["center"])
            if fn == "erase":
                i, j, h, w = call["box"]
                v = torch.tensor(call["value"], dtype=torch.uint8).view(-1, 1, 1)
                return F2.erase(img, i, j, h, w, v)
            if fn == "gaussian_blur":
                return F2.gaussian_blur(img, call["args"][0], call["args"][1])
            if fn == "color_jitter":
                fns = [F2.adjust_brightness, F2.adjust_contrast, F2.adjust_saturation,
                       F2.adjust_hue]
                for k in call["order"]:
                    f = call["factors"][k]
                    if f is not None and not math.isnan(f):
                        img = fns[k](img, f)
                return img
            return getattr(F2, fn)(img, *call["args"])

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

        def compare(key, call, img, ours, ref, st, fails):
            """Adds to st [cases, values, off by 1, tie pixels, max, not-tie pixels]."""
            st[0] += 1
            if tuple(ref.shape) != tuple(ours.shape):
                fails.append(f"{key} {call}: shape {tuple(ours.shape)} != {tuple(ref.shape)}")
                return
            diff = (ours.to(torch.int32) - ref.to(torch.int32)).abs()
            st[1] += diff.numel()
            family = call["op"] if call["fn"] == "op" else call["fn"]
            if family in GEOMETRIC:
                bad = (diff > 0).any(dim=0).numpy()
                if bad.any():
                    sx, sy = source_coords(img, call)
                    fx = np.abs(np.abs(sx - np.floor(sx)) - 0.5)
                    fy = np.abs(np.abs(sy - np.floor(sy)) - 0.5)
                    tie = (fx < TIE_TOL) | (fy < TIE_TOL)
                    not_tie = bad & ~tie
                    st[3] += int((bad & tie).sum())
                    st[5] += int(not_tie.sum())
                    if not_tie.any():
                        yy, xx = np.argwhere(not_tie)[0]
                        fails.append(f"{key} {call}: {int(not_tie.sum())} pixels differ away "
                                     f"from a tie, first at (y {yy}, x {xx}): ours "
                                     f"{ours[:, yy, xx].tolist()}, torchvision "
                                     f"{ref[:, yy, xx].tolist()}, source ({sx[yy, xx]:.6f}, "
                                     f"{sy[yy, xx]:.6f})")
            else:
                m = int(diff.max())
                st[2] += int((diff == 1).sum())
                st[4] = max(st[4], m)
                if m > 1:
                    st[5] += int((diff > 1).sum())
                    fails.append(f"{key} {call}: max difference {m} grey levels "
                                 f"({int((diff > 1).sum())} values above 1)")

        stats = collections.OrderedDict()
        stats_v2 = collections.OrderedDict()
        v2_notes = []
        for case in spec["cases"]:
            call = case["call"]
            img = inputs[case["input"]]
            ours = load(case["file"], case["height"], case["width"], case["channels"])
            family = call["op"] if call["fn"] == "op" else call["fn"]
            key = f"{family} ({case['input']})"
            compare(key, call, img, ours, reference(img.clone(), call),
                    stats.setdefault(key, [0, 0, 0, 0, 0, 0]), failures)
            compare(key, call, img, ours, reference_v2(img.clone(), call),
                    stats_v2.setdefault(key, [0, 0, 0, 0, 0, 0]), v2_notes)

        print(f"{'op (input)':32s} {'cases':>6s} {'values':>9s} {'off by 1':>9s} "
              f"{'tie px':>7s} {'max':>4s} | v2: {'off by 1':>9s} {'tie px':>7s} {'other':>7s}")
        for key, (n, px, off, ties, mx, _) in stats.items():
            o2 = stats_v2[key]
            print(f"{key:32s} {n:6d} {px:9d} {off:9d} {ties:7d} {mx:4d} | "
                  f"{o2[2]:13d} {o2[3]:7d} {o2[5]:7d}")
        for note in v2_notes[:10]:
            print("v2 differs:", note)
        print(f"{len(spec['cases'])} cases")

    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
