#!/usr/bin/python3
"""python/rhckpt/torch_bridge.py: torch.save checkpoints -> flat safetensors. A handcrafted nested
checkpoint with every leaf kind is converted and read back with rhckpt's strict safetensors parser
(bytes, dtype and shape of every tensor, the text of every metadata leaf); the same input twice
gives the same bytes; a directory gets relative-path prefixes; the restricted unpickler refuses a
pickle that REDUCEs os.system (and the command never runs) while --trust-pickle accepts a harmless
class; hostile inputs (truncated, garbage, empty, 10^5-deep nesting, symlinks, a
torch.distributed.checkpoint directory, a missing output directory) exit 2 with exactly one
stderr line and no traceback. Issue 41's attacks (tests/conformance/hostile_torch.py): a legacy
file steering torch's loader into writing a .patch file, a legacy tar with a hard-link member (a
chmod of another file) or a FIFO member (a hang), storages declared larger than their records,
tensors past their storage, stride-0 expansion, a deflate record, a million-deep tuple key,
BUILD on a class or a dtype, a FIFO as input, a json.py in the current directory, links planted
in place of the output's directories: each refused with one line, exit 2, nothing written,
memory bounded (the child's peak RSS measured), and the bridge never imports torch.

  /usr/bin/python3 tests/test_torch_bridge.py [TOOL]     (the tool argument CTest passes is ignored)
"""
import argparse
import collections
import contextlib
import enum
import io
import json
import os
import pathlib
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import types
import unittest

import numpy as np
try:
    import torch
except ImportError:   # Debian python3-torch (scripts/setup.sh installs it)
    print("test_torch_bridge: skipped, /usr/bin/python3 has no torch")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(HERE, "..", "python")
sys.path.insert(0, PYTHON_DIR)
from rhckpt import safetensors as st  # noqa: E402
from rhckpt import bridge_flatten, torch_bridge  # noqa: E402


def bridge(*args, extra_path=None, cwd=None, timeout=120):
    """The bridge started as the tool starts it: isolated (-I), the package dir put on sys.path
    by torch_bridge.LAUNCHER (harness/verify/external_check.cpp)."""
    paths = PYTHON_DIR + (os.pathsep + extra_path if extra_path else "")
    return subprocess.run([sys.executable, "-I", "-c", torch_bridge.LAUNCHER, paths] + list(args),
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)


def peak_rss_mib(*args, limit_mib=1024):
    """(completed process, the child's peak RSS in MiB) of one bridge run in a fresh process whose
    address space is capped at limit_mib (a regression cannot take the machine's memory)."""
    probe = ("import resource, subprocess, sys\n"
             "def cap():\n"
             "    resource.setrlimit(resource.RLIMIT_AS, (%d << 20, %d << 20))\n"
             "p = subprocess.run(sys.argv[1:], preexec_fn=cap, capture_output=True, text=True, timeout=120)\n"
             "sys.stderr.write(p.stderr)\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n"
             "sys.exit(p.returncode)\n") % (limit_mib, limit_mib)
    p = subprocess.run([sys.executable, "-c", probe, sys.executable, "-I", "-c", torch_bridge.LAUNCHER, PYTHON_DIR]
                       + list(args), capture_output=True, text=True, timeout=180)
    return p, int(p.stdout.strip() or 0)


