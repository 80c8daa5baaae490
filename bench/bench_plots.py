#!/usr/bin/python3
"""The report's plot step (reports/plots.py) on long matrix summaries: rows per second.

Writes a synthetic run directory of N scenarios (summary.csv, plots/index.csv, plots/storage.csv;
the scenarios' metrics files absent, so the loss panels are empty and the time is the summary's)
and times plots.py on it, N = 1,000 / 10,000 / 100,000 by default. A 100,000-row
summary ran past the plot step's 300 s limit; the ULP heat map now draws at most
plots.MAX_ULP_ROWS rows and says so.

    bench/bench_plots.py [N ...]
"""
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PLOTS = os.environ.get("RH_PLOTS_SCRIPT", os.path.join(HERE, "..", "reports", "plots.py"))   # e.g. an older one
HEADER = ["scenario", "expectation", "passed", "outcome", "verdict", "first_divergence", "max_abs_dloss", "max_ulp_model",
          "max_ulp_master_param", "max_ulp_remainder", "max_ulp_exp_avg", "max_ulp_exp_avg_sq", "max_ulp_scale",
          "checkpoint_bytes", "bytes_per_param", "num_params", "save_policy", "fault", "exp_avg_dtype",
          "exp_avg_sq_dtype", "master_mode", "seconds", "compress", "raw_bytes_per_param"]


def write_run(d, n):
    os.makedirs(os.path.join(d, "plots"))
    with open(os.path.join(d, "summary.csv"), "w", newline="") as f, \
            open(os.path.join(d, "plots", "index.csv"), "w", newline="") as g:
        s, x = csv.writer(f), csv.writer(g)
        s.writerow(HEADER)
        x.writerow(["scenario", "group", "dir", "save_at", "iterations", "passed", "outcome"])
        for i in range(n):
            group = "g%d" % (i % 40)
            name = "%s/case=%d" % (group, i)
            passed = "0" if i % 97 == 0 else "1"
            s.writerow([name, "exact", passed, "identical", "PASS", "", "0", "0", str(i % 13), "", str(i % 5), "0",
                        "", "9928800", "10.08", "984704", "native", "none", "fp32", "fp32", "fp32", "2.0", "none",
                        "10.08"])
            x.writerow([name, group, "scenarios/" + name.replace("/", "__"), "10", "20", passed, "identical"])
    with open(os.path.join(d, "plots", "storage.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["storage", "save_policy", "kind", "bytes", "total_bytes", "is_reference", "reduction_pct"])
        for kind, b in (("model", 1969408), ("master_param", 3938816), ("exp_avg", 3938816), ("exp_avg_sq", 3938816)):
            w.writerow(["native: fp32 states", "native", kind, b, 13785856, 1, "0.00"])


def main(argv):
    sizes = [int(a) for a in argv] or [1000, 10000, 100000]
    for n in sizes:
        d = tempfile.mkdtemp(prefix="rh_bench_plots_")
        try:
            write_run(d, n)
            t0 = time.monotonic()
            p = subprocess.run([sys.executable, PLOTS, d], capture_output=True, text=True)
            dt = time.monotonic() - t0
            if p.returncode != 0:
                print("bench_plots: plots.py exit %d: %s" % (p.returncode, p.stderr.strip()[-300:]))
                return 1
            print("bench_plots: %7d rows: %6.1f s, %8.0f rows/s" % (n, dt, n / dt))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
