#!/usr/bin/python3
"""report.html as a person sees it: rendered by headless Chromium (Debian's `chromium`, installed
by scripts/setup.sh), checked from the live DOM and from a screenshot.

From the DOM (a probe script is appended to a copy of the page; Chromium runs it after load and
`--dump-dom` returns what it found): the list of scenarios that missed their expectation is the
first section and starts on the first screen, with one item per failing row of summary.csv, each
naming its reproduce command; the outcome grid has one coloured cell per scenario, failed cells
exactly for the failing rows and expected divergences in their own class; every image decoded,
shown at its natural aspect ratio, at least 300 px wide and not wider than the page; nothing
overflows the window sideways.
From the screenshot (full page, 1280 px wide): the grid's colours are on the page and the first
screen is not blank. The screenshot is kept as build/report_screenshot.png.

Usage: test_report_browser.py PATH_TO_resume-harness   (CTest passes it). Exits 77 (CTest: skipped)
when Chromium is not installed.
"""
import csv
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHROMIUM = os.environ.get("RH_CHROMIUM", "/usr/bin/chromium")
TOOL = None
WIDTH = 1280
FIRST_SCREEN = 800
SKIP = 77
# The grid's cell colours (reports/document.cpp kCss), as 8-bit RGB.
COLOURS = {"o-identical": (0xda, 0xfb, 0xe1), "o-diverged-as-expected": (0xdd, 0xf4, 0xff),
           "o-failed": (0xff, 0xd8, 0xd3)}

PROBE = """<script>
window.addEventListener('load', () => {
  const box = e => { const r = e.getBoundingClientRect(); return {top: r.top + scrollY, w: r.width, h: r.height}; };
  const h2 = [...document.querySelectorAll('h2')].map(h => ({text: h.textContent, top: box(h).top}));
  const failing = [...document.querySelectorAll('h2')].find(h => h.textContent.startsWith('Scenarios that did not'));
  let items = [];
  if (failing) { let n = failing.nextElementSibling; while (n && n.tagName !== 'UL' && n.tagName !== 'H2') n = n.nextElementSibling;
                 if (n && n.tagName === 'UL') items = [...n.querySelectorAll('li')].map(li => li.textContent); }
  const cells = {};
  for (const td of document.querySelectorAll('td[class^="o-"]')) cells[td.className] = (cells[td.className] || 0) + 1;
  const titled = [...document.querySelectorAll('td[class^="o-"][title]')].length;
  const images = [...document.images].map(i => ({complete: i.complete, nw: i.naturalWidth, nh: i.naturalHeight,
                                                 w: box(i).w, h: box(i).h}));
  const out = {h2, items, cells, titled, images, scrollWidth: document.documentElement.scrollWidth,
               innerWidth: innerWidth, height: document.documentElement.scrollHeight};
  const pre = document.createElement('pre'); pre.id = 'rh-probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def chromium(*args):
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
           "--no-first-run", "--disable-extensions", "--user-data-dir=" + tempfile.mkdtemp(prefix="rh_chromium_"),
           "--virtual-time-budget=10000"] + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def load_fixture():
    spec = importlib.util.spec_from_file_location("test_plots", os.path.join(HERE, "test_plots.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class ReportInChromium(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="rh_browser_")
        load_fixture().make_run(cls.dir)
        p = subprocess.run([TOOL, "report", cls.dir], capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        with open(os.path.join(cls.dir, "summary.csv"), newline="") as f:
            cls.rows = list(csv.DictReader(f))
        with open(os.path.join(cls.dir, "report.html")) as f:
            html = f.read()
        probe_page = os.path.join(cls.dir, "probe.html")
        with open(probe_page, "w") as f:
            f.write(html.replace("</body>", PROBE + "</body>"))
        p = chromium("--window-size=%d,%d" % (WIDTH, FIRST_SCREEN), "--dump-dom", "file://" + probe_page)
        found = re.search(r'<pre id="rh-probe">(.*?)</pre>', p.stdout, re.S)
        assert found, "no probe output from Chromium: " + p.stderr[-2000:]
        cls.dom = json.loads(found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                             .replace("&amp;", "&"))
        cls.shot = os.path.join(cls.dir, "screenshot.png")
        p = chromium("--window-size=%d,%d" % (WIDTH, cls.dom["height"] + 20), "--screenshot=" + cls.shot,
                     "file://" + os.path.join(cls.dir, "report.html"))
        assert os.path.exists(cls.shot), "no screenshot: " + p.stderr[-2000:]
        shutil.copy(cls.shot, os.path.join(os.getcwd(), "report_screenshot.png"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def failing_rows(self):
        return [r for r in self.rows if r["passed"] != "1"]

    def test_failing_list_comes_first_on_the_first_screen(self):
        h2 = self.dom["h2"]
        self.assertTrue(h2 and h2[0]["text"].startswith("Scenarios that did not meet their expectation"), h2[:3])
        self.assertLess(h2[0]["top"], FIRST_SCREEN)
        failing = self.failing_rows()
        self.assertEqual(len(self.dom["items"]), len(failing), self.dom["items"])
        for row, item in zip(failing, self.dom["items"]):
            self.assertTrue(item.startswith(row["scenario"]), item)
            self.assertIn("reproduce: resume-harness check --file", item)

    def test_outcome_grid_separates_failures_from_expected_divergence(self):
        cells = self.dom["cells"]
        self.assertEqual(cells.get("o-failed", 0), len(self.failing_rows()), cells)
        self.assertEqual(cells.get("o-diverged-as-expected", 0),
                         sum(1 for r in self.rows if r["passed"] == "1" and r["outcome"] == "diverged"), cells)
        self.assertEqual(cells.get("o-identical", 0), sum(1 for r in self.rows if r["outcome"] == "identical"), cells)
        self.assertGreaterEqual(self.dom["titled"], len(self.rows))   # the first divergence on hover

    def test_every_image_is_decoded_and_fits_the_page(self):
        images = self.dom["images"]
        self.assertEqual(len(images), 4)
        for im in images:
            self.assertTrue(im["complete"] and im["nw"] > 0 and im["nh"] > 0, im)
            self.assertGreaterEqual(im["w"], 300, im)
            self.assertLessEqual(im["w"], WIDTH, im)
            self.assertAlmostEqual(im["w"] / im["h"], im["nw"] / im["nh"], delta=0.02 * im["nw"] / im["nh"])
        self.assertLessEqual(self.dom["scrollWidth"], self.dom["innerWidth"])

    def test_screenshot_shows_the_grid_colours_and_a_first_screen(self):
        import matplotlib.image
        px = (matplotlib.image.imread(self.shot)[:, :, :3] * 255).round().astype(int)
        self.assertEqual(px.shape[1], WIDTH)
        for name, rgb in COLOURS.items():
            hits = int(((abs(px - rgb)).max(axis=2) <= 2).sum())
            self.assertGreater(hits, 100, "%s %s: %d pixels" % (name, rgb, hits))
        first = px[:FIRST_SCREEN]
        self.assertGreater(int((first.max(axis=2) < 128).sum()), 2000, "first screen holds almost no text")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_report_browser.py PATH_TO_resume-harness")
    TOOL = sys.argv.pop(1)
    if not os.access(CHROMIUM, os.X_OK):
        print("test_report_browser: %s not found: skipped (scripts/setup.sh installs chromium)" % CHROMIUM)
        sys.exit(SKIP)
    unittest.main()
