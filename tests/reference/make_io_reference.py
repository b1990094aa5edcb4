#!/usr/bin/env python3
"""Golden files for tests/io (safetensors and torch.save interchange), and the checker that
verifies safetensors files written by dltrain.

Run with Debian's python3-torch (+ python3-torchvision for --check-resnet18):

    /usr/bin/python3 tests/reference/make_io_reference.py            # (re)write tests/reference/io/
    /usr/bin/python3 tests/reference/make_io_reference.py --check F  # F holds the reference tensors?
    /usr/bin/python3 tests/reference/make_io_reference.py --check-resnet18 F

Writing (into tests/reference/io/):
- io_reference.txt: the expected tensors. Per tensor a line `name dtype ndim d0 d1 ...` (dtype
  as dltrain names it) and a line of its elements in row-major order, each written as the
  unsigned decimal value of its little-endian bit pattern (float32 -> 32 bits, bfloat16 ->
  16 bits, int64 -> 64-bit two's complement, ...), so C++ compares bit for bit, NaN and -0
  included. Names `ref.*` are the state dict below as dltrain loads it (int8/int16 widened to
  int32); `ckpt.*` the model state dict inside checkpoint.pth.
- tensors.pth: torch.save of the reference state dict (views sharing a storage, a transposed
  view, a channels-last tensor, 0-d and empty tensors, every dtype).
- tensors.safetensors: the same tensors in safetensors format, written by hand (struct + json)
  because the `safetensors` package is not installed; metadata {"format": "pt"}.
- tensors_zip64.pth / tensors_big_endian.pth: tensors.pth re-zipped by Python's zipfile, once
  with ZIP64 records forced, once with a `byteorder` record saying "big".
- checkpoint.pth: {"epoch", "model": state_dict, "optimizer": state_dict, "args": Namespace}
  of a small conv/BN/linear model after one SGD step.
- params_proto4.pth: dict(model.named_parameters()) saved with pickle protocol 4.
- legacy.pth, module.pth, namespace.pth, complex.pth: files dltrain must refuse (pre-1.6
  format, a whole nn.Module, a non-tensor entry, a complex dtype).

Checking (exit status 0 = pass, 1 = mismatch, 2 = malformed file):
- --check F: F must be a valid safetensors file (read by hand, strictly) holding exactly the
  reference state dict as dltrain loads it, in order, bit for bit, with metadata
  {"format": "pt", "writer": "dltrain"}.
- --check-resnet18 F: F's tensors must load into torchvision's resnet18 with strict=True and
  matching dtypes; its float64 eval logits on the deterministic input of
  make_resnet_reference.py must match resnet_reference.txt (resnet18.eval_logits).
"""
import argparse
import collections
import json
import math
import os
import struct
import sys
import zipfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "io")

# dtype: (safetensors name, dltrain name, bit-pattern view dtype or None for 1-byte types)
DTYPES = {
    torch.float64: ("F64", "float64", torch.int64),
    torch.float32: ("F32", "float32", torch.int32),
    torch.float16: ("F16", "float16", torch.int16),
    torch.bfloat16: ("BF16", "bfloat16", torch.int16),
    torch.int64: ("I64", "int64", torch.int64),
    torch.int32: ("I32", "int32", torch.int32),
    torch.int16: ("I16", None, torch.int16),
    torch.int8: ("I8", None, torch.int8),
    torch.uint8: ("U8", "uint8", torch.uint8),
    torch.bool: ("BOOL", "bool", torch.uint8),
}
BY_ST_NAME = {v[0]: k for k, v in DTYPES.items()}


