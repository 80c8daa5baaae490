"""rhckpt: read resume-harness checkpoints with numpy (plus Debian's python3-xxhash and
python3-zstandard), verifying everything the tool's own load verifies about the files.

    import rhckpt
    ck = rhckpt.open("run/ckpt")            # a checkpoint root or an iter_XXXXXXX directory
    ck.keys()                               # every tensor key, shards joined
    ck.value("layers.0.moe.router.weight")  # float32 values, data-parallel shards joined
    ck.unscaled("P/exp_avg")                # fp16: decode * scale, fp8: decode * scale_inv, per shard
    ck.master("P")                          # the fp32 master: stored, or bf16 weight + int16 remainder
    ck.stored("P/exp_avg")                  # stored elements (BF16 bits as uint16, F8_E4M3 codes)
    ck.to_torch("P/exp_avg")                # the stored elements as a torch tensor in its own dtype
    ck.state_dict()                         # {key: ck.to_torch(key)} for every key

Raises rhckpt.BadInput (not a checkpoint) or rhckpt.Damaged (bytes disagree with the manifest),
each naming the file and, where it applies, the tensor.
"""
import builtins
import json
import os

import numpy as np

from . import rules
from . import safetensors as st
from .errors import BadInput, Damaged
from .guard import Field, parse_json_bounded, quote, read_regular_file

__all__ = ["open", "Checkpoint", "BadInput", "Damaged", "NoTensor", "decode"]


