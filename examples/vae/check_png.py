#!/usr/bin/env python3
"""Round trip of the VAE example's PNG grids, with the standard library only: reads
reconstructions.png (chunk CRCs checked, IDAT inflated, scanline filters undone) and checks that
its even tile rows are the Fashion-MNIST test images byte for byte (they went IDX -> float
tensor in [0, 1] -> grid -> PNG), and that samples.png decodes to the same grid size.

    check_png.py OUT_DIR [FASHION_MNIST_DIR]
"""
import gzip
import os
import struct
import sys
import zlib

TILE, COLS = 30, 8  # 28 pixels + a 1-pixel frame on each side, 8 tiles a row


def read_png(path):
    raw = open(path, "rb").read()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG signature"
    pos, idat, ihdr = 8, b"", None
    while pos < len(raw):
        (n,) = struct.unpack(">I", raw[pos:pos + 4])
        kind, body = raw[pos + 4:pos + 8], raw[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", raw[pos + 8 + n:pos + 12 + n])
        assert zlib.crc32(kind + body) == crc, f"{path}: bad CRC in {kind}"
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + n
    w, h, depth, color, _, _, interlace = ihdr
    assert (depth, color, interlace) == (8, 0, 0), f"{path}: expected 8-bit grey, got {ihdr}"
    data, rows, prev = zlib.decompress(idat), [], bytearray(w)
    for y in range(h):
        f, line = data[y * (w + 1)], bytearray(data[y * (w + 1) + 1:(y + 1) * (w + 1)])
        for x in range(w):
            a = line[x - 1] if x else 0
            b, c = prev[x], prev[x - 1] if x else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            else:
                assert f == 0, f"{path}: bad filter {f}"
        rows.append(bytes(line))
        prev = line
    return w, h, rows


def main():
    out = sys.argv[1]
    data = sys.argv[2] if len(sys.argv) > 2 else "/usr/share/datasets/fashion-mnist"
    path = os.path.join(data, "t10k-images-idx3-ubyte")
    raw = gzip.open(path + ".gz").read() if not os.path.exists(path) else open(path, "rb").read()
    images = raw[16:]
    w, h, rows = read_png(os.path.join(out, "reconstructions.png"))
    assert (w, h) == (COLS * TILE, COLS * TILE), (w, h)
    for k in range(4):  # tile rows 0, 2, 4, 6: test images 8k .. 8k + 7
        for c in range(COLS):
            img = images[(8 * k + c) * 784:(8 * k + c + 1) * 784]
            for y in range(28):
                got = rows[2 * k * TILE + 1 + y][c * TILE + 1:c * TILE + 29]
                assert got == img[y * 28:(y + 1) * 28], f"test image {8 * k + c} row {y} differs"
    ws, hs, _ = read_png(os.path.join(out, "samples.png"))
    assert (ws, hs) == (w, h), (ws, hs)
    print(f"PNG round trip: {w}x{h} grids decoded, CRCs good, 32 test images equal byte for byte")


if __name__ == "__main__":
    main()
