"""rhckpt: read resume-harness checkpoints with numpy (plus Debian's python3-xxhash and
python3-zstandard), verifying everything the tool's own load verifies about the files.

    import rhckpt
    ck = rhckpt.open("run/ckpt")            # a checkpoint root or an iter_XXXXXXX directory
    ck.keys()                               # every tensor key, shards joined
    ck.value("layers.0.moe.router.weight")  # float32 values, data-parallel shards joined
    ck.unscaled("P/exp_avg")                # fp16: decode * scale, fp8: decode * scale_inv, per shard
    ck.master("P")                          # the fp32 master: stored, or bf16 weight + int16 remainder
    ck.stored("P/exp_avg")                  # stored elements (BF16 bits as uint16, F8_E4M3 codes)

Raises rhckpt.BadInput (not a checkpoint) or rhckpt.Damaged (bytes disagree with the manifest),
each naming the file and, where it applies, the tensor.
"""
import builtins
import json
import os

import numpy as np

from . import safetensors as st
from .errors import BadInput, Damaged

__all__ = ["open", "Checkpoint", "BadInput", "Damaged", "decode"]


def _e4m3_table():
    """float32 of each E4M3 (FN) byte: bias 7, subnormals, 0x7F/0xFF NaN, no infinities
    (codec::fp8_decode in harness/optim/storage_codecs.cpp)."""
    out = np.zeros(256, dtype=np.float32)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        v = float("nan") if (e == 15 and m == 7) else m / 8.0 * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
        out[b] = -v if s else v
    return out


E4M3 = _e4m3_table()


def decode(dtype, stored):
    """Element values: BF16 widened exactly to float32 (bits << 16), F8_E4M3 by table, F16 widened,
    F32/F64 as stored, integers as int64."""
    if dtype == "BF16":
        return (stored.astype(np.uint32) << 16).view(np.float32)
    if dtype == "F8_E4M3":
        return E4M3[stored]
    if dtype == "F16":
        return stored.astype(np.float32)
    if dtype in ("F32", "F64"):
        return stored
    return stored.astype(np.int64)


def _iteration_dir(path):
    """A root names its newest checkpoint in latest_checkpointed_iteration.txt (written last)."""
    if os.path.isfile(os.path.join(path, "manifest.json")):
        return path
    pointer = os.path.join(path, "latest_checkpointed_iteration.txt")
    if not os.path.isfile(pointer):
        raise BadInput("%s: not a checkpoint (no manifest.json, no latest_checkpointed_iteration.txt)" % path)
    with builtins.open(pointer) as f:
        text = f.read(64).strip()
    if not text.isdigit():
        raise Damaged(pointer, "expected an iteration number, got %r" % text[:32])
    d = os.path.join(path, "iter_%07d" % int(text))
    if not os.path.isfile(os.path.join(d, "manifest.json")):
        raise Damaged(pointer, "names iteration %s, but %s has no manifest.json" % (text, d))
    return d


def _check_manifest_checksum(d, mpath, text):
    """manifest.json.xxh3 holds the manifest's XXH3-64 ("<16 hex>\\n"), checked before parsing
    (manifest_reader.h, read_checked_manifest); a checkpoint without it is refused, as the tool does."""
    import xxhash
    spath = os.path.join(d, "manifest.json.xxh3")
    if os.path.islink(spath) or not os.path.isfile(spath):
        raise Damaged(spath, "missing or not a regular file: the manifest's checksum (checkpoints written before it "
                             "existed have none)")
    with builtins.open(spath, "rb") as f:
        side = f.read(64)
    want = xxhash.xxh3_64_hexdigest(text)
    if len(side) != 17 or side[16:] != b"\n" or not all(c in b"0123456789abcdef" for c in side[:16]):
        raise Damaged(spath, "expected 16 lower-case hex digits and a newline, got %r" % side[:32])
    if side[:16].decode() != want:
        raise Damaged(mpath, "XXH3-64 checksum %s != %s %s (the manifest is corrupted)" % (want, spath, side[:16].decode()))