def reference_state_dict():
    """The reference tensors. Deterministic: no random numbers."""
    inf, nan = float("inf"), float("nan")
    sd = collections.OrderedDict()
    sd["f32"] = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) * 0.37 - 3.1
    sd["f32.special"] = torch.tensor(
        [0.0, -0.0, inf, -inf, nan, 1e-45, 3.4028234663852886e38, -1.5, 1 / 3], dtype=torch.float32)
    sd["f64"] = torch.linspace(-1, 1, 7, dtype=torch.float64) * math.pi
    sd["f16"] = torch.tensor([0.0, -0.0, 1.0, -2.5, 65504.0, 6e-8, inf, nan, 0.1],
                             dtype=torch.float16)
    sd["bf16"] = torch.tensor([[0.0, -0.0, 1.0], [-2.5, 3e38, 1e-40], [inf, nan, 0.1]],
                              dtype=torch.bfloat16)
    sd["i64"] = torch.tensor([0, -1, 2**62 + 1, -2**63, 2**63 - 1], dtype=torch.int64)
    sd["i32"] = torch.tensor([[0, -1], [2**31 - 1, -2**31]], dtype=torch.int32)
    sd["i16"] = torch.tensor([0, -1, 32767, -32768], dtype=torch.int16)
    sd["i8"] = torch.tensor([0, -1, 127, -128], dtype=torch.int8)
    sd["u8"] = torch.tensor([0, 1, 127, 128, 255], dtype=torch.uint8)
    sd["bool"] = torch.tensor([True, False, True, True], dtype=torch.bool)
    sd["scalar.f64"] = torch.tensor(2.5, dtype=torch.float64)
    sd["scalar.i64"] = torch.tensor(7, dtype=torch.int64)  # like BN's num_batches_tracked
    sd["empty"] = torch.zeros(0, 3, dtype=torch.float32)
    # Views of one storage: in torch.save they share one record, with offsets and strides.
    base = torch.arange(20, dtype=torch.float32).reshape(4, 5) - 7.25
    sd["view.base"] = base
    sd["view.t"] = base.t()  # non-contiguous
    sd["view.row"] = base[2]  # storage offset 10
    sd["view.col"] = base[1:, 3]  # offset 8, stride 5
    cl = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).reshape(2, 3, 2, 2) / 8 - 1
    sd["channels_last"] = cl.contiguous(memory_format=torch.channels_last)
    return sd


def as_loaded_by_dltrain(sd):
    """dltrain widens int8/int16 to int32."""
    return collections.OrderedDict(
        (k, v.to(torch.int32) if v.dtype in (torch.int8, torch.int16) else v) for k, v in sd.items())


def tensor_bytes(t):
    """Row-major little-endian bytes of t."""
    t = t.detach().contiguous()
    return t.view(DTYPES[t.dtype][2]).numpy().tobytes() if t.numel() else b""


def bit_patterns(t):
    width = t.element_size()
    b = tensor_bytes(t)
    return [int.from_bytes(b[i:i + width], "little") for i in range(0, len(b), width)]


# --- safetensors by hand ----------------------------------------------------------------------


