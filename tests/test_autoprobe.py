#!/usr/bin/python3
"""python/rhckpt/autoprobe.py (resume-harness's `probe = "auto"`): run under the environment the
harness gives a trainer, examples/tiny_lm/train.py WITHOUT --probe writes the same state hashes as
its manual probe calls, changes none of its printed losses, and a run resumed from iteration 10
writes a before_step record at 11 equal key for key to the uninterrupted run's (and unequal at an
rng/ key with --bug rng_not_saved). Without RH_PROBE_AUTO nothing is hooked or written; a script
that never imports torch runs as without us, Debian's own sitecustomize still runs, and torch is
never imported before the trainer imports it.

  /usr/bin/python3 tests/test_autoprobe.py [TOOL]     (the tool argument CTest passes is ignored)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import torch  # noqa: F401  (only to skip where the trainer cannot run)
except ImportError:   # Debian python3-torch (scripts/setup.sh installs it)
    print("test_autoprobe: skipped, /usr/bin/python3 has no torch")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYTHON_DIR = os.path.join(ROOT, "python")
AUTO_DIR = os.path.join(PYTHON_DIR, "rhckpt", "auto")
TRAIN = os.path.join(ROOT, "examples", "tiny_lm", "train.py")
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
KINDS = ("param/", "buffer/", "optimizer/", "scheduler/", "rng/", "mode/")


def environment(probe_dir=None, auto=False, first=None, before=None, pythonpath=None):
    """The environment the harness gives the trainer (auto) or a plain one (manual or none)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RH_PROBE")}
    env.pop("PYTHONPATH", None)
    if probe_dir:
        env["RH_PROBE_DIR"] = probe_dir
    if auto:
        env["RH_PROBE_AUTO"] = "1"
        env["PYTHONPATH"] = os.pathsep.join([AUTO_DIR, PYTHON_DIR] + ([pythonpath] if pythonpath else []))
    elif pythonpath:
        env["PYTHONPATH"] = pythonpath
    if first is not None:
        env["RH_PROBE_FIRST_ITERATION"] = str(first)
    if before is not None:
        env["RH_PROBE_BEFORE"] = str(before)
    return env


def run(argv, env, cwd=None):
    p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert p.returncode == 0, "%s: rc %d: %s" % (" ".join(argv), p.returncode, p.stderr)
    return p


def train(out, iters, *flags, env):
    p = run([PY, TRAIN, "--iters", str(iters), "--save-every", "10", "--out", out] + list(flags), env)
    return p.stdout.splitlines(), p.stderr


def records(probe_dir):
    with open(os.path.join(probe_dir, "probe.jsonl")) as f:
        return [json.loads(line) for line in f]


def only(recs, event, iteration):
    found = [r for r in recs if r["event"] == event and r["iteration"] == iteration]
    assert len(found) == 1, "%d %s records of iteration %d" % (len(found), event, iteration)
    return dict(found[0]["state"])


