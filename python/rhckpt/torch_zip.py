"""torch_zip: reads torch.save's zip format (torch >= 1.6) without torch, for torch_bridge.

Nothing of torch's runs on the file. The archive is parsed with zipfile from an already-open
file object; every record must be STORED (torch.save never compresses, so a deflate record, and
with it a deflate bomb, is refused) and no name may appear twice. `<archive>/data.pkl` goes
through pickle's pure-Python unpickler (so that a dict key or set element can be checked before
it is hashed: CPython hashes a tuple recursively, and a million-deep one overflows the C stack)
with a find_class that returns this module's stand-ins (below), never torch's objects, and a
persistent_load that gives a StorageRef per `('storage', type, key, location, numel)`.

Each storage is one read of its record `<archive>/data/<key>`, whose size must EQUAL the
declared numel * itemsize (a 4096-float storage over a 4-byte record is refused, not read past).
Each tensor's (offset, size, stride) must address only elements inside its storage, and its
bytes are gathered (numpy as_strided over the record, never past it) only after the output
budget allows them: all tensors of one conversion together may be at most OUTPUT_FACTOR x the
input bytes + OUTPUT_SLACK (overlapping and stride-0 views that expand a small record are
refused; ties and views of one storage stay well inside it). Nesting: dict keys and set
elements are walked iteratively before hashing (at most MAX_KEY_NODES nodes, MAX_KEY_DEPTH deep),
and a BYTEARRAY8 may not declare more bytes than the pickle holds (pickle allocates it first).
"""
import collections
import pickle
import struct
import zipfile

import numpy as np

OUTPUT_FACTOR = 4
OUTPUT_SLACK = 64 << 20
MAX_KEY_NODES = 10_000
MAX_KEY_DEPTH = 100


class Refused(Exception):
    """A one-line reason the file is refused (torch_bridge prefixes the file name)."""


# --- stand-ins for torch's pickled types -------------------------------------------------------

class DType:
    """torch.<name> dtype: str() is torch's ("torch.float32")."""

    def __init__(self, name, itemsize, np_raw):
        self.name, self.itemsize, self.np_raw = name, itemsize, np_raw

    def __str__(self):
        return "torch." + self.name

    __repr__ = __str__

    def __reduce__(self):
        raise TypeError("a dtype stand-in is not picklable")


class Named:
    """torch.layout / torch.memory_format values: kind is the leaf's type name."""

    def __init__(self, kind, name):
        self.kind, self.name = kind, name

    def __str__(self):
        return "torch." + self.name

    __repr__ = __str__


class Size(tuple):
    """torch.Size."""

    def __new__(cls, dims=()):
        dims = tuple(dims)
        if not all(type(d) is int and d >= 0 for d in dims):
            raise Refused("a torch.Size holds something other than non-negative ints")
        return tuple.__new__(cls, dims)

    def __repr__(self):
        return "torch.Size([%s])" % ", ".join(str(d) for d in self)


class Device:
    """torch.device: str() is torch's ("cpu", "cuda:1")."""

    def __init__(self, kind, index=None):
        if not isinstance(kind, str) or (index is not None and type(index) is not int):
            raise Refused("a torch.device with arguments other than (str[, int])")
        if index is None and ":" in kind:
            kind, _, idx = kind.partition(":")
            if not idx.isdigit():
                raise Refused("a torch.device '%s:%s'" % (kind, idx))
            index = int(idx)
        self.type, self.index = kind, index

    def __str__(self):
        return self.type if self.index is None else "%s:%d" % (self.type, self.index)

    def __repr__(self):
        return "device(type='%s')" % self.type if self.index is None else "device(type='%s', index=%d)" % (self.type, self.index)

    def __eq__(self, other):
        return isinstance(other, Device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self):
        return hash((self.type, self.index))


_DTYPES = {}   # name -> DType
for _name, _size, _raw in (("float64", 8, "<f8"), ("float32", 4, "<f4"), ("float16", 2, "<f2"), ("bfloat16", 2, "<i2"),
                           ("int64", 8, "<i8"), ("int32", 4, "<i4"), ("int16", 2, "<i2"), ("int8", 1, "i1"),
                           ("uint8", 1, "u1"), ("bool", 1, "u1"), ("complex32", 4, None), ("complex64", 8, None),
                           ("complex128", 16, None), ("qint8", 1, None), ("quint8", 1, None), ("qint32", 4, None),
                           ("quint4x2", 1, None), ("quint2x4", 1, None)):
    _DTYPES[_name] = DType(_name, _size, _raw)
