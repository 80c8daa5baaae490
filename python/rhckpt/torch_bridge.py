"""torch_bridge: torch.save checkpoints -> one flat safetensors file each, so the C++ tool can
compare a user's own trainer's checkpoints tensor by tensor and value by value.

    PYTHONPATH=python /usr/bin/python3 -m rhckpt.torch_bridge [--trust-pickle] IN OUT [IN OUT ...]

IN is a torch.save file or a directory (every regular file under it, recursively, sorted by
relative path, that starts with the zip magic PK\\x03\\x04 or a pickle protocol header, plus
*.safetensors files; keys get the relative path as prefix: `mp_rank_00/model_optim_rng.pt/
optimizer/state/3/exp_avg`). Symlinks are refused, never followed.

Flattening: dict / OrderedDict / list / tuple / namedtuple (field names) / argparse.Namespace /
SimpleNamespace (and, with --trust-pickle, any object with a __dict__) become key paths joined
by '/'; dict keys of any type become str(key); '%' in a key part is written %25 and '/' %2F.
The root object of a single file gets the key "." (torch.save(tensor)).
Tensors (and numpy arrays, via torch.from_numpy) become safetensors tensors: float64/32/16,
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

Safety: by default nothing outside a fixed allow-list is unpickled (Unpickler.find_class):
torch's tensor rebuild functions (not _rebuild_qtensor, _rebuild_device_tensor_from_numpy or
_rebuild_wrapper_subclass), torch._tensor._rebuild_from_type_v2, torch.nn.Parameter,
torch.Tensor, storage classes, torch.Size / device / dtype names / layouts, collections.
OrderedDict, builtins set / frozenset / bytearray / slice / complex (plain values, no code),
_codecs.encode with latin-1 only (how protocol 2 pickles bytes), numpy's _reconstruct / scalar /
ndarray / dtype (numpy._core spelled as numpy.core), numpy.random._pickle's constructors (they
build a bit generator by name from numpy's own table), argparse.Namespace, types.SimpleNamespace, pathlib.PosixPath / PurePosixPath / PureWindowsPath.
torch 1.13's weights_only=True is narrower (refuses Python floats in an args dict and numpy's
RNG state). Anything else: `<file>: refused to unpickle <module>.<name> (not a checkpoint type;
rerun with --trust-pickle if you trust this file)`, exit 2. The restricted module goes straight to
torch.serialization._load / _legacy_load (torch.load's own readers): Debian's torch 1.13.0a0
torch.load silently replaces a pickle_module argument by pickle unless weights_only=True, so
torch.load(pickle_module=...) would unpickle anything. TorchScript archives are refused
(torch.load would hand them to torch.jit.load). --trust-pickle uses plain torch.load.

torch.distributed.checkpoint: the installed torch (Debian's 1.13, python3-torch) has no
torch.distributed.checkpoint module at all (ModuleNotFoundError; it came with 2.0), so a
directory holding a `.metadata` file and *.distcp files is refused with a one-line message; on a
newer torch, torch.distributed.checkpoint.format_utils.dcp_to_torch_save turns it into a
torch.save file this bridge reads.

Output: 8-byte little-endian header length, JSON header (keys sorted, padded with spaces to a
multiple of 8, at most 100 MB), tensor data packed in key order; written to OUT.tmp, renamed.
The same checkpoint gives the same bytes. Exit 0 converted, 2 bad input (one line on stderr,
`torch_bridge: <file>: <what>`, never a traceback).
"""
import _compat_pickle
import collections
import enum
import json
import os
import pathlib
import pickle
import stat
import struct
import sys
import types

MAX_LEAVES = 1_000_000
MAX_DEPTH = 2000
MAX_HEADER = 100_000_000
PICKLE_PROTOCOLS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
ZIP_MAGIC = b"PK\x03\x04"


class BridgeError(Exception):
    """One-line refusal: `<file>: <what>`; exit 2."""


# --- restricted unpickling -----------------------------------------------------------------

