"""torch_bridge: torch.save checkpoints -> one flat safetensors file each, so the C++ tool can
compare a user's own trainer's checkpoints tensor by tensor and value by value.

    python3 -I -c '<launcher>' PYTHONPATH -m ...   (how the tool starts it: see "Starting" below)
    PYTHONPATH=python /usr/bin/python3 -P -m rhckpt.torch_bridge [--trust-pickle] [--root DIR] IN OUT [IN OUT ...]

IN is a torch.save file or a directory (every regular file under it, recursively, sorted by
relative path, that starts with the zip magic PK\\x03\\x04 or a pickle protocol header, plus
*.safetensors files; keys get the relative path as prefix: `mp_rank_00/model_optim_rng.pt/
optimizer/state/3/exp_avg`). Symlinks are refused, never followed; FIFOs, devices and sockets in
a directory are skipped, and as IN refused, never opened for reading (python/rhckpt/nofollow.py).

Flattening: dict / OrderedDict / list / tuple / namedtuple (field names) / argparse.Namespace /
SimpleNamespace (and, with --trust-pickle, any object with a __dict__) become key paths joined
by '/'; dict keys of any type become str(key); '%' in a key part is written %25 and '/' %2F.
The root object of a single file gets the key "." (torch.save(tensor)).
Tensors (and numpy arrays) become safetensors tensors: float64/32/16,
bfloat16, int64/32/16, uint8 as F64/F32/F16/BF16/I64/I32/I16/U8; bool and int8 as U8 raw bytes
with `__metadata__["dtype:<key>"]` = "bool" / "int8"; numpy uint16/32/64 (numpy's RNG state is
uint32) as I16/I32/I64 of the same bits with `dtype:<key>` = "uint16" / "uint32" / "uint64". Sparse, quantized, complex and meta tensors
and other dtypes are refused, naming the key. Every other leaf is `__metadata__["leaf:<key>"]`:
`int:10`, `float:<float.hex>`, `bool:true`, `str:<text>`, `none:`, `bytes:<hex>`,
`complex:<re hex>,<im hex>`, `dtype:torch.float32`, `size:2x3` (torch.Size; `size:` for []),
`device:cpu`, `layout:torch.strided`, `numpy.<type>:<value>` (numpy scalars: floats as the hex
of the exactly widened Python float, ints decimal, bools true/false), `path:<text>` (pathlib paths), `enum:<module.class>.<member>` (with --trust-pickle), `set:` / `frozenset:` /
`slice:` + a JSON list of the element texts (sets sorted), `empty:dict` / `empty:list`
(empty tuples too). numpy RandomState / Generator / BitGenerator objects are flattened as their
state dict. Objects flattened with --trust-pickle other than the plain containers record their
class as `class:<key>` = "module.qualname". `rh_bridge` = "1"; `rh_source:<prefix or .>` = the
file's base name (never a full path: two runs in different directories convert alike).

Reading (default, untrusted): torch is never imported and none of torch's loaders sees the file.
python/rhckpt/torch_zip.py reads torch.save's zip format itself: STORED records only (a deflate
record is refused), data.pkl through a restricted pure-Python unpickler whose find_class returns
stand-ins (torch's tensor rebuild functions, torch._tensor._rebuild_from_type_v2, Parameter,
Tensor, storage classes as dtypes, torch.Size / device / dtype names / layouts / memory formats),
collections.OrderedDict, builtins set / frozenset / bytearray (from bytes only) / slice / complex,
_codecs.encode with latin-1 only (how protocol 2 pickles bytes), numpy's _reconstruct / scalar /
ndarray / dtype (numpy._core spelled as numpy.core), numpy.random._pickle's constructors (they
build a bit generator by name from numpy's own table), argparse.Namespace, types.SimpleNamespace,
pathlib.PosixPath / PurePosixPath / PureWindowsPath. Not _rebuild_qtensor,
_rebuild_device_tensor_from_numpy or _rebuild_wrapper_subclass. Anything else: `<file>: refused to
unpickle <module>.<name> (not a checkpoint type; rerun with --trust-pickle if you trust this
file)`, exit 2. Each storage's record must hold exactly its declared numel * itemsize bytes, each
tensor must lie inside its storage, all tensor bytes of one conversion are capped at
torch_zip.OUTPUT_FACTOR (4) x the input bytes + 64 MiB, dict keys and set elements are checked
before they are hashed (a million-deep tuple key is refused, not a segfault).
The legacy formats (torch < 1.6's pickle stream and tar file, `_use_new_zipfile_serialization=
False`) are refused: their only reader is torch's _legacy_load, which an untrusted file can steer
into writing files and changing modes (issue 41). TorchScript archives are refused.
--trust-pickle uses plain torch.load (on an fd this module opened), legacy formats included: the
tool runs it as a process of its own, since a trusted pickle runs code.

torch.distributed.checkpoint: a directory holding a top-level `.metadata` is read through
python/rhckpt/dcp.py (also without torch): each key of the state dict (its fully qualified name,
escaped as a key part) is a global tensor reassembled from its chunks in the *.distcp files, or the
value of a bytes item flattened below it; other torch.save / safetensors files in the directory
(Megatron's common.pt) are flattened with their relative path as prefix, as in any directory.
*.distcp files without a `.metadata` are refused.

Paths: with --root DIR (the tool passes the directory above the cell), every input and output
below DIR is opened one component at a time without following links (nofollow.py): a link a
trainer planted in place of the cell, `flat` or any directory is refused naming it, and nothing
is written through it. Missing output directories below DIR are created by the bridge.

Starting: the tool runs `python3 -I -c LAUNCHER PATHS ...` (isolated: no PYTHON* variables, no
current directory or script directory on sys.path, so a json.py where the tool was started is
never imported; PATHS, colon-separated, are put first on sys.path by the launcher).

Output: 8-byte little-endian header length, JSON header (keys sorted, padded with spaces to a
multiple of 8, at most 100 MB), tensor data packed in key order; written to OUT.tmp, renamed.
The same checkpoint gives the same bytes. Exit 0 converted, 2 bad input (one line on stderr,
`torch_bridge: <file>: <what>`, never a traceback).
"""
import collections
import enum
import json
import os
import pathlib
import re
import struct
import sys
import types

