#!/usr/bin/python3
"""reports/plots.py on a small hand-written run directory: the tool's `report` draws four valid
PNGs of sensible size and embeds them; every PNG fits a page (at most 1400 px wide, 1800 px
high), also for a group wider than a panel's legend; no axes carries more than 8 labelled series;
exact zeros are drawn on the |d loss| plot's "0 (bit-exact)" row; plotting is deterministic (same
CSVs, same bytes, no Software chunk); a Python without matplotlib exits 3 with a clear message and
the tool still writes its tables; bad input exits 2; the helpers that place exact zeros on the
log-scale |d loss| plot and pick the highlighted series; and the ULP heat map of a default-sized
run (190 scenarios, 19 groups) is readable, measured on the figure at the PNG's pixels.

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


# A group wider than a panel's legend: 12 scenarios, 3 of them differing after resume, one of those
# missing its expectation (it expected exact).
WIDE = [("wide/k=%02d" % k, "wide__k=%02d" % k, "native", "BF16", 2.0 ** -(k + 5) if k in (2, 6, 9) else 0.0,
         0 if k not in (2, 6, 9) else 7) for k in range(12)]
WIDE_FAILED = {"wide/k=06"}


def make_run(root, scenarios=SCENARIOS, failed=()):
    rows, entries = [], []
    for name, safe, policy, moments, bump, ulp in scenarios:
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
        ok = name not in failed
        rows.append('"%s",exact,%d,%s,%s,,%r,0,0,,%d,0,,%d,%g,100,%s,none,bf16,bf16,fp32,1\n'
                    % (name, int(ok), "diverged" if bump else "identical", "PASS" if ok else "FAIL: diverged", bump,
                       ulp, cb, cb / 100, policy))
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
MAX_W, MAX_H, MAX_LABELLED = 1400, 1800, 8


def png_chunk_types(path):
    data, pos, types = read_bytes(path), 8, []
    while pos < len(data):
        n, = struct.unpack(">I", data[pos:pos + 4])
        types.append((data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]))
        pos += 12 + n
    return types


def labelled_series(ax):
    """Labels an axes would show in a legend (matplotlib skips labels starting with '_')."""
    return ax.get_legend_handles_labels()[1]


def bit_exact_text(fig):
    """The text of the figure's "bit-exact groups" line, or None."""
    texts = [t.get_text() for t in fig.findobj(lambda a: getattr(a, "get_gid", lambda: None)() == "bit-exact-groups")]
    return texts[0] if texts else None


