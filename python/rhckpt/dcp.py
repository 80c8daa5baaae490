"""dcp: torch.distributed.checkpoint directories without torch, for torch_bridge (issue 43).

On disk (upstream pytorch/pytorch: torch/distributed/checkpoint/filesystem.py at b639d82d83d4,
FileSystemWriter and _StorageInfo; torch/distributed/checkpoint/metadata.py at 57ba412974d8, the
dataclasses; torch 1.13's torch/distributed/_shard/checkpoint/ writes the same layout): `.metadata`
is a pickle of a Metadata dataclass: state_dict_metadata {fqn: TensorStorageMetadata(properties=
TensorProperties(dtype, ...), size, chunks=[ChunkStorageMetadata(offsets, sizes)]) or
BytesStorageMetadata()}, and storage_data {MetadataIndex(fqn, offset, index): _StorageInfo(
relative_path, offset, length)}. Each item is a torch.save blob (zip format) at [offset, offset +
length) of a *.distcp file: a tensor chunk, or for a bytes item the pickled value.

Read here: `.metadata` through torch_zip's restricted unpickler with stand-ins for those
dataclasses, under both module paths (torch.distributed._shard.checkpoint.metadata /
.sharded_tensor.metadata / .filesystem, and torch.distributed.checkpoint.metadata / .filesystem);
any other class is refused. Each blob is read by torch_zip (records STORED, storages bounded);
a blob must lie inside its plain-named file in the same directory (opened without following
links); each global tensor is reassembled from its chunks, which must lie inside the tensor,
match the declared dtype and sizes, not overlap and cover it exactly (at most MAX_CHUNKS each;
overlap is found with one byte per element, not by comparing every pair of chunks).
"""
import io
import os

import numpy as np

from . import nofollow
from . import torch_zip
from .torch_zip import Refused

MAX_CHUNKS = 4096
MODULES = ("torch.distributed._shard.checkpoint.metadata", "torch.distributed._shard.sharded_tensor.metadata",
           "torch.distributed._shard.checkpoint.filesystem", "torch.distributed.checkpoint.metadata",
           "torch.distributed.checkpoint.filesystem")
CLASSES = ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "MetadataIndex",
           "TensorProperties", "_StorageInfo", "StorageMeta")


class Record:
    """A dataclass stand-in: NEWOBJ then BUILD fills __dict__; refuses being called with args
    beyond what a dataclass pickle uses."""

    def __init__(self, *args, **kwargs):
        self.__dict__["_args"] = args
        self.__dict__.update(kwargs)

    def get(self, name, default=None):
        return self.__dict__.get(name, default)


def _record_class(module, name):
    return type(name, (Record,), {"__module__": module, "__qualname__": name})


class _MemFormat:
    """MEM_FORMAT_ENCODING (1.13) / _MEM_FORMAT_ENCODING (metadata.py), an Enum: pickled as
    getattr(cls, name) (Python >= 3.11) or cls(value); either gives the member's name."""
    names = ("TORCH_CONTIGUOUS_FORMAT", "TORCH_CHANNELS_LAST", "TORCH_PRESERVE_FORMAT")

    def __call__(self, value):
        if type(value) is not int or not 0 <= value < len(self.names):
            raise Refused("an unknown memory format encoding %r" % (value,))
        return self.names[value]


def _getattr(obj, name):
    if isinstance(obj, _MemFormat) and name in _MemFormat.names:
        return name
    raise Refused("builtins.getattr on something other than MEM_FORMAT_ENCODING")