# torch's other spellings of the same dtypes (torch.float is torch.float32)
_ALIASES = {"double": "float64", "float": "float32", "half": "float16", "long": "int64", "int": "int32",
            "short": "int16", "cfloat": "complex64", "cdouble": "complex128", "chalf": "complex32"}
STORAGE_DTYPES = {"DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
                  "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16",
                  "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
                  "ComplexFloatStorage": "complex64", "ComplexDoubleStorage": "complex128",
                  "QInt8Storage": "qint8", "QUInt8Storage": "quint8", "QInt32Storage": "qint32",
                  "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4", "UntypedStorage": "uint8"}
LAYOUTS = {n: Named("layout", n) for n in ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr",
                                           "sparse_bsc", "_mkldnn")}
MEMORY_FORMATS = {n: Named("memory_format", n) for n in ("contiguous_format", "channels_last", "channels_last_3d",
                                                         "preserve_format")}


class StorageType:
    def __init__(self, name):
        self.name, self.dtype = name, _DTYPES[STORAGE_DTYPES[name]]

    def __call__(self, *a, **k):
        raise Refused("a pickle calls the storage class %s" % self.name)


class TensorType:
    """torch.Tensor / torch.nn.Parameter / torch.<X>Tensor as a class named in the pickle."""

    def __init__(self, name):
        self.name = name

    def __call__(self, *a, **k):
        raise Refused("a pickle calls the class %s" % self.name)


class StorageRef:
    def __init__(self, key, dtype, numel, data):
        self.key, self.dtype, self.numel, self.data = key, dtype, numel, data


class Tensor:
    """A strided tensor read from a storage record: raw holds its elements in C order."""

    def __init__(self, dtype, shape, raw, layout="torch.strided", device="cpu"):
        self.dtype, self.shape, self.raw, self.layout, self.device = dtype, list(shape), raw, layout, device


def _ints(v, what):
    if not isinstance(v, (tuple, list)) or not all(type(x) is int for x in v):
        raise Refused("a tensor's %s is not a tuple of ints" % what)
    return tuple(v)


