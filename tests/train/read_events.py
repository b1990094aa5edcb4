#!/usr/bin/env python3
"""Reads dltrain's TensorBoard event files back with TensorBoard's own reader.

Runs the hidden Catch2 test "[.tensorboard_fixture]" of test_train, which writes event files (and
a CSV and a JSON-lines file) into a scratch directory, then loads them with
tensorboard.backend.event_processing.plugin_event_accumulator (what the TensorBoard server uses:
it checks every record's CRC32C and migrates scalars, histograms and images into the plugins'
tensor form) and with the classic EventAccumulator, and checks every value. The CSV is read with
the csv module and the JSON lines with json (NaN must arrive as null).

Usage: read_events.py --writer PATH/test_train [--python PATH/.venv-tb/bin/python]
Started by /usr/bin/python3 (ctest), it re-runs itself under --python, the virtual environment
that scripts/setup.sh makes with `pip install tensorboard pillow`.
"""
import argparse
import csv
import io
import json
import math
import os
import subprocess
import sys
import tempfile


def reject(constant):
    """json.loads accepts NaN and Infinity, which are not JSON; refuse them."""
    raise ValueError(f"not JSON: {constant}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--writer", required=True)
    ap.add_argument("--python", default="")
    args = ap.parse_args()

    if args.python and os.path.realpath(sys.prefix) != os.path.realpath(
        os.path.dirname(os.path.dirname(args.python))
    ):
        if not os.path.exists(args.python):
            print(
                f"read_events.py: {args.python} does not exist: run scripts/setup.sh, which "
                "creates .venv-tb with TensorBoard (pip install tensorboard pillow)",
                file=sys.stderr,
            )
            return 1
        return subprocess.call([args.python, __file__, "--writer", args.writer])

    import numpy as np
    from PIL import Image
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.backend.event_processing import plugin_event_accumulator as pea
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.util import tensor_util

    checks = {"passed": 0, "failed": 0}

    def check(cond, what):
        if cond:
            checks["passed"] += 1
        else:
            checks["failed"] += 1
            print("FAILED:", what)

    with tempfile.TemporaryDirectory(prefix="dltrain_tb_") as out:
        env = dict(os.environ, DLTRAIN_TB_FIXTURE_DIR=out)
        r = subprocess.run([args.writer, "[.tensorboard_fixture]"], env=env)
        if r.returncode != 0:
            print(f"read_events.py: the writer exited with {r.returncode}", file=sys.stderr)
            return 1
        logdir = os.path.join(out, "tb")
        files = [f for f in os.listdir(logdir) if f.startswith("events.out.tfevents.")]
        check(len(files) == 1, f"one event file, found {files}")

        # --- what the TensorBoard server reads (plugin form) -------------------------------
        acc = pea.EventAccumulator(logdir, size_guidance={"tensors": 0})
        acc.Reload()
        scalars = acc.PluginTagToContent("scalars")
        check(
            {"train/loss", "train/lr", "train/diverged", "val/acc"} <= set(scalars),
            f"scalar tags {sorted(scalars)}",
        )
        loss = acc.Tensors("train/loss")
        check([e.step for e in loss] == list(range(10)), "loss steps 0..9")
        vals = [float(tensor_util.make_ndarray(e.tensor_proto)) for e in loss]
        check(
            all(abs(v - 1.0 / (s + 1)) < 1e-6 for s, v in enumerate(vals)),
            f"loss values {vals}",
        )
        div = acc.Tensors("train/diverged")
        check(math.isnan(float(tensor_util.make_ndarray(div[0].tensor_proto))), "NaN scalar")
        check(div[0].step == 10, "NaN scalar's step")

        hist = acc.Tensors("weights/fc")
        check("weights/fc" in acc.PluginTagToContent("histograms"), "histogram plugin tag")
        h = tensor_util.make_ndarray(hist[0].tensor_proto)  # rows of [left, right, count]
        check(h.shape == (10, 3), f"histogram shape {h.shape}")
        check(float(h[:, 2].sum()) == 100.0, f"histogram total {h[:, 2].sum()}")
        check(abs(h[0, 0]) < 1e-9 and abs(h[-1, 1] - 99) < 1e-9, f"histogram range {h[0]} {h[-1]}")
        check(list(h[:, 2]) == [10.0] * 10, f"histogram counts {list(h[:, 2])}")

        check(
            {"samples/rgb", "samples/grey"} <= set(acc.PluginTagToContent("images")),
            "image plugin tags",
        )
        img = tensor_util.make_ndarray(acc.Tensors("samples/rgb")[0].tensor_proto)
        check(img[0] == b"3" and img[1] == b"2", f"image width/height {img[:2]}")
        pixels = np.array(Image.open(io.BytesIO(img[2])))
        expect = np.array(
            [[[40 * c + 10 * y + x for c in range(3)] for x in range(3)] for y in range(2)],
            dtype=np.uint8,
        )
        check(pixels.shape == (2, 3, 3) and (pixels == expect).all(), f"RGB pixels {pixels}")
        grey = tensor_util.make_ndarray(acc.Tensors("samples/grey")[0].tensor_proto)
        gp = np.array(Image.open(io.BytesIO(grey[2])))
        check(gp.tolist() == [[0, 128], [255, 64]], f"grey pixels {gp.tolist()}")

        check("notes" in acc.PluginTagToContent("text"), "text plugin tag")
        text = tensor_util.make_ndarray(acc.Tensors("notes")[0].tensor_proto)
        check(text.item() == b"**dltrain** fixture", f"text {text}")

        hp = acc.PluginTagToContent("hparams")
        check(
            set(hp) == {
                "_hparams_/experiment",
                "_hparams_/session_start_info",
                "_hparams_/session_end_info",
            },
            f"hparams tags {sorted(hp)}",
        )
        start = plugin_data_pb2.HParamsPluginData.FromString(hp["_hparams_/session_start_info"])
        got = start.session_start_info.hparams
        check(got["lr"].number_value == 0.1, "hparam lr")
        check(got["optimizer"].string_value == "sgd", "hparam optimizer")
        check(got["amp"].bool_value is True, "hparam amp")
        exp = plugin_data_pb2.HParamsPluginData.FromString(hp["_hparams_/experiment"])
        check(
            sorted(i.name for i in exp.experiment.hparam_infos) == ["amp", "lr", "optimizer"],
            "experiment hparam infos",
        )
        check(
            [m.name.tag for m in exp.experiment.metric_infos] == ["val/acc"],
            "experiment metric infos",
        )

        # --- the classic accumulator (tbparse and older tools read this form) ---------------
        old = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0})
        old.Reload()
        check("train/loss" in old.Tags()["scalars"], "classic scalars")
        check(len(old.Scalars("train/loss")) == 10, "classic scalar count")
        hv = old.Histograms("weights/fc")[0].histogram_value
        check(hv.num == 100 and hv.min == 0 and hv.max == 99, f"classic histogram {hv}")
        check(abs(hv.sum - 4950) < 1e-9 and abs(hv.sum_squares - 328350) < 1e-6, "sums")
        im = old.Images("samples/rgb")[0]
        check(im.width == 3 and im.height == 2, "classic image size")

        # --- the CSV and JSON lines written alongside ---------------------------------------
        with open(os.path.join(out, "metrics.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
        check(rows[0].keys() == {"wall_time", "step", "tag", "value"}, "CSV header")
        check(len(rows) == 13, f"CSV rows {len(rows)}")
        d = [r for r in rows if r["tag"] == "train/diverged"]
        check(len(d) == 1 and math.isnan(float(d[0]["value"])), "CSV NaN")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            lines = [json.loads(line, parse_constant=reject) for line in f]
        d = [j for j in lines if j.get("tag") == "train/diverged"]
        check(d[0]["value"] is None and d[0]["nonfinite"] == "nan", "JSON lines NaN as null")
        check(any(j.get("kind") == "hparams" for j in lines), "JSON lines hparams")

    print(f"read_events: {checks['passed']} passed, {checks['failed']} failed")
    return 0 if checks["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
