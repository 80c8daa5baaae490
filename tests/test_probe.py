#!/usr/bin/python3
"""python/rhckpt/probe.py: the records a user's training loop writes for resume-harness. Without
RH_PROBE_DIR nothing is written and torch is not imported; with it, one JSON line per call with
the documented key order; the hashes follow the bytes (one flipped parameter bit, an advanced
RNG, a missing optimizer state, a model left in eval mode, a param group with its parameters in
another order each change exactly the keys they should); and the probe neither draws from any RNG
nor changes training (losses bit-identical with and without it).

  /usr/bin/python3 tests/test_probe.py [TOOL]     (the tool argument CTest passes is ignored)
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
try:
    import torch
except ImportError:   # Debian python3-torch (scripts/setup.sh installs it)
    print("test_probe: skipped, /usr/bin/python3 has no torch")
    sys.exit(77)
import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(HERE, "..", "python")
sys.path.insert(0, PYTHON_DIR)
from rhckpt import probe  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.bn = torch.nn.BatchNorm1d(3)
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, x):
        return self.bn(self.drop(self.fc(x)))


class Wrapper(torch.nn.Module):   # like DistributedDataParallel: the model under .module
    def __init__(self, m):
        super().__init__()
        self.module = m


def setup(seed=0):
    torch.manual_seed(seed)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    return model, opt, sched


def train(steps, use_probe, seed=0):
    """A tiny loop calling the probe as a trainer would; returns the exact losses."""
    model, opt, sched = setup(seed)
    g = torch.Generator().manual_seed(1)
    losses = []
    for i in range(1, steps + 1):
        x = torch.randn(8, 4, generator=g)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item().hex())
        if use_probe:
            probe.after_step(i, model, opt, sched, loss=loss, batch=(x,), metrics={"lr": sched.get_last_lr()[0], "n": i},
                             state={"epoch": 0, "seen": i * 8})
    return losses, (model, opt, sched)


class Probe(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="rh_probe_")
        os.environ.pop(probe.ENV, None)

    def tearDown(self):
        os.environ.pop(probe.ENV, None)
        shutil.rmtree(self.dir)

    def records(self):
        with open(os.path.join(self.dir, "probe.jsonl")) as f:
            return [json.loads(line) for line in f]

    def state_of(self, *args, **kw):
        """One after_load record's state as {key: hash} (and the key order)."""
        path = os.path.join(self.dir, "probe.jsonl")
        if os.path.exists(path):
            os.unlink(path)
        os.environ[probe.ENV] = self.dir
        probe.after_load(*args, **kw)
        rec = self.records()[-1]
        return dict(rec["state"]), [k for k, _ in rec["state"]]

    def test_noop_without_env_and_no_torch_import(self):
        train(2, use_probe=True)
        self.assertEqual(os.listdir(self.dir), [])
        code = ("import os, sys; os.environ.pop('RH_PROBE_DIR', None); from rhckpt import probe; "
                "probe.after_step(1, None); probe.after_load(1, None); print('torch' in sys.modules)")
        p = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=PYTHON_DIR), cwd=self.dir,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual((p.returncode, p.stdout.strip()), (0, "False"), p.stderr)
        self.assertEqual(os.listdir(self.dir), [])

    def test_records_and_key_order(self):
        os.environ[probe.ENV] = self.dir
        losses, (model, opt, sched) = train(2, use_probe=True)
        recs = self.records()
        self.assertEqual([(r["event"], r["iteration"]) for r in recs], [("step", 1), ("step", 2)])
        r = recs[1]
        self.assertEqual(r["metrics"][0], ["loss", losses[1]])
        self.assertEqual(r["metrics"][1], ["lr", (1e-2 * 0.25).hex()])
        self.assertEqual(r["metrics"][2], ["n", "2"])
        keys = [k for k, _ in r["state"]]
        for _, h in r["state"]:
            self.assertRegex(h, "^[0-9a-f]{16}$")
        want_prefix = ["data/batch", "rng/python", "rng/numpy", "rng/torch"]
        self.assertEqual(keys[:4], want_prefix)
        groups = [k.split("/")[0] if not k.startswith("optimizer/") else "/".join(k.split("/")[:2]) for k in keys[4:]]
        order = ["scheduler", "optimizer/param_groups", "mode", "param", "buffer", "optimizer/state", "state"]
        self.assertEqual([g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g], order)
        self.assertIn("scheduler/last_epoch", keys)
        self.assertIn("optimizer/param_groups/0/lr", keys)
        self.assertIn("optimizer/param_groups/0/params", keys)
        self.assertEqual([k for k in keys if k.startswith("mode/")], ["mode/."])   # every submodule trains too
        self.assertEqual(dict(r["state"])["mode/."], xxhash.xxh3_64_hexdigest(b"true"))
        self.assertEqual(dict(r["state"])["optimizer/param_groups/0/params"],
                         xxhash.xxh3_64_hexdigest(b"(fc.weight,fc.bias,bn.weight,bn.bias)"))
        self.assertEqual([k for k in keys if k.startswith("param/")], ["param/fc.weight", "param/fc.bias", "param/bn.weight",
                                                                        "param/bn.bias"])
        self.assertEqual([k for k in keys if k.startswith("buffer/")], ["buffer/bn.running_mean", "buffer/bn.running_var",
                                                                         "buffer/bn.num_batches_tracked"])
        self.assertIn("optimizer/state/fc.weight/exp_avg", keys)
        self.assertIn("optimizer/state/bn.bias/step", keys)
        self.assertEqual(keys[-2:], ["state/epoch", "state/seen"])
        # the documented canonical bytes of a tensor and of a plain value
        w = model.fc.weight.detach()
        want = xxhash.xxh3_64_hexdigest(b"Tfloat32:3x4:" + w.numpy().tobytes())
        self.assertEqual(dict(r["state"])["param/fc.weight"], want)
        self.assertEqual(dict(r["state"])["state/seen"], xxhash.xxh3_64_hexdigest(b"16"))
        self.assertEqual(dict(r["state"])["rng/torch"], xxhash.xxh3_64_hexdigest(
            b"Tuint8:%d:" % torch.get_rng_state().numel() + torch.get_rng_state().numpy().tobytes()))

    def test_hashes_follow_the_bytes(self):
        _, (model, opt, sched) = train(2, use_probe=False)
        base, order = self.state_of(2, model, opt, sched)
        self.assertEqual(self.state_of(2, Wrapper(model), opt, sched), (base, order))   # .module is unwrapped
        # one bit of one parameter
        with torch.no_grad():
            bits = model.fc.bias.view(torch.int32)
            bits[1] ^= 1
        flipped, _ = self.state_of(2, model, opt, sched)
        self.assertEqual({k for k in base if base[k] != flipped[k]}, {"param/fc.bias"})
        with torch.no_grad():
            bits[1] ^= 1
        self.assertEqual(self.state_of(2, model, opt, sched)[0], base)
        # each RNG advancing changes its own key only
        for key, draw in (("rng/torch", lambda: torch.rand(1)), ("rng/numpy", lambda: np.random.rand()),
                          ("rng/python", lambda: random.random())):
            draw()
            now, _ = self.state_of(2, model, opt, sched)
            self.assertEqual({k for k in base if base[k] != now[k]}, {key}, key)
            base = now
        # a fresh optimizer (its state not restored): the moments are missing, the lr differs
        fresh = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        missing, _ = self.state_of(2, model, fresh, sched)
        self.assertFalse(any(k.startswith("optimizer/state/") for k in missing))
        self.assertTrue(any(k.startswith("optimizer/state/") for k in base))
        self.assertNotEqual(missing["optimizer/param_groups/0/lr"], base["optimizer/param_groups/0/lr"])
        # optimizer state of a parameter the model does not name: by index
        other = torch.nn.Parameter(torch.ones(2))
        opt2 = torch.optim.SGD([other], lr=0.1, momentum=0.9)
        other.grad = torch.ones(2)
        opt2.step()
        st, _ = self.state_of(0, model, opt2)
        self.assertIn("optimizer/state/0/momentum_buffer", st)

    def test_mode_after_resume(self):
        _, (model, opt, sched) = train(2, use_probe=False)
        base, order = self.state_of(2, model, opt, sched)
        self.assertIn("mode/.", base)
        self.assertLess(order.index("optimizer/param_groups/0/params"), order.index("mode/."))
        self.assertLess(order.index("mode/."), order.index("param/fc.weight"))
        model.eval()   # an evaluation after the restore that forgets model.train()
        evaluated, _ = self.state_of(2, model, opt, sched)
        self.assertEqual({k for k in base if base[k] != evaluated[k]}, {"mode/."})
        self.assertEqual(set(evaluated), set(base))   # every submodule as the root: no mode/<name>
        model.train()
        model.drop.eval()   # one submodule off: a key of its own, the root unchanged
        one_off, keys = self.state_of(2, model, opt, sched)
        self.assertEqual(set(one_off) - set(base), {"mode/drop"})
        self.assertEqual(one_off["mode/drop"], xxhash.xxh3_64_hexdigest(b"false"))
        self.assertEqual(keys.index("mode/drop"), keys.index("mode/.") + 1)
        self.assertEqual({k for k in base if base[k] != one_off[k]}, set())
        model.train()
        self.assertEqual(self.state_of(2, model, opt, sched), (base, order))

    def test_param_group_layout(self):
        _, (model, opt, sched) = train(2, use_probe=False)
        base, _ = self.state_of(2, model, opt, sched)
        # the optimizer rebuilt with the parameters in another order, then its saved state loaded:
        # the state keyed by position lands on other parameters, and no error is raised
        saved = opt.state_dict()
        params = list(model.parameters())
        params[0], params[1] = params[1], params[0]
        swapped = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
        swapped.load_state_dict(saved)
        now, _ = self.state_of(2, model, swapped, sched)
        self.assertNotEqual(now["optimizer/param_groups/0/params"], base["optimizer/param_groups/0/params"])
        self.assertEqual(now["optimizer/param_groups/0/params"],
                         xxhash.xxh3_64_hexdigest(b"(fc.bias,fc.weight,bn.weight,bn.bias)"))
        changed = {k for k in base if base[k] != now.get(k)}
        self.assertIn("optimizer/param_groups/0/params", changed)
        self.assertFalse({k for k in changed if not k.startswith("optimizer/")}, changed)
        # the same layout rebuilt in the same order: nothing differs
        same = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        same.load_state_dict(saved)
        self.assertEqual(self.state_of(2, model, same, sched)[0], base)
        # parameters the model does not name: labelled by their index across groups
        a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
        two = torch.optim.SGD([{"params": [a]}, {"params": [b, model.fc.bias]}], lr=0.1)
        st, _ = self.state_of(0, model, two)
        self.assertEqual(st["optimizer/param_groups/0/params"], xxhash.xxh3_64_hexdigest(b"(0)"))
        self.assertEqual(st["optimizer/param_groups/1/params"], xxhash.xxh3_64_hexdigest(b"(1,fc.bias)"))

    def test_probe_draws_no_rng(self):
        _, (model, opt, sched) = train(2, use_probe=False)
        model.drop.eval()   # a mode key recorded as well
        before = (torch.get_rng_state().tolist(), np.random.get_state()[1].tolist(), random.getstate())
        os.environ[probe.ENV] = self.dir
        probe.after_load(2, model, opt, sched, state={"seen": 16})
        probe.after_step(3, model, opt, sched, loss=torch.ones(()), batch=(torch.zeros(2),), metrics={"lr": 0.1})
        after = (torch.get_rng_state().tolist(), np.random.get_state()[1].tolist(), random.getstate())
        self.assertEqual(after, before)
        self.assertEqual(len(self.records()), 2)
        self.assertIn("mode/drop", dict(self.records()[1]["state"]))

    def test_probe_does_not_change_training(self):
        without, _ = train(4, use_probe=False)
        rng = torch.get_rng_state()
        os.environ[probe.ENV] = self.dir
        with_probe, _ = train(4, use_probe=True)
        self.assertEqual(with_probe, without)
        self.assertEqual(len(self.records()), 4)
        self.assertEqual(torch.get_rng_state().tolist(), rng.tolist())   # same draws in both runs


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