def _latin1_encode(obj, encoding="latin1", errors="strict"):
    """_codecs.encode as protocol 2 uses it for bytes; any other codec is refused."""
    if encoding not in ("latin1", "latin-1") or errors != "strict" or not isinstance(obj, str):
        raise pickle.UnpicklingError("refused _codecs.encode with codec %r" % (encoding,))
    return obj.encode("latin1")


def _allowed_globals():
    import numpy as np
    import numpy.core.multiarray as ma
    import numpy.random._pickle as nrp
    import argparse
    import torch
    import torch._utils as tu
    allowed = {
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("builtins", "set"): set, ("builtins", "frozenset"): frozenset,
        ("builtins", "bytearray"): bytearray, ("builtins", "slice"): slice,
        ("builtins", "complex"): complex,
        ("_codecs", "encode"): _latin1_encode,
        ("numpy.core.multiarray", "_reconstruct"): ma._reconstruct,
        ("numpy.core.multiarray", "scalar"): ma.scalar,
        ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
        ("argparse", "Namespace"): argparse.Namespace,
        ("types", "SimpleNamespace"): types.SimpleNamespace,
        ("pathlib", "PosixPath"): pathlib.PosixPath, ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
        ("pathlib", "PureWindowsPath"): pathlib.PureWindowsPath,
        ("torch", "Size"): torch.Size, ("torch", "device"): torch.device, ("torch", "Tensor"): torch.Tensor,
        ("torch._tensor", "_rebuild_from_type_v2"): torch._tensor._rebuild_from_type_v2,
        ("torch.nn.parameter", "Parameter"): torch.nn.Parameter,
        ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    }
    for name in ("__randomstate_ctor", "__generator_ctor", "__bit_generator_ctor"):
        if hasattr(nrp, name):
            allowed[("numpy.random._pickle", name)] = getattr(nrp, name)
    for name in ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_parameter", "_rebuild_parameter_with_state",
                 "_rebuild_sparse_tensor", "_rebuild_sparse_csr_tensor", "_rebuild_meta_tensor_no_storage"):
        if hasattr(tu, name):
            allowed[("torch._utils", name)] = getattr(tu, name)
    for cls in list(torch._storage_classes) + list(torch._tensor_classes):
        allowed[(cls.__module__, cls.__name__)] = cls
    for name in ("TypedStorage", "_TypedStorage", "UntypedStorage", "_UntypedStorage", "_LegacyStorage"):
        if hasattr(torch.storage, name):
            allowed[("torch.storage", name)] = getattr(torch.storage, name)
    for name in dir(torch):
        v = getattr(torch, name, None)
        if isinstance(v, (torch.dtype, torch.layout, torch.memory_format)):
            allowed[("torch", name)] = v
    return allowed


def restricted_pickle_module(source):
    """A module object for torch.serialization._load / _legacy_load: its Unpickler and load refuse
    every global outside _allowed_globals(), naming `source` in the message."""
    allowed = _allowed_globals()

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) in _compat_pickle.NAME_MAPPING:   # Python 2 names, as pickle's own find_class
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            elif module in _compat_pickle.IMPORT_MAPPING:       # (protocol 2 writes __builtin__.complex)
                module = _compat_pickle.IMPORT_MAPPING[module]
            if module.startswith("numpy._core"):   # numpy 2 spelling of the same functions
                module = "numpy.core" + module[len("numpy._core"):]
            got = allowed.get((module, name))
            if got is None:
                raise BridgeError("%s: refused to unpickle %s.%s (not a checkpoint type; rerun with --trust-pickle "
                                  "if you trust this file)" % (source, module, name))
            return got

    def load(file, **kwargs):
        return Unpickler(file, **kwargs).load()

    mod = types.ModuleType("rhckpt_restricted_pickle")
    mod.Unpickler, mod.load = Unpickler, load
    mod.Pickler, mod.dump, mod.dumps = pickle.Pickler, pickle.dump, pickle.dumps
    mod.UnpicklingError = pickle.UnpicklingError
    return mod


# --- reading inputs -------------------------------------------------------------------------

