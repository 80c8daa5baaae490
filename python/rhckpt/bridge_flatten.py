"""bridge_flatten: a loaded checkpoint object -> the tensors {key: (dtype, shape, bytes)} and
metadata texts of one flat safetensors file, and that file's bytes (safetensors_bytes). The key
paths, dtypes and leaf texts are torch_bridge.py's "Flattening" section; nothing here reads files.
"""
import collections
import enum
import json
import pathlib
import struct
import sys
import types

from . import torch_zip
from .errors import BridgeError

MAX_LEAVES = 1_000_000
MAX_DEPTH = 2000
MAX_HEADER = 100_000_000


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