def build_figures(run_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt, load_plots_module().build_figures(plt, run_dir)


def close_all(plt, figs):
    for f in figs.values():
        plt.close(f)


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
        for name in PNGS:   # named, not linked: report.md is posted where a relative link breaks
            self.assertNotIn("](plots/%s)" % name, md)
            self.assertIn("plots/%s in the run directory" % name, md)
        p = subprocess.run([TOOL, "report", "--md-image-links", self.dir], env=self.env, capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr + p.stdout)
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

    def report(self, run_dir=None):
        p = subprocess.run([TOOL, "report", run_dir or self.dir], env=self.env, capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr + p.stdout)

    def wide_run(self):
        d = os.path.join(self.dir, "wide")
        make_run(d, SCENARIOS + WIDE, WIDE_FAILED)
        self.report(d)
        return d

    def test_every_png_fits_a_page(self):
        for run_dir in (self.dir, self.wide_run()):
            if run_dir == self.dir:
                self.report()
            for name in PNGS:
                w, h = png_size(os.path.join(run_dir, "plots", name))
                self.assertLessEqual(w, MAX_W, "%s: %s" % (run_dir, name))
                self.assertLessEqual(h, MAX_H, "%s: %s" % (run_dir, name))

    def test_no_axes_has_more_than_8_labelled_series(self):
        plt, figs = build_figures(self.wide_run())
        try:
            for name, fig in figs.items():
                for ax in fig.axes:
                    self.assertLessEqual(len(labelled_series(ax)), MAX_LABELLED, "%s: %s" % (name, ax.get_title()))
            # The wide group is summarised, not truncated: highlighted series plus "+N more" or one
            # entry for the bit-exact ones, and the scenario that missed its expectation is named.
            for name in ("loss_curves.png", "dloss.png"):
                wide = [ax for ax in figs[name].axes if ax.get_title().startswith("wide (12")]
                self.assertEqual(len(wide), 1, name)
                labels = labelled_series(wide[0])
                self.assertTrue(any(t.startswith("+") and "more" in t for t in labels)
                                or any("0 at every iteration" in t for t in labels), (name, labels))
                self.assertIn("k=06 (missed expectation)", labels, name)
                if name == "dloss.png":    # every differing scenario of the group is in colour
                    for k in ("k=02", "k=09"):
                        self.assertIn(k, labels)
                    self.assertIn("9 scenarios: 0 at every iteration", labels)
        finally:
            close_all(plt, figs)

    def test_zeros_are_drawn_on_the_bit_exact_row(self):
        self.report()
        plt, figs = build_figures(self.dir)
        try:
            axes = {ax.get_title().split(" (")[0]: ax for ax in figs["dloss.png"].axes if ax.get_visible()}
            # states is bit-exact throughout: one line of text names it instead of a panel of zeros.
            self.assertEqual(set(axes), {"faults"})
            self.assertEqual(bit_exact_text(figs["dloss.png"]),
                             "Bit-exact at every iteration after resume (|d loss| = 0, no panel drawn): states (2)")
            for group, expected_its in (("faults", {5}),):
                ax = axes[group]
                ticks = [t.get_text() for t in ax.get_yticklabels()]
                self.assertIn("0 (bit-exact)", ticks, group)
                zero_y = ax.get_yticks()[ticks.index("0 (bit-exact)")]
                zero_lines = [ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith("zeros:")]
                self.assertTrue(zero_lines, group)
                its = set()
                for ln in zero_lines:
                    self.assertTrue(all(y == zero_y for y in ln.get_ydata()), group)
                    its |= {int(round(x)) for x in ln.get_xdata()}
                self.assertEqual(its, expected_its, group)
                lo, hi = ax.get_ylim()
                self.assertTrue(lo < zero_y < hi, group)
            # faults has nonzero differences too, above the zero row, on a log axis.
            self.assertEqual(axes["faults"].get_yscale(), "log")
            ys = [y for ln in axes["faults"].get_lines() if not (ln.get_gid() or "").startswith("zeros:")
                  for y in ln.get_ydata()]
            self.assertIn(2.0 ** -7, ys)
        finally:
            close_all(plt, figs)

    def test_script_writes_the_same_bytes_twice_without_software_chunk(self):
        wide = self.wide_run()
        for run_dir in (self.dir, wide):
            if run_dir == self.dir:
                self.report()
            runs = []
            for _ in range(2):
                p = subprocess.run(["/usr/bin/python3", SCRIPT, run_dir], capture_output=True, text=True)
                self.assertEqual(p.returncode, 0, p.stderr)
                runs.append({n: read_bytes(os.path.join(run_dir, "plots", n)) for n in PNGS})
            self.assertEqual(runs[0], runs[1], run_dir)
            for n in PNGS:
                for kind, body in png_chunk_types(os.path.join(run_dir, "plots", n)):
                    if kind in (b"tEXt", b"iTXt", b"zTXt"):
                        self.assertFalse(body.startswith(b"Software"), n)

    def test_bad_input_exits_2(self):
        self.report()
        os.remove(os.path.join(self.dir, "plots", "index.csv"))
        p = subprocess.run(["/usr/bin/python3", SCRIPT, self.dir], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("index.csv", p.stderr)
        p = subprocess.run(["/usr/bin/python3", SCRIPT], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)

    def test_highlighted_series(self):
        plots = load_plots_module()
        mk = lambda name, d, failed=False: {"name": name, "max_d": d, "failed": failed}
        few = [mk("a", 0.0), mk("b", 1.0)]
        self.assertEqual(plots.split_series(few), (few, []))
        many = [mk("s%d" % k, float(k % 3 == 0) * k, k == 4) for k in range(12)]
        hi, rest = plots.split_series(many)
        self.assertEqual(len(hi), 7)
        self.assertEqual(len(hi) + len(rest), 12)
        # the failed one first, then the largest |d loss| (9, 6, 3), then matrix order; order kept
        self.assertEqual([s["name"] for s in hi], ["s0", "s1", "s2", "s3", "s4", "s6", "s9"])
        self.assertEqual(plots.rest_label([mk("x", 0.0), mk("y", 0.0)]), "+2 more (grey; |d loss| all 0)")
        hi, rest, exact = plots.dloss_split(many)
        self.assertEqual([s["name"] for s in exact], ["s%d" % k for k in (0, 1, 2, 5, 7, 8, 10, 11)])
        self.assertEqual(([s["name"] for s in hi], rest), (["s3", "s4", "s6", "s9"], []))

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


# A real resume that went NaN: dead-expert/master=fp32,guard=off,policy=per_key of the default
# matrix (tests/data/nan_resume: its baseline and resumed metrics.csv and metrics_compare.csv as the
# harness wrote them). Saved at 10, the resumed lm loss is finite at 11 and -nan from 12 on; its
# |d loss| is inf from 12.
NAN_DATA = os.path.join(HERE, "data", "nan_resume")
NAN_SCENARIO = ("dead-expert/policy=per_key", "dead-expert__policy=per_key", "per_key", "BF16", 1.0, 3)


class NonFiniteAndBitExactTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="rh_plots_nan_")
        make_run(self.dir, SCENARIOS + [NAN_SCENARIO])
        d = os.path.join(self.dir, "scenarios", NAN_SCENARIO[1])
        for rel in ("baseline/metrics.csv", "resumed/metrics.csv", "metrics_compare.csv"):
            shutil.copy(os.path.join(NAN_DATA, rel), os.path.join(d, rel))
        env = dict(os.environ, RH_PYTHON="/bin/false")   # plot inputs only; the figures are built here
        subprocess.run([TOOL, "report", self.dir], env=env, check=True, capture_output=True)
        self.plt, self.figs = build_figures(self.dir)

    def tearDown(self):
        close_all(self.plt, self.figs)
        shutil.rmtree(self.dir)

    def panel(self, png, group):
        found = [ax for ax in self.figs[png].axes if ax.get_title().startswith(group + " (")]
        self.assertEqual(len(found), 1, [ax.get_title() for ax in self.figs[png].axes])
        return found[0]

    def test_a_nan_run_is_drawn_up_to_where_it_became_nan_and_marked_there(self):
        import math
        ax = self.panel("loss_curves.png", "dead-expert")
        self.assertIn("policy=per_key (nan from iteration 12)", labelled_series(ax))
        marks = [ln for ln in ax.get_lines() if ln.get_gid() == "nonfinite:policy=per_key"]
        self.assertEqual(len(marks), 1)
        self.assertEqual(list(marks[0].get_xdata()), [12])
        self.assertTrue(any("nan from 12" in t.get_text() for t in ax.texts), [t.get_text() for t in ax.texts])
        # The finite prefix is drawn: the resumed point at 11 (4.14344168 in metrics.csv) and the
        # whole baseline, no line reaches a non-finite value.
        points = [(x, y) for ln in ax.get_lines() if not (ln.get_gid() or "").startswith("nonfinite")
                  for x, y in zip(ln.get_xdata(), ln.get_ydata()) if math.isfinite(y)]
        self.assertIn((11, float.fromhex("0x1.092e26p+2")), points)
        self.assertEqual(len([p for p in points if p[0] == 20]), 1)   # the baseline's 20; the resumed 20 is nan
        # |d loss| after resume: inf from 12, triangles along the top with the same gid.
        ax = self.panel("dloss.png", "dead-expert")
        bad = [ln for ln in ax.get_lines() if ln.get_gid() == "nonfinite:policy=per_key"]
        self.assertEqual(len(bad), 1)
        self.assertEqual(list(bad[0].get_xdata()), list(range(12, 21)))
        self.assertTrue(any(t.get_text() == "not finite" for t in ax.texts))

    def test_bit_exact_groups_are_one_line_not_a_panel_each(self):
        titles = [ax.get_title() for ax in self.figs["dloss.png"].axes if ax.get_visible()]
        self.assertFalse(any(t.startswith("states (") for t in titles), titles)
        self.assertTrue(any(t.startswith("faults (") for t in titles), titles)
        self.assertEqual(bit_exact_text(self.figs["dloss.png"]),
                         "Bit-exact at every iteration after resume (|d loss| = 0, no panel drawn): states (2)")
        # The loss panels still show every group: their curves are not empty.
        self.panel("loss_curves.png", "states")

    def test_a_run_where_every_group_is_bit_exact_draws_one_line(self):
        close_all(self.plt, self.figs)
        d = os.path.join(self.dir, "exact")
        make_run(d, SCENARIOS[:2])
        with open(os.path.join(d, "summary.csv")) as f:   # drop the errored row make_run adds
            rows = [r for r in f if not r.startswith("faults/crash")]
        write(os.path.join(d, "summary.csv"), "".join(rows))
        subprocess.run([TOOL, "report", d], env=dict(os.environ, RH_PYTHON="/bin/false"), check=True,
                       capture_output=True)
        self.plt, self.figs = build_figures(d)
        self.assertEqual([ax for ax in self.figs["dloss.png"].axes if ax.get_visible() and ax.axison], [])
        self.assertEqual(bit_exact_text(self.figs["dloss.png"]),
                         "Bit-exact at every iteration after resume (|d loss| = 0, no panel drawn): states (2)")


class UlpCapTest(unittest.TestCase):
    """A summary with more differing rows than MAX_ULP_ROWS draws MAX_ULP_ROWS of them (1,000 rows
    took 80 s, 100,000 ran past the plot step's limit): the failed rows and the largest
    differences, in summary order; the title says how many of how many, and the line under the
    panel counts the rows not drawn."""

    def test_long_summary_draws_the_worst_rows_and_says_so(self):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        plots = load_plots_module()
        n = 3 * plots.MAX_ULP_ROWS
        rows = [{"scenario": "g/s%05d" % i, "expectation": "exact", "passed": "1", "max_ulp_model": "0",
                 "max_ulp_exp_avg": str(i % 7)} for i in range(n)]
        rows[5]["passed"] = "0"            # a miss is always shown, whatever its ULP
        rows[n - 1]["max_ulp_exp_avg"] = "1000"
        exact = len([i for i in range(n) if i % 7 == 0])
        fig = plots.build_ulp_figure(plt, rows)
        try:
            names = [t.get_text() for ax in fig.axes if ax.images for t in ax.get_yticklabels()]
            self.assertEqual(len(names), plots.MAX_ULP_ROWS)
            self.assertEqual(names, sorted(names))
            self.assertIn("s00005", names)
            self.assertIn("s%05d" % (n - 1), names)
            self.assertIn("%d of %d scenarios shown" % (plots.MAX_ULP_ROWS, n - exact), fig._suptitle.get_text())
            lines = [t.get_text() for t in fig.texts if t.get_gid() == "ulp-collapsed:g"]
            self.assertEqual(lines, ["%d scenarios bit-exact in every key; %d more scenarios with a difference, not "
                                     "drawn (row limit)" % (exact, n - exact - plots.MAX_ULP_ROWS)])
        finally:
            plt.close(fig)

    def test_short_summary_is_drawn_whole(self):
        plots = load_plots_module()
        rows = [{"scenario": "s%d" % i, "passed": "1", "max_ulp_model": "0"} for i in range(10)]
        self.assertEqual(plots.ulp_rows_shown(rows, ["model"]), (rows, ""))


def default_size_summary():
    """190 scenarios in 19 groups of 10, named like the default matrix's longest (states/...), every
    key kind present, and what each row should become: 'drawn', 'exact' (met its expectation, 0 ULP
    in every key) or 'no-keys' (met it, no key compared)."""
    import itertools
    combos = ["exp_avg=%s,exp_avg_sq=%s,master=%s,policy=%s" % c for c in
              itertools.product(("fp32", "bf16"), ("fp32", "bf16"), ("remainders", "fp32"),
                                ("dp_reshardable", "per_key", "native"))]
    kinds = ["model", "master_param", "remainder", "exp_avg", "exp_avg_sq", "scale"]
    rows, klass = [], {}
    for g in range(19):
        for k in range(10):
            name = "group%02d/%s" % (g, combos[(3 * g + k) % len(combos)])
            r = {"scenario": name, "expectation": "tolerance" if k % 2 else "exact", "passed": "1"}
            differs = (g + k) % 3 != 0 and g % 5 != 0
            values = ["990057071", "7", "14", "32768", "28", "35"] if differs else ["0"] * 6
            klass[name] = "drawn" if differs else "exact"
            if g % 4 == 0 and k == 9:
                values, r["expectation"], klass[name] = [""] * 6, "refused", "no-keys"
            if (g % 3 == 1 and k == 4) or (g == 7 and k == 2):    # missed: drawn, red, even at 0 ULP
                r["passed"], klass[name] = "0", "drawn"
            r.update(("max_ulp_" + kind, v) for kind, v in zip(kinds, values))
            rows.append(r)
    return rows, klass


class UlpReadableTest(unittest.TestCase):
    """The ULP figure of a default-matrix-sized run (190 scenarios, 19 groups) is readable, measured
    on the figure at the saved PNG's pixels: no y label overlaps another or a panel, every text is at
    least 7 pt, every cell at least 24 x 12 px and as wide as its number, the PNG within the page
    limits; every row that differs or missed is drawn and the rest are counted per group."""

    @classmethod
    def setUpClass(cls):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        cls.plt, plots = plt, load_plots_module()
        cls.rows, cls.klass = default_size_summary()
        cls.dir = tempfile.mkdtemp(prefix="rh_plots_ulp_")
        cls.png = os.path.join(cls.dir, "ulp_heatmap.png")
        cls.fig = plots.build_ulp_figure(plt, cls.rows)
        cls.fig.savefig(cls.png, dpi=plots.DPI, metadata=plots.PNG_META)
        cls.renderer = cls.fig.canvas.get_renderer()
        cls.heat = [ax for ax in cls.fig.axes if ax.images]    # the colour bars have none

    @classmethod
    def tearDownClass(cls):
        cls.plt.close(cls.fig)
        shutil.rmtree(cls.dir)

    def labels(self):
        return [t for ax in self.heat for t in ax.get_yticklabels() if t.get_visible() and t.get_text()]

    def test_png_fits_the_page(self):
        w, h = png_size(self.png)
        self.assertLessEqual(w, MAX_W)
        self.assertLessEqual(h, MAX_H)
        self.assertEqual((w, h), tuple(int(round(v)) for v in self.fig.get_size_inches() * self.fig.dpi))

    def test_labels_do_not_overlap(self):
        boxes = [(t.get_text(), t.get_window_extent(self.renderer)) for t in self.labels()]
        self.assertTrue(boxes)
        for i, (a, ba) in enumerate(boxes):
            for b, bb in boxes[i + 1:]:
                self.assertFalse(ba.x0 < bb.x1 and bb.x0 < ba.x1 and ba.y0 < bb.y1 and bb.y0 < ba.y1,
                                 "%r overlaps %r" % (a, b))
        for ax in self.heat:     # nor a panel's cells (a long label of the right-hand column)
            box = ax.get_window_extent(self.renderer)
            for text, b in boxes:
                if text not in [t.get_text() for t in ax.get_yticklabels()]:
                    self.assertFalse(box.x0 < b.x1 and b.x0 < box.x1 and box.y0 < b.y1 and b.y0 < box.y1, text)

    def test_every_text_is_at_least_7_pt(self):
        texts = self.labels() + [t for ax in self.heat for t in ax.get_xticklabels() + ax.texts if t.get_text()]
        texts += [t for t in self.fig.texts if t.get_text()]
        for t in texts:
            self.assertGreaterEqual(t.get_fontsize(), 7, t.get_text())

    def test_cells_are_at_least_24_by_12_px_and_hold_their_numbers(self):
        for ax in self.heat:
            columns = []
            for im in ax.images:
                rows, cols = im.get_array().shape[:2]
                left, right, bottom, top = im.get_extent()
                (x0, y0), (x1, y1) = ax.transData.transform([(left, bottom), (right, top)])
                self.assertGreaterEqual(abs(x1 - x0) / cols, 24, ax.get_gid())
                self.assertGreaterEqual(abs(y1 - y0) / rows, 12, ax.get_gid())
                columns += [(min(x0, x1) + c * abs(x1 - x0) / cols, min(x0, x1) + (c + 1) * abs(x1 - x0) / cols)
                            for c in range(cols)]
            for t in ax.texts:
                b = t.get_window_extent(self.renderer)
                left, right = [c for c in columns if c[0] <= (b.x0 + b.x1) / 2 <= c[1]][0]
                self.assertTrue(left <= b.x0 and b.x1 <= right, "%r is wider than its cell" % t.get_text())

    def test_every_row_that_differs_is_drawn_and_the_rest_counted_per_group(self):
        import re
        drawn = [t.get_text() for t in self.labels()]
        self.assertEqual(sorted(drawn), sorted(n.split("/", 1)[1] for n, c in self.klass.items() if c == "drawn"))
        expected = {}
        for name, c in self.klass.items():
            expected.setdefault(name.split("/")[0], {"drawn": 0, "exact": 0, "no-keys": 0})[c] += 1
        counted = {}
        for t in self.fig.texts:
            gid = t.get_gid() or ""
            if gid.startswith("ulp-collapsed:"):
                text = t.get_text()
                self.assertNotIn("not drawn", text)
                exact = re.search(r"(\d+) scenarios? bit-exact in every key", text)
                no_keys = re.search(r"(\d+) scenarios? with no key compared", text)
                counted[gid.split(":", 1)[1]] = (int(exact.group(1)) if exact else 0,
                                                 int(no_keys.group(1)) if no_keys else 0)
            elif gid == "ulp-collapsed-groups":     # the groups without a panel
                for group, parts in re.findall(r"(\S+) \(([^)]*)\)", t.get_text()):
                    exact = re.search(r"(\d+) bit-exact", parts)
                    no_keys = re.search(r"(\d+) no key compared", parts)
                    self.assertNotIn(group, counted)
                    self.assertEqual(expected[group]["drawn"], 0, group)
                    counted[group] = (int(exact.group(1)) if exact else 0, int(no_keys.group(1)) if no_keys else 0)
        self.assertEqual(counted, {g: (e["exact"], e["no-keys"]) for g, e in expected.items()
                                   if e["exact"] or e["no-keys"]})
        # groups 0, 5 and 15 have no row to draw (10 has a miss), 0 a load refused as well
        self.assertEqual([g for g, e in expected.items() if not e["drawn"]], ["group00", "group05", "group15"])


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_plots.py PATH_TO_resume-harness")
    TOOL = sys.argv.pop(1)
    unittest.main()