def inproc(*args):
    """torch_bridge.main in this process (no torch import per call): (exit status, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = torch_bridge.main(list(args))
    return types.SimpleNamespace(returncode=rc, stderr=err.getvalue())


def read(path):
    """(metadata, {key: (dtype, shape, bytes)}) after rhckpt's strict checks plus the writer's own
    promises: header keys sorted, space padding to 8, data packed in key order."""
    with open(path, "rb") as f:
        blob = f.read()
    meta, entries = st.parse(path, blob)
    (n,) = struct.unpack("<Q", blob[:8])
    assert n % 8 == 0, n
    header = json.loads(blob[8:8 + n])
    assert list(header) == sorted(header), "header keys not sorted"
    offsets = [header[k]["data_offsets"] for k in sorted(header) if k != "__metadata__"]
    assert offsets == sorted(offsets), "data not in key order"
    return meta, {k: (dt, shape, bytes(raw)) for k, (dt, shape, raw) in entries.items()}


def raw(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    if t.dtype in (torch.bool, torch.int8):
        return t.view(torch.uint8).numpy().tobytes()
    return t.numpy().tobytes()


Point = collections.namedtuple("Point", "x y")
Color = enum.Enum("Color", "RED GREEN")


def handcrafted():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(4, 6, generator=g)
    tensors = {
        "f64": torch.randn(2, 3, generator=g, dtype=torch.float64), "f32": base,
        "f16": torch.randn(5, generator=g).half(), "bf16": torch.randn(3, 2, generator=g).bfloat16(),
        "i64": torch.arange(-3, 3), "i32": torch.arange(4, dtype=torch.int32).reshape(2, 2),
        "i16": torch.tensor([-2, 7], dtype=torch.int16), "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([[True, False], [False, True]]), "i8": torch.tensor([-128, 5, 127], dtype=torch.int8),
        "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3), "transposed": base.t(), "offset_view": base[1:3, 2:],
        "param": torch.nn.Parameter(torch.ones(2)),
    }
    ck = {
        "model": collections.OrderedDict([("layers.0.weight", tensors["f32"]), ("layers.0.bias", tensors["bf16"])]),
        "optimizer": {"state": {3: {"exp_avg": tensors["f16"], "step": tensors["scalar"]}},
                      "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [3]}]},
        "t": tensors,
        "np": {"f32": np.arange(6, dtype=np.float32).reshape(2, 3), "u32": np.array([1, 2 ** 32 - 1], dtype=np.uint32),
               "bool": np.array([True, False]), "i8": np.array([-1, 1], dtype=np.int8), "f64_0d": np.array(0.25)},
        "leaves": {"int": 10, "big": 2 ** 70, "float": 0.1, "true": True, "false": False, "str": "héllo",
                   "none": None, "bytes": b"\x00\xff", "np_f32": np.float32(0.1), "np_i64": np.int64(-7),
                   "np_bool": np.bool_(True), "dtype": torch.bfloat16, "size": torch.Size([2, 3]),
                   "size0": torch.Size([]), "complex": complex(1.5, -2.0), "set": {3, 1}, "inf": float("inf"),
                   "path": pathlib.PurePosixPath("/data/x.bin")},
        "args": argparse.Namespace(lr=0.001, name="run"), "ns": types.SimpleNamespace(k=1),
        "a/b%c": torch.ones(1), 7: "seven", "empty_dict": {}, "empty_list": [], "empty_tuple": (),
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
    }
    return ck, tensors


class Bridge(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="rh_bridge_")
        cls.ck, cls.tensors = handcrafted()
        cls.src = cls.path("ck.pt")
        torch.save(cls.ck, cls.src)
        cls.legacy = cls.path("legacy.pt")
        torch.save(cls.ck, cls.legacy, _use_new_zipfile_serialization=False)
        p = bridge(cls.src, cls.path("ck.st"), cls.src, cls.path("ck2.st"))
        assert p.returncode == 0, p.stderr
        p = bridge("--trust-pickle", cls.legacy, cls.path("legacy.st"))
        assert p.returncode == 0, p.stderr
        cls.meta, cls.out = read(cls.path("ck.st"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    @classmethod
    def path(cls, *parts):
        return os.path.join(cls.tmp, *parts)

    def one_line_refusal(self, p, *needles):
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertTrue(lines[0].startswith("torch_bridge: "), lines[0])
        for n in needles:
            self.assertIn(n, lines[0])
        return lines[0]

    # --- the round trip ----------------------------------------------------------------------
    def test_every_tensor_bytes_dtype_shape(self):
        want = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "U8": torch.uint8}
        for name, t in self.tensors.items():
            dt, shape, data = self.out["t/" + name]
            self.assertEqual(shape, list(t.shape), name)
            self.assertEqual(data, raw(t.detach()), name)
            if t.dtype in (torch.bool, torch.int8):
                self.assertEqual(dt, "U8", name)
                self.assertEqual(self.meta["dtype:t/" + name], "bool" if t.dtype == torch.bool else "int8")
            else:
                self.assertEqual(want[dt], t.dtype, name)
                self.assertNotIn("dtype:t/" + name, self.meta)
        self.assertEqual(self.out["model/layers.0.weight"][2], raw(self.tensors["f32"]))
        self.assertEqual(self.out["optimizer/state/3/exp_avg"][2], raw(self.tensors["f16"]))
        self.assertEqual(self.out["a%2Fb%25c"], ("F32", [1], raw(torch.ones(1))))
        self.assertEqual(self.out["rng/torch"][2], raw(self.ck["rng"]["torch"]))

    def test_numpy_arrays(self):
        n = self.ck["np"]
        self.assertEqual(self.out["np/f32"], ("F32", [2, 3], n["f32"].tobytes()))
        self.assertEqual(self.out["np/u32"], ("I32", [2], n["u32"].tobytes()))
        self.assertEqual(self.meta["dtype:np/u32"], "uint32")
        self.assertEqual(self.out["np/bool"], ("U8", [2], b"\x01\x00"))
        self.assertEqual(self.meta["dtype:np/bool"], "bool")
        self.assertEqual(self.out["np/i8"], ("U8", [2], n["i8"].tobytes()))
        self.assertEqual(self.out["np/f64_0d"], ("F64", [], n["f64_0d"].tobytes()))
        self.assertEqual(self.out["rng/numpy/1"][2], self.ck["rng"]["numpy"][1].tobytes())

    def test_metadata_leaves(self):
        want = {
            "leaves/int": "int:10", "leaves/big": "int:%d" % 2 ** 70, "leaves/float": "float:0x1.999999999999ap-4",
            "leaves/true": "bool:true", "leaves/false": "bool:false", "leaves/str": "str:héllo", "leaves/none": "none:",
            "leaves/bytes": "bytes:00ff", "leaves/np_f32": "numpy.float32:0x1.99999a0000000p-4",
            "leaves/np_i64": "numpy.int64:-7", "leaves/np_bool": "numpy.bool_:true", "leaves/dtype": "dtype:torch.bfloat16",
            "leaves/size": "size:2x3", "leaves/size0": "size:", "leaves/complex": "complex:0x1.8000000000000p+0,-0x1.0000000000000p+1",
            "leaves/set": 'set:["int:1", "int:3"]', "leaves/inf": "float:inf", "leaves/path": "path:/data/x.bin",
            "optimizer/param_groups/0/lr": "float:0x1.0624dd2f1a9fcp-10", "optimizer/param_groups/0/betas/0": "float:0x1.ccccccccccccdp-1",
            "optimizer/param_groups/0/params/0": "int:3", "args/lr": "float:0x1.0624dd2f1a9fcp-10", "args/name": "str:run",
            "ns/k": "int:1", "7": "str:seven", "empty_dict": "empty:dict", "empty_list": "empty:list", "empty_tuple": "empty:list",
            "rng/numpy/0": "str:MT19937", "rng/python/0": "int:3",
        }
        for k, v in want.items():
            self.assertEqual(self.meta.get("leaf:" + k), v, k)
        self.assertEqual(self.meta["class:args"], "argparse.Namespace")
        self.assertEqual(self.meta["rh_bridge"], "1")
        self.assertEqual(self.meta["rh_source:."], "ck.pt")
        # every leaf of random.getstate() is there, exactly
        state = random.getstate()
        self.assertEqual(self.meta["leaf:rng/python/1/624"], "int:%d" % state[1][624])

    def test_deterministic_and_legacy_format(self):
        """The legacy format: refused untrusted, with --trust-pickle (torch.load) the same output
        as the zip file's through the torch-free reader."""
        with open(self.path("ck.st"), "rb") as a, open(self.path("ck2.st"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        self.one_line_refusal(inproc(self.legacy, self.path("legacy_untrusted.st")), "legacy", "trust_pickle")
        self.assertFalse(os.path.exists(self.path("legacy_untrusted.st")))
        meta, out = read(self.path("legacy.st"))
        self.assertEqual(out, self.out)
        self.assertEqual(meta["rh_source:."], "legacy.pt")
        self.assertEqual({k: v for k, v in meta.items() if k != "rh_source:."},
                         {k: v for k, v in self.meta.items() if k != "rh_source:."})

    def test_namedtuple_and_custom_objects_in_process(self):
        flat = torch_bridge.Flat("x", trust=True)
        flat.add("", {"p": Point(1, torch.ones(2))})
        self.assertEqual(flat.meta["leaf:p/x"], "int:1")
        self.assertIn("p/y", flat.tensors)
        self.assertTrue(flat.meta["class:p"].endswith("Point"))
        flat.add("e", Color.RED)
        self.assertEqual(flat.meta["leaf:e"], "enum:__main__.Color.RED")
        for trust in (False, True):   # a function or class object has no flat form
            with self.assertRaisesRegex(torch_bridge.BridgeError, "'f' is a builtins"):
                torch_bridge.Flat("x", trust=trust).add("", {"f": len})
            with self.assertRaisesRegex(torch_bridge.BridgeError, "'c' is a builtins.type"):
                torch_bridge.Flat("x", trust=trust).add("", {"c": Point})

    def test_leaf_cap(self):
        old = bridge_flatten.MAX_LEAVES   # where Flat reads it (torch_bridge re-exports the value)
        bridge_flatten.MAX_LEAVES = 5
        try:
            with self.assertRaisesRegex(torch_bridge.BridgeError, "more than 5 leaves"):
                torch_bridge.Flat("x", trust=False).add("", list(range(6)))
        finally:
            bridge_flatten.MAX_LEAVES = old

    def test_duplicate_keys_refused(self):
        with self.assertRaisesRegex(torch_bridge.BridgeError, "two values flatten to the key '1'"):
            torch_bridge.Flat("x", trust=False).add("", {1: 1, "1": 2})

    # --- directories -----------------------------------------------------------------------------
    def test_directory_with_prefixes(self):
        d = self.path("dir")
        os.makedirs(os.path.join(d, "mp_rank_00"))
        os.makedirs(os.path.join(d, "mp_rank_01"))
        torch.save({"optimizer": {"state": {3: {"exp_avg": torch.ones(2)}}}, "iter": 5},
                   os.path.join(d, "mp_rank_00", "model_optim_rng.pt"))
        torch.save({"w": torch.zeros(3)}, os.path.join(d, "mp_rank_01", "model_optim_rng.pt"))
        with open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write("5")
        shutil.copy(self.path("ck.st"), os.path.join(d, "extra.safetensors"))
        p = inproc(d, self.path("dir.st"))
        self.assertEqual(p.returncode, 0, p.stderr)
        meta, out = read(self.path("dir.st"))
        self.assertEqual(out["mp_rank_00/model_optim_rng.pt/optimizer/state/3/exp_avg"], ("F32", [2], raw(torch.ones(2))))
        self.assertEqual(out["mp_rank_01/model_optim_rng.pt/w"], ("F32", [3], raw(torch.zeros(3))))
        self.assertEqual(meta["leaf:mp_rank_00/model_optim_rng.pt/iter"], "int:5")
        self.assertEqual(meta["rh_source:mp_rank_00/model_optim_rng.pt"], "model_optim_rng.pt")
        self.assertEqual(out["extra.safetensors/t/bf16"], self.out["t/bf16"])   # safetensors copied key by key
        self.assertEqual(meta["leaf:extra.safetensors/__metadata__/leaf:leaves%2Fint"], "str:int:10")
        self.assertFalse(any("latest_checkpointed" in k for k in list(out) + list(meta)))

    # --- safety ----------------------------------------------------------------------------------
    def test_restricted_unpickler_refuses_os_system(self):
        marker = self.path("pwned")

        class Evil:
            def __reduce__(self):
                return (os.system, ("touch " + marker,))
        src = self.path("evil.pt")
        torch.save({"model": {"w": torch.ones(1)}, "x": Evil()}, src)
        line = self.one_line_refusal(bridge(src, self.path("evil.st")), src, "refused to unpickle posix.system",
                                     "--trust-pickle")
        self.assertIn("not a checkpoint type", line)
        self.assertFalse(os.path.exists(marker))
        self.assertFalse(os.path.exists(self.path("evil.st")))
        # the legacy (non-zip) format is not unpickled at all
        torch.save({"x": Evil()}, self.path("evil_legacy.pt"), _use_new_zipfile_serialization=False)
        self.one_line_refusal(inproc(self.path("evil_legacy.pt"), self.path("e2.st")), "legacy")
        self.assertFalse(os.path.exists(marker))

    def test_trust_pickle_accepts_a_harmless_class(self):
        mod_dir = self.path("mods")
        os.makedirs(mod_dir)
        with open(os.path.join(mod_dir, "harmless_cfg.py"), "w") as f:
            f.write("class Config:\n    def __init__(self):\n        self.lr = 0.5\n        self.layers = [1, 2]\n")
        sys.path.insert(0, mod_dir)
        try:
            import harmless_cfg
            torch.save({"cfg": harmless_cfg.Config(), "w": torch.ones(2)}, self.path("cfg.pt"))
        finally:
            sys.path.remove(mod_dir)
        self.one_line_refusal(inproc(self.path("cfg.pt"), self.path("cfg.st")), "refused to unpickle harmless_cfg.Config")
        self.assertFalse(os.path.exists(self.path("cfg.st")))
        p = bridge("--trust-pickle", self.path("cfg.pt"), self.path("cfg.st"), extra_path=mod_dir)
        self.assertEqual(p.returncode, 0, p.stderr)
        meta, out = read(self.path("cfg.st"))
        self.assertEqual(meta["leaf:cfg/lr"], "float:0x1.0000000000000p-1")
        self.assertEqual(meta["leaf:cfg/layers/1"], "int:2")
        self.assertEqual(meta["class:cfg"], "harmless_cfg.Config")
        self.assertEqual(out["w"][2], raw(torch.ones(2)))

    # --- hostile inputs --------------------------------------------------------------------------
    def test_hostile_inputs(self):
        with open(self.src, "rb") as f:
            good = f.read()
        cases = {"truncated.pt": good[:len(good) // 2], "garbage.pt": bytes(range(256)) * 8, "empty.pt": b"",
                 "pickle_garbage.pt": b"\x80\x02garbage", "zip_head_only.pt": good[:64]}
        for name, blob in cases.items():
            with open(self.path(name), "wb") as f:
                f.write(blob)
            run = bridge if name == "truncated.pt" else inproc   # one through the CLI, the rest in-process
            self.one_line_refusal(run(self.path(name), self.path(name + ".st")), self.path(name))
            self.assertFalse(os.path.exists(self.path(name + ".st")), name)
        # a 10^5-deep nested list in a well-formed torch zip
        deep = self.path("deep.pt")
        w = torch._C.PyTorchFileWriter(deep)
        n = 100_000
        pk = b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b"."
        w.write_record("data.pkl", pk, len(pk))
        w.write_end_of_file()
        del w
        self.one_line_refusal(bridge(deep, self.path("deep.st")), deep, "nested deeper")
        # symlinks: as the input, and inside a directory
        os.symlink(self.src, self.path("link.pt"))
        self.one_line_refusal(inproc(self.path("link.pt"), self.path("link.st")), "link.pt", "symlink")
        d = self.path("linkdir")
        os.makedirs(d)
        torch.save({"w": torch.ones(1)}, os.path.join(d, "a.pt"))
        os.symlink(self.src, os.path.join(d, "b.pt"))
        self.one_line_refusal(inproc(d, self.path("linkdir.st")), "b.pt", "symlink")
        # no torch file in a directory; a missing input; a missing output directory
        os.makedirs(self.path("nothing"))
        with open(self.path("nothing", "notes.txt"), "w") as f:
            f.write("hello")
        self.one_line_refusal(inproc(self.path("nothing"), self.path("n.st")), "no torch.save")
        self.one_line_refusal(inproc(self.path("missing.pt"), self.path("m.st")), "missing.pt", "no such file")
        self.one_line_refusal(inproc(self.src, self.path("no_dir", "x.st")), "no_dir")
        # refused tensor kinds name the key
        for name, t in {"sparse": torch.eye(2).to_sparse(), "complex": torch.ones(2, dtype=torch.complex64)}.items():
            torch.save({"model": {name: t}}, self.path(name + ".pt"))
            self.one_line_refusal(inproc(self.path(name + ".pt"), self.path(name + ".st")), "model/" + name, name)
        # usage errors
        self.one_line_refusal(inproc(self.src))
        self.one_line_refusal(inproc())

    def test_distributed_checkpoint_directory_refused(self):
        """A .metadata that is not a DCP Metadata pickle (the real ones: class Dcp)."""
        d = self.path("dcp")
        os.makedirs(d)
        torch.save({"w": torch.ones(1)}, os.path.join(d, "__0_0.distcp"))
        with open(os.path.join(d, ".metadata"), "wb") as f:
            f.write(b"\x80\x04N.")
        self.one_line_refusal(inproc(d, self.path("dcp.st")), "torch.distributed.checkpoint", "not a Metadata")

    def test_torchscript_archive_refused(self):
        src = self.path("script.pt")
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), src)
        self.one_line_refusal(inproc(src, self.path("script.st")), "TorchScript")


sys.path.insert(0, os.path.join(HERE, "conformance"))
import hostile_torch as H  # noqa: E402


class Hostile(unittest.TestCase):
    """Issue 41 (round four): what each attack on the bridge gets now. Every case fails on
    b8ed1e0's bridge (it wrote the .patch file, chmodded the victim, exited 0 on the heap read,
    segfaulted, hung on the FIFO, imported json.py, had no --root)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="rh_bridge_hostile_")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def write(self, name, blob):
        path = os.path.join(self.tmp, name)
        with open(path, "wb") as f:
            f.write(blob)
        return path

    one_line_refusal = Bridge.one_line_refusal

    def refused(self, name, blob, *needles, run=None):
        src = self.write(name, blob)
        out = src + ".st"
        line = self.one_line_refusal((run or inproc)(src, out), src, *needles)
        self.assertFalse(os.path.exists(out))
        self.assertFalse(os.path.exists(out + ".tmp"))
        return line

    def test_legacy_dump_patches_writes_nothing(self):
        target = os.path.join(self.tmp, "elsewhere", "pwned")
        os.makedirs(os.path.dirname(target))
        before = set(os.listdir(self.tmp))
        self.refused("patch.pt", H.legacy_dump_patches(target), "legacy", "non-zip", run=bridge)
        self.assertEqual(os.listdir(os.path.dirname(target)), [])
        self.assertEqual(set(os.listdir(self.tmp)) - before, {"patch.pt"})

    def test_legacy_tar_hard_link_chmods_nothing(self):
        victim = self.write("victim", b"v")
        os.chmod(victim, 0o644)
        os.utime(victim, (1_700_000_000, 1_700_000_000))
        self.refused("link.pt", H.legacy_tar("storages", victim), "legacy", "tar format", run=bridge)
        st_ = os.stat(victim)
        self.assertEqual((st_.st_mode & 0o7777, st_.st_mtime, st_.st_nlink), (0o644, 1_700_000_000, 1))

    def test_legacy_tar_fifo_member_does_not_block(self):
        self.refused("fifo.pt", H.legacy_tar("storages", fifo=True), "legacy", run=lambda *a: bridge(*a, timeout=30))

    def test_storage_larger_than_its_record(self):
        self.refused("over.pt", H.zip_oversize_storage(), "declares 4096 float32 elements", "holds 4 bytes")
        self.refused("huge.pt", H.zip_huge_storage(), "declares 1073741824", run=bridge)   # segfaulted
        self.refused("past.pt", H.zip_tensor_past_storage(), "reaches element 8 of a 4-element storage")

    def test_stride0_expansion_bounded(self):
        src = self.write("stride0.pt", H.zip_stride0())
        p, rss = peak_rss_mib(src, src + ".st")
        self.one_line_refusal(p, "expand to more than 4 x the input")
        self.assertLess(rss, 200, "peak RSS %d MiB" % rss)
        self.assertFalse(os.path.exists(src + ".st"))

    def test_deflate_record_refused(self):
        src = self.write("deflate.pt", H.zip_deflate())
        self.assertLess(os.path.getsize(src), 1 << 20)
        p, rss = peak_rss_mib(src, src + ".st")
        self.one_line_refusal(p, "is compressed (method 8)")
        self.assertLess(rss, 200, "peak RSS %d MiB" % rss)

    def test_million_deep_tuple_key(self):
        self.refused("deep_key.pt", H.zip_deep_key(), "nested deeper than 100 levels", run=bridge)   # segfaulted

    def test_build_on_class_or_dtype_refused(self):
        import argparse
        self.refused("build.pt", H.zip_build_on_class(), "sets the state of the class Namespace")
        self.assertFalse(hasattr(argparse.Namespace, "dump_patches"))
        self.refused("dtype.pt", H.zip_dtype_mutation(), "sets the state of a DType")
        self.assertEqual(str(torch_bridge.torch_zip._DTYPES["float32"]), "torch.float32")

    def test_valid_handmade_file_and_no_torch_import(self):
        src = self.write("valid.pt", H.zip_valid())
        probe = ("import sys; sys.path.insert(0, %r); from rhckpt import torch_bridge as b; "
                 "rc = b.main(sys.argv[1:]); print('torch' in sys.modules); sys.exit(rc)" % PYTHON_DIR)
        p = subprocess.run([sys.executable, "-I", "-c", probe, src, src + ".st"], capture_output=True, text=True, timeout=60)
        self.assertEqual((p.returncode, p.stdout.strip()), (0, "False"), p.stderr)
        meta, out = read(src + ".st")
        self.assertEqual(out["w"], ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)))
        self.assertEqual(out["t"], ("F32", [2, 2], struct.pack("<4f", 1, 3, 2, 4)))

    def test_fifo_input_refused_without_blocking(self):
        fifo = os.path.join(self.tmp, "in.pt")
        os.mkfifo(fifo)
        self.one_line_refusal(bridge(fifo, fifo + ".st", timeout=30), "in.pt", "not a regular file")
        d = os.path.join(self.tmp, "dir")   # in a directory: skipped, never opened
        os.makedirs(d)
        os.mkfifo(os.path.join(d, "a.pt"))
        with open(os.path.join(d, "b.pt"), "wb") as f:
            f.write(H.zip_valid())
        p = bridge(d, d + ".st", timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(sorted(read(d + ".st")[1]), ["b.pt/t", "b.pt/w"])

    def test_json_py_in_cwd_is_not_imported(self):
        marker = os.path.join(self.tmp, "imported")
        cwd = os.path.join(self.tmp, "cwd")
        os.makedirs(cwd)
        for mod in ("json", "zipfile", "numpy"):
            with open(os.path.join(cwd, mod + ".py"), "w") as f:
                f.write("open(%r, 'w').write(%r)\n" % (marker, mod))
        src = self.write("valid.pt", H.zip_valid())
        p = bridge(src, src + ".st", cwd=cwd)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertFalse(os.path.exists(marker))

    def test_planted_links_under_root(self):
        """--root: a link in place of the cell or `flat` directory is refused naming it, and
        nothing appears where it points; a missing directory below the root is created."""
        root = os.path.join(self.tmp, "run")
        outside = os.path.join(self.tmp, "outside")
        os.makedirs(os.path.join(root, "cell"))
        os.makedirs(outside)
        src = self.write("run/cell/ck.pt", H.zip_valid())
        out = os.path.join(root, "cell", "flat", "a.safetensors")
        p = bridge("--root", root, src, out)
        self.assertEqual(p.returncode, 0, p.stderr)
        shutil.rmtree(os.path.join(root, "cell", "flat"))
        os.symlink(outside, os.path.join(root, "cell", "flat"))
        self.one_line_refusal(bridge("--root", root, src, out), os.path.join(root, "cell", "flat"), "symlink")
        os.unlink(os.path.join(root, "cell", "flat"))
        os.rename(os.path.join(root, "cell"), os.path.join(self.tmp, "cell_moved"))
        os.symlink(os.path.join(self.tmp, "cell_moved"), os.path.join(root, "cell"))
        self.one_line_refusal(bridge("--root", root, os.path.join(root, "cell", "ck.pt"), out),
                              os.path.join(root, "cell"), "symlink")
        self.assertEqual(os.listdir(outside), [])
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "cell_moved", "flat")))
        # a link at the output's own name is replaced, not written through
        os.unlink(os.path.join(root, "cell"))
        os.rename(os.path.join(self.tmp, "cell_moved"), os.path.join(root, "cell"))
        os.makedirs(os.path.join(root, "cell", "flat"))
        os.symlink(os.path.join(outside, "x"), out)
        self.assertEqual(bridge("--root", root, src, out).returncode, 0)
        self.assertEqual(os.listdir(outside), [])
        self.assertFalse(os.path.islink(out))
        # the --serve protocol's {"root", "io"} form
        p = subprocess.run([sys.executable, "-I", "-c", torch_bridge.LAUNCHER, PYTHON_DIR, "--serve"],
                           input=json.dumps({"root": root, "io": [src, os.path.join(outside, "y.st")]}) + "\n",
                           capture_output=True, text=True, timeout=60)
        reply = json.loads(p.stdout)
        self.assertFalse(reply["ok"])
        self.assertIn("not below the root", reply["error"])
        self.assertEqual(os.listdir(outside), [])


class CorpusVerdicts(unittest.TestCase):
    """The conformance corpus's torch_* cases (tests/conformance/make_corpus.py): the bridge's
    verdict from expected_bridge.tsv, one line, nothing written into the case's directory (the
    tool's readers' verdict on the same directories is held by the corpus's other consumers)."""

    def test_every_torch_case_gets_its_bridge_verdict(self):
        tmp = tempfile.mkdtemp(prefix="rh_bridge_corpus_")
        try:
            gen = [sys.executable, os.path.join(HERE, "conformance", "make_corpus.py"), os.path.join(tmp, "c")]
            names = [line.split("\t")[0] for line in subprocess.run(gen[:2] + ["--list"], capture_output=True, text=True,
                                                                     check=True).stdout.splitlines()
                     if line.startswith(("torch_", "dcp_"))]
            subprocess.run(gen + names, check=True, timeout=120)
            with open(os.path.join(tmp, "c", "expected_bridge.tsv")) as f:
                rows = [line.rstrip("\n").split("\t") for line in f]
            self.assertGreaterEqual(len(rows), 20)
            for name, code, reason, what in rows:
                d = os.path.join(tmp, "c", name)
                before = sorted(os.listdir(d))
                out = os.path.join(tmp, name + ".st")
                src = os.path.join(d, "checkpoint.pt") if what == "checkpoint.pt" else d
                p = inproc(src, out)
                if code == "0":
                    self.assertEqual(p.returncode, 0, name + ": " + p.stderr)
                    if name.startswith("dcp_"):   # reassembled from its chunks
                        self.assertEqual(read(out)[1]["w"], ("F32", [4, 2], struct.pack("<8f", *range(8))), name)
                else:
                    self.one_line_refusal(p, src, reason)
                    self.assertFalse(os.path.exists(out), name)
                self.assertEqual(sorted(os.listdir(d)), before, name)
                if os.path.exists(os.path.join(d, "victim")):
                    self.assertEqual(os.stat(os.path.join(d, "victim")).st_mode & 0o7777, 0o644, name)
        finally:
            shutil.rmtree(tmp)

    one_line_refusal = Bridge.one_line_refusal


def dcp_modules():
    """torch 1.13's torch.distributed._shard.checkpoint (metadata, filesystem) and sharded_tensor
    metadata. They do not import on Python 3.11 as shipped (a dataclass field defaults to an
    unhashable dataclass instance): dataclasses get an identity hash while they import."""
    import dataclasses
    orig = dataclasses.dataclass

    def hashable(cls=None, **kw):
        def wrap(c):
            c = orig(c, **kw) if kw else orig(c)
            if c.__hash__ is None:
                c.__hash__ = object.__hash__
            return c
        return wrap(cls) if cls is not None else wrap
    dataclasses.dataclass = hashable
    try:
        import torch.distributed._shard.checkpoint as dcp
        import torch.distributed._shard.checkpoint.filesystem as fs
        import torch.distributed._shard.checkpoint.metadata as md
        import torch.distributed._shard.sharded_tensor.metadata as stm
    finally:
        dataclasses.dataclass = orig
    return dcp, fs, md, stm


def write_chunked_dcp(d, w, rows, protocol=4, newer=False, chunk_rows=None, length_extra=0):
    """A DCP directory holding tensor `w` in row chunks `rows` ([(begin, end)], one .distcp file
    each, a torch.save blob at an offset after 16 bytes of padding), plus the bytes item "step" = 7,
    written with torch 1.13's own dataclasses. newer: the pickle's class paths rewritten to
    torch.distributed.checkpoint.metadata / .filesystem (torch >= 2.0's module)."""
    _, fs, md, stm = dcp_modules()
    os.makedirs(d)
    chunks, storage = [], {}
    for n, (b, e) in enumerate(chunk_rows or rows):
        buf = io.BytesIO()
        torch.save(w[b:e].clone(), buf)
        blob = buf.getvalue()
        name = "__0_%d.distcp" % n
        with open(os.path.join(d, name), "wb") as f:
            f.write(b"\0" * 16 + blob)
        off = torch.Size([b] + [0] * (w.dim() - 1))
        chunks.append(md.ChunkStorageMetadata(offsets=off, sizes=torch.Size([e - b] + list(w.shape[1:]))))
        storage[md.MetadataIndex("w", off, n)] = fs._StorageInfo(name, 16, len(blob) + length_extra)
    buf = io.BytesIO()
    torch.save(7, buf)
    with open(os.path.join(d, "__1_0.distcp"), "wb") as f:
        f.write(buf.getvalue())
    storage[md.MetadataIndex("step")] = fs._StorageInfo("__1_0.distcp", 0, len(buf.getvalue()))
    props = stm.TensorProperties(dtype=w.dtype, layout=torch.strided, requires_grad=False,
                                 memory_format=torch.contiguous_format, pin_memory=False)
    meta = md.Metadata(state_dict_metadata={"w": md.TensorStorageMetadata(properties=props, size=w.shape, chunks=chunks),
                                            "step": md.BytesStorageMetadata()},
                       planner_data=None, storage_data=storage)
    import pickle
    raw = pickle.dumps(meta, protocol=2 if newer else protocol)
    if newer:
        for old, new in ((b"torch.distributed._shard.checkpoint.metadata\n", b"torch.distributed.checkpoint.metadata\n"),
                         (b"torch.distributed._shard.sharded_tensor.metadata\n", b"torch.distributed.checkpoint.metadata\n"),
                         (b"torch.distributed._shard.checkpoint.filesystem\n", b"torch.distributed.checkpoint.filesystem\n")):
            assert old in raw, old
            raw = raw.replace(old, new)
        raw = raw.replace(b"\nMEM_FORMAT_ENCODING\n", b"\n_MEM_FORMAT_ENCODING\n")
    with open(os.path.join(d, ".metadata"), "wb") as f:
        f.write(raw)


class Dcp(unittest.TestCase):
    """torch.distributed.checkpoint directories (issue 43), read without torch (rhckpt/dcp.py):
    torch 1.13's own FileSystemWriter, hand-chunked tensors with 1.13's classes and with the newer
    module's class paths, a changed element, and hostile directories."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="rh_bridge_dcp_")
        g = torch.Generator().manual_seed(5)
        cls.w = torch.randn(4, 3, generator=g)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    one_line_refusal = Bridge.one_line_refusal

    def path(self, *p):
        return os.path.join(self.tmp, *p)

    def test_torch_113_writer(self):
        dcp, _, _, _ = dcp_modules()
        sd = {"model.w": self.w, "b": torch.arange(5), "h": torch.ones(3).bfloat16(), "step": 3, "cfg": {"lr": 0.5}}
        dcp.save_state_dict(sd, dcp.FileSystemWriter(self.path("w113")), no_dist=True)
        self.assertTrue(os.path.exists(self.path("w113", ".metadata")))
        p = inproc(self.path("w113"), self.path("w113.st"))
        self.assertEqual(p.returncode, 0, p.stderr)
        meta, out = read(self.path("w113.st"))
        self.assertEqual(out["model.w"], ("F32", [4, 3], raw(self.w)))
        self.assertEqual(out["b"], ("I64", [5], raw(torch.arange(5))))
        self.assertEqual(out["h"][2], raw(torch.ones(3).bfloat16()))
        self.assertEqual(meta["leaf:step"], "int:3")
        self.assertEqual(meta["leaf:cfg/lr"], "float:0x1.0000000000000p-1")
        # one changed element: only that key's bytes differ
        sd2 = dict(sd, **{"model.w": self.w.clone()})
        sd2["model.w"][2, 1] += 1
        dcp.save_state_dict(sd2, dcp.FileSystemWriter(self.path("w113b")), no_dist=True)
        self.assertEqual(inproc(self.path("w113b"), self.path("w113b.st")).returncode, 0)
        _, out2 = read(self.path("w113b.st"))
        self.assertEqual(sorted(k for k in out if out[k] != out2[k]), ["model.w"])

    def test_chunks_reassembled_both_class_paths(self):
        for newer in (False, True):
            d = self.path("chunked_%d" % newer)
            write_chunked_dcp(d, self.w, [(0, 1), (1, 3), (3, 4)], newer=newer)
            p = inproc(d, d + ".st")
            self.assertEqual(p.returncode, 0, p.stderr)
            meta, out = read(d + ".st")
            self.assertEqual(out["w"], ("F32", [4, 3], raw(self.w)), newer)
            self.assertEqual(meta["leaf:step"], "int:7")

    def test_hostile_directories(self):
        d = self.path("past")
        write_chunked_dcp(d, self.w, [(0, 2), (2, 4)], length_extra=1)
        self.one_line_refusal(inproc(d, d + ".st"), "past its end")
        d = self.path("overlap")
        write_chunked_dcp(d, self.w, [(0, 2), (1, 4)])
        self.one_line_refusal(inproc(d, d + ".st"), "overlap")
        d = self.path("gap")
        write_chunked_dcp(d, self.w, [(0, 1), (2, 4)])
        self.one_line_refusal(inproc(d, d + ".st"), "cover 9 of its 12 elements")
        d = self.path("evil")
        write_chunked_dcp(d, self.w, [(0, 4)])
        marker = self.path("evil_ran")
        with open(os.path.join(d, ".metadata"), "wb") as f:
            f.write(b"\x80\x02cposix\nsystem\nX" + struct.pack("<I", len("touch " + marker)) +
                    ("touch " + marker).encode() + b"\x85R.")
        self.one_line_refusal(inproc(d, d + ".st"), ".metadata: refused to unpickle posix.system")
        self.assertFalse(os.path.exists(marker))
        d = self.path("escape")
        write_chunked_dcp(d, self.w, [(0, 4)])
        with open(os.path.join(d, ".metadata"), "rb") as f:
            m = f.read()
        with open(os.path.join(d, ".metadata"), "wb") as f:
            f.write(m.replace(b"\x8c\x0c__0_0.distcp", b"\x8c\x0c../0_0.distc"))
        self.one_line_refusal(inproc(d, d + ".st"), "not a plain file name")
        os.makedirs(self.path("nometa"))
        open(self.path("nometa", "__0_0.distcp"), "wb").close()
        self.one_line_refusal(inproc(self.path("nometa"), self.path("nometa.st")), "without a .metadata")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