def write_safetensors(path, sd, metadata):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in sd.items():
        b = tensor_bytes(t)
        header[name] = {"dtype": DTYPES[t.dtype][0], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


class Malformed(Exception):
    pass


def read_safetensors(path):
    """Strict reader: returns (OrderedDict name -> tensor in header order, metadata, raw bytes
    per name). Raises Malformed on anything a valid dltrain-written file cannot contain."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise Malformed("shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise Malformed(f"header length {n} exceeds the file")
    if n % 8 != 0:
        raise Malformed(f"header length {n} is not a multiple of 8 (dltrain pads to 8)")

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise Malformed(f"duplicate keys in {keys}")
        return collections.OrderedDict(pairs)

    header = json.loads(data[8:8 + n].decode("utf-8"), object_pairs_hook=no_duplicates)
    metadata = header.pop("__metadata__", {})
    body = data[8 + n:]
    tensors, raw, end = collections.OrderedDict(), collections.OrderedDict(), 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if set(info) != {"dtype", "shape", "data_offsets"}:
            raise Malformed(f"{name}: fields {sorted(info)}")
        dtype = BY_ST_NAME[info["dtype"]]
        begin, stop = info["data_offsets"]
        numel = math.prod(info["shape"])
        if begin != end or stop - begin != numel * torch.tensor([], dtype=dtype).element_size():
            raise Malformed(f"{name}: data_offsets {info['data_offsets']} (expected start {end})")
        end = stop
        b = body[begin:stop]
        raw[name] = b
        view = DTYPES[dtype][2]
        flat = torch.frombuffer(bytearray(b), dtype=view) if b else torch.empty(0, dtype=view)
        tensors[name] = flat.view(dtype).reshape(info["shape"])
    if end != len(body):
        raise Malformed(f"data section has {len(body)} bytes, tensors use {end}")
    ordered = collections.OrderedDict((k, tensors[k]) for k in header)  # header order
    return ordered, metadata, raw


def check_reference_file(path):
    try:
        got, metadata, raw = read_safetensors(path)
    except (Malformed, KeyError, ValueError) as e:
        print(f"FAIL {path}: malformed safetensors file: {e}")
        return 2
    want = as_loaded_by_dltrain(reference_state_dict())
    errors = []
    if list(got) != list(want):
        missing = [k for k in want if k not in got][:5]
        unexpected = [k for k in got if k not in want][:5]
        errors.append(f"names or order differ: missing (first 5) {missing}, unexpected (first 5) "
                      f"{unexpected}, order {list(got)[:5]}... vs {list(want)[:5]}...")
    for name, t in want.items():
        if name not in got:
            continue
        g = got[name]
        if g.dtype != t.dtype or tuple(g.shape) != tuple(t.shape):
            errors.append(f"{name}: {g.dtype} {tuple(g.shape)} != {t.dtype} {tuple(t.shape)}")
        elif raw[name] != tensor_bytes(t):
            errors.append(f"{name}: values differ: {g.reshape(-1)[:8].tolist()} vs "
                          f"{t.reshape(-1)[:8].tolist()}")
    if metadata != {"format": "pt", "writer": "dltrain"}:
        errors.append(f"metadata {metadata}")
    for e in errors:
        print(f"FAIL {path}: {e}")
    if not errors:
        print(f"OK {path}: {len(got)} tensors identical to the reference, bit for bit")
    return 1 if errors else 0


def read_reference_txt(path, name):
    with open(path) as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if line.split(" ")[0] == name:
            dims = [int(d) for d in line.split()[2:]]
            return torch.tensor([float(v) for v in lines[i + 1].split()],
                                dtype=torch.float64).reshape(dims)
    raise KeyError(name)


def check_resnet18(path):
    import torchvision

    sys.path.insert(0, HERE)
    try:
        got, _, _ = read_safetensors(path)
    except (Malformed, KeyError, ValueError) as e:
        print(f"FAIL {path}: malformed safetensors file: {e}")
        return 2
    model = torchvision.models.resnet18()
    expected = model.state_dict()
    errors = [f"{k}: dtype {got[k].dtype} != {v.dtype}" for k, v in expected.items()
              if k in got and got[k].dtype != v.dtype]
    try:
        model.load_state_dict(got, strict=True)
    except RuntimeError as e:
        errors.append(f"load_state_dict(strict=True) failed: {e}")
    if not errors:
        model.double().eval()
        n = 2 * 3 * 64 * 64
        x = torch.sin(0.05 * torch.arange(n, dtype=torch.float64)).reshape(2, 3, 64, 64)
        with torch.no_grad():
            logits = model(x)[:, :200]
        ref = read_reference_txt(os.path.join(HERE, "resnet_reference.txt"), "resnet18.eval_logits")
        err = (logits - ref).abs().max().item() / ref.abs().max().item()
        # dltrain saved float32 weights rounded from make_resnet_reference.py's float64 fill.
        if not err < 1e-5:
            errors.append(f"eval logits differ from resnet_reference.txt: max error {err:.3g} "
                          "relative to max |logit|")
        else:
            print(f"OK {path}: torchvision resnet18 loads it (strict) and its logits match the "
                  f"reference (max error {err:.2g} relative to max |logit|)")
    for e in errors:
        print(f"FAIL {path}: {e}")
    return 1 if errors else 0


# --- writing the golden files -----------------------------------------------------------------


def write_reference_txt(path, entries):
    dl_name = {k: v[1] for k, v in DTYPES.items()}
    with open(path, "w") as f:
        f.write(f"# generated by make_io_reference.py with torch {torch.__version__}\n")
        f.write("# name dtype ndim sizes... / row-major elements as little-endian bit patterns "
                "(unsigned decimal)\n")
        for name, t in entries.items():
            f.write(f"{name} {dl_name[t.dtype]} {t.dim()} {' '.join(str(s) for s in t.shape)}"
                    .rstrip() + "\n")
            f.write(" ".join(str(v) for v in bit_patterns(t)) + "\n")


def small_model():
    torch.manual_seed(0)  # only to construct; every entry is overwritten below
    m = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.ReLU(),
                            torch.nn.Flatten(), torch.nn.Linear(12, 4))
    with torch.no_grad():
        for k, (name, t) in enumerate(m.state_dict().items()):
            if t.is_floating_point():
                i = torch.arange(t.numel(), dtype=torch.float64)
                t.copy_(torch.sin(0.7 * i + 0.3 * k).reshape(t.shape) * 0.5 +
                        (1.0 if name.endswith("running_var") else 0.0))
    return m


def rezip(src, dst, extra=None, force_zip64=False):
    old = zipfile.ZIP64_LIMIT
    if force_zip64:
        zipfile.ZIP64_LIMIT = 16  # every size and offset above 16 bytes gets a ZIP64 field
    try:
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
            for info in zin.infolist():
                zout.writestr(info.filename, zin.read(info.filename))
            for name, data in (extra or {}).items():
                zout.writestr(name, data)
    finally:
        zipfile.ZIP64_LIMIT = old
    if force_zip64:
        # Python keeps the real values in the classic end record when they fit; saturate them
        # (as a > 4 GiB archive must) so readers have to follow the ZIP64 end record.
        with open(dst, "r+b") as f:
            f.seek(-22, os.SEEK_END)
            eocd = bytearray(f.read(22))
            assert eocd[:4] == b"PK\x05\x06"
            eocd[8:20] = b"\xff" * 12
            f.seek(-22, os.SEEK_END)
            f.write(eocd)


def write_all():
    os.makedirs(OUT, exist_ok=True)
    p = lambda name: os.path.join(OUT, name)  # noqa: E731
    sd = reference_state_dict()
    torch.save(sd, p("tensors.pth"))
    write_safetensors(p("tensors.safetensors"), sd, {"format": "pt"})
    rezip(p("tensors.pth"), p("tensors_zip64.pth"), force_zip64=True)
    rezip(p("tensors.pth"), p("tensors_big_endian.pth"), extra={"tensors/byteorder": "big"})

    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.sin(torch.arange(2 * 2 * 4 * 4, dtype=torch.float32)).reshape(2, 2, 4, 4)
    model(x).square().sum().backward()
    opt.step()
    torch.save({"epoch": 3, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "args": argparse.Namespace(lr=0.1, arch="tiny"), "best_acc": 0.25,
                "step": 2**40}, p("checkpoint.pth"))
    torch.save(collections.OrderedDict(model.named_parameters()), p("params_proto4.pth"),
               pickle_protocol=4)

    torch.save({"w": torch.ones(2)}, p("legacy.pth"), _use_new_zipfile_serialization=False)
    torch.save(torch.nn.Linear(2, 2), p("module.pth"))
    torch.save({"w": torch.ones(2), "args": argparse.Namespace(lr=0.1)}, p("namespace.pth"))
    torch.save({"w": torch.ones(2, dtype=torch.complex64)}, p("complex.pth"))

    entries = collections.OrderedDict()
    for k, v in as_loaded_by_dltrain(sd).items():
        entries["ref." + k] = v
    for k, v in model.state_dict().items():
        entries["ckpt." + k] = v
    write_reference_txt(p("io_reference.txt"), entries)

    # Self-checks: the hand-written safetensors file reads back, and torch loads what we zipped.
    got, _, _ = read_safetensors(p("tensors.safetensors"))
    for k, v in sd.items():
        assert tensor_bytes(got[k]) == tensor_bytes(v), k
    back = torch.load(p("tensors.pth"))
    assert all(tensor_bytes(back[k]) == tensor_bytes(v) for k, v in sd.items())
    with zipfile.ZipFile(p("tensors_zip64.pth")) as z:  # torch 1.13's miniz rejects it; Python
        assert z.testzip() is None and len(z.namelist()) == len(sd) - 3 + 2  # reads it
    total = sum(os.path.getsize(p(f)) for f in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files ({total} bytes) into {OUT}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", metavar="FILE", help="verify a dltrain-written reference file")
    ap.add_argument("--check-resnet18", metavar="FILE", help="verify a dltrain-written resnet18")
    args = ap.parse_args()
    if args.check:
        sys.exit(check_reference_file(args.check))
    if args.check_resnet18:
        sys.exit(check_resnet18(args.check_resnet18))
    write_all()


if __name__ == "__main__":
    main()
