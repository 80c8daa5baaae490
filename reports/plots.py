#!/usr/bin/python3
"""PNG plots of a resume-harness matrix run directory, for report.md / report.html.

Usage: plots.py RUN_DIR

Reads only CSVs: RUN_DIR/summary.csv, RUN_DIR/plots/index.csv and RUN_DIR/plots/storage.csv
(written by `resume-harness report` from the same parsed values as its tables), and each
scenario's baseline/metrics.csv, resumed/metrics.csv and metrics_compare.csv. Writes into
RUN_DIR/plots/: loss_curves.png, dloss.png, disk_bytes.png, ulp_heatmap.png.

Exit status: 0 written, 2 bad input, 3 matplotlib cannot be imported (the C++ side reports that
and still writes its tables).
"""
import csv
import math
import os
import sys

NO_MATPLOTLIB_EXIT = 3
ULP_KINDS = ["model", "master_param", "remainder", "exp_avg", "exp_avg_sq", "scale"]
DISK_KINDS = ULP_KINDS + ["metadata"]
KIND_COLORS = {"model": "#4c72b0", "master_param": "#dd8452", "remainder": "#c44e52", "exp_avg": "#55a868",
               "exp_avg_sq": "#8172b3", "scale": "#937860", "metadata": "#8c8c8c"}
DPI = 100
# PNG metadata carries the matplotlib version by default; leaving it out keeps the bytes of a
# plot a function of the run's CSVs alone.
PNG_META = {"Software": None}


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def lm_loss_series(path):
    """(iterations, lm_loss) from a metrics.csv, values taken from the exact hex column."""
    its, loss = [], []
    for row in read_csv(path):
        its.append(int(row["iteration"]))
        loss.append(float.fromhex(row["lm_loss_hex"]))
    return its, loss


def dloss_series(path):
    """(iterations, |d lm_loss|) after resume from a metrics_compare.csv."""
    its, diff = [], []
    for row in read_csv(path):
        if row["metric"] == "lm_loss":
            its.append(int(row["iteration"]))
            diff.append(float(row["abs_diff"]))
    return its, diff


def zero_row_y(values):
    """The y position of the "0 (bit-exact)" row on a log axis: two decades below the smallest
    nonzero difference, so zeros sit on their own row instead of vanishing off a log scale."""
    pos = [v for v in values if v > 0 and math.isfinite(v)]
    if not pos:
        return 1e-12
    return 10.0 ** (math.floor(math.log10(min(pos))) - 2)


def wrap_label(label):
    """'per_key: model BF16, exp_avg BF16' -> one key per line, for bar-chart tick labels."""
    head, _, rest = label.partition(": ")
    return "\n".join([head] + [p for p in rest.split(", ") if p])


def size_change_text(row):
    """The bar annotation, from the same reduction text the report's disk table shows."""
    if row["is_reference"] == "1":
        return "fp32 reference"
    red = row["reduction_pct"]
    if not red:
        return "no fp32 reference"
    return "%s %% larger" % red[1:] if red.startswith("-") else "%s %% smaller" % red


def short_name(scenario, group):
    return scenario[len(group) + 1:] if scenario.startswith(group + "/") else scenario


def grid(n):
    cols = min(3, max(1, n))
    return (n + cols - 1) // cols, cols


def by_group(index):
    groups = {}
    for row in index:
        groups.setdefault(row["group"], []).append(row)
    return groups


