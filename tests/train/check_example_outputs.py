#!/usr/bin/env python3
"""Runs an example with --metrics, --tensorboard, --profile and --json, and reads every file back.

  check_example_outputs.py --out DIR [--python PATH/.venv-tb/bin/python] [--no-tensorboard]
                           [--epoch-tags TAG,TAG] [--final-tags TAG,TAG] -- PROGRAM ARG...

Appends `--metrics DIR/metrics.csv --tensorboard DIR/tb --profile DIR/trace.json --profile-steps 2
--profile-warmup 1 --json DIR/report.json` to the command and checks:
- the program exits with 0 and prints where each file is (and the dltrain-plot line);
- the CSV (csv module): header wall_time,step,tag,value; train/loss and train/lr at every step
  1..N, each epoch's tags (--epoch-tags) at the steps where an epoch ended, every value a finite
  float;
- the TensorBoard event file, with TensorBoard's own reader (plugin_event_accumulator, as in
  read_events.py, which checks each record's CRC32C): the same scalar tags, steps and values as the
  CSV (values to float32 precision), and the hparams session whose metrics are --final-tags;
- the Chrome trace (json, NaN refused): traceEvents with complete events named "forward",
  "backward" and "optimizer" (the training step's profile ranges);
- the report (json, NaN refused): a non-empty "epochs" list.
Started by /usr/bin/python3 (ctest), it re-runs itself under --python, the virtual environment with
TensorBoard that scripts/setup.sh makes (pip install tensorboard pillow).
"""
import argparse
import csv
import math
import os
import shutil
import subprocess
import sys

# The checks and the strict JSON reader of the command-line test (tests/cli/check_cli.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from check_cli import check, failures, strict_load  # noqa: E402


def read_csv(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        check(reader.fieldnames == ["wall_time", "step", "tag", "value"],
              f"CSV header {reader.fieldnames}")
        rows = list(reader)
    series = {}
    for r in rows:
        v = float(r["value"])
        check(math.isfinite(v), f"CSV value {r}")
        series.setdefault(r["tag"], []).append((int(r["step"]), v))
    return series


def read_tensorboard(logdir):
    from tensorboard.backend.event_processing import plugin_event_accumulator as pea
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.util import tensor_util

    files = [f for f in os.listdir(logdir) if f.startswith("events.out.tfevents.")]
    check(len(files) == 1, f"one event file in {logdir}: {files}")
    acc = pea.EventAccumulator(logdir, size_guidance={"tensors": 0})
    acc.Reload()
    series = {}
    for tag in acc.PluginTagToContent("scalars"):
        series[tag] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                       for e in acc.Tensors(tag)]
    hp = acc.PluginTagToContent("hparams")
    hparams, metrics = {}, []
    if "_hparams_/experiment" in hp and "_hparams_/session_start_info" in hp:
        start = plugin_data_pb2.HParamsPluginData.FromString(hp["_hparams_/session_start_info"])
        hparams = dict(start.session_start_info.hparams)
        exp = plugin_data_pb2.HParamsPluginData.FromString(hp["_hparams_/experiment"])
        metrics = sorted(m.name.tag for m in exp.experiment.metric_infos)
    return series, hparams, metrics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--python", default="")
    ap.add_argument("--no-tensorboard", action="store_true")
    ap.add_argument("--epoch-tags", default="")
    ap.add_argument("--final-tags", default="")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no program to run (after --)")

    if (not args.no_tensorboard and args.python and os.path.realpath(sys.prefix) !=
            os.path.realpath(os.path.dirname(os.path.dirname(args.python)))):
        if not os.path.exists(args.python):
            print(f"check_example_outputs.py: {args.python} does not exist: run scripts/setup.sh, "
                  "which creates .venv-tb with TensorBoard (pip install tensorboard pillow)",
                  file=sys.stderr)
            return 1
        return subprocess.call([args.python, __file__] + sys.argv[1:])

    out = args.out
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    csv_path, tb_dir = os.path.join(out, "metrics.csv"), os.path.join(out, "tb")
    trace, report = os.path.join(out, "trace.json"), os.path.join(out, "report.json")
    argv = command + ["--metrics", csv_path, "--profile", trace, "--profile-steps", "2",
                      "--profile-warmup", "1", "--json", report]
    if not args.no_tensorboard:
        argv += ["--tensorboard", tb_dir]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    print(p.stdout[-3000:], p.stderr[-3000:], sep="\n")
    check(p.returncode == 0, f"{' '.join(argv)}: exit {p.returncode}")
    if p.returncode != 0:
        return 1
    check(f"metrics: {csv_path}" in p.stdout, "prints the CSV's path")
    check(f"plot: tools/dltrain-plot {csv_path}" in p.stdout, "prints how to plot it")
    check(f"profile: wrote {trace}" in p.stdout, "prints the trace's path")
    check(f"wrote {report}" in p.stdout, "prints the report's path")

    # The CSV: every step's loss and learning rate, each epoch's figures.
    series = read_csv(csv_path)
    loss = [s for s, _ in series.get("train/loss", [])]
    check(len(loss) > 0 and loss == list(range(1, len(loss) + 1)),
          f"train/loss at steps 1..N: {loss}")
    check([s for s, _ in series.get("train/lr", [])] == loss, "train/lr at the same steps")
    epoch_tags = [t for t in args.epoch_tags.split(",") if t]
    for tag in epoch_tags:
        steps = [s for s, _ in series.get(tag, [])]
        check(len(steps) > 0 and all(s in loss for s in steps),
              f"{tag} logged at an epoch's last step: {steps}")
    print(f"CSV: {len(series)} tags, {len(loss)} steps")

    # TensorBoard's reader: the same records.
    if not args.no_tensorboard:
        tb, hparams, metrics = read_tensorboard(tb_dir)
        check(set(tb) == set(series), f"TensorBoard tags {sorted(tb)} = CSV tags {sorted(series)}")
        for tag, rows in series.items():
            got = tb.get(tag, [])
            same = len(got) == len(rows) and all(
                gs == s and abs(gv - v) <= 1e-6 * max(1.0, abs(v))
                for (gs, gv), (s, v) in zip(got, rows))
            check(same, f"TensorBoard {tag} = CSV {tag}: {got[:3]} vs {rows[:3]}")
        final_tags = sorted(t for t in args.final_tags.split(",") if t)
        check(metrics == final_tags, f"hparams metrics {metrics} = {final_tags}")
        check("lr" in hparams and "batch_size" in hparams, f"hparams {sorted(hparams)}")
        print(f"TensorBoard: {len(tb)} tags, hparams {sorted(hparams)}, metrics {metrics}")

    # The Chrome trace and the report.
    t = strict_load(trace)
    events = t.get("traceEvents", []) if isinstance(t, dict) else t
    names = {e.get("name") for e in events if e.get("ph") == "X"}
    check({"forward", "backward", "optimizer"} <= names,
          f"trace has the step's ranges: {sorted(n for n in names if n)[:20]}")
    r = strict_load(report)
    check(isinstance(r.get("epochs"), list) and len(r["epochs"]) > 0, "report has epochs")
    check(r.get("framework") == "dltrain" and "precision" in r, "report header")
    print(f"trace: {len(events)} events; report: {len(r['epochs'])} epoch(s)")

    print(f"check_example_outputs: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
