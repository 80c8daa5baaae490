#!/usr/bin/python3
"""Fuzzing `python3 -m rhckpt`: hostile input must end in exit 1 or 2 with one
line naming the file, never a traceback, an internal error (exit 3) or a hang. A deterministic
mutation loop over the conformance bases (tests/conformance/base): each input changes one thing
and RESEALS the checksums, so it reaches the parser or rule behind them instead of stopping at the
checksum:
  - manifest: a field replaced by a value of another type or an extreme one (null, -1, 2^64, 1.5,
    "", a NUL string, [], {}, deep nesting), a field deleted, an array element duplicated;
  - a safetensors header: the same, on its JSON;
  - a compressed file's table (rh_tensors): the same, on its JSON;
  - a data file: random bytes flipped, truncated or extended.
The torch bridge's reader (python/rhckpt/torch_zip.py, issue 41) gets its own loop (BridgeFuzz,
RH_BRIDGE_FUZZ_ITERATIONS, default 400): a hand-made torch.save zip whose data.pkl has bytes
flipped, opcodes inserted, ranges deleted or repeated, ints made huge, or whose zip bytes are
flipped or cut, converted in-process with a 5 s alarm: each must convert or be refused with one
BridgeError line naming the file, never another exception or a hang.
CI runs a bounded number (RH_FUZZ_ITERATIONS, default 500: about 15 s), and every 10th input also
through the tool's `inspect` (CTest passes its path), which must give the same exit code; any count
and seed run by hand:

    tests/test_rhckpt_fuzz.py --iterations 20000 --seed 7     prints tried / accepted / refused / crashes
    tests/test_rhckpt_fuzz.py --iterations 500 --tool build/resume-harness
                              also runs `resume-harness inspect` on every input and counts the
                              inputs where the two readers' exit codes differ (differential)
    tests/test_rhckpt_fuzz.py --iterations 500 --export DIR
                              keeps every input as DIR/fNNNNN with rhckpt's exit code in
                              DIR/expected.tsv, the conformance corpus's form: then
                              RH_CONFORMANCE_CORPUS=DIR ctest -R test_checkpoint_conformance
                              holds the tool's reader to rhckpt's verdicts (differential)
"""
import argparse
import contextlib
import importlib.util
import io
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from rhckpt.__main__ import main  # noqa: E402

_spec = importlib.util.spec_from_file_location("make_corpus", os.path.join(HERE, "conformance", "make_corpus.py"))
corpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corpus)

ODD_VALUES = [None, -1, 0, 1, 2 ** 63, 2 ** 64, 1.5, -0.0, "", "\0", "x" * 300, "zz", "../x", [], {}, [[[[[]]]]],
              {"a": {"b": {"c": {}}}}, True, False, [None], {"": None}]


def paths(node, prefix=()):
    """Every (path, value) in a JSON tree, containers included."""
    yield prefix, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, prefix + (i,))


def mutate_json(rng, root):
    """One structural change of a JSON tree, in place; returns a description."""
    all_paths = [p for p, _ in paths(root) if p]
    p = rng.choice(all_paths)
    parent = root
    for k in p[:-1]:
        parent = parent[k]
    what = rng.random()
    if what < 0.6:
        v = rng.choice(ODD_VALUES)
        if rng.random() < 0.1:
            v = json.loads("[" * 200 + "]" * 200)
        parent[p[-1]] = v
        return "set %s = %s" % ("/".join(map(str, p)), json.dumps(v)[:40])
    if what < 0.8:
        if isinstance(parent, dict):
            del parent[p[-1]]
        else:
            parent.pop(p[-1])
        return "delete " + "/".join(map(str, p))
    if isinstance(parent, list):
        parent.append(parent[p[-1]])
        return "duplicate " + "/".join(map(str, p))
    v = parent[p[-1]]
    parent[p[-1]] = v + rng.choice([-1, 1, 1 << 40]) if isinstance(v, int) and not isinstance(v, bool) else rng.choice(ODD_VALUES)
    return "nudge " + "/".join(map(str, p))


