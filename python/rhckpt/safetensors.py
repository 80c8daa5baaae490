"""One safetensors file of a resume-harness checkpoint, read as hostile input.

Structure as harness/checkpoint/safetensors_format.cpp checks it: an 8-byte little-endian header
length (at least 2, at most 100 MB, inside the file), a JSON header without duplicate keys, every
tensor's [begin, end) = numel x itemsize, the spans tiling the data buffer with no hole, overlap or
trailing byte. Compressed files (`__metadata__.rh_codec = "byteplane-zstd/1"`, written by
write_safetensors_compressed in harness/checkpoint/safetensors.cpp) hold each tensor as a U8 blob
of independent blocks; decode_entry() gets the exact raw bytes back as SafetensorsFile::decoded
does, checking each block's stored and raw XXH3-64 (docs/checkpoints.md, "Compressed checkpoints").
"""
import json
import re
import struct

import numpy as np

from .errors import Damaged
from .guard import MAX_JSON_DEPTH, Field, depth_violation, parse_json_bounded, quote

ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "I64": 8, "I32": 4, "I16": 2, "U8": 1}
STORAGE = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F8_E4M3": np.uint8,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "U8": np.uint8}
MAX_HEADER = 100_000_000
CODEC = "byteplane-zstd/1"
_HEX16 = re.compile(r"^[0-9a-f]{16}$")


MAX_DIM = 1 << 40
BLOCK_BYTES = 1 << 20   # kCompressBlockBytes: the codec's raw bytes per block, the only block size


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise _Duplicate("duplicate key '%s' in the header" % quote(next(k for k in keys if keys.count(k) > 1)))
    return dict(pairs)


def _xxh3(data):
    import xxhash   # Debian python3-xxhash
    return xxhash.xxh3_64_hexdigest(data)


def _bad(path, what):
    raise Damaged("safetensors file " + path, what)


def parse(path, blob):
    """Returns (metadata dict, {key: (dtype, shape, memoryview of its bytes)}) after every check of
    parse_safetensors (harness/checkpoint/safetensors_format.cpp)."""
    if len(blob) < 8:
        _bad(path, "file has %d bytes, fewer than the 8-byte header length" % len(blob))
    (n,) = struct.unpack("<Q", bytes(blob[:8]))
    if n < 2:
        _bad(path, "header length %d < 2" % n)
    if n > MAX_HEADER:
        _bad(path, "header length %d exceeds the 100 MB cap" % n)
    if n > len(blob) - 8:
        _bad(path, "header length %d runs past the end of the file (%d bytes)" % (n, len(blob)))
    text = bytes(blob[8:8 + n])
    if text[:1] != b"{":
        _bad(path, "header does not start with '{'")
    at = depth_violation(text.decode("latin-1"))
    if at >= 0:
        _bad(path, "header nesting deeper than %d levels at offset %d" % (MAX_JSON_DEPTH, at))
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except _Duplicate as e:
        _bad(path, str(e))
    except (ValueError, RecursionError) as e:
        _bad(path, "header is not valid JSON: %s" % quote(str(e)))
    if not isinstance(header, dict):
        _bad(path, "header is not a JSON object")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict):
        _bad(path, "__metadata__ is not an object")
    for k, v in meta.items():
        if not isinstance(v, str):
            _bad(path, "__metadata__ value of '%s' is not a string" % quote(k))
    buf = memoryview(blob)[8 + n:]
    spans, out = [], {}
    for key, e in sorted(header.items()):
        def tb(what):
            _bad(path, "tensor '%s': %s" % (quote(key), what))
        if key == "":
            _bad(path, "empty tensor key")
        if not isinstance(e, dict):
            tb("entry is not an object")
        for f in e:
            if f not in ("dtype", "shape", "data_offsets"):
                tb("unexpected field '%s'" % quote(f))
        dt, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if not isinstance(dt, str):
            tb("missing or non-string dtype")
        if dt not in ITEMSIZE:
            tb("unknown dtype '%s'" % quote(dt))
        if not isinstance(shape, list):
            tb("missing or non-array shape")
        numel = 1
        for d in shape:
            if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                tb("shape entries must be integers >= 0, got %s" % quote(d))
            if d > MAX_DIM or (d and numel > (1 << 60) // d):
                tb("shape too large")
            numel *= d
        if not isinstance(offsets, list) or len(offsets) != 2 or \
                not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets):
            tb("data_offsets must be [begin, end] of integers >= 0")
        b, end = offsets
        if b > end:
            tb("data_offsets begin %d > end %d" % (b, end))
        if end > len(buf):
            tb("data_offsets [%d, %d] out of range: the data buffer has %d bytes" % (b, end, len(buf)))
        if end - b != numel * ITEMSIZE[dt]:
            tb("data_offsets span %d bytes, expected numel %d * itemsize %d = %d"
               % (end - b, numel, ITEMSIZE[dt], numel * ITEMSIZE[dt]))
        spans.append((b, end, key))
        out[key] = (dt, list(shape), buf[b:end])
    cursor, prev = 0, None
    for b, end, key in sorted(spans):
        if b < cursor:
            _bad(path, "tensor '%s' [%d, %d) overlaps tensor '%s' ending at %d" % (quote(key), b, end, quote(prev), cursor))
        if b > cursor:
            _bad(path, "hole of %d bytes before tensor '%s' at offset %d" % (b - cursor, quote(key), cursor))
        cursor, prev = end, key
    if cursor != len(buf):
        _bad(path, "file size %d != 8 + header %d + tensor bytes %d" % (len(blob), n, cursor))
    return meta, out