from . import nofollow
from . import torch_zip

MAX_LEAVES = 1_000_000
MAX_DEPTH = 2000
MAX_HEADER = 100_000_000
PICKLE_PROTOCOLS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
ZIP_MAGIC = b"PK\x03\x04"
# How the tool starts the bridge: python3 -I -c LAUNCHER PATHS ARGS... (harness/verify/external_check.cpp)
LAUNCHER = ("import sys; sys.path[:0] = [p for p in sys.argv.pop(1).split(':') if p]; import runpy; "
            "runpy.run_module('rhckpt.torch_bridge', run_name='__main__', alter_sys=True)")


class BridgeError(Exception):
    """One-line refusal: `<file>: <what>`; exit 2."""


_LINE_BREAKS = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")


def one_line(text):
    """text with each control or line-breaking character as \\xNN / \\uNNNN: a class, key or file
    name from a hostile file may hold \\r or \\n, and a refusal is one line (the tool reads one)."""
    return _LINE_BREAKS.sub(lambda m: "\\x%02x" % ord(m.group()) if ord(m.group()) < 256 else "\\u%04x" % ord(m.group()),
                            text)


# --- reading inputs -------------------------------------------------------------------------

class Input:
    """One open input file: fd, size, first bytes, the path to name in messages."""

    def __init__(self, fd, st, shown):
        self.fd, self.size, self.shown = fd, st.st_size, shown
        self.head = os.pread(fd, 4, 0)

    def kind(self):
        """'torch', 'safetensors' or None by the file's first bytes (and name for safetensors)."""
        if self.head == ZIP_MAGIC or self.head[:2] in PICKLE_PROTOCOLS:
            return "torch"
        if self.shown.endswith(".safetensors"):
            return "safetensors"
        return None

    def fileobj(self):
        """A file object from offset 0 (a dup shares the offset: every reader starts over)."""
        f = os.fdopen(os.dup(self.fd), "rb")
        f.seek(0)
        return f

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def load_torch(inp, trust, budget):
    path = inp.shown
    if not inp.head:
        raise BridgeError("%s: empty file" % path)
    if inp.head != ZIP_MAGIC and inp.head[:2] not in PICKLE_PROTOCOLS:
        raise BridgeError("%s: not a torch.save file (no zip or pickle magic)" % path)
    if trust:
        return _trusted_load(inp)
    if inp.head != ZIP_MAGIC:
        tar = os.pread(inp.fd, 5, 257) == b"ustar"
        raise BridgeError("%s: a legacy (torch < 1.6, %s) torch.save file, refused: only torch's own loader reads it "
                          "and an untrusted file can steer that loader (set trust_pickle = true / --trust-pickle if "
                          "you trust this file, or re-save it with torch >= 1.6)"
                          % (path, "tar format" if tar else "non-zip pickle format"))
    budget[0] += torch_zip.OUTPUT_FACTOR * inp.size
    with inp.fileobj() as f:
        try:
            return torch_zip.load(f, inp.size, budget)
        except torch_zip.Refused as e:
            raise BridgeError("%s: %s" % (path, e)) from None