class Fuzzer:
    def __init__(self, seed, work, tool=None, export=None, tool_every=1):
        self.tool, self.tool_every = tool, tool_every
        self.export = export
        self.disagreements = []
        self.rng = random.Random(seed)
        self.work = work
        self.stats = {"tried": 0, "accepted": 0, "refused": 0, "crashes": 0}
        self.crashes = []
        self.seconds = 0.0

    def fresh(self):
        d = os.path.join(self.work, "case")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(os.path.join(HERE, "conformance", "base", self.rng.choice(corpus.BASES)), d)
        return corpus.Ckpt(d)

    def one(self):
        c = self.fresh()
        kind = self.rng.randrange(4)
        name = self.rng.choice([f["name"] for f in c.m["files"]])
        if kind == 0:
            desc = "manifest: " + mutate_json(self.rng, c.m)
        elif kind == 1:
            header, data = c.read_st(name)
            blobs = c.blobs(header, data)
            desc = name + " header: " + mutate_json(self.rng, header)
            text = json.dumps(header, separators=(",", ":")).encode()
            with open(c.path(name), "wb") as f:   # offsets as mutated: the parser must judge them
                f.write(struct.pack("<Q", len(text)) + text + b"".join(b for b in blobs.values()))
            c.reseal_file(name)
        elif kind == 2 and "compress" in c.file_entry(name):
            header, data, table = c.rh_table(name)
            desc = name + " rh_tensors: " + mutate_json(self.rng, table)
            c.write_table(name, header, c.blobs(header, data), table)
        else:
            with open(c.path(name), "rb") as f:
                b = bytearray(f.read())
            op = self.rng.randrange(3)
            if op == 0:
                for _ in range(self.rng.randint(1, 8)):
                    b[self.rng.randrange(len(b))] ^= 1 << self.rng.randrange(8)
            elif op == 1:
                del b[self.rng.randrange(len(b)):]
            else:
                b += bytes(self.rng.randrange(256) for _ in range(self.rng.randint(1, 64)))
            with open(c.path(name), "wb") as f:
                f.write(bytes(b))
            c.reseal_file(name)
            desc = "%s bytes: op %d" % (name, op)
        c.save(reseal=True)
        self.run(c.d, desc)

    def run(self, d, desc):
        err = io.StringIO()
        t0 = time.monotonic()
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                rc = main([d])
        except BaseException as e:   # noqa: BLE001 (anything escaping main is a crash)
            rc = "%s: %s" % (type(e).__name__, str(e)[:200])
        self.seconds += time.monotonic() - t0
        self.stats["tried"] += 1
        lines = err.getvalue().strip().splitlines()
        if self.tool and self.stats["tried"] % self.tool_every == 0:
            p = subprocess.run([self.tool, "inspect", d], capture_output=True, text=True, errors="replace", timeout=120)
            if p.returncode != rc:
                last = (p.stdout.strip().splitlines() or [""])[-1]
                self.disagreements.append("%s: rhckpt %s (%s), tool %d (%s)" % (desc, rc, " | ".join(lines)[:200], p.returncode,
                                                                           last[:200]))
        if self.export and rc in (0, 1, 2):
            name = "f%05d" % self.stats["tried"]
            shutil.copytree(d, os.path.join(self.export, name), symlinks=True)
            with open(os.path.join(self.export, "expected.tsv"), "a") as f:
                f.write("%s\t%d\tfuzz\t\n" % (name, rc))
        if rc == 0:
            self.stats["accepted"] += 1
        elif rc in (1, 2) and len(lines) == 1 and d in lines[0] and "Traceback" not in lines[0]:
            self.stats["refused"] += 1
        else:
            self.stats["crashes"] += 1
            self.crashes.append("%s -> %s %s" % (desc, rc, " | ".join(lines)[:300]))


def fuzz(iterations, seed, tool=None, export=None, tool_every=1):
    work = tempfile.mkdtemp(prefix="rh_rhckpt_fuzz_")
    try:
        f = Fuzzer(seed, work, tool, export, tool_every)
        for _ in range(iterations):
            f.one()
        return f
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bridge_seed():
    """(data.pkl, records) of a torch.save zip file holding every container and leaf kind."""
    import argparse
    import collections
    import pickle
    sys.path.insert(0, os.path.join(HERE, "conformance"))
    import hostile_torch as ht
    extra = pickle.dumps({"a": [1, 2.5, "x", (1, 2), 2 ** 70], "b": collections.OrderedDict(c=None, d=b"xx"),
                          "ns": argparse.Namespace(lr=1), "s": {1, 2}, "sl": slice(1, 2), "z": 1j}, 2)[2:-1]
    pkl = (ht.PROTO + b"}" + ht.s("w") + ht.tensor("0", 6, (2, 3), (3, 1)) + b"s" + ht.s("t") +
           ht.tensor("0", 6, (3, 2), (1, 3), storage="FloatStorage") + b"s" + ht.s("i") +
           ht.tensor("1", 2, (2,), (1,), storage="LongStorage") + b"s" + ht.s("m") + extra + b"s.")
    return pkl, {"0": struct.pack("<6f", *range(6)), "1": struct.pack("<2q", -1, 7)}


