#!/usr/bin/env python3
"""Runs tools/dltrain-plot on metrics files and checks the pictures it writes.

The PNG must carry PNG's signature and an IHDR chunk of a plausible size, decode with
matplotlib's reader, and not be one flat colour; the SVG must parse as XML with an <svg> root.

Usage: check_plot.py --tool PATH/dltrain-plot FILE [FILE...]
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    for f in args.files:
        if not os.path.exists(f):
            print(f"check_plot.py: {f} does not exist (the test that writes it must run first)",
                  file=sys.stderr)
            return 1
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sub", "curves")
        r = subprocess.run([sys.executable, args.tool, *args.files, "-o", out],
                           capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        if r.returncode != 0:
            print(f"check_plot.py: dltrain-plot failed ({r.returncode})", file=sys.stderr)
            return 1
        with open(out + ".png", "rb") as f:
            data = f.read()
        if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
            print("check_plot.py: not a PNG", file=sys.stderr)
            return 1
        width, height = struct.unpack(">II", data[16:24])
        if not (200 <= width <= 4000 and 200 <= height <= 4000):
            print(f"check_plot.py: PNG of {width}x{height}", file=sys.stderr)
            return 1
        import matplotlib.image as mpimg
        img = mpimg.imread(out + ".png")
        if img.shape[0] != height or img.shape[1] != width or float(img.std()) == 0.0:
            print("check_plot.py: the PNG does not decode to a picture", file=sys.stderr)
            return 1
        root = ET.parse(out + ".svg").getroot()
        if not root.tag.endswith("svg"):
            print(f"check_plot.py: SVG root is {root.tag}", file=sys.stderr)
            return 1
        print(f"check_plot.py: PNG {width}x{height} and SVG OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
