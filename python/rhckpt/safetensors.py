"""One safetensors file of a resume-harness checkpoint, read as hostile input.

Structure as harness/checkpoint/safetensors_format.cpp checks it: an 8-byte little-endian header
length (at least 2, at most 100 MB, inside the file), a JSON header without duplicate keys, every
tensor's [begin, end) = numel x itemsize, the spans tiling the data buffer with no hole, overlap or
trailing byte. Compressed files (`__metadata__.rh_codec = "byteplane-zstd/1"`, written by
write_safetensors_compressed in harness/checkpoint/safetensors.cpp) hold each tensor as a U8 blob
of independent blocks; decode_blob() gets the exact raw bytes back as SafetensorsFile::decoded
does, checking each block's stored and raw XXH3-64 (README "Compressed checkpoints").
"""
import json
import struct

import numpy as np

from .errors import Damaged

ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "I64": 8, "I32": 4, "I16": 2, "U8": 1}
STORAGE = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F8_E4M3": np.uint8,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "U8": np.uint8}
MAX_HEADER = 100_000_000
CODEC = "byteplane-zstd/1"


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate key in header")
    return dict(pairs)


def _xxh3(data):
    import xxhash   # Debian python3-xxhash
    return xxhash.xxh3_64_hexdigest(data)


def parse(path, blob):
    """Returns (metadata dict, {key: (dtype, shape, memoryview of its bytes)}) after every check."""
    if len(blob) < 8:
        raise Damaged(path, "shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n < 2 or n > MAX_HEADER or 8 + n > len(blob):
        raise Damaged(path, "header length %d does not fit a %d-byte file" % (n, len(blob)))
    try:
        header = json.loads(bytes(blob[8:8 + n]).decode("utf-8"), object_pairs_hook=_no_duplicates)
    except ValueError as e:
        raise Damaged(path, "header is not valid JSON: %s" % e) from None
    meta = header.pop("__metadata__", {}) or {}
    buf = memoryview(blob)[8 + n:]
    spans, out = [], {}
    for key, e in header.items():
        dt, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if dt not in ITEMSIZE or not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2:
            raise Damaged(path, "tensor '%s': expected dtype, shape and data_offsets" % key)
        b, end = offsets
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not 0 <= b <= end <= len(buf) or end - b != numel * ITEMSIZE[dt]:
            raise Damaged(path, "tensor '%s': offsets [%d, %d) do not fit %s %s" % (key, b, end, dt, shape))
        spans.append((b, end))
        out[key] = (dt, [int(s) for s in shape], buf[b:end])
    cursor = 0
    for b, end in sorted(spans):
        if b != cursor:
            raise Damaged(path, "hole or overlap at data byte %d" % cursor)
        cursor = end
    if cursor != len(buf):
        raise Damaged(path, "%d trailing bytes after the last tensor" % (len(buf) - cursor))
    return meta, out


def as_array(dt, shape, raw):
    """The stored elements as numpy (BF16 as uint16 bits, F8_E4M3 as uint8 codes)."""
    return np.frombuffer(raw, dtype=STORAGE[dt]).reshape(shape)


def decode_blob(path, key, table, block_bytes, blob):
    """Raw bytes of one compressed tensor: per block, check XXH3-64 of the stored bytes, decode
    each plane ('r' as is, 'z' one zstd frame) to n bytes, interleave raw[i*k + j] = plane[j][i],
    check XXH3-64 of the raw block (SafetensorsFile::decoded)."""
    import zstandard   # Debian python3-zstandard
    k = ITEMSIZE[table["dtype"]]
    raw_bytes = int(table["raw_bytes"])
    numel = int(np.prod(table["shape"], dtype=np.int64)) if table["shape"] else 1
    if raw_bytes != numel * k:
        raise Damaged(path, "tensor '%s': raw_bytes %d != %d elements x %d" % (key, raw_bytes, numel, k))
    blocks = table["blocks"]
    if len(blocks) != -(-raw_bytes // block_bytes):
        raise Damaged(path, "tensor '%s': %d blocks for %d raw bytes of %d" % (key, len(blocks), raw_bytes, block_bytes))
    out = bytearray(raw_bytes)
    at = 0
    dctx = zstandard.ZstdDecompressor()
    for i, (modes, sizes, h_stored, h_raw) in enumerate(blocks):
        lo = i * block_bytes
        length = min(block_bytes, raw_bytes - lo)
        n = length // k
        where = "tensor '%s' compressed block %d of %d" % (key, i, len(blocks))
        if len(modes) != k or len(sizes) != k or at + sum(sizes) > len(blob):
            raise Damaged(path, where + ": plane table does not add up")
        stored = blob[at:at + sum(sizes)]
        if _xxh3(stored) != h_stored:
            raise Damaged(path, where + ": XXH3-64 of the stored bytes differs (block is corrupted)")
        planes, p = [], 0
        for mode, s in zip(modes, sizes):
            piece = bytes(stored[p:p + s])
            p += s
            plane = piece if mode == "r" else dctx.decompress(piece, max_output_size=n) if mode == "z" else None
            if plane is None or len(plane) != n:
                raise Damaged(path, where + ": plane mode '%s' does not give %d bytes" % (mode, n))
            planes.append(np.frombuffer(plane, dtype=np.uint8))
        block = np.stack(planes, axis=1).reshape(-1).tobytes() if k > 1 else planes[0].tobytes()
        if _xxh3(block) != h_raw:
            raise Damaged(path, where + ": XXH3-64 of the decoded bytes differs")
        out[lo:lo + length] = block
        at += sum(sizes)
    if at != len(blob):
        raise Damaged(path, "tensor '%s': %d stored bytes left after the last block" % (key, len(blob) - at))
    return bytes(out)


def tensors(path, blob):
    """{key: (dtype, shape, raw bytes)} of a file, compressed files decoded."""
    meta, entries = parse(path, blob)
    codec = meta.get("rh_codec")
    if codec is None:
        return {k: (dt, shape, raw) for k, (dt, shape, raw) in entries.items()}
    if codec != CODEC:
        raise Damaged(path, "unknown codec '%s' (expected %s)" % (codec, CODEC))
    table = json.loads(meta["rh_tensors"])
    block_bytes = int(meta["rh_block_bytes"])
    if block_bytes <= 0 or set(table) != set(entries):
        raise Damaged(path, "compressed tensor table does not match the file's tensors")
    return {k: (t["dtype"], [int(s) for s in t["shape"]], decode_blob(path, k, t, block_bytes, entries[k][2]))
            for k, t in table.items()}


def file_checksums(path, blob, entry):
    """The manifest's per-file checks: size, then every block XXH3-64 (or the whole-file one)."""
    if len(blob) != entry["bytes"]:
        raise Damaged(path, "%d bytes, the manifest says %d" % (len(blob), entry["bytes"]))
    hashes = entry.get("block_xxh3")
    if hashes:
        bb = int(entry["block_bytes"])
        if len(hashes) != max(1, -(-len(blob) // bb)) and len(blob) > 0:
            raise Damaged(path, "%d block checksums for %d bytes" % (len(hashes), len(blob)))
        for i, want in enumerate(hashes):
            got = _xxh3(blob[i * bb:(i + 1) * bb])
            if got != want:
                raise Damaged(path, "XXH3-64 checksum of bytes [%d, %d) %s != manifest %s (file is corrupted)"
                              % (i * bb, min((i + 1) * bb, len(blob)), got, want))
    elif _xxh3(blob) != entry["xxh3"]:
        raise Damaged(path, "XXH3-64 checksum differs from the manifest (file is corrupted)")
