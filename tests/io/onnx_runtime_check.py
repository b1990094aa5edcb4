#!/usr/bin/env python3
"""Runs the ONNX files io::export_onnx writes in ONNX Runtime and compares with dltrain.

Runs the hidden Catch2 case "[.onnx_fixture]" of test_io, which exports models (ResNet-18,
ResNet-50, an MLP, a small CNN with a residual add and a concatenation, a model of the other
covered layers) with a dynamic batch axis into a temporary folder, and writes for two batch
sizes each the inputs and dltrain's own eval-mode outputs (raw f32) and expect.json. Then, for
each model: onnx.checker.check_model with full_check (which runs ONNX's shape inference too),
the symbolic batch dim on every graph input and output, the state-dict names among the
initializers, and ONNX Runtime's CPU outputs for both batch sizes against dltrain's:
max|ort - ours| <= 1e-5 * max|ours| (f32; issue 32's bound).

16-bit models (f16, bf16) are fed in their own type (the files hold the values as f32, exactly).
ONNX Runtime's CPU provider runs f16 graphs (through f32 where it has no f16 kernel) but has
almost no bf16 kernels, so bf16 graphs run in ONNX's reference evaluator (onnx.reference, numpy
with ml_dtypes), after onnx.checker has type-checked them. Bound for 16-bit outputs: each
arithmetic node (all but the ones that only move, select or cast values) rounds its output to
the 16-bit type once in dltrain and in ONNX Runtime, so the two differ by at most one unit
roundoff u (2^-11 f16, 2^-8 bf16) per such node, relative to the values: max|ort - ours| <=
(n + 1) * u * max|ours|, n the number of arithmetic nodes or, where dltrain rounds more often
than the graph has nodes, the model's "roundings" from expect.json (an f16 LSTM node runs in f32
in ONNX Runtime, dltrain rounds the ~9 gate ops of every step); the reference evaluator
computes a node in 16-bit arithmetic step by step (batch norm: four roundings), hence
4 * (n + 1) * u there.

With --convert PATH/dltrain-convert, ResNet-18's weights (saved as safetensors by the fixture)
are exported again by `dltrain-convert export-onnx` and checked the same way.

Usage: onnx_runtime_check.py --writer PATH/test_io [--python PATH/.venv-peers/bin/python]
                             [--convert PATH/dltrain-convert]
Started by /usr/bin/python3 (ctest), it re-runs itself under --python, the virtual environment
that `scripts/setup.sh --peers` makes (pip install ... onnx onnxruntime). Exits 4 (ctest's
SKIP_RETURN_CODE) with a message when that Python, onnx or onnxruntime is missing.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

SKIP = 4
REL_TOL = 1e-5
# Nodes that only move, select or convert values: no rounding of their own in the bound below
# (a Cast to 16 bits follows an f32 node that the count already has).
NO_ARITHMETIC = {"Cast", "Concat", "Expand", "Flatten", "Gather", "Identity", "Reshape", "Shape",
                 "Slice", "Split", "Squeeze", "Transpose", "Unsqueeze"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--writer", required=True)
    ap.add_argument("--python", default="")
    ap.add_argument("--convert", default="")
    args = ap.parse_args()

    if args.python and os.path.realpath(sys.prefix) != os.path.realpath(
        os.path.dirname(os.path.dirname(args.python))
    ):
        if not os.path.exists(args.python):
            print(f"onnx_runtime_check.py: SKIPPED: {args.python} does not exist; run "
                  "scripts/setup.sh --peers, which creates .venv-peers with onnx and onnxruntime",
                  file=sys.stderr)
            return SKIP
        return subprocess.call([args.python, __file__, "--writer", args.writer,
                                "--convert", args.convert])

    try:
        import ml_dtypes
        import numpy as np
        import onnx
        import onnx.reference
        import onnxruntime as ort
    except ImportError as e:
        print(f"onnx_runtime_check.py: SKIPPED: {e} for {sys.executable}; run "
              "scripts/setup.sh --peers (pip install onnx onnxruntime)", file=sys.stderr)
        return SKIP

    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
        return cond

    with tempfile.TemporaryDirectory(prefix="dltrain_onnx_") as d:
        env = dict(os.environ, DLTRAIN_ONNX_FIXTURE=d)
        r = subprocess.run([args.writer, "[.onnx_fixture]"], env=env)
        if r.returncode == SKIP:
            print("onnx_runtime_check.py: SKIPPED: the writer has no ONNX support", file=sys.stderr)
            return SKIP
        if r.returncode != 0:
            print(f"onnx_runtime_check.py: the writer failed ({r.returncode})", file=sys.stderr)
            return 1
        with open(os.path.join(d, "expect.json")) as f:
            expect = json.load(f)

        def load(entry, feed=False):
            kind = {"float32": "<f4", "int64": "<i8", "bool": "u1"}[entry.get("dtype", "float32")]
            a = np.fromfile(os.path.join(d, entry["file"]), dtype=kind)
            if entry.get("dtype") == "bool":
                a = a.astype(bool)
            if feed and "feed" in entry:  # a 16-bit graph input (the f32 file is exact)
                a = a.astype({"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[entry["feed"]])
            return a.reshape(entry["shape"])

        print(f"onnx {onnx.__version__}, onnxruntime {ort.__version__}")
        models = list(expect["models"])
        if args.convert:
            for m in expect["models"]:
                if "weights" not in m:
                    continue
                cli = dict(m, name=m["name"] + "_cli", file=m["name"] + "_cli.onnx",
                           dims={"input": ["batch", None, "height", "width"],
                                 "output": ["batch", None]})
                cmd = [args.convert, "export-onnx", os.path.join(d, m["weights"]),
                       os.path.join(d, cli["file"]), "--model", m["name"], "--image-size",
                       str(m["runs"][0]["inputs"][0]["shape"][-1]), "--dynamic-batch",
                       "--dynamic-image-size"]
                r = subprocess.run(cmd, capture_output=True, text=True)
                print(r.stdout.strip())
                if check(r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr}"):
                    models.append(cli)
        for m in models:
            name, path = m["name"], os.path.join(d, m["file"])
            model = onnx.load(path)
            try:
                onnx.checker.check_model(model, full_check=True)
            except Exception as e:  # the checker's own exception types vary between versions
                check(False, f"{name}: onnx.checker: {e}")
                continue
            check(model.opset_import[0].version == 17, f"{name}: opset {model.opset_import}")
            static = m.get("static_batch", False)  # exported without a dynamic batch
            dims = m.get("dims")  # the symbolic name (or None: fixed) of each dim, by value name
            for v in list(model.graph.input) + list(model.graph.output):
                shape = v.type.tensor_type.shape.dim
                if dims is not None:
                    for k, want in enumerate(dims.get(v.name, [])):
                        got = shape[k].dim_param or shape[k].dim_value
                        check((shape[k].dim_value > 0) if want is None else got == want,
                              f"{name}: {v.name} dim {k} is {got!r}, not {want or 'fixed'}")
                elif static:
                    check(shape[0].dim_value > 0, f"{name}: {v.name} dim 0 is not a fixed size")
                else:
                    check(shape[0].dim_param == "batch", f"{name}: {v.name} dim 0 is not 'batch'")
            ops = {n.op_type for n in model.graph.node}
            for want in m.get("ops_include", []):  # e.g. LSTM written as ONNX's own operator
                check(want in ops, f"{name}: no {want} node (ops: {sorted(ops)})")
            inits = {i.name for i in model.graph.initializer}
            for want in m["initializers_include"]:
                check(want in inits, f"{name}: no initializer named {want}")
            feeds0 = [e.get("feed", "") for e in m["runs"][0]["inputs"] + m["runs"][0]["outputs"]]
            reference = "bfloat16" in feeds0
            u = 2.0 ** -8 if reference else 2.0 ** -11 if "float16" in feeds0 else 0.0
            arithmetic = sum(n.op_type not in NO_ARITHMETIC for n in model.graph.node)
            n = max(arithmetic, m.get("roundings", 0))
            tol = REL_TOL if u == 0 else (4 if reference else 1) * (n + 1) * u
            if reference:
                sess = onnx.reference.ReferenceEvaluator(model)
            else:
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = 2
                sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
            batches = []
            for run in m["runs"]:
                feeds = {e["name"]: load(e, feed=True) for e in run["inputs"]}
                batches.append(next(iter(feeds.values())).shape[0])
                got = sess.run([e["name"] for e in run["outputs"]], feeds)
                for e, g in zip(run["outputs"], got):
                    ours = load(e)
                    if not check(g.shape == ours.shape,
                                 f"{name} batch {batches[-1]}: shape {g.shape} != {ours.shape}"):
                        continue
                    scale = float(np.max(np.abs(ours)))
                    err = float(np.max(np.abs(g.astype(np.float64) - ours)))
                    runner = "reference" if reference else "ort"
                    print(f"{name:10s} batch {batches[-1]}: max|{runner} - ours| = {err:.3e}, "
                          f"max|ours| = {scale:.3e}, ratio {err / scale:.2e} (bound {tol:.2g})")
                    check(err <= tol * scale,
                          f"{name} batch {batches[-1]} {e['name']}: max|{runner} - ours| = "
                          f"{err:.3e} > {tol:.2g} * {scale:.3e}")
            check(len(set(batches)) == (1 if static else 2),
                  f"{name}: the runs do not use {'one batch size' if static else 'two batch sizes'}")

    for f_ in failures:
        print("FAIL:", f_, file=sys.stderr)
    print(f"onnx_runtime_check.py: {len(models)} models, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