def _trusted_load(inp):
    """--trust-pickle: plain torch.load (a process of its own: the tool starts one per conversion)."""
    import torch
    import zipfile
    path = inp.shown
    if inp.head == ZIP_MAGIC:
        try:
            with inp.fileobj() as f, zipfile.ZipFile(f) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, ValueError, EOFError) as e:
            raise BridgeError("%s: not a readable zip archive (%s)" % (path, e)) from None
        if not any(n.endswith("data.pkl") for n in names):
            raise BridgeError("%s: a zip archive without data.pkl, not a torch.save file" % path)
    try:
        with inp.fileobj() as f:
            return torch.load(f, map_location="cpu")
    except RecursionError:
        raise BridgeError("%s: nested too deeply to load" % path) from None
    except Exception as e:   # torch raises RuntimeError, pickle UnpicklingError/EOFError/... on damage
        what = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BridgeError("%s: torch.load failed: %s: %s" % (path, type(e).__name__, what[:300])) from None


def load_safetensors(inp):
    from . import safetensors as st
    from .errors import Damaged
    with inp.fileobj() as f:
        blob = f.read()
    path = inp.shown
    try:
        meta, _ = st.parse(path, blob)
        tensors = st.tensors(path, blob)
    except Damaged as e:
        raise BridgeError(str(e)) from None
    except (ValueError, KeyError, TypeError) as e:
        raise BridgeError("%s: not a valid safetensors file: %s" % (path, e)) from None
    return meta, tensors


class DcpInput:
    """A torch.distributed.checkpoint directory's .metadata and *.distcp files (dcp.py)."""

    def __init__(self, fd, shown, size):
        self.fd, self.shown, self.size = fd, shown, size

    def kind(self):
        return "dcp"

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def list_inputs(walker, root):
    """[(relative path, Input)] of a directory, sorted; refuses symlinks. A directory with a
    top-level .metadata is a torch.distributed.checkpoint: its *.distcp files are read through it
    (one entry, relative path ""), other torch/safetensors files (Megatron's common.pt) as usual."""
    dfd = walker.open_dir(root)
    found = []
    try:
        rels = nofollow.scan(dfd, root)
        if ".metadata" in rels:
            distcp = [r for r in rels if r.endswith(".distcp") and "/" not in r]
            found.append(("", DcpInput(os.dup(dfd), root, sum(walker_size(dfd, r) for r in distcp))))
            rels = [r for r in rels if r != ".metadata" and r not in distcp]
        elif any(r.endswith(".distcp") for r in rels):
            raise BridgeError("%s: *.distcp files without a .metadata file (not a torch.distributed.checkpoint "
                              "directory)" % root)
        for rel in rels:
            fd, st_ = nofollow.open_rel(dfd, rel, root)
            inp = Input(fd, st_, os.path.join(root, rel))
            if inp.kind():
                found.append((rel, inp))
            else:
                inp.close()
    except BaseException:
        for _, inp in found:
            inp.close()
        raise
    finally:
        os.close(dfd)
    if not found:
        raise BridgeError("%s: no torch.save or safetensors file in the directory" % root)
    return found


