#!/usr/bin/python3
"""reports/plots.py on a small hand-written run directory: the tool's `report` draws four valid
PNGs of sensible size and embeds them; plotting is deterministic (same CSVs, same bytes); a
Python without matplotlib exits 3 with a clear message and the tool still writes its tables; and
the helpers that place exact zeros on the log-scale |d loss| plot.

Usage: test_plots.py PATH_TO_resume-harness   (CTest passes it)
"""
import importlib.util
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "reports", "plots.py")
TOOL = None

SUMMARY_HEADER = ("scenario,expectation,passed,outcome,verdict,first_divergence,max_abs_dloss,max_ulp_model,"
                  "max_ulp_master_param,max_ulp_remainder,max_ulp_exp_avg,max_ulp_exp_avg_sq,max_ulp_scale,"
                  "checkpoint_bytes,bytes_per_param,num_params,save_policy,fault,exp_avg_dtype,exp_avg_sq_dtype,"
                  "master_mode,seconds\n")
# name, safe dir, policy, moments on disk, |d loss| bump after iteration 5, max ulp exp_avg
SCENARIOS = [
    ("states/m=bf16,policy=fp32", "states__m=bf16+policy=fp32", "fp32", "F32", 0.0, 0),
    ("states/m=bf16,policy=per_key", "states__m=bf16+policy=per_key", "per_key", "BF16", 0.0, 0),
    ("faults/skip=exp_avg", "faults__skip=exp_avg", "native", "BF16", 2.0 ** -7, 5),
]
CONFIG = '{"model":{"param_dtype":"bf16"},"optimizer":{"exp_avg_dtype":"bf16"}}'


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def loss(i, bump):
    return 4.0 - i / 8.0 + (bump if i > 5 else 0.0)


def metrics(first, last, bump):
    s = ("iteration,consumed_samples,lm_loss,lm_loss_hex,aux_loss,aux_loss_hex,total_loss,total_loss_hex,"
         "grad_norm,grad_norm_hex,lr,lr_hex,num_zeros\n")
    for i in range(first, last + 1):
        v = loss(i, bump)
        s += "%d,%d,%.9g,%s,0,0x0p+0,%.9g,%s,1.5,0x1.8p+0,0.01,%s,0\n" % (i, 16 * i, v, v.hex(), v, v.hex(),
                                                                          (0.01).hex())
    return s


def make_run(root):
    rows, entries = [], []
    for name, safe, policy, moments, bump, ulp in SCENARIOS:
        d = os.path.join(root, "scenarios", safe)
        size = 400 if moments == "F32" else 200
        write(os.path.join(d, "disk.csv"),
              "file,key,kind,dtype,numel,bytes\nmodel.safetensors,w,model,BF16,100,200\n"
              "o.safetensors,w/master_param,master_param,F32,100,400\n"
              "o.safetensors,w/exp_avg,exp_avg,%s,100,%d\no.safetensors,w/exp_avg_sq,exp_avg_sq,%s,100,%d\n"
              "manifest.json,<manifest>,metadata,,0,300\n" % (moments, size, moments, size))
        write(os.path.join(d, "state_compare.csv"),
              "phase,key,kind,dtype_saved,dtype_loaded,numel,bit_equal_fraction,max_abs_diff,max_ulp\n"
              "after_load,w/exp_avg,exp_avg,F32,F32,100,1,0,%d\n" % ulp)
        mc = "iteration,metric,baseline,baseline_hex,resumed,resumed_hex,abs_diff,rel_diff,ulp,bit_equal\n"
        for i in range(5, 11):
            b, r = loss(i, 0), loss(i, bump)
            mc += "%d,lm_loss,%r,%s,%r,%s,%r,%r,%d,%d\n" % (i, b, b.hex(), r, r.hex(), r - b, (r - b) / b,
                                                            int(r != b), int(r == b))
        write(os.path.join(d, "metrics_compare.csv"), mc)
        write(os.path.join(d, "baseline", "metrics.csv"), metrics(1, 10, 0.0))
        write(os.path.join(d, "resumed", "metrics.csv"), metrics(5, 10, bump))
        write(os.path.join(d, "result.json"), '{"save_at":4,"iterations":10,"config":%s}\n' % CONFIG)
        cb = 1200 + 4 * size
        rows.append('"%s",exact,1,%s,PASS,,%r,0,0,,%d,0,,%d,%g,100,%s,none,bf16,bf16,fp32,1\n'
                    % (name, "diverged" if bump else "identical", bump, ulp, cb, cb / 100, policy))
        entries.append('{"name":"%s","dir":"scenarios/%s","config":%s}' % (name, safe, CONFIG))
    rows.append('faults/crash,exact,0,error,"FAIL: error: boom",boom,0,,,,,,,0,0,0,native,none,bf16,bf16,fp32,0\n')
    write(os.path.join(root, "summary.csv"), SUMMARY_HEADER + "".join(rows))
    write(os.path.join(root, "summary.json"),
          '{"file":"fixture.toml","scenarios":[%s],"environment":{"harness_version":"0.1.0"}}\n' % ",".join(entries))


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def png_size(path):
    data = read_bytes(path)
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    assert data[12:16] == b"IHDR", path
    assert data[-8:-4] == b"IEND", path
    return struct.unpack(">II", data[16:24])