class _MetaUnpickler(torch_zip._Unpickler):
    def __init__(self, data):
        super().__init__(data, torch_zip.Reader(None, 0, [0]))
        for module in MODULES:
            for name in CLASSES:
                self.allowed[(module, name)] = _record_class(module, name)
            self.allowed[(module, "MEM_FORMAT_ENCODING")] = self.allowed[(module, "_MEM_FORMAT_ENCODING")] = _MemFormat()
        self.allowed[("builtins", "getattr")] = _getattr

    def persistent_load(self, pid):
        raise Refused("a persistent id in .metadata")

    def _checked_build(self):
        """BUILD on a Record: a dict (or (None, slot dict)) fills its attributes; another state
        (TensorProperties' __getstate__ tuple) is kept as _state."""
        inst, state = self.stack[-2], self.stack[-1]
        if not isinstance(inst, Record):
            return super()._checked_build()
        if isinstance(state, tuple) and len(state) == 2 and state[0] is None and isinstance(state[1], dict):
            state = state[1]
        if isinstance(state, dict):
            if not all(isinstance(k, str) and not k.startswith("__") for k in state):
                raise Refused("a pickle sets a special attribute of a %s" % type(inst).__name__)
            inst.__dict__.update(state)
        else:
            inst.__dict__["_state"] = state
        self.stack.pop()


def _ints(v, what):
    if not isinstance(v, (tuple, list)) or not all(type(x) is int and x >= 0 for x in v):
        raise Refused("%s is not a tuple of non-negative ints" % what)
    return tuple(v)


def read(dir_fd, shown, budget):
    """[(fqn, value)] of a DCP directory (dir_fd open on it): tensors as torch_zip.Tensor."""
    fd, st = nofollow.open_file_at(dir_fd, ".metadata", os.path.join(shown, ".metadata"))
    with os.fdopen(fd, "rb") as f:
        if st.st_size > 64 << 20:
            raise Refused(".metadata is larger than 64 MiB")
        raw = f.read()
    try:
        meta = _MetaUnpickler(raw).load()
    except Refused as e:
        raise Refused(".metadata: %s" % e) from None
    except Exception as e:   # pickle's own errors on damage
        what = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise Refused(".metadata: cannot unpickle: %s: %s" % (type(e).__name__, what[:200])) from None
    sdm, storage = meta.get("state_dict_metadata") if isinstance(meta, Record) else None, \
        meta.get("storage_data") if isinstance(meta, Record) else None
    if type(meta).__name__ != "Metadata" or not isinstance(sdm, dict) or not isinstance(storage, dict):
        raise Refused(".metadata is not a Metadata with state_dict_metadata and storage_data")
    where = {}   # (fqn, offsets or None) -> (file, offset, length)
    for idx, info in storage.items():
        if type(idx).__name__ != "MetadataIndex" or type(info).__name__ != "_StorageInfo":
            raise Refused(".metadata storage_data holds something other than MetadataIndex -> _StorageInfo")
        fqn, off = idx.get("fqn"), idx.get("offset")
        path, at, length = info.get("relative_path"), info.get("offset"), info.get("length")
        if not isinstance(fqn, str) or not isinstance(path, str) or type(at) is not int or type(length) is not int \
                or at < 0 or length < 0:
            raise Refused(".metadata: a malformed storage entry for '%s'" % str(fqn)[:100])
        if info.get("transform_descriptors"):
            raise Refused(".metadata: '%s' is stored with transforms %r (not read here)" % (fqn[:100], info.get("transform_descriptors")))
        if "/" in path or path in ("", ".", "..") or "\0" in path:
            raise Refused(".metadata: '%s' names the file '%s', not a plain file name in the directory" % (fqn[:100], path[:100]))
        where[(fqn, None if off is None else _ints(off, "an index offset"))] = (path, at, length)
    files = {}
    out = []
    try:
        for fqn in sorted(sdm, key=str):
            item = sdm[fqn]
            if not isinstance(fqn, str):
                raise Refused(".metadata: a key that is not a string")
            kind = type(item).__name__
            if kind == "BytesStorageMetadata":
                blob = _blob(dir_fd, shown, files, where, fqn, None)
                out.append((fqn, torch_zip.load(io.BytesIO(blob), len(blob), budget)))
            elif kind == "TensorStorageMetadata":
                out.append((fqn, _tensor(dir_fd, shown, files, where, fqn, item, budget)))
            else:
                raise Refused(".metadata: '%s' is a %s, neither tensor nor bytes metadata" % (fqn[:100], kind))
    finally:
        for fd, _ in files.values():
            os.close(fd)
    return out