def plot_loss_curves(plt, run_dir, index, out):
    groups = by_group(index)
    rows, cols = grid(len(groups))
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.2 * rows), squeeze=False)
    for ax, (group, members) in zip(axes.flat, groups.items()):
        drawn, save_points = 0, set()
        for k, s in enumerate(members):
            color = plt.cm.tab10(k % 10)
            base = os.path.join(run_dir, s["dir"], "baseline", "metrics.csv")
            res = os.path.join(run_dir, s["dir"], "resumed", "metrics.csv")
            name = short_name(s["scenario"], group)
            if os.path.exists(base):
                ax.plot(*lm_loss_series(base), color=color, lw=1.4, label=name + " baseline")
                drawn += 1
            if os.path.exists(res):
                ax.plot(*lm_loss_series(res), color=color, lw=0, marker="x", ms=5, label=name + " resumed")
            if s["save_at"]:
                save_points.add(int(s["save_at"]))
        for k in sorted(save_points):
            ax.axvline(k, color="0.3", ls="--", lw=1)
            ax.annotate("save at %d" % k, (k, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
                        textcoords="offset points", fontsize=8, color="0.3")
        if not drawn:
            ax.text(0.5, 0.5, "no metrics (scenarios errored)", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(group)
        ax.set_xlabel("iteration")
        ax.set_ylabel("lm loss")
        if drawn:
            ax.legend(fontsize=7, ncol=1 if len(members) < 6 else 2)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    fig.suptitle("Loss, baseline (line) vs resumed (x)")
    fig.tight_layout()
    fig.savefig(out, dpi=DPI, metadata=PNG_META)
    plt.close(fig)


def plot_dloss(plt, run_dir, index, out):
    groups = by_group(index)
    rows, cols = grid(len(groups))
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.2 * rows), squeeze=False)
    for ax, (group, members) in zip(axes.flat, groups.items()):
        series = []
        for s in members:
            path = os.path.join(run_dir, s["dir"], "metrics_compare.csv")
            if os.path.exists(path):
                its, d = dloss_series(path)
                if its:
                    series.append((short_name(s["scenario"], group), its, d))
        if not series:
            ax.text(0.5, 0.5, "no resumed iterations to compare", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(group)
            continue
        zero_y = zero_row_y([v for _, _, d in series for v in d])
        top = max([v for _, _, d in series for v in d if v > 0 and math.isfinite(v)] + [zero_y * 1e3])
        ax.set_yscale("log")
        ax.axhspan(zero_y / 3, zero_y * 3, color="#e6f4ea", zorder=0)
        ax.axhline(zero_y * 6, color="0.6", lw=0.8, ls=":")
        width = 0.6 / max(1, len(series))
        for k, (name, its, d) in enumerate(series):
            color = plt.cm.tab10(k % 10)
            nz = [(i, v) for i, v in zip(its, d) if v > 0]
            if nz:
                ax.plot([i for i, _ in nz], [v for _, v in nz], color=color, marker="o", ms=4, lw=1.2, label=name)
            zeros = [i + (k - (len(series) - 1) / 2) * width for i, v in zip(its, d) if v == 0]
            if zeros:
                ax.plot(zeros, [zero_y] * len(zeros), ls="none", marker="s", ms=6, mfc="none", mec=color,
                        mew=1.5, label=None if nz else name)
        ax.set_ylim(zero_y / 3, top * 10)
        ticks = [t for t in ax.get_yticks() if zero_y * 10 <= t <= top * 10]
        ax.set_yticks([zero_y] + ticks)
        ax.set_yticklabels(["0 (bit-exact)"] + ["%.0e" % t for t in ticks])
        ax.set_title(group)
        ax.set_xlabel("iteration after resume")
        ax.set_ylabel("|d lm loss|")
        ax.legend(fontsize=7, ncol=1 if len(series) < 6 else 2)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    fig.suptitle("|d loss| per iteration after resume (squares on the bottom row: exactly 0)")
    fig.tight_layout()
    fig.savefig(out, dpi=DPI, metadata=PNG_META)
    plt.close(fig)


def plot_disk(plt, storage, out):
    labels = []
    for row in storage:
        if row["storage"] not in labels:
            labels.append(row["storage"])
    fig, ax = plt.subplots(figsize=(max(6.4, 1.9 * len(labels) + 2), 6.2))
    biggest = max([float(r["total_bytes"]) for r in storage] + [1.0])
    unit, scale = ("MiB", 2.0 ** 20) if biggest >= 2.0 ** 24 else ("KiB", 2.0 ** 10)
    bottoms = [0.0] * len(labels)
    for kind in DISK_KINDS:
        vals = [0.0] * len(labels)
        for row in storage:
            if row["kind"] == kind:
                vals[labels.index(row["storage"])] = float(row["bytes"]) / scale
        if any(vals):
            ax.bar(range(len(labels)), vals, bottom=bottoms, color=KIND_COLORS[kind], label=kind, width=0.6)
            bottoms = [b + v for b, v in zip(bottoms, vals)]
    for x, label in enumerate(labels):
        row = next(r for r in storage if r["storage"] == label)
        text = size_change_text(row)
        ax.annotate(text, (x, bottoms[x]), xytext=(0, 4), textcoords="offset points", ha="center", fontsize=9)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([wrap_label(lab) for lab in labels], fontsize=7)
    ax.set_ylabel("checkpoint " + unit)
    ax.set_ylim(0, max(bottoms + [1.0]) * 1.12)
    ax.legend(fontsize=8)
    ax.set_title("Checkpoint bytes by key kind, size change vs the fp32 policy")
    fig.tight_layout()
    fig.savefig(out, dpi=DPI, metadata=PNG_META)
    plt.close(fig)


def plot_ulp_heatmap(plt, summary, out):
    import numpy as np
    names = [r["scenario"] for r in summary]
    data = np.full((len(names), len(ULP_KINDS)), np.nan)
    for i, r in enumerate(summary):
        for j, k in enumerate(ULP_KINDS):
            if r["max_ulp_" + k] != "":
                data[i, j] = math.log10(1.0 + float(r["max_ulp_" + k]))
    fig, ax = plt.subplots(figsize=(9.5, max(3.0, 0.32 * len(names) + 1.8)))
    cmap = plt.get_cmap("magma_r").copy()
    cmap.set_bad("#d9d9d9")
    vmax = max(1.0, float(np.nanmax(data)) if np.isfinite(data).any() else 1.0)
    im = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, vmin=0, vmax=vmax, aspect="auto")
    for i, r in enumerate(summary):
        for j, k in enumerate(ULP_KINDS):
            txt = r["max_ulp_" + k] or "\u2014"
            dark = np.isfinite(data[i, j]) and data[i, j] > vmax / 2
            ax.text(j, i, txt, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_xticks(range(len(ULP_KINDS)))
    ax.set_xticklabels(ULP_KINDS, fontsize=8)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=7)
    fig.colorbar(im, ax=ax, label="log10(1 + max ULP)")
    ax.set_title("Max ULP after load per key kind (0 = bit-exact, grey = key not in checkpoint)")
    fig.tight_layout()
    fig.savefig(out, dpi=DPI, metadata=PNG_META)
    plt.close(fig)


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    run_dir = argv[1]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print("plots.py: matplotlib cannot be imported by %s (%s); install python3-matplotlib "
              "or run with an interpreter that has it" % (sys.executable, e), file=sys.stderr)
        return NO_MATPLOTLIB_EXIT
    plots = os.path.join(run_dir, "plots")
    try:
        summary = read_csv(os.path.join(run_dir, "summary.csv"))
        index = read_csv(os.path.join(plots, "index.csv"))
        storage = read_csv(os.path.join(plots, "storage.csv"))
    except (OSError, csv.Error) as e:
        print("plots.py: %s" % e, file=sys.stderr)
        return 2
    plot_loss_curves(plt, run_dir, index, os.path.join(plots, "loss_curves.png"))
    plot_dloss(plt, run_dir, index, os.path.join(plots, "dloss.png"))
    plot_disk(plt, storage, os.path.join(plots, "disk_bytes.png"))
    plot_ulp_heatmap(plt, summary, os.path.join(plots, "ulp_heatmap.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
