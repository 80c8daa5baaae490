#!/usr/bin/python3
"""`cmake --install` makes a relocatable tool: installed into a temporary prefix, run from an
unrelated directory, `check` finds its default scenario file and `report` its plot script and
projection models under PREFIX/share/resume-harness (relative to the binary, not the source tree),
and the source tree is not consulted (RH_DATA_DIR, RH_PLOTS_SCRIPT unset; the build tree's
share/ is not on the path).

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
            for rel in ("reports/plots.py", "reports/models.toml", "scenarios/default.toml", "scenarios/ci.toml"):
                self.assertTrue(os.path.isfile(os.path.join(share, rel)), rel)
            elsewhere = os.path.join(tmp, "elsewhere")
            os.makedirs(elsewhere)
            env = {k: v for k, v in os.environ.items() if k not in ("RH_DATA_DIR", "RH_PLOTS_SCRIPT")}
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
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    TOOL = sys.argv.pop(1)
    unittest.main()