class NoTensor(KeyError):
    """A key (or a param's master) the checkpoint does not hold: its message names the checkpoint and
    the key. A KeyError for callers' `except KeyError`; printed without KeyError's quotes."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


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


POINTER_FILE = "latest_checkpointed_iteration.txt"
MAX_POINTER_BYTES = 32                 # kMaxPointerBytes: "<iteration>\n"
MAX_MANIFEST_BYTES = 64 << 20          # kMaxManifestBytes
MAX_SIDECAR_BYTES = 64


def _physical_memory():
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def _parse_pointer(raw, path):
    """The iteration a pointer names: decimal digits (then "\n" or spaces), at most kMaxCounter."""
    text = raw.decode("latin-1").rstrip("\n ")
    if not text or len(text) > 13 or not all("0" <= c <= "9" for c in text) or int(text) > rules.MAX_COUNTER:
        raise Damaged(path, "expected an iteration number in [0, %d], got '%s'" % (rules.MAX_COUNTER, quote(raw.decode("latin-1"))))
    return int(text)


def _iteration_dir(path):
    """A checkpoint directory (has manifest.json) or a root whose pointer names one
    (resolve_checkpoint_dir in harness/checkpoint/manifest.cpp)."""
    if os.path.lexists(os.path.join(path, "manifest.json")):
        return path
    pointer = os.path.join(path, POINTER_FILE)
    if not os.path.lexists(pointer):
        if os.path.basename(os.path.normpath(path)).startswith("iter_"):
            raise Damaged("checkpoint " + path, "no manifest.json (an incomplete save; not a checkpoint)")
        raise BadInput("%s: neither a checkpoint directory (no manifest.json) nor a checkpoint root (no %s)"
                       % (path, POINTER_FILE))
    it = _parse_pointer(read_regular_file(pointer, MAX_POINTER_BYTES, no_follow=False), pointer)
    d = os.path.join(path, "iter_%07d" % it)
    if not os.path.lexists(os.path.join(d, "manifest.json")):
        raise Damaged(pointer, "names iteration %d but %s has no manifest.json" % (it, d))
    return d


def _read_checked_manifest(d):
    """manifest.json and its sidecar manifest.json.xxh3 ("<16 hex>\n", the manifest's XXH3-64),
    both regular files read without following a link; the checksum before parsing, then the schema
    (read_checked_manifest in harness/checkpoint/manifest_reader.cpp)."""
    import xxhash
    mpath = os.path.join(d, "manifest.json")
    spath = os.path.join(d, "manifest.json.xxh3")
    text = read_regular_file(mpath, MAX_MANIFEST_BYTES)
    if not os.path.lexists(spath):
        raise Damaged("checkpoint file " + spath, "missing: the manifest's checksum (checkpoints written before it "
                                                  "existed have none; they cannot be verified)")
    side = read_regular_file(spath, MAX_SIDECAR_BYTES)
    want = xxhash.xxh3_64_hexdigest(text)
    if len(side) != 17 or side[16:] != b"\n" or not all(c in b"0123456789abcdef" for c in side[:16]):
        raise Damaged("checkpoint file " + spath, "expected 16 lower-case hex digits and a newline (the XXH3-64 of %s), "
                                                  "got '%s'" % (mpath, quote(side.decode("latin-1"))))
    if side[:16].decode() != want:
        raise Damaged("checkpoint file " + mpath, "XXH3-64 checksum %s != %s %s (the manifest is corrupted)"
                      % (want, spath, side[:16].decode()))
    where = "checkpoint file " + mpath
    m = parse_json_bounded(text, where, unique_keys=True)
    rules.check_schema(m, where)
    return m


def _is_plain_file_name(name):
    return name not in ("", ".", "..") and not name.startswith(".") and not any(c in name for c in "/\\\0")


class Checkpoint:
    """One verified checkpoint directory; every file is read and checked when it is opened, in the
    order and by the rules of the tool's own reader (docs/checkpoint-format.md)."""

    def __init__(self, path, max_decoded_bytes=None):
        self.max_decoded_bytes = max_decoded_bytes
        self.dir = _iteration_dir(path)
        self.manifest = _read_checked_manifest(self.dir)
        self._mpath = "checkpoint file " + os.path.join(self.dir, "manifest.json")
        self._pieces = {}   # (file, key) -> (dtype, stored array)
        self._in_file = {}  # (file, key) -> bytes the tensor takes in its file
        self.raw_bytes, self.stored_bytes = {}, {}
        m = Field(self.manifest, self._mpath)
        self._listed = self._index_manifest_tensors(m)
        entries = self._listed_files(m)
        self._check_decode_budget(entries)
        for entry in entries:
            self._read_file(entry)
        self._check_tensors(m)
        self._check_consistency()
        self._ranges = self._shard_ranges()

    def _index_manifest_tensors(self, m):
        """{(file, key): manifest tensor entry}; a tensor listed twice is refused."""
        out = {}
        for t in m["tensors"].each():
            k = (t["file"].v, t["key"].v)
            if k in out:
                t["key"].fail("tensor '%s' of %s listed twice" % (quote(k[1]), k[0]))
            out[k] = t.v
        return out

    def _listed_files(self, m):
        """The manifest's files: plain names inside the directory, each once, present, not a link."""
        names, out = set(), []
        for f in m["files"].each():
            name = f["name"].str()
            if not _is_plain_file_name(name):
                f["name"].fail("'%s' is not a plain file name inside the checkpoint directory" % quote(name))
            if name in names:
                f["name"].fail("file '%s' listed twice" % name)
            names.add(name)
            path = os.path.join(self.dir, name)
            if not os.path.lexists(path):
                raise Damaged("checkpoint file " + path, "missing (listed in %s)" % os.path.join(self.dir, "manifest.json"))
            if os.path.islink(path):
                raise Damaged("checkpoint file " + path, "is a symbolic link; refused (checkpoint files must be regular "
                                                         "files inside %s)" % self.dir)
            out.append(f.v)
        return out

    def _check_decode_budget(self, entries):
        """A load decodes at most what the manifest says the compressed files' tensors hold (every
        table is matched to the manifest before decoding), and that must fit this machine and the
        caller's max_decoded_bytes. A state tensor of a compressed file must have as many elements
        as its shard's range of its param, before anything is decoded (expect_tables in
        harness/checkpoint/manifest.cpp: a manifest resealed to agree with a bomb's table still
        disagrees with its own layout)."""
        compressed = {e["name"] for e in entries if "compress" in e}
        ranges = {}
        for sh in self.manifest["shards"]:
            for r in sh["param_ranges"]:
                ranges.setdefault((sh["file"], r["param"]), r["end"] - r["begin"])
        for i, t in enumerate(self.manifest["tensors"]):
            if t["file"] not in compressed or t["kind"] not in ("master_param", "remainder", "exp_avg", "exp_avg_sq"):
                continue
            numel = 1
            for d in t["shape"]:
                numel *= d
            want = ranges.get((t["file"], t["param"]))
            if want is not None and want != numel:
                raise Damaged(self._mpath, "field /tensors/%d/shape: %s is %d elements, but the shard range of '%s' in "
                                           "%s has %d (its shard's range; refused before decoding)"
                              % (i, quote(t["shape"]), numel, quote(t["param"]), t["file"], want))
        need = sum(t["bytes"] for (f, _), t in self._listed.items() if f in compressed)
        phys = _physical_memory()
        if need > phys:
            raise Damaged(self._mpath, "the compressed files' tensors need %d bytes decoded, more than this machine's "
                                       "memory (%d)" % (need, phys))
        if self.max_decoded_bytes is not None and need > self.max_decoded_bytes:
            raise Damaged(self._mpath, "the compressed files' tensors need %d bytes decoded, more than the %d bytes "
                                       "allowed (max_decoded_bytes); refused before decoding"
                          % (need, self.max_decoded_bytes))

    def _expect_table(self, name, path):
        """A compressed file's table against the manifest, before anything is decoded."""
        def check(table):
            for key, t in sorted(table.items()):
                want = self._listed.get((name, key))
                if want is None:
                    raise Damaged("checkpoint file " + path, "tensor '%s' is not in the manifest (refused before "
                                                             "decoding)" % quote(key))
                if t["dtype"] != want["dtype"] or t["shape"] != want["shape"] or t["raw_bytes"] != want["bytes"]:
                    raise Damaged("checkpoint file " + path, "tensor '%s' is %s %s (%d bytes) in rh_tensors, manifest "
                                  "says %s %s (%d bytes); refused before decoding"
                                  % (quote(key), t["dtype"], quote(t["shape"]), t["raw_bytes"], quote(want["dtype"]),
                                     quote(want["shape"]), want["bytes"]))
        return check

    def _read_file(self, entry):
        name = entry["name"]
        path = os.path.join(self.dir, name)
        size = os.lstat(path).st_size
        if size != entry["bytes"]:   # before reading: never more than the manifest lists
            raise Damaged("checkpoint file " + path, "size %d bytes, manifest says %d%s"
                          % (size, entry["bytes"], " (truncated)" if size < entry["bytes"] else ""))
        blob = read_regular_file(path, entry["bytes"])
        st.file_checksums(path, blob, entry)   # sizes and XXH3-64 before parsing
        meta, _ = st.parse(path, blob)
        compressed = "rh_codec" in meta
        if compressed != ("compress" in entry):
            raise Damaged("checkpoint file " + path,
                          "is compressed (rh_codec), but the manifest does not say so" if compressed
                          else "the manifest says compressed, but the file names no codec (rh_codec)")
        _, entries = st.parse(path, blob)
        for key, (dt, shape, raw) in st.tensors(path, blob, self._expect_table(name, path)).items():
            self._pieces[(name, key)] = (dt, st.as_array(dt, shape, raw))
            self._in_file[(name, key)] = len(entries[key][2])   # a compressed tensor's blob
        self.stored_bytes[name] = len(blob)
        self.raw_bytes[name] = int(entry.get("raw_bytes", len(blob)))

    def _check_tensors(self, m):
        """Manifest tensors <-> file tensors: the same set, dtype, shape and bytes (match_tensors)."""
        files = {e["name"] for e in self.manifest["files"]}
        for t in m["tensors"].each():
            file, key = t["file"].v, t["key"].v
            if file not in files:
                t["file"].fail("tensor '%s' refers to unlisted file '%s'" % (quote(key), quote(file)))
            where = "checkpoint file " + os.path.join(self.dir, file)
            got = self._pieces.get((file, key))
            if got is None:
                raise Damaged(where, "has no tensor '%s' (listed in the manifest)" % quote(key))
            dt, arr = got
            stored = t.v.get("stored_bytes", t.v["bytes"])
            if self._in_file[(file, key)] != stored:
                raise Damaged(where, "tensor '%s' takes %d bytes in the file, manifest says %d"
                              % (key, self._in_file[(file, key)], stored))
            if dt != t.v["dtype"] or list(arr.shape) != t.v["shape"] or arr.nbytes != t.v["bytes"]:
                raise Damaged(where, "tensor '%s' is %s %s, manifest says %s %s"
                              % (key, dt, list(arr.shape), quote(t.v["dtype"]), quote(t.v["shape"])))
        extra = set(self._pieces) - set(self._listed)
        if extra:
            f, k = sorted(extra)[0]
            raise Damaged("checkpoint file " + os.path.join(self.dir, f), "tensor '%s' is not in the manifest" % k)

    def _check_consistency(self):
        """What the tool checks after the files (check_consistency in harness/checkpoint/load.cpp):
        counters, generator states, shard coverage, shard files."""
        rules.check_counters(self.manifest, self._mpath)
        rules.check_generators(self.manifest, self._mpath)
        if not any(e["name"] == "model.safetensors" for e in self.manifest["files"]):
            raise Damaged(self._mpath, "lists no model.safetensors")
        shapes = {k: list(a.shape) for (f, k), (_, a) in self._pieces.items() if f == "model.safetensors"}
        rules.shard_index(self.manifest, self._mpath, shapes, {e["name"] for e in self.manifest["files"]})
        rules.check_shard_files(self.manifest, self._mpath, lambda f, k: int(self._pieces[(f, k)][1].size),
                                {k: int(np.prod(s, dtype=np.int64)) for k, s in shapes.items()})

    def _shard_ranges(self):
        """{(file, param): (begin, end)} flat element range of each optimizer piece
        (manifest "shards", written by the sharded save in harness/checkpoint/save.cpp)."""
        out = {}
        for s in self.manifest["shards"]:
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
            raise NoTensor("%s: no tensor '%s'" % (self.dir, key))
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
        has_remainder = any(k == param + "/remainder" for _, k in self._pieces)
        if not has_remainder and self.dtype(param) == "F32":   # fp32 training: the weight is the master
            return weight.astype(np.float32)
        if self.dtype(param) != "BF16":
            raise NoTensor("%s: '%s' has no master_param and a %s weight" % (self.dir, param, self.dtype(param)))
        rem = self._remainder(param).reshape(weight.shape)
        bits = (weight.astype(np.int64) << 16) + rem.astype(np.int64)
        return (bits & 0xFFFFFFFF).astype(np.uint32).view(np.float32)

    def _remainder(self, param):
        """`param/remainder` as int16: stored as I16 (native, dp_reshardable) or widened into an
        F32 container (per_key, fully_reshardable, dp_zero), whose values must then be int16's."""
        key = param + "/remainder"
        dt = self.dtype(key)
        rem = self.stored(key)
        if dt == "I16":
            return rem
        if dt != "F32":
            raise Damaged(self.dir, "tensor '%s': %s, expected I16 or an F32 container of int16 values" % (key, dt))
        ok = np.isfinite(rem) & (rem == np.round(rem)) & (rem >= -32768) & (rem <= 32767)
        if not np.all(ok):
            bad = int(np.argmin(ok.reshape(-1)))
            raise Damaged(self.dir, "tensor '%s': element %d is %r, expected an int16 value in an F32 container"
                          % (key, bad, float(rem.reshape(-1)[bad])))
        return rem.astype(np.int16)

    def to_torch(self, key):
        """The stored elements of `key` (shards joined, as stored()) as a torch tensor in the
        checkpoint's own dtype: BF16 -> torch.bfloat16, F16 -> float16, F32 -> float32, I16 -> int16,
        U8 -> uint8, F8_E4M3 -> torch.float8_e4m3fn where torch has it (2.1 and later), else its
        uint8 codes. Scales are not applied (a scaled state's .scale/.scale_inv are keys of their
        own). Needs torch; raises ImportError naming what to install without it."""
        from .torch_tensors import as_torch
        return as_torch(self.dtype(key), self.stored(key), key)

    def state_dict(self):
        """{key: to_torch(key)} for every key of keys(): the model's tensors and every optimizer
        state as stored, in their own dtypes."""
        return {k: self.to_torch(k) for k in self.keys()}

    def tensor_rows(self):
        """[(file, key, dtype, shape, bytes)] of every stored piece, sorted."""
        return sorted((f, k, dt, list(a.shape), a.nbytes) for (f, k), (dt, a) in self._pieces.items())


def open(path, max_decoded_bytes=None):   # noqa: A001 (the package's entry point, like builtins.open for files)
    """Opens and verifies a checkpoint root or iter_ directory; see Checkpoint. max_decoded_bytes
    caps what the compressed files may decode to (checked against the manifest before decoding;
    the tool's load uses what its model and optimizer can hold), else this machine's memory."""
    if not os.path.lexists(path):
        raise BadInput("%s: no such file or directory" % path)
    if not os.path.isdir(path):
        raise BadInput("%s: not a directory" % path)
    return Checkpoint(path, max_decoded_bytes)