def _blob(dir_fd, shown, files, where, fqn, offsets):
    got = where.get((fqn, offsets))
    if got is None:
        raise Refused("'%s'%s has no storage entry in .metadata" % (fqn[:100], "" if offsets is None else " chunk at %r" % (offsets,)))
    path, at, length = got
    if path not in files:
        files[path] = nofollow.open_file_at(dir_fd, path, os.path.join(shown, path))
    fd, st = files[path]
    if at + length > st.st_size:
        raise Refused("'%s' is stored at [%d, %d) of %s, past its end (%d bytes)" % (fqn[:100], at, at + length, path, st.st_size))
    return os.pread(fd, length, at)


def _tensor(dir_fd, shown, files, where, fqn, item, budget):
    props, size, chunks = item.get("properties"), item.get("size"), item.get("chunks")
    dtype = props.get("dtype") if isinstance(props, Record) else None
    if dtype is None and isinstance(props, Record) and isinstance(props.get("_state"), tuple) and props.get("_state"):
        dtype = props.get("_state")[0]   # torch 1.13's TensorProperties pickles a tuple, dtype first
    if not isinstance(dtype, torch_zip.DType) or not isinstance(chunks, list):
        raise Refused("'%s': tensor metadata without a dtype or chunk list" % fqn[:100])
    size = _ints(size, "'%s' size" % fqn[:100])
    if len(chunks) > MAX_CHUNKS:
        raise Refused("'%s' has %d chunks (at most %d)" % (fqn[:100], len(chunks), MAX_CHUNKS))
    numel = 1
    for s in size:
        numel *= s
    nbytes = numel * dtype.itemsize
    if nbytes > budget[0]:
        raise Refused("'%s' would be larger than the bridge's output cap" % fqn[:100])
    # Which elements a chunk already holds: one byte each, so overlap costs the chunks' volume, not
    # chunks^2 pairs (4096 one-element chunks took over 20 s pairwise). A size with no elements may
    # hold dimensions numpy cannot allocate ((0, 10**20)); its chunks are empty and cannot overlap.
    taken = np.zeros(size, dtype=np.bool_) if numel else None
    boxes, volume = [], 0
    for c in chunks:
        off = _ints(c.get("offsets") if isinstance(c, Record) else None, "'%s' chunk offsets" % fqn[:100])
        sz = _ints(c.get("sizes") if isinstance(c, Record) else None, "'%s' chunk sizes" % fqn[:100])
        if len(off) != len(size) or len(sz) != len(size) or any(o + s > g for o, s, g in zip(off, sz, size)):
            raise Refused("'%s': chunk at %r of size %r lies outside the tensor's size %r" % (fqn[:100], off, sz, size))
        if taken is not None and all(sz):
            region = taken[_box(off, sz)]
            if region.any():   # the earlier boxes are disjoint: name the first one this one meets
                o2 = next(o2 for o2, s2 in boxes
                          if all(s2) and all(a < b + t and b < a + s for a, s, b, t in zip(off, sz, o2, s2)))
                raise Refused("'%s': chunks at %r and %r overlap" % (fqn[:100], off, o2))
            region[...] = True
        boxes.append((off, sz))
        v = 1
        for s in sz:
            v *= s
        volume += v
    taken = None
    if volume != numel:
        raise Refused("'%s': its chunks cover %d of its %d elements" % (fqn[:100], volume, numel))
    if dtype.np_raw is None:
        return torch_zip.Tensor(dtype, size, None)
    whole = np.zeros(size, dtype=dtype.np_raw) if numel else None
    for off, sz in boxes:
        blob = _blob(dir_fd, shown, files, where, fqn, off)
        t = torch_zip.load(io.BytesIO(blob), len(blob), budget)
        if not isinstance(t, torch_zip.Tensor) or t.dtype.name != dtype.name or tuple(t.shape) != sz or t.raw is None:
            raise Refused("'%s': the chunk at %r is not a %s tensor of size %r" % (fqn[:100], off, dtype, sz))
        if whole is not None:
            whole[_box(off, sz)] = np.frombuffer(t.raw, dtype=dtype.np_raw).reshape(sz)
    budget[0] -= nbytes
    return torch_zip.Tensor(dtype, size, whole.tobytes() if whole is not None else b"")


def _box(off, sz):
    return tuple(slice(o, o + s) for o, s in zip(off, sz))