def walker_size(dfd, name):
    return os.stat(name, dir_fd=dfd, follow_symlinks=False).st_size


def load_dcp(inp, budget):
    from . import dcp
    budget[0] += torch_zip.OUTPUT_FACTOR * inp.size
    try:
        return dcp.read(inp.fd, inp.shown, budget)
    except torch_zip.Refused as e:
        raise BridgeError("%s: torch.distributed.checkpoint: %s" % (inp.shown, e)) from None


# --- flattening -------------------------------------------------------------------------------

def escape(part):
    return part.replace("%", "%25").replace("/", "%2F")


def join(prefix, part):
    return escape(part) if prefix == "" else prefix + "/" + escape(part)


# dtype name -> (safetensors dtype, original name for metadata or None)
DTYPES = {"float64": ("F64", None), "float32": ("F32", None), "float16": ("F16", None), "bfloat16": ("BF16", None),
          "int64": ("I64", None), "int32": ("I32", None), "int16": ("I16", None), "uint8": ("U8", None),
          "bool": ("U8", "bool"), "int8": ("U8", "int8")}
# numpy dtype name -> (safetensors dtype, original name or None)
NUMPY_DTYPES = dict(DTYPES, uint16=("I16", "uint16"), uint32=("I32", "uint32"), uint64=("I64", "uint64"))


def _torch():
    """torch when this process imported it (--trust-pickle), else None: never imported here."""
    return sys.modules.get("torch")


def _hexfloat(x):
    return float(x).hex()


