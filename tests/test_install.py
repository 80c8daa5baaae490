#!/usr/bin/python3
"""`cmake --install` makes a relocatable tool: installed into a temporary prefix, run from an
unrelated directory, `check` finds its default scenario file, `check -f ci.toml` the installed
ci.toml and `--golden scenarios/golden/ci` its installed goldens, `report` its plot script and
projection models under PREFIX/share/resume-harness (relative to the binary, not the source tree),
and the installed Python package (PREFIX/share/resume-harness/python) reads a checkpoint the
installed tool wrote; the source tree is not consulted (RH_DATA_DIR, RH_PLOTS_SCRIPT, PYTHONPATH
unset; the build tree's share/ is not on the path). Every scenario file, golden and example
trainer of the source tree is installed.

Usage: test_install.py PATH_TO_resume-harness   (CTest passes it; the build dir is its folder)
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

TOOL = None


class Install(unittest.TestCase):
    def test_pip_installs_rhckpt_into_a_venv(self):
        """`pip install ./python` (pyproject.toml) into a venv that sees Debian's packages (no package
        index here: --no-index, and setuptools from the system: --no-build-isolation), from a copy
        so the source tree gets no build files; then `rhckpt --help` and `python -m rhckpt --help`
        exit 0 from another directory and import the installed copy."""
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")
        tmp = tempfile.mkdtemp(prefix="rh_pip_")
        try:
            copy = os.path.join(tmp, "python")
            shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
            venv = os.path.join(tmp, "venv")
            r = subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
                               capture_output=True, text=True)
            if r.returncode != 0 and "ensurepip" in r.stdout + r.stderr:
                self.skipTest("python3-venv is not installed")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            r = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "--no-build-isolation", "--no-index", copy],
                               capture_output=True, text=True, cwd=tmp)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            for cmd in ([os.path.join(venv, "bin", "rhckpt"), "--help"],
                        [os.path.join(venv, "bin", "python"), "-m", "rhckpt", "--help"]):
                r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertIn("rhckpt", r.stdout)
            r = subprocess.run([os.path.join(venv, "bin", "python"), "-c", "import rhckpt; print(rhckpt.__file__)"],
                               capture_output=True, text=True, cwd=tmp, env=env)
            self.assertTrue(r.stdout.startswith(venv), r.stdout + r.stderr)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_installed_tool_checks_and_reports_from_another_directory(self):
        build = os.path.dirname(os.path.abspath(TOOL))
        tmp = tempfile.mkdtemp(prefix="rh_install_")
        try:
            prefix = os.path.join(tmp, "prefix")
            r = subprocess.run(["cmake", "--install", build, "--prefix", prefix],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            tool = os.path.join(prefix, "bin", "resume-harness")
            share = os.path.join(prefix, "share", "resume-harness")
            src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
            wanted = ["reports/plots.py", "reports/models.toml", "scenarios/README.md",
                      "python/pyproject.toml", "python/rhckpt/__init__.py", "python/rhckpt/torch_tensors.py"]
            for sub, ext in (("scenarios", ".toml"), ("scenarios/golden/ci", ".csv"), ("examples/tiny_lm", ".py")):
                found = sorted(f for f in os.listdir(os.path.join(src, sub)) if f.endswith(ext))
                self.assertTrue(found, sub)
                wanted += [sub + "/" + f for f in found]
            for rel in wanted:
                self.assertTrue(os.path.isfile(os.path.join(share, rel)), rel)
            elsewhere = os.path.join(tmp, "elsewhere")
            os.makedirs(elsewhere)
            env = {k: v for k, v in os.environ.items() if k not in ("RH_DATA_DIR", "RH_PLOTS_SCRIPT", "PYTHONPATH")}
            # An installed scenario file by its name alone, with its installed goldens.
            r = subprocess.run([tool, "check", "-f", "ci.toml", "--list", "seed-protocol"], cwd=elsewhere,
                               capture_output=True, text=True, env=env, timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(r.stdout.split(), ["seed-protocol"])
            ci_run = os.path.join(tmp, "ci-run")
            r = subprocess.run([tool, "check", "-f", "ci.toml", "seed-protocol", "--golden", "scenarios/golden/ci",
                                "--run-dir", ci_run], cwd=elsewhere, capture_output=True, text=True, env=env,
                               timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("seed-protocol: PASS", r.stdout)   # a golden not found fails: "no golden metrics"
            r = subprocess.run([tool, "check", "-f", "no-such.toml", "seed-protocol"], cwd=elsewhere,
                               capture_output=True, text=True, env=env, timeout=600)
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertEqual((r.stdout + r.stderr).count("\n"), 1, r.stdout + r.stderr)
            self.assertIn("no-such.toml", r.stderr)
            # The installed Python package reads a checkpoint the installed tool wrote.
            ck = os.path.join(tmp, "ck")
            r = subprocess.run([tool, "train", "--quiet", "--train-iters", "2", "--save-at", "2", "--save", ck,
                                "--out", os.path.join(tmp, "train"), "--hidden-size", "16", "--num-layers", "1"],
                               cwd=elsewhere, capture_output=True, text=True, env=env, timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            penv = dict(env, PYTHONPATH=os.path.join(share, "python"))
            r = subprocess.run(["/usr/bin/python3", "-c", "import rhckpt, sys; print(rhckpt.__file__); "
                                "print(len(rhckpt.open(sys.argv[1]).keys()))", ck],
                               cwd=elsewhere, capture_output=True, text=True, env=penv, timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertTrue(r.stdout.startswith(os.path.join(share, "python", "rhckpt")), r.stdout)
            r = subprocess.run(["/usr/bin/python3", "-m", "rhckpt", ck], cwd=elsewhere, capture_output=True,
                               text=True, env=penv, timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            run_dir = os.path.join(tmp, "run")
            # No -f: the default scenario file is the installed copy of scenarios/default.toml.
            r = subprocess.run([tool, "check", "seed-protocol", "--run-dir", run_dir], cwd=elsewhere,
                               capture_output=True, text=True, env=env, timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("seed-protocol: PASS", r.stdout)
            r = subprocess.run([tool, "report", run_dir], cwd=elsewhere, capture_output=True, text=True,
                               env=env, timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            html = open(os.path.join(run_dir, "report.html")).read()
            self.assertIn("DeepSeek-V2-Lite", html, "the projection read the installed models.toml")
            pngs = [f for f in os.listdir(os.path.join(run_dir, "plots")) if f.endswith(".png")]
            self.assertGreaterEqual(len(pngs), 1, "the installed plots.py drew the figures")
            self.assertEqual(os.listdir(elsewhere), [], "nothing is written to the working directory")
            # The installed wheel installs into a venv and writes nothing into the prefix (a pip
            # install of the share/python directory itself builds there: build/, rhckpt.egg-info).
            wheels = [f for f in os.listdir(os.path.join(share, "python")) if f.endswith(".whl")]
            self.assertEqual(len(wheels), 1, os.listdir(os.path.join(share, "python")))
            before = sorted(os.path.relpath(os.path.join(d, f), prefix)
                            for d, _, files in os.walk(prefix) for f in files)
            venv = os.path.join(tmp, "venv")
            r = subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
                               capture_output=True, text=True)
            if r.returncode == 0:   # python3-venv present (the first test skips without it)
                r = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "--no-index", "--no-deps",
                                    os.path.join(share, "python", wheels[0])], capture_output=True, text=True,
                                   cwd=elsewhere)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                r = subprocess.run([os.path.join(venv, "bin", "rhckpt"), ck], capture_output=True, text=True,
                                   cwd=elsewhere, env=env)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                after = sorted(os.path.relpath(os.path.join(d, f), prefix)
                               for d, _, files in os.walk(prefix) for f in files)
                self.assertEqual(before, after, "pip install of the wheel wrote into the prefix")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    TOOL = sys.argv.pop(1)
    unittest.main()
