#!/usr/bin/python3
"""Reads every file of a resume-harness checkpoint with numpy + json only (no safetensors or
torch package), the way a Python user would, and optionally compares every tensor with the
values the harness reported (tests/test_checkpoint_python.cpp writes them).

    safetensors_reader.py CKPT_DIR [CKPT_DIR ...]        list tensors, check structure
    safetensors_reader.py --expect EXPECTED.json          check the listed checkpoints' values

BF16 is decoded by widening the uint16 bits into the high half of a float32; F8_E4M3 bytes by
the E4M3 (FN) rules; scaled fp16/fp8 states are also reconstructed as TransformerEngine decodes
them: fp16 as decode(data) * scale, fp8 as decode(data) * scale_inv.
Exits 0 if everything matches, 1 otherwise (first problem printed).
"""
import json
import os
import struct
import sys

import numpy as np

PLAIN = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I16": np.int16,
         "I32": np.int32, "I64": np.int64, "U8": np.uint8}
ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "I16": 2, "U8": 1, "I32": 4, "I64": 8, "F64": 8}


def e4m3_table():
    """float32 value of each E4M3 (FN) byte: bias 7, subnormals, 0x7F/0xFF NaN, no infinities."""
    out = np.zeros(256, dtype=np.float32)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = float("nan")
        elif e == 0:
            v = m / 8.0 * 2.0 ** -6
        else:
            v = (1.0 + m / 8.0) * 2.0 ** (e - 7)
        out[b] = -v if s else v
    return out


E4M3 = e4m3_table()


class Bad(Exception):
    pass


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise Bad("duplicate key in header")
    return dict(pairs)


def read_safetensors(path):
    """Returns {key: (dtype, numpy array of the raw elements)} after structural checks."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise Bad(f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    if n < 2 or n > 100_000_000 or 8 + n > len(blob):
        raise Bad(f"{path}: bad header length {n}")
    header = json.loads(blob[8:8 + n].decode("utf-8"), object_pairs_hook=no_duplicates)
    buf = memoryview(blob)[8 + n:]
    header.pop("__metadata__", None)
    spans, out = [], {}
    for key, e in header.items():
        dt, shape, (b, end) = e["dtype"], e["shape"], e["data_offsets"]
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - b != numel * ITEMSIZE[dt] or end > len(buf):
            raise Bad(f"{path}: tensor {key}: offsets [{b}, {end}] do not fit {dt} {shape}")
        spans.append((b, end))
        raw = np.frombuffer(buf[b:end], dtype=np.uint16 if dt == "BF16" else np.uint8 if dt == "F8_E4M3" else PLAIN[dt])
        out[key] = (dt, raw.reshape(shape))
    cursor = 0
    for b, end in sorted(spans):
        if b != cursor:
            raise Bad(f"{path}: hole or overlap at byte {cursor}")
        cursor = end
    if cursor != len(buf):
        raise Bad(f"{path}: {len(buf) - cursor} trailing bytes")
    return out


def to_float(dt, raw):
    """Element values as float64 (ints exactly, floats widened exactly)."""
    if dt == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dt == "F8_E4M3":
        return E4M3[raw].astype(np.float64)
    return raw.astype(np.float64)


def read_checkpoint(d):
    with open(os.path.join(d, "manifest.json")) as f:
        manifest = json.load(f)
    tensors = {}
    for entry in manifest["files"]:
        name = entry["name"]
        if "/" in name or name.startswith("."):
            raise Bad(f"{d}: manifest file name {name!r} leaves the directory")
        path = os.path.join(d, name)
        if os.path.getsize(path) != entry["bytes"]:
            raise Bad(f"{path}: size differs from the manifest")
        for key, (dt, raw) in read_safetensors(path).items():
            tensors[(name, key)] = (dt, raw)
    for t in manifest["tensors"]:
        dt, raw = tensors[(t["file"], t["key"])]
        if dt != t["dtype"] or list(raw.shape) != t["shape"] or raw.nbytes != t["bytes"]:
            raise Bad(f"{t['file']}: tensor {t['key']} differs from the manifest")
    return manifest, tensors


def as_floats(values):
    return np.array([float(v) if not isinstance(v, str) else float(v) for v in values], dtype=np.float64)


def check_expected(spec):
    checked = 0
    for ck in spec["checkpoints"]:
        _, tensors = read_checkpoint(ck["dir"])
        if len(tensors) != len(ck["tensors"]):
            raise Bad(f"{ck['dir']}: {len(tensors)} tensors on disk, {len(ck['tensors'])} expected")
        for e in ck["tensors"]:
            dt, raw = tensors[(e["file"], e["key"])]
            got = to_float(dt, raw).reshape(-1)
            want = as_floats(e["values"])
            if dt != e["dtype"] or list(raw.shape) != e["shape"] or not np.array_equal(got, want, equal_nan=True):
                raise Bad(f"{ck['dir']}/{e['file']}: tensor {e['key']} ({dt}) does not match the harness")
            if "unscaled" in e:   # a scaled fp16/fp8 state: decode(data) * (fp16: scale, fp8: scale_inv)
                mult_key = e["key"] + (".scale_inv" if e["dtype"] == "F8_E4M3" else ".scale")
                scale = to_float(*tensors[(e["file"], mult_key)]).astype(np.float32).reshape(())
                value = (got.astype(np.float32) * scale).astype(np.float64)
                if not np.array_equal(value, as_floats(e["unscaled"]), equal_nan=True):
                    raise Bad(f"{ck['dir']}/{e['file']}: tensor {e['key']} unscaled values differ")
            checked += 1
    return checked


def main(argv):
    try:
        if len(argv) == 3 and argv[1] == "--expect":
            with open(argv[2]) as f:
                n = check_expected(json.load(f))
            print(f"safetensors_reader: {n} tensors match the harness")
            return 0
        for d in argv[1:]:
            _, tensors = read_checkpoint(d)
            for (name, key), (dt, raw) in sorted(tensors.items()):
                print(f"{name:32s} {key:40s} {dt:8s} {list(raw.shape)}")
        return 0 if len(argv) > 1 else 2
    except (Bad, KeyError, ValueError, OSError) as e:
        print(f"safetensors_reader: FAIL: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