class Flat:
    """Collects tensors {key: (dtype, shape, bytes)} and metadata {name: text} of one output."""

    def __init__(self, source, trust):
        self.source, self.trust = source, trust
        self.tensors, self.meta, self.leaves, self.meta_bytes = {}, {}, 0, 0

    def _count(self):
        self.leaves += 1
        if self.leaves > MAX_LEAVES:
            raise BridgeError("%s: more than %d leaves (refused)" % (self.source, MAX_LEAVES))

    def _claim(self, key):
        if key in self.tensors or ("leaf:" + key) in self.meta:
            raise BridgeError("%s: two values flatten to the key '%s'" % (self.source, key))
        if key == "__metadata__":
            raise BridgeError("%s: a value's key is '__metadata__' (reserved by safetensors)" % self.source)
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise BridgeError("%s: key %r is not valid UTF-8" % (self.source, key)) from None

    def put_tensor(self, key, t):
        """A torch_zip.Tensor (or, with --trust-pickle, a torch tensor)."""
        self._count()
        self._claim(key)
        if not isinstance(t, torch_zip.Tensor):
            return self._put_torch_tensor(key, t)
        name = t.dtype.name
        if t.layout != "torch.strided":
            raise BridgeError("%s: tensor '%s' is sparse (%s), refused" % (self.source, key, t.layout))
        if name.startswith("q"):
            raise BridgeError("%s: tensor '%s' is quantized, refused" % (self.source, key))
        if name.startswith("complex"):
            raise BridgeError("%s: tensor '%s' is complex (torch.%s), refused" % (self.source, key, name))
        if t.device == "meta":
            raise BridgeError("%s: tensor '%s' is a meta tensor (no data), refused" % (self.source, key))
        if name not in DTYPES:
            raise BridgeError("%s: tensor '%s' has dtype torch.%s, which safetensors here cannot hold" % (self.source, key, name))
        st_dtype, original = DTYPES[name]
        if original:
            self.meta["dtype:" + key] = original
        self.tensors[key] = (st_dtype, list(t.shape), t.raw)

    def put_array(self, key, a):
        """A native-order, C-contiguous numpy array of kind b/i/u/f."""
        self._count()
        self._claim(key)
        if a.dtype.name not in NUMPY_DTYPES:
            raise BridgeError("%s: numpy array '%s' has dtype %s, refused" % (self.source, key, a.dtype))
        st_dtype, original = NUMPY_DTYPES[a.dtype.name]
        if original:
            self.meta["dtype:" + key] = original
        self.tensors[key] = (st_dtype, list(a.shape), a.tobytes())

    def _put_torch_tensor(self, key, t):
        torch = _torch()
        if torch is None or not isinstance(t, torch.Tensor):
            raise BridgeError("%s: value '%s' is not a tensor" % (self.source, key))
        if t.is_sparse or t.layout != torch.strided:
            raise BridgeError("%s: tensor '%s' is sparse (%s), refused" % (self.source, key, t.layout))
        if t.is_quantized:
            raise BridgeError("%s: tensor '%s' is quantized, refused" % (self.source, key))
        if t.is_complex():
            raise BridgeError("%s: tensor '%s' is complex (%s), refused" % (self.source, key, t.dtype))
        if t.device.type == "meta":
            raise BridgeError("%s: tensor '%s' is a meta tensor (no data), refused" % (self.source, key))
        name = str(t.dtype)[len("torch."):]
        if name not in DTYPES:
            raise BridgeError("%s: tensor '%s' has dtype %s, which safetensors here cannot hold" % (self.source, key, t.dtype))
        st_dtype, original = DTYPES[name]
        t = t.detach().to("cpu").contiguous()
        if t.dtype in (torch.bool, torch.int8):
            raw = t.view(torch.uint8).numpy().tobytes()
            self.meta["dtype:" + key] = original
        elif t.dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().tobytes()
        else:
            raw = t.numpy().tobytes()
        self.tensors[key] = (st_dtype, list(t.shape), raw)

    def put_leaf(self, key, text):
        self._count()
        self._claim(key)
        self.meta_bytes += len(key) + len(text)
        if self.meta_bytes > MAX_HEADER:
            raise BridgeError("%s: its values' texts exceed %d bytes (refused)" % (self.source, MAX_HEADER))
        self.meta["leaf:" + key] = text

    def leaf_text(self, key, v):
        """The exact text of a non-tensor leaf, or None when v is not a leaf type."""
        import numpy as np
        if v is None:
            return "none:"
        if isinstance(v, np.generic):
            name = "numpy." + type(v).__name__
            if isinstance(v, np.bool_):
                return name + ":" + ("true" if v else "false")
            if isinstance(v, np.integer):
                return name + ":%d" % int(v)
            if isinstance(v, np.floating) and v.dtype.itemsize <= 8:
                return name + ":" + _hexfloat(v)
            if isinstance(v, np.complexfloating) and v.dtype.itemsize <= 16:
                return name + ":%s,%s" % (_hexfloat(v.real), _hexfloat(v.imag))
            if isinstance(v, (np.str_, np.bytes_)):
                return self.leaf_text(key, v.item())
            raise BridgeError("%s: value '%s' is a numpy %s scalar, refused" % (self.source, key, v.dtype))
        if isinstance(v, bool):
            return "bool:" + ("true" if v else "false")
        if isinstance(v, int):
            return "int:%d" % v
        if isinstance(v, float):
            return "float:" + v.hex()
        if isinstance(v, complex):
            return "complex:%s,%s" % (v.real.hex(), v.imag.hex())
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise BridgeError("%s: string '%s' is not valid UTF-8" % (self.source, key)) from None
            return "str:" + v
        if isinstance(v, (bytes, bytearray)):
            return "bytes:" + bytes(v).hex()
        if isinstance(v, torch_zip.DType):
            return "dtype:" + str(v)
        if isinstance(v, torch_zip.Size):
            return "size:" + "x".join(str(s) for s in v)
        if isinstance(v, torch_zip.Device):
            return "device:" + str(v)
        if isinstance(v, torch_zip.Named):
            return v.kind + ":" + str(v)
        torch = _torch()
        if torch is not None:
            if isinstance(v, torch.dtype):
                return "dtype:" + str(v)
            if isinstance(v, torch.Size):
                return "size:" + "x".join(str(s) for s in v)
            if isinstance(v, torch.device):
                return "device:" + str(v)
            if isinstance(v, (torch.layout, torch.memory_format)):
                return type(v).__name__ + ":" + str(v)
        if isinstance(v, pathlib.PurePath):
            return "path:" + str(v)
        if isinstance(v, enum.Enum):
            return "enum:%s.%s" % (_qualname(v), v.name)
        if isinstance(v, (set, frozenset)):
            items = sorted(self._plain_text(key, x) for x in v)
            return type(v).__name__ + ":" + json.dumps(items, ensure_ascii=False)
        if isinstance(v, slice):
            return "slice:" + json.dumps([self._plain_text(key, x) for x in (v.start, v.stop, v.step)])
        return None

    def _plain_text(self, key, v):
        text = self.leaf_text(key, v)
        if text is None:
            raise BridgeError("%s: value '%s' holds a %s inside a set or slice, refused" % (self.source, key, type(v).__name__))
        return text

    def add(self, root_key, obj):
        """Iterative depth-first flattening (no recursion: deep nesting is refused, not a crash)."""
        import numpy as np
        torch = _torch()
        stack = [(root_key, obj, 0)]
        while stack:
            key, v, depth = stack.pop()
            if depth > MAX_DEPTH:
                raise BridgeError("%s: nested deeper than %d levels at '%s...' (refused)"
                                  % (self.source, MAX_DEPTH, key[:80]))
            out_key = key if key != "" else "."
            if isinstance(v, torch_zip.Tensor) or (torch is not None and isinstance(v, torch.Tensor)):
                self.put_tensor(out_key, v)
                continue
            if isinstance(v, np.ndarray):
                if v.dtype.hasobject or v.dtype.fields is not None or v.dtype.kind not in "biuf":
                    raise BridgeError("%s: numpy array '%s' has dtype %s, refused" % (self.source, out_key, v.dtype))
                a = v.astype(v.dtype.newbyteorder("=")) if not v.dtype.isnative else v
                a = a if a.flags.c_contiguous else a.copy(order="C")   # (ascontiguousarray makes 0-d 1-d)
                self.put_array(out_key, a)   # unsigned: same bits as signed, original recorded
                continue
            text = self.leaf_text(out_key, v)
            if text is not None:
                self.put_leaf(out_key, text)
                continue
            items, cls = self._children(out_key, v)
            if cls is not None:
                self.meta["class:" + out_key] = cls
            if not items:
                self.put_leaf(out_key, "empty:dict" if isinstance(items, dict) else "empty:list")
                continue
            for k, child in reversed(list(items.items() if isinstance(items, dict) else enumerate(items))):
                stack.append((join(key, str(k)), child, depth + 1))

    def _children(self, key, v):
        """(dict or list of children, class name to record or None)."""
        import argparse
        import numpy as np
        if isinstance(v, dict):
            return v, None if type(v) in (dict, collections.OrderedDict, collections.defaultdict) else _qualname(v)
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            return collections.OrderedDict(zip(v._fields, v)), _qualname(v)
        if isinstance(v, (list, tuple)):
            return list(v), None if type(v) in (list, tuple) else _qualname(v)
        if isinstance(v, (argparse.Namespace, types.SimpleNamespace)):
            return dict(vars(v)), _qualname(v)
        if isinstance(v, np.random.RandomState):
            return v.get_state(legacy=False), _qualname(v)
        if isinstance(v, np.random.Generator):
            return v.bit_generator.state, _qualname(v)
        if isinstance(v, np.random.BitGenerator):
            return v.state, _qualname(v)
        if self.trust and hasattr(v, "__dict__") and isinstance(vars(v), dict):
            return dict(vars(v)), _qualname(v)
        raise BridgeError("%s: value '%s' is a %s, which has no flat form (refused)" % (self.source, key, _qualname(v)))