def _kind(path):
    """'torch', 'safetensors' or None by the file's first bytes (and name for safetensors)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head == ZIP_MAGIC or head[:2] in PICKLE_PROTOCOLS:
        return "torch"
    if path.endswith(".safetensors"):
        return "safetensors"
    return None


def load_torch(path, trust):
    import torch
    import zipfile
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        raise BridgeError("%s: empty file" % path)
    if head == ZIP_MAGIC:
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, ValueError, EOFError) as e:
            raise BridgeError("%s: not a readable zip archive (%s)" % (path, e)) from None
        if any(n.endswith("constants.pkl") for n in names) and not trust:
            raise BridgeError("%s: a TorchScript archive (torch.jit.save), not a checkpoint" % path)
        if not any(n.endswith("data.pkl") for n in names):
            raise BridgeError("%s: a zip archive without data.pkl, not a torch.save file" % path)
    elif head[:2] not in PICKLE_PROTOCOLS:
        raise BridgeError("%s: not a torch.save file (no zip or pickle magic)" % path)
    try:
        if trust:
            return torch.load(path, map_location="cpu")
        return _restricted_load(path, head == ZIP_MAGIC)
    except BridgeError:
        raise
    except RecursionError:
        raise BridgeError("%s: nested too deeply to load" % path) from None
    except Exception as e:   # torch raises RuntimeError, pickle UnpicklingError/EOFError/... on damage
        what = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BridgeError("%s: torch.load failed: %s: %s" % (path, type(e).__name__, what[:300])) from None


def _restricted_load(path, is_zip):
    """torch.load's own readers with the restricted module. Not torch.load(pickle_module=...):
    Debian's torch 1.13.0a0 replaces any pickle_module by pickle when weights_only is False
    (serialization.py: `else: pickle_module = pickle`), which would unpickle anything."""
    import torch.serialization as ts
    if not all(hasattr(ts, n) for n in ("_load", "_legacy_load", "_open_zipfile_reader")):
        raise BridgeError("%s: this torch %s has no torch.serialization._load/_legacy_load to restrict "
                          "(rerun with --trust-pickle if you trust this file)" % (path, torch_version()))
    module = restricted_pickle_module(path)
    if is_zip:
        with ts._open_zipfile_reader(path) as z:   # reads records from the file, no copy in memory
            return ts._load(z, "cpu", module, encoding="utf-8")
    with open(path, "rb") as f:
        return ts._legacy_load(f, "cpu", module, encoding="utf-8")


def torch_version():
    import torch
    return torch.__version__


def load_safetensors(path):
    from . import safetensors as st
    from .errors import Damaged
    with open(path, "rb") as f:
        blob = f.read()
    try:
        meta, _ = st.parse(path, blob)
        tensors = st.tensors(path, blob)
    except Damaged as e:
        raise BridgeError(str(e)) from None
    except (ValueError, KeyError, TypeError) as e:
        raise BridgeError("%s: not a valid safetensors file: %s" % (path, e)) from None
    return meta, tensors


def _regular_file(path):
    st_ = os.lstat(path)
    if stat.S_ISLNK(st_.st_mode):
        raise BridgeError("%s: is a symlink (refused, never followed)" % path)
    return stat.S_ISREG(st_.st_mode)


def list_inputs(root):
    """[(relative path, kind)] of a directory, sorted; refuses symlinks and DCP directories."""
    found, distcp = [], False
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False, onerror=_raise_walk):
        for d in dirnames:
            if os.path.islink(os.path.join(dirpath, d)):
                raise BridgeError("%s: is a symlink (refused, never followed)" % os.path.join(dirpath, d))
        for name in filenames:
            full = os.path.join(dirpath, name)
            if not _regular_file(full):
                continue
            if name.endswith(".distcp"):
                distcp = True
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            kind = _kind(full)
            if kind:
                found.append((rel, kind))
    if distcp or os.path.isfile(os.path.join(root, ".metadata")):
        import torch
        raise BridgeError("%s: a torch.distributed.checkpoint directory (.metadata, *.distcp); the installed torch %s "
                          "has no torch.distributed.checkpoint and cannot read it (convert it with "
                          "torch.distributed.checkpoint.format_utils.dcp_to_torch_save on torch >= 2.2)"
                          % (root, torch.__version__))
    if not found:
        raise BridgeError("%s: no torch.save or safetensors file in the directory" % root)
    return sorted(found)


def _raise_walk(err):
    raise BridgeError("%s: %s" % (err.filename, err.strerror or err))


# --- flattening -------------------------------------------------------------------------------

def escape(part):
    return part.replace("%", "%25").replace("/", "%2F")


def join(prefix, part):
    return escape(part) if prefix == "" else prefix + "/" + escape(part)


DTYPES = None   # torch dtype -> (safetensors dtype, original name for metadata or None)


def _dtypes():
    global DTYPES
    if DTYPES is None:
        import torch
        DTYPES = {torch.float64: ("F64", None), torch.float32: ("F32", None), torch.float16: ("F16", None),
                  torch.bfloat16: ("BF16", None), torch.int64: ("I64", None), torch.int32: ("I32", None),
                  torch.int16: ("I16", None), torch.uint8: ("U8", None), torch.bool: ("U8", "bool"),
                  torch.int8: ("U8", "int8")}
    return DTYPES


def _hexfloat(x):
    return float(x).hex()


class Flat:
    """Collects tensors {key: (dtype, shape, bytes)} and metadata {name: text} of one output."""

    def __init__(self, source, trust):
        self.source, self.trust = source, trust
        self.tensors, self.meta, self.leaves = {}, {}, 0

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
        import torch
        self._count()
        self._claim(key)
        if t.is_sparse or t.layout != torch.strided:
            raise BridgeError("%s: tensor '%s' is sparse (%s), refused" % (self.source, key, t.layout))
        if t.is_quantized:
            raise BridgeError("%s: tensor '%s' is quantized, refused" % (self.source, key))
        if t.is_complex():
            raise BridgeError("%s: tensor '%s' is complex (%s), refused" % (self.source, key, t.dtype))
        if t.device.type == "meta":
            raise BridgeError("%s: tensor '%s' is a meta tensor (no data), refused" % (self.source, key))
        if t.dtype not in _dtypes():
            raise BridgeError("%s: tensor '%s' has dtype %s, which safetensors here cannot hold" % (self.source, key, t.dtype))
        st_dtype, original = _dtypes()[t.dtype]
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
        self.meta["leaf:" + key] = text

    def leaf_text(self, key, v):
        """The exact text of a non-tensor leaf, or None when v is not a leaf type."""
        import numpy as np
        import torch
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
        import torch
        stack = [(root_key, obj, 0)]
        while stack:
            key, v, depth = stack.pop()
            if depth > MAX_DEPTH:
                raise BridgeError("%s: nested deeper than %d levels at '%s...' (refused)"
                                  % (self.source, MAX_DEPTH, key[:80]))
            out_key = key if key != "" else "."
            if isinstance(v, torch.Tensor):
                self.put_tensor(out_key, v)
                continue
            if isinstance(v, np.ndarray):
                if v.dtype.hasobject or v.dtype.fields is not None or v.dtype.kind not in "biuf":
                    raise BridgeError("%s: numpy array '%s' has dtype %s, refused" % (self.source, out_key, v.dtype))
                a = v.astype(v.dtype.newbyteorder("=")) if not v.dtype.isnative else v
                a = a if a.flags.c_contiguous else a.copy(order="C")   # (ascontiguousarray makes 0-d 1-d)
                wide = {np.dtype(np.uint16): np.int16, np.dtype(np.uint32): np.int32, np.dtype(np.uint64): np.int64}
                if a.dtype in wide:   # no unsigned tensor dtypes: same bits as signed, original recorded
                    original = str(a.dtype)
                    self.put_tensor(out_key, torch.from_numpy(a.view(wide[a.dtype])))
                    self.meta["dtype:" + out_key] = original
                    continue
                self.put_tensor(out_key, torch.from_numpy(a))
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


def convert(src, dst, trust=False):
    """Reads src (file or directory), writes dst atomically. Raises BridgeError."""
    try:
        if os.path.islink(src):
            raise BridgeError("%s: is a symlink (refused, never followed)" % src)
        if not os.path.exists(src):
            raise BridgeError("%s: no such file or directory" % src)
        if os.path.isdir(src):
            entries = [(rel, os.path.join(src, rel), kind) for rel, kind in list_inputs(src)]
        elif os.path.isfile(src):
            kind = _kind(src)
            if kind is None:
                with open(src, "rb") as f:
                    empty = f.read(1) == b""
                raise BridgeError("%s: %s" % (src, "empty file" if empty else "not a torch.save file (no zip or pickle magic)"))
            entries = [("", src, kind)]
        else:
            raise BridgeError("%s: not a regular file or directory" % src)
        flat = Flat(src, trust)
        flat.meta["rh_bridge"] = "1"
        for rel, path, kind in entries:
            flat.source = path
            prefix = "/".join(escape(p) for p in rel.split("/")) if rel else ""
            flat.meta["rh_source:" + (prefix or ".")] = os.path.basename(path)
            if kind == "safetensors":
                meta, tensors = load_safetensors(path)
                for k, v in sorted(meta.items()):
                    if not k.startswith("rh_"):
                        flat.put_leaf(join(join(prefix, "__metadata__"), k), "str:" + str(v))
                for k, (dt, shape, raw) in sorted(tensors.items()):
                    full = k if not prefix else prefix + "/" + k
                    flat._count()
                    flat._claim(full)
                    flat.tensors[full] = (dt, list(shape), bytes(raw))
            else:
                flat.add(prefix, load_torch(path, trust))
        flat.source = src
        parts = safetensors_bytes(flat.tensors, flat.meta)
    except RecursionError:
        raise BridgeError("%s: nested too deeply (refused)" % src) from None
    except MemoryError:
        raise BridgeError("%s: out of memory while converting" % src) from None
    except OSError as e:
        raise BridgeError("%s: %s" % (e.filename or src, e.strerror or e)) from None
    tmp = dst + ".tmp"
    try:
        with open(tmp, "wb") as f:
            for p in parts:
                f.write(p)
        os.replace(tmp, dst)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise BridgeError("%s: cannot write: %s" % (dst, e.strerror or e)) from None
    return len(flat.tensors), len(flat.meta)


USAGE = "usage: python3 -m rhckpt.torch_bridge [--trust-pickle] INPUT OUTPUT [INPUT OUTPUT ...] | --serve"


def main(argv):
    trust = False
    args = list(argv)
    if args == ["--serve"]:
        return serve()
    if args and args[0] == "--trust-pickle":
        trust, args = True, args[1:]
    if not args or len(args) % 2 or any(a.startswith("-") for a in args[::2]) or any(a in ("-h", "--help") for a in args):
        print("torch_bridge: " + USAGE, file=sys.stderr)
        return 2
    for src, dst in zip(args[::2], args[1::2]):
        try:
            convert(src, dst, trust)
        except BridgeError as e:
            print("torch_bridge: %s" % e, file=sys.stderr)
            return 2
    return 0


def serve():
    """--serve: one conversion request per stdin line, a JSON array [INPUT, OUTPUT, ...]; one
    reply per request on stdout, {"ok": true} or {"ok": false, "error": "<one line>"}. torch is
    imported once, so the tool pays its start-up once per run instead of once per comparison.
    Never trusts pickles (a --trust-pickle conversion runs as its own process). Ends at EOF."""
    import torch  # noqa: F401  (imported up front: the point of a long-lived bridge)
    for line in sys.stdin:
        try:
            args = json.loads(line)
            if not isinstance(args, list) or not args or len(args) % 2 or not all(isinstance(a, str) for a in args):
                raise BridgeError("request: expected a JSON array of INPUT, OUTPUT paths")
            for src, dst in zip(args[::2], args[1::2]):
                convert(src, dst, False)
            reply = {"ok": True}
        except BridgeError as e:
            reply = {"ok": False, "error": "torch_bridge: %s" % e}
        except Exception as e:   # noqa: BLE001 (one line per request, never a traceback)
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            reply = {"ok": False, "error": "torch_bridge: internal error: %s%s" % (type(e).__name__, (": " + msg[:300]) if msg else "")}
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
        print("torch_bridge: %s: internal error: %s%s" % (src, type(e).__name__, (": " + msg[:300]) if msg else ""),
              file=sys.stderr)
        code = 2
    sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    _entry()
