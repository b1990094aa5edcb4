"""The peers of benchmarks/inference_cpu: eval-mode ResNet forward latency on the CPU in
ONNX Runtime (on the ONNX file that `inference_cpu --export-onnx FILE` wrote: dltrain's own
graph and weights) and in PyTorch (torchvision's model of the same architecture, eval, no_grad),
at the same batch sizes, image size and thread count; the median of --iters forwards after 3
warm-ups, per batch size. With --compare (inference_cpu's JSON) prints the three side by side.

    .venv-peers/bin/python benchmarks/peers/inference_cpu.py --onnx r50.onnx --threads 2 \\
        --batches 1,8 --compare dltrain.json --json peers.json
"""
import argparse
import json

import numpy as np
import onnxruntime as ort
import torch
import torchvision
from peer_bench import median_ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--onnx", required=True, help="the ONNX file inference_cpu exported")
    ap.add_argument("--arch", default="resnet50", help="torchvision model for PyTorch")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--channels-last", action="store_true", help="PyTorch in channels-last")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--compare", help="inference_cpu's JSON: print the three side by side")
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.arch)().eval()
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(a.onnx, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name

    cases = {"onnxruntime": {}, "pytorch": {}}
    print(f"{a.arch} inference, {a.size}x{a.size}, f32, {a.threads} threads, median of {a.iters}; "
          f"onnxruntime {ort.__version__}, torch {torch.__version__}")
    for b in batches:
        x = np.random.default_rng(0).standard_normal((b, 3, a.size, a.size), dtype=np.float32)
        key = f"{a.arch} b{b}"
        cases["onnxruntime"][key] = median_ms(lambda: sess.run(None, {name: x}), a.iters, warmup=3)
        xt = torch.from_numpy(x).contiguous(memory_format=fmt)
        with torch.no_grad():
            cases["pytorch"][key] = median_ms(lambda: model(xt), a.iters, warmup=3)
        print(f"  {key:16s} onnxruntime {cases['onnxruntime'][key]:9.2f} ms   "
              f"pytorch {cases['pytorch'][key]:9.2f} ms", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"threads": a.threads, "onnxruntime": ort.__version__,
                       "torch": torch.__version__, "cases": cases}, f, indent=1)
    if a.compare:
        with open(a.compare) as f:
            dl = json.load(f)["cases"]
        print(f"\n{'case':16s} {'dltrain':>10s} {'ORT':>10s} {'PyTorch':>10s} "
              f"{'dl/ORT':>7s} {'dl/PT':>7s}")
        for k in cases["pytorch"]:
            if k in dl:
                o, p = cases["onnxruntime"][k], cases["pytorch"][k]
                print(f"{k:16s} {dl[k]:10.2f} {o:10.2f} {p:10.2f} {dl[k] / o:7.3f} {dl[k] / p:7.3f}")


if __name__ == "__main__":
    main()