class AutoProbe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        """The uninterrupted run to 20 three ways (auto, manual, no probe), shared by the tests."""
        cls.dir = tempfile.mkdtemp(prefix="rh_autoprobe_")
        d = cls.path
        cls.auto_log, cls.auto_err = train(d("auto_ck"), 20, env=environment(d("auto"), auto=True, first=1, before=11))
        cls.manual_log, _ = train(d("manual_ck"), 20, "--probe", env=environment(d("manual")))
        cls.plain_log, _ = train(d("plain_ck"), 20, env=environment())
        cls.auto = records(d("auto"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    @classmethod
    def path(cls, name):
        return os.path.join(cls.dir, name)

    def test_probe_changes_nothing(self):
        self.assertEqual(len(self.plain_log), 20)
        self.assertEqual(self.auto_log, self.plain_log)
        self.assertEqual(self.manual_log, self.plain_log)
        self.assertEqual(self.auto_err, "")

    def test_records_match_the_manual_probe(self):
        events = [(r["event"], r["iteration"]) for r in self.auto]
        want = [("step", i) for i in range(1, 11)] + [("before_step", 11)] + [("step", i) for i in range(11, 21)]
        self.assertEqual(events, want)
        manual = records(self.path("manual"))
        for i in range(1, 21):
            auto, hand = only(self.auto, "step", i), only(manual, "step", i)
            for key, h in auto.items():
                self.assertTrue(key.startswith(KINDS), key)
                self.assertEqual(hand.get(key), h, "iteration %d: %s" % (i, key))
            for kind in ("param/", "buffer/", "optimizer/state/", "optimizer/param_groups/", "scheduler/", "mode/"):
                self.assertTrue(any(k.startswith(kind) for k in auto), "iteration %d: no %s key" % (i, kind))
            for key in ("rng/torch", "rng/python", "rng/numpy"):
                self.assertIn(key, auto)
            # everything the manual probe records but the batch and the trainer's own state
            self.assertEqual({k for k in hand if not k.startswith(("data/", "state/"))}, set(auto), i)
        for r in self.auto:
            self.assertEqual(r["metrics"], [])

    def test_resume_before_step_matches(self):
        uninterrupted = only(self.auto, "before_step", 11)
        for bug, differs in ((None, False), ("rng_not_saved", True)):
            with self.subTest(bug=bug):
                flags = ("--bug", bug) if bug else ()
                first, second = self.path("first_%s" % bug), self.path("second_%s" % bug)
                train(first, 10, *flags, env=environment())
                log, err = train(second, 20, "--load", first, *flags,
                                 env=environment(self.path("resumed_%s" % bug), auto=True, first=11))
                self.assertEqual(err, "")
                recs = records(self.path("resumed_%s" % bug))
                self.assertEqual([(r["event"], r["iteration"]) for r in recs][:3],
                                 [("before_step", 11), ("step", 11), ("step", 12)])
                resumed = only(recs, "before_step", 11)
                self.assertEqual(set(resumed), set(uninterrupted))
                changed = sorted(k for k in resumed if resumed[k] != uninterrupted[k])
                if differs:
                    self.assertTrue(changed and all(k.startswith("rng/") for k in changed), changed)
                    self.assertNotEqual(log, self.plain_log[10:])
                else:
                    self.assertEqual(changed, [])
                    self.assertEqual(log, self.plain_log[10:])
                    for i in range(11, 21):   # the resumed steps are the uninterrupted ones
                        self.assertEqual(only(recs, "step", i), only(self.auto, "step", i), i)

    def test_nothing_without_rh_probe_auto(self):
        code = ("import sys, torch, torch.optim.optimizer as o\n"
                "torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])   # torch 1.13: wraps AdamW.step\n"
                "stepping = bool(getattr(o, '_global_optimizer_pre_hooks', None))   # torch >= 2.0\n"
                "print(any(type(f).__name__ == '_Finder' for f in sys.meta_path), hasattr(torch.load, '__wrapped__'),\n"
                "      stepping or hasattr(torch.optim.AdamW.step, '_rhckpt_autoprobe'),\n"
                "      hasattr(torch.nn.Module.load_state_dict, '__wrapped__'), '_rhckpt_autoprobe' in sys.modules)\n")
        env = environment(self.path("off"), first=1, before=1)
        env["PYTHONPATH"] = os.pathsep.join([AUTO_DIR, PYTHON_DIR])   # the harness's path, no RH_PROBE_AUTO
        p = run([PY, "-c", code], env)
        self.assertEqual(p.stdout.split(), ["False"] * 4 + ["True"])
        log, err = train(self.path("off_ck"), 3, env=env)
        self.assertEqual((log, err), (self.plain_log[:3], ""))
        self.assertFalse(os.path.exists(self.path("off")))
        env["RH_PROBE_AUTO"] = "1"   # and with it, the hooks are there
        self.assertEqual(run([PY, "-c", code], env).stdout.split(), ["True"] * 5)

    def test_torch_is_not_imported_first_and_other_scripts_run_unchanged(self):
        code = ("import os, sys\n"
                "print(sorted(m for m in ('torch', 'numpy', 'xxhash', 'rhckpt') if m in sys.modules))\n"
                "os.environ['MY_THREADS'] = '1'\n"
                "print(sys.argv[1:], 7 * 6)\n")
        plain = run([PY, "-c", code, "a", "b"], environment())
        auto = run([PY, "-c", code, "a", "b"], environment(self.path("script"), auto=True, first=1, before=1))
        self.assertEqual((auto.stdout, auto.stderr), (plain.stdout, plain.stderr))
        self.assertEqual(plain.stdout.splitlines()[0], "[]")
        self.assertFalse(os.path.exists(self.path("script")))

    def test_next_sitecustomize_still_runs(self):
        other = self.path("other_site")
        os.makedirs(other)
        with open(os.path.join(other, "sitecustomize.py"), "w") as f:
            f.write("import sys\nsys.rh_other_site = __file__\n")
        code = "import sys; print(getattr(sys, 'rh_other_site', None))"
        p = run([PY, "-c", code], environment(self.path("chain"), auto=True, pythonpath=other))
        self.assertEqual(p.stdout.strip(), os.path.join(other, "sitecustomize.py"))
        self.assertEqual(p.stderr, "")
        # and without another on the path, the system's own one (Debian's) is the one found
        p = run([PY, "-c", "import sitecustomize; print(sitecustomize.__file__)"], environment())
        system = p.stdout.strip()
        code = ("import importlib.machinery as m, sys\n"
                "spec = m.PathFinder.find_spec('sitecustomize', sys.path[sys.path.index(%r) + 1:])\n"
                "print(spec.origin if spec else None)\n" % AUTO_DIR)
        p = run([PY, "-c", code], environment(self.path("chain"), auto=True))
        self.assertEqual(p.stdout.strip(), system if system.endswith("sitecustomize.py") else "None")

    def test_a_failure_is_one_line_and_training_goes_on(self):
        # a probe directory that cannot be created: every record fails, the trainer is untouched
        blocker = self.path("blocker")
        with open(blocker, "w") as f:
            f.write("a file, not a directory\n")
        log, err = train(self.path("fail_ck"), 3, env=environment(os.path.join(blocker, "sub"), auto=True))
        self.assertEqual(log, self.plain_log[:3])
        lines = err.splitlines()
        self.assertEqual(len(lines), 1, err)
        self.assertTrue(lines[0].startswith("rhckpt.autoprobe: ") and "recording stopped" in lines[0], err)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