class Reader:
    """One torch.save zip file: load() -> the unpickled object with Tensor stand-ins."""

    def __init__(self, fileobj, size, budget):
        self.f, self.size, self.budget = fileobj, size, budget   # budget: [bytes left for tensor data]
        self.storages = {}

    def load(self):
        try:
            z = zipfile.ZipFile(self.f)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError) as e:
            raise Refused("not a readable zip archive (%s)" % e) from None
        with z:
            infos = z.infolist()
            if not infos:
                raise Refused("an empty zip archive, not a torch.save file")
            if any(i.filename.endswith("constants.pkl") for i in infos):
                raise Refused("a TorchScript archive (torch.jit.save), not a checkpoint")
            seen = set()
            for i in infos:
                if i.filename in seen:
                    raise Refused("the zip archive holds two records named '%s'" % i.filename[:200])
                seen.add(i.filename)
                if i.compress_type != zipfile.ZIP_STORED:
                    raise Refused("zip record '%s' is compressed (method %d); torch.save stores records "
                                  "uncompressed, refused" % (i.filename[:200], i.compress_type))
                if i.header_offset + i.file_size > self.size:
                    raise Refused("zip record '%s' ends past the end of the file" % i.filename[:200])
            archive = infos[0].filename.split("/", 1)[0]
            self.z, self.prefix = z, archive + "/"
            if self.prefix + "data.pkl" not in seen:
                raise Refused("a zip archive without %sdata.pkl, not a torch.save file" % self.prefix)
            if self.prefix + "byteorder" in seen and self._record("byteorder") not in (b"little",):
                raise Refused("a big-endian torch.save file (byteorder record), not supported")
            pk = self._record("data.pkl")
            return _Unpickler(pk, self).load()

    def _record(self, name):
        try:
            with self.z.open(self.prefix + name) as r:
                return r.read()
        except KeyError:
            raise Refused("no record '%s%s' in the archive" % (self.prefix, name[:200])) from None
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
            raise Refused("zip record '%s%s' is damaged (%s)" % (self.prefix, name[:200], e)) from None

    def storage(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise Refused("a persistent id other than ('storage', type, key, location, numel)")
        _, stype, key, location, numel = pid
        if not isinstance(stype, StorageType) or not isinstance(key, str) or not isinstance(location, str) \
                or type(numel) is not int or numel < 0:
            raise Refused("a malformed storage reference %r" % (pid[:4],))
        nbytes = numel * stype.dtype.itemsize
        got = self.storages.get(key)
        if got is None:
            info = self.z.NameToInfo.get(self.prefix + "data/" + key)
            if info is None:
                raise Refused("storage '%s' has no record %sdata/%s" % (key[:100], self.prefix, key[:100]))
            if info.file_size != nbytes:
                raise Refused("storage '%s' declares %d %s elements (%d bytes) but its record holds %d bytes"
                              % (key[:100], numel, stype.dtype.name, nbytes, info.file_size))
            got = self.storages[key] = StorageRef(key, stype.dtype, numel, self._record("data/" + key))
        elif len(got.data) != nbytes:
            raise Refused("storage '%s' is declared twice with different sizes" % key[:100])
        return StorageRef(key, stype.dtype, numel, got.data)

    def tensor(self, storage, offset, size, stride):
        if not isinstance(storage, StorageRef) or type(offset) is not int or offset < 0:
            raise Refused("a tensor rebuilt from something other than (storage, offset >= 0, size, stride)")
        size, stride = _ints(size, "size"), _ints(stride, "stride")
        if len(size) != len(stride) or any(s < 0 for s in size) or any(s < 0 for s in stride):
            raise Refused("a tensor's size %r and stride %r do not match" % (size[:8], stride[:8]))
        dt = storage.dtype
        numel = 1
        for s in size:
            numel *= s
        if numel == 0:
            return Tensor(dt, size, b"")
        last = offset + sum((s - 1) * st for s, st in zip(size, stride))
        if last >= storage.numel:
            raise Refused("a tensor of size %r stride %r at offset %d reaches element %d of a %d-element storage '%s'"
                          % (size[:8], stride[:8], offset, last, storage.numel, storage.key[:100]))
        nbytes = numel * dt.itemsize
        if nbytes > self.budget[0]:
            raise Refused("its tensors would expand to more than %d x the input's bytes (overlapping or stride-0 "
                          "views), refused" % OUTPUT_FACTOR)
        self.budget[0] -= nbytes
        if dt.np_raw is None:   # refused by the caller naming the key; no bytes needed
            return Tensor(dt, size, None)
        base = np.frombuffer(storage.data, dtype=dt.np_raw)
        view = np.lib.stride_tricks.as_strided(base[offset:], shape=size, strides=[s * dt.itemsize for s in stride],
                                               writeable=False)
        return Tensor(dt, size, view.tobytes())


# --- the restricted unpickler --------------------------------------------------------------------

def _check_key(v):
    """Walks a value about to be hashed (dict key, set element) without recursion."""
    stack, nodes = [(v, 0)], 0
    while stack:
        x, depth = stack.pop()
        nodes += 1
        if nodes > MAX_KEY_NODES or depth > MAX_KEY_DEPTH:
            raise Refused("a dict key or set element nested deeper than %d levels or larger than %d values, refused"
                          % (MAX_KEY_DEPTH, MAX_KEY_NODES))
        if isinstance(x, (tuple, frozenset)):
            stack.extend((y, depth + 1) for y in x)
        elif isinstance(x, Tensor):
            raise Refused("a tensor used as a dict key or set element, refused")


def _checked_set(cls):
    def make(items=()):
        items = list(items)
        for x in items:
            _check_key(x)
        return cls(items)
    return make


def _ordered_dict(items=()):
    out = collections.OrderedDict()
    for pair in (items.items() if isinstance(items, dict) else items):
        k, v = pair
        _check_key(k)
        out[k] = v
    return out


def _bytearray(data=b"", encoding=None, errors="strict"):
    """Only from bytes (protocol 3+) or a latin-1 str (protocol 2): never bytearray(10**12)."""
    if isinstance(data, (bytes, bytearray)) and encoding is None:
        return bytearray(data)
    if isinstance(data, str) and encoding in ("latin1", "latin-1") and errors == "strict":
        return bytearray(data.encode("latin1"))
    raise Refused("bytearray built from something other than bytes")


def _latin1_encode(obj, encoding="latin1", errors="strict"):
    """_codecs.encode as protocol 2 uses it for bytes; any other codec is refused."""
    if encoding not in ("latin1", "latin-1") or errors != "strict" or not isinstance(obj, str):
        raise Refused("refused _codecs.encode with codec %r" % (encoding,))
    return obj.encode("latin1")


def _globals(reader):
    import argparse
    import pathlib
    import types
    import numpy.core.multiarray as ma
    import numpy.random._pickle as nrp

    def rebuild_tensor(storage, storage_offset, size, stride, *rest):
        return reader.tensor(storage, storage_offset, size, stride)

    def rebuild_parameter(data, requires_grad=False, backward_hooks=None, state=None):
        if not isinstance(data, Tensor):
            raise Refused("a Parameter rebuilt from something other than a tensor")
        return data

    def rebuild_from_type_v2(func, new_type, args, state=None):
        if func not in (rebuild_tensor, rebuild_parameter) or not isinstance(new_type, TensorType) \
                or not isinstance(args, tuple):
            raise Refused("_rebuild_from_type_v2 with a function or class other than a tensor's")
        return func(*args)

    def rebuild_sparse(layout, data, *rest):
        return Tensor(_DTYPES["float32"], [], None, layout=str(layout))

    def rebuild_meta(dtype, size, stride, requires_grad=False, *rest):
        return Tensor(dtype, _ints(size, "size"), None, device="meta")

    def get_layout(name):
        got = LAYOUTS.get(name[len("torch."):] if isinstance(name, str) and name.startswith("torch.") else None)
        if got is None:
            raise Refused("an unknown layout %r" % (name,))
        return got

    allowed = {
        ("collections", "OrderedDict"): _ordered_dict,
        ("builtins", "set"): _checked_set(set), ("builtins", "frozenset"): _checked_set(frozenset),
        ("builtins", "bytearray"): _bytearray, ("builtins", "slice"): slice, ("builtins", "complex"): complex,
        ("_codecs", "encode"): _latin1_encode,
        ("numpy.core.multiarray", "_reconstruct"): ma._reconstruct,
        ("numpy.core.multiarray", "scalar"): ma.scalar,
        ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
        ("argparse", "Namespace"): argparse.Namespace, ("types", "SimpleNamespace"): types.SimpleNamespace,
        ("pathlib", "PosixPath"): pathlib.PosixPath, ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
        ("pathlib", "PureWindowsPath"): pathlib.PureWindowsPath,
        ("torch", "Size"): Size, ("torch", "device"): Device, ("torch", "Tensor"): TensorType("torch.Tensor"),
        ("torch.nn.parameter", "Parameter"): TensorType("torch.nn.parameter.Parameter"),
        ("torch._tensor", "_rebuild_from_type_v2"): rebuild_from_type_v2,
        ("torch.serialization", "_get_layout"): get_layout,
        ("torch._utils", "_rebuild_tensor"): rebuild_tensor, ("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor,
        ("torch._utils", "_rebuild_parameter"): rebuild_parameter,
        ("torch._utils", "_rebuild_parameter_with_state"): rebuild_parameter,
        ("torch._utils", "_rebuild_sparse_tensor"): rebuild_sparse,
        ("torch._utils", "_rebuild_sparse_csr_tensor"): rebuild_sparse,
        ("torch._utils", "_rebuild_meta_tensor_no_storage"): rebuild_meta,
    }
    for name in ("__randomstate_ctor", "__generator_ctor", "__bit_generator_ctor"):
        if hasattr(nrp, name):
            allowed[("numpy.random._pickle", name)] = getattr(nrp, name)
    for name in STORAGE_DTYPES:
        for mod in ("torch", "torch.cuda", "torch.storage"):
            allowed[(mod, name)] = StorageType(name)
    for name in ("TypedStorage", "_TypedStorage", "_UntypedStorage", "_LegacyStorage"):
        allowed[("torch.storage", name)] = TensorType("torch.storage." + name)
    for name in ("DoubleTensor", "FloatTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
                 "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor"):
        allowed[("torch", name)] = TensorType("torch." + name)
    for name, dt in list(_DTYPES.items()) + [(a, _DTYPES[n]) for a, n in _ALIASES.items()]:
        allowed[("torch", name)] = dt
    for table in (LAYOUTS, MEMORY_FORMATS):
        for name, v in table.items():
            allowed[("torch", name)] = v
    return allowed


class _Unpickler(pickle._Unpickler):   # the pure-Python one: its opcodes can be checked one by one
    def __init__(self, data, reader):
        import io
        super().__init__(io.BytesIO(data), encoding="utf-8")
        self.reader, self.allowed = reader, _globals(reader)
        d = dict(self.dispatch)
        for op, name in ((pickle.SETITEM[0], "setitem"), (pickle.SETITEMS[0], "setitems"), (pickle.DICT[0], "dict"),
                         (pickle.ADDITEMS[0], "additems"), (pickle.FROZENSET[0], "frozenset"),
                         (pickle.BUILD[0], "build"), (pickle.BYTEARRAY8[0], "bytearray8")):
            d[op] = getattr(type(self), "_checked_" + name)
        self.dispatch = d
        self.data_size = len(data)

    def find_class(self, module, name):
        import _compat_pickle
        if (module, name) in _compat_pickle.NAME_MAPPING:   # Python 2 names, as pickle's own find_class
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:       # (protocol 2 writes __builtin__.complex)
            module = _compat_pickle.IMPORT_MAPPING[module]
        if module.startswith("numpy._core"):   # numpy 2 spelling of the same functions
            module = "numpy.core" + module[len("numpy._core"):]
        got = self.allowed.get((module, name))
        if got is None:
            raise UnpicklingRefused("refused to unpickle %s.%s (not a checkpoint type; rerun with --trust-pickle "
                                    "if you trust this file)" % (module, name))
        return got

    def persistent_load(self, pid):
        return self.reader.storage(pid)

    def _checked_setitem(self):
        _check_key(self.stack[-2])
        pickle._Unpickler.load_setitem(self)

    def _checked_setitems(self):
        for k in self.stack[self._mark_at():][::2]:
            _check_key(k)
        pickle._Unpickler.load_setitems(self)

    def _checked_dict(self):
        for k in self.stack[self._mark_at():][::2]:
            _check_key(k)
        pickle._Unpickler.load_dict(self)

    def _checked_additems(self):
        for k in self.stack[self._mark_at():]:
            _check_key(k)
        pickle._Unpickler.load_additems(self)

    def _checked_frozenset(self):
        for k in self.stack[self._mark_at():]:
            _check_key(k)
        pickle._Unpickler.load_frozenset(self)

    def _checked_bytearray8(self):
        """pickle's BYTEARRAY8 makes (and zeroes) a bytearray of the declared length before reading
        it: 8 bytes of a 1 KB pickle could take all memory. The length must fit in the pickle."""
        n, = struct.unpack("<Q", self.read(8))
        if n > self.data_size:
            raise Refused("a BYTEARRAY8 of %d bytes in a %d-byte pickle, refused" % (n, self.data_size))
        b = bytearray(n)
        self.readinto(b)
        self.append(b)

    def _checked_build(self):
        """BUILD only on instances of the types whose pickles need it (numpy's __setstate__,
        a Namespace's or a state dict's __dict__): never on a class or a stand-in (setattr(argparse.Namespace,
        "dump_patches", True), or renaming the dtype every later file shares)."""
        inst = self.stack[-2]
        if isinstance(inst, type) or not isinstance(inst, _buildable()):
            raise Refused("a pickle sets the state of %s, refused" % (
                "the class " + inst.__name__ if isinstance(inst, type) else "a " + type(inst).__name__))
        st = self.stack[-1]
        if isinstance(st, tuple) and len(st) == 2 and isinstance(st[1], dict) and \
                any(not isinstance(k, str) or k.startswith("__") for k in st[1]):
            raise Refused("a pickle sets a special attribute of a %s, refused" % type(inst).__name__)
        pickle._Unpickler.load_build(self)

    def _mark_at(self):
        """Items after the innermost MARK are self.stack (pickle._Unpickler moves the outer part
        to self.metastack at MARK)."""
        return 0


def _buildable():
    import argparse
    import types
    return (np.ndarray, np.dtype, np.random.RandomState, np.random.Generator, np.random.BitGenerator,
            argparse.Namespace, types.SimpleNamespace, collections.OrderedDict)


class UnpicklingRefused(Refused):
    """find_class refused a global."""


def load(fileobj, size, budget):
    """The unpickled object of a torch.save zip file (Refused on anything else)."""
    try:
        return Reader(fileobj, size, budget).load()
    except Refused:
        raise
    except RecursionError:
        raise Refused("nested too deeply to load") from None
    except MemoryError:
        raise Refused("out of memory while unpickling") from None
    except Exception as e:   # pickle's UnpicklingError/EOFError/ValueError/TypeError/... on damage
        what = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise Refused("cannot unpickle data.pkl: %s: %s" % (type(e).__name__, what[:300])) from None