def load_plots_module():
    spec = importlib.util.spec_from_file_location("plots", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


PNGS = ["loss_curves.png", "dloss.png", "disk_bytes.png", "ulp_heatmap.png"]


class PlotsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="rh_plots_")
        make_run(self.dir)
        self.env = dict(os.environ)
        self.env.pop("RH_PYTHON", None)
        self.env["RH_PLOTS_SCRIPT"] = SCRIPT

    def tearDown(self):
        shutil.rmtree(self.dir)

    def fake_no_matplotlib(self):
        fake = os.path.join(self.dir, "fake")
        write(os.path.join(fake, "matplotlib", "__init__.py"), "raise ImportError('no matplotlib here')\n")
        return fake

    def test_report_draws_valid_pngs_and_embeds_them(self):
        p = subprocess.run([TOOL, "report", self.dir], env=self.env, capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr + p.stdout)
        for name in PNGS:
            w, h = png_size(os.path.join(self.dir, "plots", name))
            self.assertGreater(w, 200, name)
            self.assertGreater(h, 200, name)
        with open(os.path.join(self.dir, "report.html")) as f:
            self.assertEqual(f.read().count('src="data:image/png;base64,'), 4)
        with open(os.path.join(self.dir, "report.md")) as f:
            md = f.read()
        for name in PNGS:
            self.assertIn("](plots/%s)" % name, md)

    def test_plotting_is_deterministic(self):
        subprocess.run([TOOL, "report", self.dir], env=self.env, check=True, capture_output=True)
        first = {n: read_bytes(os.path.join(self.dir, "plots", n)) for n in PNGS}
        subprocess.run(["/usr/bin/python3", SCRIPT, self.dir], check=True)
        for n in PNGS:
            self.assertEqual(read_bytes(os.path.join(self.dir, "plots", n)), first[n], n)

    def test_script_without_matplotlib_exits_3_with_message(self):
        env = dict(self.env, PYTHONPATH=self.fake_no_matplotlib())
        subprocess.run([TOOL, "report", self.dir], env=dict(self.env, RH_PYTHON="/bin/false"), check=True,
                       capture_output=True)   # writes plots/index.csv and storage.csv
        p = subprocess.run(["/usr/bin/python3", SCRIPT, self.dir], env=env, capture_output=True, text=True)
        self.assertEqual(p.returncode, 3)
        self.assertIn("matplotlib cannot be imported", p.stderr)

    def test_tool_without_matplotlib_still_writes_tables(self):
        env = dict(self.env, PYTHONPATH=self.fake_no_matplotlib(), RH_PYTHON="/usr/bin/python3")
        p = subprocess.run([TOOL, "report", self.dir], env=env, capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("matplotlib cannot be imported by /usr/bin/python3", p.stdout)
        with open(os.path.join(self.dir, "report.md")) as f:
            md = f.read()
        self.assertIn("Plots not drawn: matplotlib cannot be imported", md)
        self.assertIn("| states/m=bf16,policy=per_key |", md)
        for name in PNGS:
            self.assertFalse(os.path.exists(os.path.join(self.dir, "plots", name)), name)

    def test_zero_differences_get_their_own_row(self):
        plots = load_plots_module()
        self.assertEqual(plots.zero_row_y([0.0, 3e-3, 1e-5]), 1e-7)   # two decades below 1e-5's decade
        self.assertEqual(plots.zero_row_y([0.0, 0.0]), 1e-12)
        self.assertLess(plots.zero_row_y([0.0, 2.0 ** -7]), 2.0 ** -7 / 10)

    def test_labels(self):
        plots = load_plots_module()
        self.assertEqual(plots.wrap_label("per_key: model BF16, exp_avg BF16"), "per_key\nmodel BF16\nexp_avg BF16")
        self.assertEqual(plots.size_change_text({"is_reference": "1", "reduction_pct": "0.00"}), "fp32 reference")
        self.assertEqual(plots.size_change_text({"is_reference": "0", "reduction_pct": "21.05"}), "21.05 % smaller")
        self.assertEqual(plots.size_change_text({"is_reference": "0", "reduction_pct": "-3.10"}), "3.10 % larger")
        self.assertEqual(plots.size_change_text({"is_reference": "0", "reduction_pct": ""}), "no fp32 reference")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_plots.py PATH_TO_resume-harness")
    TOOL = sys.argv.pop(1)
    unittest.main()