def as_array(dt, shape, raw):
    """The stored elements as numpy (BF16 as uint16 bits, F8_E4M3 as uint8 codes)."""
    return np.frombuffer(raw, dtype=STORAGE[dt]).reshape(shape)


def read_table(path, meta, entries):
    """{key: {"dtype", "shape", "raw_bytes", "blocks": [(modes, sizes, h_stored, h_raw, offset)]}}
    of a compressed file, every field checked against the stored blobs before anything is decoded
    (read_table in harness/checkpoint/safetensors.cpp)."""
    what = "safetensors file %s __metadata__ rh_tensors" % path
    codec = meta["rh_codec"]
    if codec != CODEC:
        _bad(path, "codec '%s' is not %s" % (quote(codec), CODEC))
    if meta.get("rh_block_bytes") != str(BLOCK_BYTES):
        _bad(path, "rh_block_bytes must be %d" % BLOCK_BYTES)
    if "rh_tensors" not in meta:
        _bad(path, "compressed, but __metadata__ has no rh_tensors")
    root = Field(parse_json_bounded(meta["rh_tensors"], what), what)
    if not isinstance(root.v, dict):
        root.expected("an object")
    if len(root.v) != len(entries):
        _bad(path, "rh_tensors lists %d tensors, the file stores %d" % (len(root.v), len(entries)))
    table = {}
    for key, (dt, shape, blob) in sorted(entries.items()):
        if dt != "U8" or len(shape) != 1:
            _bad(path, "compressed tensor '%s' must be stored as a 1-D U8 blob" % key)
        if not root.has(key):
            _bad(path, "tensor '%s' has no entry in rh_tensors" % key)
        e = root[key]
        ldt = e["dtype"].str()
        if ldt not in ITEMSIZE:
            e["dtype"].fail("unknown dtype " + quote(ldt))
        k = ITEMSIZE[ldt]
        lshape, n = [], 1
        for d in e["shape"].each():
            lshape.append(d.i64(0, MAX_DIM))
            n *= lshape[-1]
        raw = n * k
        if raw >= 1 << 64:
            e["shape"].fail("the tensor's byte count overflows")
        if e["raw_bytes"].u64() != raw:
            e["raw_bytes"].fail("%d raw bytes, the shape and dtype need %d" % (e["raw_bytes"].v, raw))
        nb = -(-raw // BLOCK_BYTES)
        if e["blocks"].size() != nb:
            e["blocks"].fail("%d blocks, %d raw bytes need %d" % (e["blocks"].size(), raw, nb))
        blob_len, at, blocks = len(blob), 0, []
        for b in e["blocks"].each():
            modes = b[0].str()
            if len(modes) not in (1, k):
                b[0].fail("expected 1 or %d plane modes, got %s" % (k, quote(modes)))
            if b[1].size() != len(modes):
                b[1].fail("one stored size per plane expected")
            sizes = [s.u64(blob_len) for s in b[1].each()]
            if sum(sizes) > blob_len - at:
                b[1].fail("the blocks run past the tensor's %d stored bytes" % blob_len)
            hashes = []
            for h in (2, 3):
                s = b[h].str()
                if not _HEX16.match(s):
                    b[h].fail("expected 16 lower-case hex digits, got " + quote(s))
                hashes.append(s)
            blocks.append((modes, sizes, hashes[0], hashes[1], at))
            at += sum(sizes)
        if at != blob_len:
            _bad(path, "tensor '%s': its blocks cover %d of its %d stored bytes" % (key, at, blob_len))
        table[key] = {"dtype": ldt, "shape": lshape, "raw_bytes": raw, "blocks": blocks, "blob": blob}
    return table


def _decode_block(where, stored, block, raw_len, k):
    """One block's raw bytes (decode_block in harness/checkpoint/compress.cpp)."""
    import zstandard   # Debian python3-zstandard
    modes, sizes, h_stored, h_raw, _ = block
    planes_k = len(modes)
    if raw_len % planes_k:
        raise Damaged(where, "%d raw bytes do not split into %d planes" % (raw_len, planes_k))
    got = _xxh3(stored)
    if got != h_stored:
        raise Damaged(where, "XXH3-64 of its stored bytes %s != %s (the block is damaged)" % (got, h_stored))
    n = raw_len // planes_k
    planes, at = [], 0
    for j, (mode, length) in enumerate(zip(modes, sizes)):
        piece = bytes(stored[at:at + length])
        at += length
        if mode == "r":
            if length != n:
                raise Damaged(where, "raw plane %d has %d bytes, expected %d" % (j, length, n))
            planes.append(piece)
        elif mode == "z":
            try:
                cs = zstandard.frame_content_size(piece)
            except zstandard.ZstdError:
                cs = -2
            if cs != n:
                raise Damaged(where, "plane %d is not one zstd frame of %d bytes" % (j, n))
            try:
                d = zstandard.ZstdDecompressor().decompressobj()
                plane = d.decompress(piece)
                whole = d.eof and not d.unused_data
            except zstandard.ZstdError as e:
                raise Damaged(where, "plane %d does not decode: %s" % (j, quote(str(e)))) from None
            if not whole:
                raise Damaged(where, "plane %d is not one zstd frame of %d bytes" % (j, n))
            if len(plane) != n:
                raise Damaged(where, "plane %d does not decode: wrong size" % j)
            planes.append(plane)
        else:
            raise Damaged(where, "unknown plane mode '%s'" % quote(mode))
    if planes_k == 1:
        block = planes[0]
    else:
        block = np.stack([np.frombuffer(p, dtype=np.uint8) for p in planes], axis=1).reshape(-1).tobytes()
    got = _xxh3(block)
    if got != h_raw:
        raise Damaged(where, "XXH3-64 of its decoded bytes %s != %s (does not decode to the saved bytes)" % (got, h_raw))
    return block


def decode_entry(path, key, t):
    """The raw bytes of one checked table entry."""
    raw_bytes, k = t["raw_bytes"], ITEMSIZE[t["dtype"]]
    out = bytearray(raw_bytes)
    nb = len(t["blocks"])
    for i, block in enumerate(t["blocks"]):
        lo = i * BLOCK_BYTES
        length = min(BLOCK_BYTES, raw_bytes - lo)
        stored = t["blob"][block[4]:block[4] + sum(block[1])]
        where = "safetensors file %s tensor '%s' compressed block %d of %d (raw bytes [%d, ...))" % (path, key, i, nb, lo)
        out[lo:lo + length] = _decode_block(where, stored, block, length, k)
    return bytes(out)


def tensors(path, blob, expect=None):
    """{key: (dtype, shape, raw bytes)} of a file, compressed files decoded. expect(table), when
    given, sees a compressed file's checked table before anything is decoded and refuses what the
    manifest does not list (the decode is then bounded by what the manifest says)."""
    meta, entries = parse(path, blob)
    if "rh_codec" not in meta:
        return {k: (dt, shape, raw) for k, (dt, shape, raw) in entries.items()}
    table = read_table(path, meta, entries)
    if expect is not None:
        expect(table)
    return {k: (t["dtype"], t["shape"], decode_entry(path, k, t)) for k, t in table.items()}


def file_checksums(path, blob, entry):
    """The manifest's per-file checks (open_verified in harness/checkpoint/manifest.cpp): size,
    then every block XXH3-64, or the whole-file one where there are no block checksums."""
    where = "checkpoint file " + path
    if len(blob) != entry["bytes"]:
        raise Damaged(where, "size %d bytes, manifest says %d%s"
                      % (len(blob), entry["bytes"], " (truncated)" if len(blob) < entry["bytes"] else ""))
    hashes = entry.get("block_xxh3")
    if hashes is not None:
        bb = entry["block_bytes"]
        if -(-len(blob) // bb) != len(hashes) or (len(blob) > 0 and not hashes):
            raise Damaged(where, "%d block checksums of %d bytes do not cover its %d bytes" % (len(hashes), bb, len(blob)))
        for i, want in enumerate(hashes):
            got = _xxh3(blob[i * bb:(i + 1) * bb])
            if got != want:
                raise Damaged(where, "XXH3-64 checksum of bytes [%d, %d) %s != manifest %s (file is corrupted)"
                              % (i * bb, min((i + 1) * bb, len(blob)), got, want))
    else:
        got = _xxh3(blob)
        if got != entry["xxh3"]:
            raise Damaged(where, "XXH3-64 checksum %s != manifest %s (file is corrupted)" % (got, entry["xxh3"]))
