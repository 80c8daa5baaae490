#!/usr/bin/python3
"""examples/tiny_lm/train.py, the PyTorch trainer resume-harness checks as a user's own command:
the correct trainer resumed (10 then 10 -> 20) prints the same lines 11..20 as a run to 20 and
writes a bit-identical iter_20.pt (compared through rhckpt.torch_bridge), and a load + save of
zero iterations reproduces iter_10.pt; each --bug makes the resumed run differ, at the printed
iteration and first probe key after load that the harness's diagnoses rely on.

  /usr/bin/python3 tests/test_tiny_lm.py [TOOL]     (the tool argument CTest passes is ignored)
"""
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYTHON_DIR = os.path.join(ROOT, "python")
TRAIN = os.path.join(ROOT, "examples", "tiny_lm", "train.py")
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

# bug -> (first differing printed iteration, what differs on that line, first differing probe key
#         of the resumed run's after_load record vs the uninterrupted run's step-10 record)
BUGS = {
    "rng_not_saved": (11, "loss", "rng/python"),
    "reseed_on_resume": (11, "loss", "rng/python"),
    "data_position_not_saved": (11, "loss", "state/consumed"),
    "lr_scheduler_not_saved": (12, "lr", "scheduler/_last_lr"),
    "optimizer_state_not_saved": (11, "lr", "optimizer/param_groups/0/lr"),
    "save_mid_accumulation": (11, "loss+lr", "rng/python"),
}


