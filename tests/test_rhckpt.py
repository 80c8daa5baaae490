#!/usr/bin/python3
"""The rhckpt package (python/rhckpt) on checkpoints the tool wrote: every storage mode (fp32
master, fp16 master, bf16 weight + int16 remainder; fp32/bf16/fp16/fp8 moments), every save
policy (master() for each), two data-parallel ranks and a compressed checkpoint, and the torch
tensors to_torch()/state_dict() give in the stored dtypes. Values are compared bit for bit with
the tool's own lossless dump of the same state (`train --dump-states` writes state_at_save/),
which the package reads independently; negative controls: a flipped byte in a plain and in a
compressed file, a compressed block damaged under a resealed manifest, a missing path.

Usage: test_rhckpt.py PATH_TO_resume-harness   (CTest passes it)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(HERE, "..", "python")
sys.path.insert(0, PYTHON_DIR)
import rhckpt  # noqa: E402

TOOL = None
PA = ["--use-precision-aware-optimizer"]
# name -> train flags; each saves at iteration 3 of 3 with --dump-states.
MODES = {
    "fp32-states": [],
    "bf16-remainders": PA + ["--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"],
    "fp16-fp32master": PA + ["--no-store-param-remainders", "--exp-avg-dtype", "fp16", "--exp-avg-sq-dtype", "fp16"],
    "fp8-fp16master": PA + ["--no-store-param-remainders", "--main-params-dtype", "fp16", "--exp-avg-dtype", "fp8",
                            "--exp-avg-sq-dtype", "fp8"],
    "bf16-fp8-dp2-zstd": PA + ["--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "fp8", "--nproc", "2",
                               "--save-compress", "zstd"],
    "bf16-policy-fp32": PA + ["--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16", "--save-policy", "fp32"],
    "bf16-policy-per_key": PA + ["--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16", "--save-policy", "per_key"],
    "bf16-policy-fully_reshardable": PA + ["--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16",
                                           "--save-policy", "fully_reshardable"],
    "bf16-policy-dp_zero": PA + ["--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16", "--save-policy", "dp_zero"],
    "fp16-policy-fp32": PA + ["--no-store-param-remainders", "--exp-avg-dtype", "fp16", "--exp-avg-sq-dtype", "fp16",
                              "--save-policy", "fp32"],
}
STATES = ("exp_avg", "exp_avg_sq")


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint8 if a.itemsize == 1 else np.dtype("u%d" % a.itemsize))


def run_module(*args):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    return subprocess.run([sys.executable, "-m", "rhckpt"] + list(args), env=env, capture_output=True, text=True)


class Written(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="rh_rhckpt_")
        cls.runs = {}
        for name, flags in MODES.items():
            out = os.path.join(cls.root, name)
            p = subprocess.run([TOOL, "train", "--quiet", "--out", out, "--train-iters", "3", "--save-at", "3",
                                "--save", os.path.join(out, "ckpt"), "--dump-states"] + flags,
                               capture_output=True, text=True)
            assert p.returncode == 0, name + ": " + p.stderr
            cls.runs[name] = out

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root)

    def opened(self, name):
        out = self.runs[name]
        return rhckpt.open(os.path.join(out, "ckpt")), rhckpt.open(os.path.join(out, "state_at_save"))

    def params(self, ck):
        return [k for k in ck.keys() if "/" not in k]

    def test_native_checkpoints_equal_the_dump_bit_for_bit(self):
        compared = 0
        for name in ("fp32-states", "bf16-remainders", "fp16-fp32master", "fp8-fp16master", "bf16-fp8-dp2-zstd"):
            with self.subTest(mode=name):
                ck, dump = self.opened(name)
                self.assertEqual(ck.keys(), dump.keys())
                for key in ck.keys():
                    self.assertEqual(ck.dtype(key), dump.dtype(key), key)
                    np.testing.assert_array_equal(bits(ck.stored(key)), bits(dump.stored(key)), key)
                    compared += 1
                for p in self.params(ck):
                    np.testing.assert_array_equal(bits(ck.master(p)), bits(dump.master(p)), p)
                    for s in STATES:
                        np.testing.assert_array_equal(bits(ck.unscaled(p + "/" + s)), bits(dump.unscaled(p + "/" + s)))
        self.assertGreater(compared, 500)

    def test_master_from_remainder_is_the_widened_weight_plus_remainder(self):
        ck, _ = self.opened("bf16-remainders")
        p = self.params(ck)[0]
        w = ck.stored(p).astype(np.int64).reshape(-1)
        r = ck.stored(p + "/remainder").astype(np.int64).reshape(-1)
        # Slow and obvious: the high half is the weight, minus one when the remainder is negative.
        want = [((int(wi) - (1 if ri < 0 else 0)) & 0xFFFF) << 16 | (int(ri) & 0xFFFF) for wi, ri in zip(w, r)]
        self.assertEqual(bits(ck.master(p)).reshape(-1).tolist(), want)
        self.assertTrue(np.any(r < 0) and np.any(r > 0))

    def test_data_parallel_shards_join_into_whole_tensors(self):
        ck, _ = self.opened("bf16-fp8-dp2-zstd")
        self.assertEqual(ck.manifest["dp_size"], 2)
        split = [k for k in ck.keys() if len(ck.pieces(k)) == 2 and not k.endswith("scale") and "scale" not in k]
        self.assertTrue(split, "no parameter was split across the two ranks")
        for k in split:
            p = k.split("/")[0]
            self.assertEqual(ck.unscaled(k).shape, ck.value(p).shape, k)
        self.assertLess(sum(ck.stored_bytes.values()), sum(ck.raw_bytes.values()))

    def test_fp32_policy_holds_the_unscaled_states(self):
        for name, native in (("bf16-policy-fp32", "bf16-remainders"), ("fp16-policy-fp32", "fp16-fp32master")):
            with self.subTest(mode=name):
                ck, dump = self.opened(name)
                for p in self.params(ck):
                    for s in STATES:
                        self.assertEqual(ck.dtype(p + "/" + s), "F32")
                        np.testing.assert_array_equal(bits(ck.value(p + "/" + s)), bits(dump.unscaled(p + "/" + s)))
                    np.testing.assert_array_equal(bits(ck.master(p)), bits(dump.master(p)), p)

    def test_per_key_policy_keeps_bf16_moments_and_the_model(self):
        ck, dump = self.opened("bf16-policy-per_key")
        for p in self.params(ck):
            np.testing.assert_array_equal(bits(ck.stored(p)), bits(dump.stored(p)))
            for s in STATES:
                self.assertEqual(ck.dtype(p + "/" + s), "BF16")
                np.testing.assert_array_equal(bits(ck.value(p + "/" + s)), bits(dump.unscaled(p + "/" + s)))

    def test_master_works_for_every_save_policy(self):
        # per_key, fully_reshardable and dp_zero widen the int16 remainder into an F32 container
        # (master() raised a KeyError for them); the master is the dump's, bit for bit, in each.
        for name in ("bf16-remainders", "bf16-policy-fp32", "bf16-policy-per_key", "bf16-policy-fully_reshardable",
                     "bf16-policy-dp_zero", "fp16-policy-fp32", "fp32-states", "fp8-fp16master"):
            with self.subTest(mode=name):
                ck, dump = self.opened(name)
                params = self.params(ck)
                self.assertTrue(params)
                for p in params:
                    m = ck.master(p)
                    self.assertEqual(m.dtype, np.float32, p)
                    np.testing.assert_array_equal(bits(m), bits(dump.master(p)), p)
        ck, _ = self.opened("bf16-policy-per_key")
        p = self.params(ck)[0]
        self.assertEqual(ck.dtype(p + "/remainder"), "F32")

    def test_to_torch_and_state_dict_keep_the_stored_dtypes(self):
        import torch
        want = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I16": torch.int16,
                "U8": torch.uint8, "F8_E4M3": getattr(torch, "float8_e4m3fn", torch.uint8)}
        seen = set()
        for name in ("bf16-remainders", "fp16-fp32master", "fp8-fp16master", "bf16-fp8-dp2-zstd", "bf16-policy-per_key"):
            with self.subTest(mode=name):
                ck, _ = self.opened(name)
                sd = ck.state_dict()
                self.assertEqual(sorted(sd), ck.keys())
                for key, t in sd.items():
                    dt = ck.dtype(key)
                    seen.add(dt)
                    self.assertIsInstance(t, torch.Tensor, key)
                    self.assertEqual(t.dtype, want[dt], key)
                    stored = ck.stored(key)
                    self.assertEqual(tuple(t.shape), stored.shape, key)
                    # the same bits as stored(): reinterpreted, never converted
                    tb = t.view(torch.int16) if dt == "BF16" else t.view(torch.uint8) if dt == "F8_E4M3" else t
                    np.testing.assert_array_equal(bits(tb.numpy()), bits(stored), key)
                    if dt in ("BF16", "F16", "F32"):   # and the values torch computes with are decode()'s
                        np.testing.assert_array_equal(bits(t.float().numpy()), bits(ck.value(key).astype(np.float32)))
                p = self.params(ck)[0]
                self.assertTrue(torch.equal(ck.to_torch(p), sd[p]))
        self.assertTrue({"BF16", "F16", "F32", "I16", "F8_E4M3"} <= seen, seen)

    def test_to_torch_without_torch_says_what_to_install(self):
        ck, _ = self.opened("bf16-remainders")
        saved = sys.modules.get("torch")
        sys.modules["torch"] = None   # import torch raises ImportError
        try:
            with self.assertRaises(ImportError) as e:
                ck.state_dict()
            self.assertIn("need torch", str(e.exception))
        finally:
            sys.modules["torch"] = saved
        self.assertEqual(ck.stored(self.params(ck)[0]).dtype, np.uint16)   # numpy needs no torch

    def copy(self, name):
        d = tempfile.mkdtemp(prefix="rh_rhckpt_bad_", dir=self.root)
        shutil.copytree(os.path.join(self.runs[name], "ckpt"), os.path.join(d, "ckpt"))
        ck = rhckpt.open(os.path.join(d, "ckpt"))
        return ck.dir

    def flip(self, path, at):
        with open(path, "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x10]))

    def test_flipped_bytes_are_named_with_exit_1(self):
        for name in ("bf16-remainders", "bf16-fp8-dp2-zstd"):
            with self.subTest(mode=name):
                d = self.copy(name)
                path = os.path.join(d, "optim_rank_00000.safetensors")
                self.flip(path, os.path.getsize(path) - 3)
                with self.assertRaises(rhckpt.Damaged) as e:
                    rhckpt.open(d)
                self.assertIn("optim_rank_00000.safetensors", str(e.exception))
                p = run_module(d)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn("optim_rank_00000.safetensors", p.stderr)

    def test_damaged_block_under_a_resealed_manifest_names_the_tensor(self):
        import xxhash
        d = self.copy("bf16-fp8-dp2-zstd")
        path = os.path.join(d, "optim_rank_00001.safetensors")
        self.flip(path, os.path.getsize(path) - 3)
        mpath = os.path.join(d, "manifest.json")
        with open(mpath) as f:
            m = json.load(f)
        with open(path, "rb") as f:
            blob = f.read()
        for e in m["files"]:
            if e["name"] == "optim_rank_00001.safetensors":
                e["xxh3"] = xxhash.xxh3_64_hexdigest(blob)
                bb = e["block_bytes"]
                e["block_xxh3"] = [xxhash.xxh3_64_hexdigest(blob[i:i + bb]) for i in range(0, len(blob), bb)]
        with open(mpath, "w") as f:
            json.dump(m, f)
        with open(mpath, "rb") as f, open(mpath + ".xxh3", "w") as side:   # resealed, as an attacker would
            side.write(xxhash.xxh3_64_hexdigest(f.read()) + "\n")
        with self.assertRaises(rhckpt.Damaged) as e:
            rhckpt.open(d)
        self.assertRegex(str(e.exception), r"tensor '.+' compressed block \d+ of \d+ .*: XXH3-64 of its stored bytes")

    def test_listing_and_bad_input(self):
        p = run_module(os.path.join(self.runs["bf16-fp8-dp2-zstd"], "ckpt"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("layers.0.moe.router.weight/exp_avg_sq.scale_inv", p.stdout)
        self.assertRegex(p.stdout, r"total exp_avg_sq +F8_E4M3 +\d+ bytes")
        self.assertRegex(p.stdout, r"tensors in 3 files verified")
        p = run_module(os.path.join(self.root, "no-such-checkpoint"))
        self.assertEqual(p.returncode, 2)
        self.assertIn("no-such-checkpoint: no such file or directory", p.stderr)
        with self.assertRaises(rhckpt.BadInput):
            rhckpt.open(self.root)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_rhckpt.py PATH_TO_resume-harness")
    TOOL = sys.argv.pop(1)
    unittest.main()
