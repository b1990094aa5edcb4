#!/usr/bin/env python3
"""Checks that h5py, a standard HDF5 reader, opens the HDF5 files dltrain writes.

Runs the hidden Catch2 case "[.h5py_fixture]" of test_io, which writes into a temporary folder
a checkpoint saved by io::save_checkpoint, a checkpoint holding one tensor of every dtype, a
packed dataset of 3 shards, and expect.json: what the C++ side wrote (names, shapes, dtypes,
every value; the CRC-32 and label of every packed image as PackedImageDataset reads it). Then
opens every file with h5py and checks, against expect.json, the layout docs/design.md
describes ("HDF5 layout for other readers"): the 512-byte user block, the root attributes, one
dataset per state-dict entry with its `dtype` attribute, f16/bf16 stored as 16-bit patterns,
the pack's attributes, tables and JPEG bytes.

Exits 4 (ctest's SKIP_RETURN_CODE) with a message when h5py or numpy is missing.
Usage: h5py_reads.py --writer PATH/test_io
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import zlib

SKIP = 4

# How dltrain stores each dtype (src/io/checkpoint.cpp, h5_type): the numpy dtype h5py gives.
# Keys: the `dtype` attribute (dltrain::dtype_name).
STORED = {"float32": "<f4", "float64": "<f8", "float16": "<u2", "bfloat16": "<u2",
          "int32": "<i4", "int64": "<i8", "uint8": "|u1", "bool": "|u1"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--writer", required=True)
    args = ap.parse_args()
    try:
        import h5py
        import numpy as np
    except ImportError as e:
        print(f"h5py_reads.py: SKIPPED: {e} for {sys.executable}; install Debian's python3-h5py "
              "(scripts/setup.sh does)", file=sys.stderr)
        return SKIP

    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    def attr_str(v):
        return v.decode() if isinstance(v, bytes) else str(v)

    def values_of(ds, dtype):
        """The dataset's values as the C++ side described them (f64, or integers)."""
        raw = np.asarray(ds[()])
        if dtype == "float16":
            return raw.view(np.float16).astype(np.float64)
        if dtype == "bfloat16":
            return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        if dtype in ("float32", "float64"):
            return raw.astype(np.float64)
        return raw.astype(np.int64)

    def check_checkpoint(path, want):
        name = os.path.basename(path)
        with h5py.File(path, "r") as f:
            check(f.userblock_size == 512, f"{name}: user block {f.userblock_size}, not 512")
            for k, v in want["attrs"].items():
                check(k in f.attrs and int(f.attrs[k]) == v,
                      f"{name}: root attribute {k} = {f.attrs.get(k)}, expected {v}")
            check(attr_str(f.attrs.get("dltrain_version")) == want["dltrain_version"],
                  f"{name}: dltrain_version")
            meta = f.get("metadata")
            check(meta is not None, f"{name}: no /metadata group")
            if meta is not None:
                got = {k: attr_str(v) for k, v in meta.attrs.items()}
                check(got == want["metadata"], f"{name}: metadata {got} != {want['metadata']}")
            for group, entries in want["groups"].items():
                g = f.get(group)
                check(isinstance(g, h5py.Group), f"{name}: no group /{group}")
                if not isinstance(g, h5py.Group):
                    continue
                check(sorted(g.keys()) == sorted(entries.keys()),
                      f"{name}: /{group} holds {sorted(g.keys())}, expected "
                      f"{sorted(entries.keys())}")
                for key, e in entries.items():
                    ds = g.get(key)
                    where = f"{name}:/{group}/{key}"
                    check(isinstance(ds, h5py.Dataset), f"{where}: not a dataset")
                    if not isinstance(ds, h5py.Dataset):
                        continue
                    check(list(ds.shape) == e["shape"], f"{where}: shape {ds.shape} != {e['shape']}")
                    check(ds.dtype.str == np.dtype(STORED[e["dtype"]]).str,
                          f"{where}: stored as {ds.dtype.str}, expected {STORED[e['dtype']]}")
                    check(attr_str(ds.attrs.get("dtype")) == e["dtype"],
                          f"{where}: dtype attribute {ds.attrs.get('dtype')} != {e['dtype']}")
                    got = values_of(ds, e["dtype"]).reshape(-1)
                    want_v = np.asarray(e["values"], dtype=got.dtype).reshape(-1)
                    check(got.shape == want_v.shape and np.array_equal(got, want_v),
                          f"{where}: values {got[:4]}... != {want_v[:4]}...")

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, DLTRAIN_H5PY_FIXTURE=tmp)
        r = subprocess.run([args.writer, "[.h5py_fixture]"], env=env)
        if r.returncode == SKIP:
            print("h5py_reads.py: SKIPPED: the writer has no HDF5 or TurboJPEG", file=sys.stderr)
            return SKIP
        if r.returncode != 0:
            print(f"h5py_reads.py: {args.writer} failed ({r.returncode})", file=sys.stderr)
            return 1
        with open(os.path.join(tmp, "expect.json"), encoding="utf-8") as f:
            expect = json.load(f)

        check_checkpoint(os.path.join(tmp, "checkpoint.h5"), expect["checkpoint"])
        check_checkpoint(os.path.join(tmp, "dtypes.h5"), expect["dtypes"])
        # The every-dtype file: the 0-d entry is a scalar dataset.
        with h5py.File(os.path.join(tmp, "dtypes.h5"), "r") as f:
            check(f["model/scalar"].shape == () and f["model/scalar"][()] == 2.5, "0-d entry")
        # Model weights under their state-dict names, ready for numpy / PyTorch users.
        ck = expect["checkpoint"]["groups"]
        check({"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
               "1.num_batches_tracked"} <= set(ck["model"]), f"model keys {sorted(ck['model'])}")

        pack = expect["pack"]
        index = os.path.join(tmp, pack["index"])
        with h5py.File(index, "r") as f:
            check(f.userblock_size == 512, f"pack index: user block {f.userblock_size}")
            for k in ("format_version", "num_images", "max_side", "quality"):
                check(int(f.attrs[k]) == pack[k], f"pack index: {k} = {f.attrs[k]}, expected {pack[k]}")
            check(int(f.attrs["num_shards"]) == len(pack["shards"]), "pack index: num_shards")
            check(f["shard_counts"].dtype.str == "<i8" and
                  f["shard_counts"][()].tolist() == pack["shard_counts"], "pack index: shard_counts")
            classes = [c.decode() for c in f["classes"][()]]
            check(classes == pack["classes"], f"pack index: classes {classes} != {pack['classes']}")
        image = 0
        for k, shard in enumerate(pack["shards"]):
            path = os.path.join(tmp, shard)
            with open(path, "rb") as raw:
                sb = raw.read(9)
            check(sb[:8] == b"\x89HDF\r\n\x1a\n" and sb[8] >= 2,
                  f"{shard}: no HDF5 superblock v2+ at byte 0 ({sb!r})")
            with h5py.File(path, "r") as f:
                n = pack["shard_counts"][k]
                check(f.userblock_size == 0, f"{shard}: user block {f.userblock_size}")
                check(int(f.attrs["shard_index"]) == k and int(f.attrs["complete"]) == 1 and
                      int(f.attrs["num_images"]) == n, f"{shard}: attributes {dict(f.attrs)}")
                for name, dtype, length in (("jpeg", "|u1", None), ("offsets", "<i8", n + 1),
                                            ("labels", "<i8", n), ("sources", "<i8", n),
                                            ("crc32", "<u4", n), ("paths", None, n)):
                    ds = f.get(name)
                    check(isinstance(ds, h5py.Dataset) and ds.ndim == 1, f"{shard}: {name}")
                    if dtype:
                        check(ds.dtype.str == dtype, f"{shard}:{name} stored as {ds.dtype.str}")
                    if length is not None:
                        check(ds.shape == (length,), f"{shard}:{name} shape {ds.shape}")
                jpeg = f["jpeg"][()]
                offsets = f["offsets"][()]
                crcs = f["crc32"][()]
                labels = f["labels"][()]
                check(offsets[0] == 0 and offsets[-1] == jpeg.size, f"{shard}: offsets tile jpeg")
                for i in range(n):
                    b = jpeg[offsets[i]:offsets[i + 1]].tobytes()
                    crc = zlib.crc32(b)
                    check(b[:2] == b"\xff\xd8", f"{shard}: image {i} is not a JPEG")
                    check(crc == int(crcs[i]), f"{shard}: image {i} CRC {crc} != stored {crcs[i]}")
                    check(crc == pack["jpeg_crc32"][image] and len(b) == pack["jpeg_size"][image],
                          f"{shard}: image {i} differs from what PackedImageDataset reads")
                    check(int(labels[i]) == pack["labels"][image], f"{shard}: label of image {i}")
                    image += 1
        check(image == pack["num_images"], f"read {image} images, expected {pack['num_images']}")

    if failures:
        for what in failures:
            print(f"h5py_reads.py: FAILED: {what}", file=sys.stderr)
        return 1
    print(f"h5py_reads.py: h5py {h5py.__version__} (HDF5 {h5py.version.hdf5_version}) read "
          f"2 checkpoints and a pack of {len(pack['shards'])} shards as dltrain wrote them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
