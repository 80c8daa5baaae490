"""torch_bridge: torch.save checkpoints -> one flat safetensors file each, so the C++ tool can
compare a user's own trainer's checkpoints tensor by tensor and value by value. This module is the
command line, --serve and convert(); bridge_inputs.py opens and loads the inputs, bridge_flatten.py
turns a loaded object into tensors and leaves and writes the output's bytes.

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
import json
import os
import re
import sys

from . import nofollow
from . import torch_zip
from .bridge_flatten import (DTYPES, MAX_DEPTH, MAX_HEADER, MAX_LEAVES, NUMPY_DTYPES, Flat,  # noqa: F401
                             escape, join, safetensors_bytes)
from .bridge_inputs import (PICKLE_PROTOCOLS, ZIP_MAGIC, DcpInput, Input, list_inputs, load_dcp,  # noqa: F401
                            load_safetensors, load_torch, open_input, walker_size)
from .errors import BridgeError

# How the tool starts the bridge: python3 -I -c LAUNCHER PATHS ARGS... (harness/verify/external_check.cpp)
LAUNCHER = ("import sys; sys.path[:0] = [p for p in sys.argv.pop(1).split(':') if p]; import runpy; "
            "runpy.run_module('rhckpt.torch_bridge', run_name='__main__', alter_sys=True)")


_LINE_BREAKS = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")


def one_line(text):
    """text with each control or line-breaking character as \\xNN / \\uNNNN: a class, key or file
    name from a hostile file may hold \\r or \\n, and a refusal is one line (the tool reads one)."""
    return _LINE_BREAKS.sub(lambda m: "\\x%02x" % ord(m.group()) if ord(m.group()) < 256 else "\\u%04x" % ord(m.group()),
                            text)


def convert(src, dst, trust=False, root=None):
    """Reads src (file or directory), writes dst atomically. Raises BridgeError."""
    walker = nofollow.Walker(root)
    if root and not walker.beneath(dst):
        raise BridgeError("%s: the output is not below the root directory %s" % (dst, root))
    entries = []
    try:
        entries = open_input(walker, src)
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