def train(out, iters, *flags, probe_dir=None):
    env = dict(os.environ)
    env.pop("RH_PROBE_DIR", None)
    if probe_dir:
        env["RH_PROBE_DIR"] = probe_dir
    p = subprocess.run([PY, TRAIN, "--iters", str(iters), "--save-every", "10", "--out", out, "--probe"] + list(flags),
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, "train.py %s: %s" % (" ".join(flags), p.stderr)
    return p.stdout.splitlines()


def records(probe_dir):
    with open(os.path.join(probe_dir, "probe.jsonl")) as f:
        return [json.loads(line) for line in f]


def first_diff(a, b):
    """(iteration, 'loss'/'lr'/'loss+lr') of the first differing log line, or None."""
    for x, y in zip(a, b):
        if x != y:
            xs, ys = x.split(), y.split()
            what = "+".join(n for n, i in (("loss", 3), ("lr", 5)) if xs[i] != ys[i])
            return int(xs[1].rstrip(":")), what
    return None if len(a) == len(b) else ("length", len(a), len(b))


class TinyLM(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="rh_tiny_lm_")
        t = cls.path
        # interrupted runs first (the resumes need them), two trainers at a time
        jobs = {"full": (t("full"), 20, (), t("p_full")), "part": (t("part"), 10, (), None)}
        for bug in BUGS:
            if bug != "reseed_on_resume":   # its checkpoints are the correct ones
                jobs["part_" + bug] = (t("part_" + bug), 10, ("--bug", bug), None)
        jobs["nd1"] = (t("nd1"), 2, ("--bug", "nondeterministic"), None)
        jobs["nd2"] = (t("nd2"), 2, ("--bug", "nondeterministic"), None)
        cls.out = cls.run_jobs(jobs)
        shutil.copytree(t("part"), t("res"))
        jobs = {"res": (t("res"), 20, ("--resume",), t("p_res")),
                "rt": (t("rt"), 10, ("--load", t("part")), None)}
        for bug in BUGS:
            src = t("part" if bug == "reseed_on_resume" else "part_" + bug)
            jobs["res_" + bug] = (t("res_" + bug), 20, ("--load", src, "--bug", bug), t("p_" + bug))
        cls.out.update(cls.run_jobs(jobs))

    @classmethod
    def run_jobs(cls, jobs):
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            futures = {k: ex.submit(train, out, iters, *flags, probe_dir=pd) for k, (out, iters, flags, pd) in jobs.items()}
            return {k: f.result() for k, f in futures.items()}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    @classmethod
    def path(cls, *p):
        return os.path.join(cls.tmp, *p)

    def bridge(self, *pairs):
        p = subprocess.run([PY, "-m", "rhckpt.torch_bridge"] + list(pairs), env=dict(os.environ, PYTHONPATH=PYTHON_DIR),
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)

    def same_file(self, a, b):
        with open(a, "rb") as x, open(b, "rb") as y:
            return x.read() == y.read()

    def test_correct_resume_is_bit_exact(self):
        full, part, res = self.out["full"], self.out["part"], self.out["res"]
        self.assertEqual(len(full), 20)
        self.assertRegex(full[0], r"^iter 1: loss \d\.\d{6} lr \d\.\d{6}e-0\d$")
        self.assertEqual(part, full[:10])
        self.assertEqual(res, full[10:])
        t = self.path
        self.bridge(t("full", "iter_20.pt"), t("f20.st"), t("res", "iter_20.pt"), t("r20.st"),
                    t("full", "iter_10.pt"), t("f10.st"), t("part", "iter_10.pt"), t("p10.st"),
                    t("rt", "iter_10.pt"), t("rt10.st"))
        self.assertTrue(self.same_file(t("f20.st"), t("r20.st")), "iter_20.pt differs after a correct resume")
        self.assertTrue(self.same_file(t("f10.st"), t("p10.st")), "iter_10.pt differs between the runs")
        self.assertTrue(self.same_file(t("rt10.st"), t("p10.st")), "load + save of zero iterations changed iter_10.pt")
        self.assertEqual(self.out["rt"], [])
        # the probe: after_load of the resumed run equals the uninterrupted run's state after step 10
        step10 = [r for r in records(t("p_full")) if r["event"] == "step" and r["iteration"] == 10][0]
        load = [r for r in records(t("p_res")) if r["event"] == "after_load"][0]
        self.assertEqual(load["iteration"], 10)
        self.assertEqual(load["state"], [kv for kv in step10["state"] if kv[0] != "data/batch"])
        steps = [r for r in records(t("p_res")) if r["event"] == "step"]
        self.assertEqual(steps, [r for r in records(t("p_full")) if r["event"] == "step" and r["iteration"] > 10])

    def test_each_bug_makes_the_resume_differ(self):
        full = self.out["full"]
        step10 = [r for r in records(self.path("p_full")) if r["event"] == "step" and r["iteration"] == 10][0]
        ref = [kv for kv in step10["state"] if kv[0] != "data/batch"]
        for bug, (it, what, key) in BUGS.items():
            with self.subTest(bug=bug):
                self.assertEqual(self.out.get("part_" + bug, full[:10]), full[:10])   # training itself is unchanged
                self.assertEqual(first_diff(full[10:], self.out["res_" + bug]), (it, what))
                load = [r for r in records(self.path("p_" + bug)) if r["event"] == "after_load"][0]
                got = next((a[0] for a, b in zip(ref, load["state"]) if a != b), None)
                self.assertEqual(got, key)

    def test_nondeterministic_runs_differ(self):
        self.assertEqual(first_diff(self.out["nd1"], self.out["nd2"])[0], 1)   # os.urandom seeds: differ from iteration 1

    def test_bad_flags(self):
        p = subprocess.run([PY, TRAIN, "--iters", "1", "--save-every", "1", "--out", self.path("x"), "--bug", "nope"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 2)
        self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
        self.assertIn("rng_not_saved", p.stderr)
        self.assertFalse(os.path.exists(self.path("x")))


if __name__ == "__main__":
    try:
        import torch  # noqa: F401
    except ImportError:
        print("test_tiny_lm: skipped, /usr/bin/python3 has no torch (Debian python3-torch)")
        sys.exit(77)
    unittest.main(argv=sys.argv[:1], verbosity=2)