def _qualname(v):
    t = type(v)
    return "%s.%s" % (t.__module__, t.__qualname__)


# --- writing ----------------------------------------------------------------------------------

def safetensors_bytes(tensors, meta):
    """The file's bytes: header (sorted keys, space padded to 8) then data in key order."""
    header, offset = {}, 0
    for key in sorted(tensors):
        dt, shape, raw = tensors[key]
        header[key] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    header["__metadata__"] = dict(sorted(meta.items()))
    text = json.dumps(header, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    if len(text) > MAX_HEADER:
        raise BridgeError("header of %d bytes exceeds the %d-byte limit" % (len(text), MAX_HEADER))
    return [struct.pack("<Q", len(text)), text] + [tensors[k][2] for k in sorted(tensors)]


def _open_input(walker, src):
    """[(relative path, Input)]: src a file ("" as its path) or a directory."""
    import stat
    st_ = walker.lstat(src)
    if stat.S_ISLNK(st_.st_mode):
        raise BridgeError("%s: is a symlink (refused, never followed)" % src)
    if stat.S_ISDIR(st_.st_mode):
        return list_inputs(walker, src)
    if not stat.S_ISREG(st_.st_mode):
        raise BridgeError("%s: not a regular file or directory" % src)
    fd, name = walker.parent(src)
    try:
        ffd, fst = nofollow.open_file_at(fd, name, src)
    finally:
        os.close(fd)
    inp = Input(ffd, fst, src)
    if inp.kind() is None:
        inp.close()
        raise BridgeError("%s: %s" % (src, "empty file" if fst.st_size == 0 else "not a torch.save file (no zip or pickle magic)"))
    return [("", inp)]


def convert(src, dst, trust=False, root=None):
    """Reads src (file or directory), writes dst atomically. Raises BridgeError."""
    walker = nofollow.Walker(root)
    if root and not walker.beneath(dst):
        raise BridgeError("%s: the output is not below the root directory %s" % (dst, root))
    entries = []
    try:
        entries = _open_input(walker, src)
        flat = Flat(src, trust)
        flat.meta["rh_bridge"] = "1"
        budget = [torch_zip.OUTPUT_SLACK]
        for rel, inp in entries:
            flat.source = inp.shown
            prefix = "/".join(escape(p) for p in rel.split("/")) if rel else ""
            flat.meta["rh_source:" + (prefix or ".")] = os.path.basename(inp.shown)
            if inp.kind() == "dcp":
                flat.meta["rh_source:."] = os.path.basename(os.path.normpath(inp.shown))
                for fqn, value in load_dcp(inp, budget):
                    flat.add(escape(fqn), value)
            elif inp.kind() == "safetensors":
                meta, tensors = load_safetensors(inp)
                for k, v in sorted(meta.items()):
                    if not k.startswith("rh_"):
                        flat.put_leaf(join(join(prefix, "__metadata__"), k), "str:" + str(v))
                for k, (dt, shape, raw) in sorted(tensors.items()):
                    full = k if not prefix else prefix + "/" + k
                    flat._count()
                    flat._claim(full)
                    flat.tensors[full] = (dt, list(shape), bytes(raw))
            else:
                flat.add(prefix, load_torch(inp, trust, budget))
        flat.source = src
        parts = safetensors_bytes(flat.tensors, flat.meta)
    except nofollow.LinkError as e:
        raise BridgeError(str(e)) from None
    except RecursionError:
        raise BridgeError("%s: nested too deeply (refused)" % src) from None
    except MemoryError:
        raise BridgeError("%s: out of memory while converting" % src) from None
    except OSError as e:
        raise BridgeError("%s: %s" % (e.filename or src, e.strerror or e)) from None
    finally:
        for _, inp in entries:
            inp.close()
    try:
        walker.write(dst, parts)
    except nofollow.LinkError as e:
        raise BridgeError("%s (writing %s)" % (e, dst)) from None
    except OSError as e:
        raise BridgeError("%s: cannot write: %s" % (dst, e.strerror or e)) from None
    return len(flat.tensors), len(flat.meta)


USAGE = "usage: python3 -m rhckpt.torch_bridge [--trust-pickle] [--root DIR] INPUT OUTPUT [INPUT OUTPUT ...] | --serve"


def main(argv):
    trust, root = False, None
    args = list(argv)
    if args == ["--serve"]:
        return serve()
    while args and args[0] in ("--trust-pickle", "--root"):
        if args[0] == "--trust-pickle":
            trust, args = True, args[1:]
        elif len(args) >= 2:
            root, args = args[1], args[2:]
        else:
            args = []
    if not args or len(args) % 2 or any(a.startswith("-") for a in args[::2]) or any(a in ("-h", "--help") for a in args):
        print("torch_bridge: " + USAGE, file=sys.stderr)
        return 2
    for src, dst in zip(args[::2], args[1::2]):
        try:
            convert(src, dst, trust, root)
        except BridgeError as e:
            print("torch_bridge: %s" % one_line(str(e)), file=sys.stderr)
            return 2
    return 0


def _request(line):
    """(root or None, [INPUT, OUTPUT, ...]) of one --serve request line."""
    req = json.loads(line)
    root = None
    if isinstance(req, dict):
        root, req = req.get("root"), req.get("io")
        if not isinstance(root, str) or not root:
            raise BridgeError("request: \"root\" must be a directory path")
    if not isinstance(req, list) or not req or len(req) % 2 or not all(isinstance(a, str) for a in req):
        raise BridgeError("request: expected a JSON array of INPUT, OUTPUT paths (or {\"root\": DIR, \"io\": [...]})")
    return root, req


def serve():
    """--serve: one conversion request per stdin line, a JSON array [INPUT, OUTPUT, ...] or an
    object {"root": DIR, "io": [INPUT, OUTPUT, ...]} (paths below DIR are walked without following
    links); one reply per request on stdout, {"ok": true} or {"ok": false, "error": "<one line>"}.
    Never imports torch and never trusts pickles (a --trust-pickle conversion runs as its own
    process). Ends at EOF."""
    for line in sys.stdin:
        try:
            root, args = _request(line)
            for src, dst in zip(args[::2], args[1::2]):
                convert(src, dst, False, root)
            reply = {"ok": True}
        except BridgeError as e:
            reply = {"ok": False, "error": "torch_bridge: %s" % one_line(str(e))}
        except Exception as e:   # noqa: BLE001 (one line per request, never a traceback)
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            reply = {"ok": False, "error": one_line("torch_bridge: internal error: %s%s" % (type(e).__name__, (": " + msg[:300]) if msg else ""))}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


def _entry():
    try:
        code = main(sys.argv[1:])
    except BaseException as e:   # noqa: BLE001 (the contract: one line, never a traceback)
        if isinstance(e, SystemExit):
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        src = sys.argv[-2] if len(sys.argv) >= 3 else "?"
        print(one_line("torch_bridge: %s: internal error: %s%s" % (src, type(e).__name__, (": " + msg[:300]) if msg else "")),
              file=sys.stderr)
        code = 2
    sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    _entry()