def bridge_fuzz(iterations, seed):
    """(stats, crashes) of the bridge's reader over mutated torch.save files."""
    import signal
    sys.path.insert(0, os.path.join(HERE, "conformance"))
    import hostile_torch as ht
    from rhckpt import torch_bridge
    rng = random.Random(seed)
    pkl0, records = bridge_seed()
    ops = [b"(", b"t", b"}", b"]", b"s", b"u", b"a", b"e", b"R", b"b", b"Q", b"0", b"2", b"N", b"\x85", b"\x86",
           b"\x87", b"\x88", b"h\x00", b"q\x00", b"\x94", b"K\xff", b"J\xff\xff\xff\x7f", b"\x8a\x08" + b"\xff" * 8,
           b"cbuiltins\nset\n", b"ctorch\nfloat32\n", b"ctorch\nSize\n", b"cargparse\nNamespace\n", b"."]
    stats, crashes = {"tried": 0, "accepted": 0, "refused": 0}, []
    work = tempfile.mkdtemp(prefix="rh_bridge_fuzz_")

    def alarm(*_):
        raise TimeoutError("the bridge took more than 5 s")
    old = signal.signal(signal.SIGALRM, alarm)
    try:
        for n in range(iterations):
            pkl, recs = bytearray(pkl0), dict(records)
            kind = rng.randrange(7)
            at = rng.randrange(2, len(pkl) - 1)
            if kind == 0:
                pkl[at] = rng.randrange(256)
            elif kind == 1:
                pkl[at:at] = rng.choice(ops)
            elif kind == 2:
                del pkl[at:at + rng.randrange(1, 40)]
            elif kind == 3:
                pkl[at:at] = pkl[at:at + rng.randrange(1, 60)] * rng.randrange(2, 50)
            elif kind == 4:
                recs[rng.choice(list(recs))] = bytes(rng.randrange(40))
            blob = bytearray(ht.zip_bytes(bytes(pkl), recs))
            if kind == 5:
                for _ in range(rng.randrange(1, 8)):
                    blob[rng.randrange(len(blob))] = rng.randrange(256)
            elif kind == 6:
                del blob[rng.randrange(len(blob)):]
            src = os.path.join(work, "f%05d.pt" % n)
            with open(src, "wb") as f:
                f.write(blob)
            stats["tried"] += 1
            signal.alarm(5)
            try:
                torch_bridge.convert(src, src + ".st")
                stats["accepted"] += 1
            except torch_bridge.BridgeError as e:
                line = str(e)
                if "\n" in line or src not in line or "internal error" in line:
                    crashes.append("kind %d: %s" % (kind, line[:300]))
                else:
                    stats["refused"] += 1
            except BaseException as e:   # noqa: BLE001 (anything else escaping convert is a crash)
                crashes.append("kind %d: %s: %s" % (kind, type(e).__name__, str(e)[:300]))
            finally:
                signal.alarm(0)
            for p in (src, src + ".st"):
                if os.path.exists(p):
                    os.unlink(p)
    finally:
        signal.signal(signal.SIGALRM, old)
        shutil.rmtree(work, ignore_errors=True)
    return stats, crashes


class BridgeFuzz(unittest.TestCase):
    def test_no_input_crashes_the_bridge(self):
        n = int(os.environ.get("RH_BRIDGE_FUZZ_ITERATIONS", "400"))
        t0 = time.monotonic()
        stats, crashes = bridge_fuzz(n, seed=41)
        print("bridge fuzz: %(tried)d inputs, %(accepted)d accepted, %(refused)d refused" % stats,
              "%d crashes (%.1f s)" % (len(crashes), time.monotonic() - t0), file=sys.stderr)
        self.assertEqual(crashes, [], "\n".join(crashes[:20]))
        self.assertEqual(stats["tried"], n)
        self.assertGreater(stats["refused"], n // 4)   # the mutations reach the checks
        self.assertGreater(stats["accepted"], 0)       # and the seed itself is valid


TOOL = None   # CTest passes the tool: every 10th input is also judged by its `inspect`


class Fuzz(unittest.TestCase):
    def test_no_input_crashes_the_reader(self):
        n = int(os.environ.get("RH_FUZZ_ITERATIONS", "500"))
        f = fuzz(n, seed=32, tool=TOOL, tool_every=10)
        print("rhckpt fuzz: %(tried)d inputs, %(accepted)d accepted, %(refused)d refused, %(crashes)d crashes" % f.stats,
              "(%.1f s in the reader)" % f.seconds, file=sys.stderr)
        self.assertEqual(f.crashes, [], "\n".join(f.crashes[:20]))
        self.assertEqual(f.disagreements, [], "\n".join(f.disagreements[:20]))
        self.assertEqual(f.stats["tried"], n)
        self.assertGreater(f.stats["refused"], n // 2)   # the mutations reach the rules


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("--"):
        ap = argparse.ArgumentParser()
        ap.add_argument("--iterations", type=int, default=20000)
        ap.add_argument("--seed", type=int, default=7)
        ap.add_argument("--tool", help="resume-harness binary: compare its inspect verdict on every input")
        ap.add_argument("--export", help="keep every input and rhckpt's verdict here (conformance corpus form)")
        a = ap.parse_args()
        if a.export:
            os.makedirs(a.export)
        t0 = time.monotonic()
        f = fuzz(a.iterations, a.seed, a.tool, a.export)
        print("rhckpt fuzz (seed %d): %d inputs, %d accepted, %d refused, %d crashes, %.0f s%s"
              % (a.seed, f.stats["tried"], f.stats["accepted"], f.stats["refused"], f.stats["crashes"], time.monotonic() - t0,
                 ", %d verdicts differ from the tool's" % len(f.disagreements) if a.tool else ""))
        for c in f.crashes[:50]:
            print("CRASH", c)
        for c in f.disagreements[:50]:
            print("DIFFERS", c)
        sys.exit(1 if f.crashes or f.disagreements else 0)
    if len(sys.argv) > 1 and os.access(sys.argv[1], os.X_OK):
        TOOL = sys.argv[1]
    unittest.main(argv=sys.argv[:1])
