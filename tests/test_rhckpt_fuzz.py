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