class Checkpoint:
    """One verified checkpoint directory; every file is read and checked when it is opened."""

    def __init__(self, path):
        self.dir = _iteration_dir(path)
        mpath = os.path.join(self.dir, "manifest.json")
        with builtins.open(mpath, "rb") as f:
            text = f.read()
        _check_manifest_checksum(self.dir, mpath, text)
        try:
            self.manifest = json.loads(text)
        except ValueError as e:
            raise Damaged(mpath, "not valid JSON: %s" % e) from None
        self._pieces = {}   # (file, key) -> (dtype, stored array)
        self.raw_bytes, self.stored_bytes = {}, {}
        for entry in self.manifest["files"]:
            self._read_file(entry)
        self._check_tensors()
        self._ranges = self._shard_ranges()

    def _read_file(self, entry):
        name = entry["name"]
        if "/" in name or name.startswith(".") or name == "":
            raise Damaged(os.path.join(self.dir, "manifest.json"), "file name %r leaves the directory" % name)
        path = os.path.join(self.dir, name)
        if not os.path.isfile(path):
            raise Damaged(path, "listed in the manifest but missing")
        with builtins.open(path, "rb") as f:
            blob = f.read()
        st.file_checksums(path, blob, entry)   # load_checkpoint: sizes and XXH3-64 before parsing
        for key, (dt, shape, raw) in st.tensors(path, blob).items():
            self._pieces[(name, key)] = (dt, st.as_array(dt, shape, raw))
        self.stored_bytes[name] = len(blob)
        self.raw_bytes[name] = int(entry.get("raw_bytes", len(blob)))

    def _check_tensors(self):
        listed = set()
        for t in self.manifest["tensors"]:
            where = os.path.join(self.dir, t["file"])
            got = self._pieces.get((t["file"], t["key"]))
            if got is None:
                raise Damaged(where, "tensor '%s' is in the manifest but not in the file" % t["key"])
            dt, arr = got
            if dt != t["dtype"] or list(arr.shape) != t["shape"] or arr.nbytes != t["bytes"]:
                raise Damaged(where, "tensor '%s': %s %s differs from the manifest's %s %s"
                              % (t["key"], dt, list(arr.shape), t["dtype"], t["shape"]))
            listed.add((t["file"], t["key"]))
        extra = set(self._pieces) - listed
        if extra:
            f, k = sorted(extra)[0]
            raise Damaged(os.path.join(self.dir, f), "tensor '%s' is not in the manifest" % k)

    def _shard_ranges(self):
        """{(file, param): (begin, end)} flat element range of each optimizer piece
        (manifest "shards", written by the sharded save in harness/checkpoint/save.cpp)."""
        out = {}
        for s in self.manifest.get("shards", []):
            for r in s["param_ranges"]:
                out[(s["file"], r["param"])] = (int(r["begin"]), int(r["end"]))
        return out

    # --- lookup ---------------------------------------------------------------------------
    def files(self):
        return sorted({f for f, _ in self._pieces})

    def keys(self):
        return sorted({k for _, k in self._pieces})

    def pieces(self, key):
        """[(file, dtype, stored array)] of a key, in flat order (rank 0's piece first)."""
        found = [(f, dt, a) for (f, k), (dt, a) in self._pieces.items() if k == key]
        if not found:
            raise KeyError("%s: no tensor '%s'" % (self.dir, key))
        param = key.split("/")[0]
        return sorted(found, key=lambda p: self._ranges.get((p[0], param), (0, 0))[0])

    def _shape(self, key, pieces):
        param = key.split("/")[0]
        model = self._pieces.get(("model.safetensors", param))
        if len(pieces) == 1 and model is None:
            return pieces[0][2].shape
        return model[1].shape if model is not None else (-1,)

    def _join(self, key, arrays, pieces):
        if len(arrays) == 1:
            return arrays[0]
        if key.endswith(".scale") or key.endswith(".scale_inv"):   # one scalar per shard
            return np.stack([a.reshape(()) for a in arrays])
        flat = np.concatenate([a.reshape(-1) for a in arrays])
        return flat.reshape(self._shape(key, pieces))

    def stored(self, key):
        """The stored elements, shards joined (meaningful across shards for unscaled dtypes only);
        a scale of a sharded state gives one value per shard, in rank order."""
        p = self.pieces(key)
        return self._join(key, [a for _, _, a in p], p)

    def dtype(self, key):
        return self.pieces(key)[0][1]

    def value(self, key):
        """decode(stored) per element, shards joined; scale factors NOT applied (see unscaled)."""
        p = self.pieces(key)
        return self._join(key, [decode(dt, a) for _, dt, a in p], p)

    def unscaled(self, key):
        """What TransformerEngine computes with: fp16 decode(data) * scale, fp8 decode(data) *
        scale_inv, in float32, each shard with its own scale (get_unscaled_state in
        harness/optim/precision_adam.cpp); unscaled dtypes as value()."""
        p = self.pieces(key)
        out = []
        for f, dt, a in p:
            mult = (key + ".scale_inv") if dt == "F8_E4M3" else (key + ".scale")
            if dt in ("F16", "F8_E4M3") and (f, mult) in self._pieces:
                scale = decode(*self._pieces[(f, mult)]).astype(np.float32).reshape(())
                out.append(decode(dt, a).astype(np.float32) * scale)
            else:
                out.append(decode(dt, a))
        return self._join(key, out, p)

    def master(self, param):
        """The fp32 master weight: `param/master_param` unscaled, or rebuilt from the bf16 model
        weight and `param/remainder` as remainder_join (harness/optim/storage_codecs.h): bits =
        int32(weight bits) * 2^16 + int32(remainder), wrapping."""
        if any(k == param + "/master_param" for _, k in self._pieces):
            return self.unscaled(param + "/master_param").astype(np.float32)
        weight = self.stored(param)
        if self.dtype(param) != "BF16":
            raise KeyError("%s: '%s' has no master_param and a %s weight" % (self.dir, param, self.dtype(param)))
        rem = self.stored(param + "/remainder").reshape(weight.shape)
        if rem.dtype != np.int16:
            raise KeyError("%s: '%s/remainder' is %s, not I16" % (self.dir, param, self.dtype(param + "/remainder")))
        bits = (weight.astype(np.int64) << 16) + rem.astype(np.int64)
        return (bits & 0xFFFFFFFF).astype(np.uint32).view(np.float32)

    def tensor_rows(self):
        """[(file, key, dtype, shape, bytes)] of every stored piece, sorted."""
        return sorted((f, k, dt, list(a.shape), a.nbytes) for (f, k), (dt, a) in self._pieces.items())


def open(path):   # noqa: A001 (the package's entry point, like builtins.open for files)
    """Opens and verifies a checkpoint root or iter_ directory; see Checkpoint."""
    if not os.path.exists(path):
        raise BadInput("%s: no such file or directory" % path)
    return Checkpoint(path)
