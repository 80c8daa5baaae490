#!/usr/bin/python3
"""PNG plots of a resume-harness matrix run directory, for report.md / report.html.

Usage: plots.py RUN_DIR

Reads only CSVs: RUN_DIR/summary.csv, RUN_DIR/plots/index.csv and RUN_DIR/plots/storage.csv
(written by `resume-harness report` from the same parsed values as its tables), and each
scenario's baseline/metrics.csv, resumed/metrics.csv and metrics_compare.csv. Writes into
RUN_DIR/plots/: loss_curves.png, dloss.png, disk_bytes.png, ulp_heatmap.png.

Every figure fits a page (at most MAX_WIDTH_PX x MAX_HEIGHT_PX) and no axes carries more than
MAX_SERIES labelled series: a scenario group with more members shows the ones that differ most
after resume in colour and the rest as thin grey lines under one "+N more" label. Legends sit
outside the axes.

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
POLICY_ORDER = ["dp_reshardable", "fp32", "fully_reshardable", "dp_zero", "native", "per_key"]
DPI = 100
MAX_WIDTH_PX = 1400
MAX_HEIGHT_PX = 1800
MAX_SERIES = 8          # labelled series per axes, the "+N more" entry included
PANEL_COLS = 3
ULP_ROWS_PER_BLOCK = 70  # heat map rows per column block; longer matrices get blocks side by side
# Heat map rows drawn at most (4 blocks): every cell is a text object, and 1,000 rows took 80 s to
# draw (a 100,000-row summary ran past the plot step's limit); past this the map shows
# the rows that missed their expectation, then the largest differences, and says so.
MAX_ULP_ROWS = 4 * ULP_ROWS_PER_BLOCK
REST_COLOR = "0.72"
# Highlight colours: tab10 without its grey, which is kept for the "+N more" lines.
SERIES_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22"]
# PNG metadata carries the matplotlib version by default; leaving it out keeps the bytes of a
# plot a function of the run's CSVs alone.
PNG_META = {"Software": None}
PNG_NAMES = ["loss_curves.png", "dloss.png", "disk_bytes.png", "ulp_heatmap.png"]


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
            diff.append(abs(float(row["abs_diff"])))
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


def storage_keys(label):
    """'per_key: model BF16, exp_avg BF16' -> 'model BF16, exp_avg BF16' (the policy is the panel)."""
    head, sep, rest = label.partition(": ")
    return rest if sep else label


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


def by_group(index):
    groups = {}
    for row in index:
        groups.setdefault(row["group"], []).append(row)
    return groups


def split_series(series, limit=MAX_SERIES):
    """Series (dicts with 'failed' and 'max_d') -> (highlighted, rest). All of them when they fit in
    `limit` labels; otherwise limit-1 in colour, the last label going to "+N more": scenarios that
    missed their expectation first, then the largest |d loss| after resume, then matrix order."""
    if len(series) <= limit:
        return list(series), []
    order = sorted(range(len(series)), key=lambda k: (not series[k]["failed"], -series[k]["max_d"], k))
    keep = set(order[:max(0, limit - 1)])
    return [s for k, s in enumerate(series) if k in keep], [s for k, s in enumerate(series) if k not in keep]


def rest_label(rest):
    worst = max([s["max_d"] for s in rest] + [0.0])
    if worst == 0:
        return "+%d more (grey; |d loss| all 0)" % len(rest)
    return "+%d more (grey; max |d loss| %.1e)" % (len(rest), worst)


def first_nonfinite(item):
    """(iteration, "nan" | "inf") where the resumed (else the baseline) lm loss first stops being
    finite, or None. A NaN run keeps its legend entry and gets a marker there instead of vanishing."""
    for key in ("res", "base"):
        if item.get(key):
            for i, v in zip(*item[key]):
                if not math.isfinite(v):
                    return i, "nan" if math.isnan(v) else "inf"
    return None


def finite_only(series):
    """(iterations, values) with non-finite values as NaN: matplotlib draws the finite points and
    leaves a gap, never a line to an infinite value."""
    its, vals = series
    return its, [v if math.isfinite(v) else float("nan") for v in vals]


def series_label(s):
    label = s["name"] + (" (missed expectation)" if s["failed"] else "")
    if s.get("nonfinite"):
        label += " (%s from iteration %d)" % (s["nonfinite"][1], s["nonfinite"][0])
    return label


def mark_nonfinite(ax, s, color, annotate):
    """A red-edged triangle at the top of the axes above the iteration where s's loss became
    non-finite (gid "nonfinite:NAME"), with the value named beside it when `annotate`."""
    if not s.get("nonfinite"):
        return
    from matplotlib.transforms import blended_transform_factory
    it, what = s["nonfinite"]
    top = blended_transform_factory(ax.transData, ax.transAxes)
    ax.plot([it], [0.95], transform=top, ls="none", marker="v", ms=7, color=color, mec="#c62828", mew=1.2,
            zorder=5, clip_on=False, gid="nonfinite:" + s["name"])
    if annotate:
        ax.annotate("%s from %d" % (what, it), (it, 0.95), xycoords=top, xytext=(5, -3), textcoords="offset points",
                    fontsize=7, color="#c62828", va="top")


def exact_label(exact):
    if len(exact) == 1:
        return "%s: 0 at every iteration" % series_label(exact[0])
    return "%d scenarios: 0 at every iteration" % len(exact)


def load_group_series(run_dir, members, group):
    """Per scenario of a group: its name, the loss curves and |d loss| after resume (None when a file
    is missing, e.g. the scenario errored), and max_d, the largest |d loss| (inf if one is not finite)."""
    out = []
    for s in members:
        d = os.path.join(run_dir, s["dir"])
        base, res, cmp_ = (os.path.join(d, "baseline", "metrics.csv"), os.path.join(d, "resumed", "metrics.csv"),
                           os.path.join(d, "metrics_compare.csv"))
        item = {"name": short_name(s["scenario"], group), "failed": s.get("passed") == "0",
                "save_at": int(s["save_at"]) if s.get("save_at") else None,
                "base": lm_loss_series(base) if os.path.exists(base) else None,
                "res": lm_loss_series(res) if os.path.exists(res) else None,
                "dloss": dloss_series(cmp_) if os.path.exists(cmp_) else None}
        d_vals = (item["dloss"] or ([], []))[1]
        item["max_d"] = float("inf") if any(not math.isfinite(v) for v in d_vals) else max(d_vals + [0.0])
        item["nonfinite"] = first_nonfinite(item)
        out.append(item)
    return out


def dloss_split(series):
    """|d loss| entries of one panel: (highlighted, rest, exact). Scenarios whose |d loss| is 0 at every
    iteration after resume and that met their expectation share one entry (exact); the others are
    split by split_series within the labels that entry leaves."""
    exact = [s for s in series if s["max_d"] == 0 and not s["failed"]]
    other = [s for s in series if s["max_d"] != 0 or s["failed"]]
    hi, rest = split_series(other, MAX_SERIES - (1 if exact else 0))
    return hi, rest, exact


def bit_exact_group(members, series):
    """Every scenario of the group has |d loss| after resume, 0 at every iteration, and met its
    expectation (a scenario without metrics, e.g. one that errored, keeps the group's panel)."""
    return bool(series) and len(series) == len(members) and all(s["max_d"] == 0 and not s["failed"]
                                                                for s in series)


def bit_exact_line(exact_groups, groups):
    return ("Bit-exact at every iteration after resume (|d loss| = 0, no panel drawn): " +
            ", ".join("%s (%d)" % (g, len(groups[g])) for g in exact_groups))


def legend_labels_loss(series):
    hi, rest = split_series(series)
    return [series_label(s) for s in hi] + ([rest_label(rest)] if rest else [])


def legend_labels_dloss(series):
    hi, rest, exact = dloss_split(series)
    return ([series_label(s) for s in hi] + ([rest_label(rest)] if rest else []) +
            ([exact_label(exact)] if exact else []))


def legend_shape(labels):
    longest = max([len(t) for t in labels] + [0])
    ncol = 2 if longest <= 30 and len(labels) > 1 else 1
    return ncol, (len(labels) + ncol - 1) // ncol


def panel_figure(plt, legend_rows):
    """A grid of one panel per group (legend_rows: the legend lines under each panel's axes),
    PANEL_COLS wide; each grid row as tall as its axes plus its tallest legend, the whole figure
    within MAX_WIDTH_PX x MAX_HEIGHT_PX."""
    n = len(legend_rows)
    cols = min(PANEL_COLS, max(1, n))
    rows = (n + cols - 1) // cols
    heights = [2.45 + 0.14 * max(legend_rows[r * cols:(r + 1) * cols]) for r in range(rows)]
    width = min(MAX_WIDTH_PX / DPI, 4.65 * cols)
    height = min(MAX_HEIGHT_PX / DPI, 0.45 + sum(heights))
    fig, axes = plt.subplots(rows, cols, figsize=(width, height), squeeze=False, layout="constrained",
                             gridspec_kw={"height_ratios": heights})
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat)[:n]


def panel_legend(ax, ncol, last=None):
    """The legend under the axes; the entry labelled `last` (the grey summary) goes last."""
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda k: (labels[k] in (last or []), k))
    if handles:
        ax.legend([handles[k] for k in order], [labels[k] for k in order], loc="upper center",
                  bbox_to_anchor=(0.5, -0.2), ncol=ncol, fontsize=7, frameon=False, handlelength=1.6,
                  columnspacing=1.0, borderaxespad=0.0)


def style_panel(ax, title, xlabel, ylabel):
    from matplotlib.ticker import MaxNLocator
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8, labelpad=1)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def group_title(group, members, with_data):
    missing = len(members) - with_data
    return "%s (%d%s)" % (group, len(members), "; %d without metrics" % missing if missing else "")


def build_loss_figure(plt, run_dir, index):
    groups = by_group(index)
    all_series = {g: load_group_series(run_dir, m, g) for g, m in groups.items()}
    shapes = {g: legend_shape(legend_labels_loss(s)) for g, s in all_series.items()}
    fig, axes = panel_figure(plt, [shapes[g][1] for g in all_series])
    for ax, (group, series) in zip(axes, all_series.items()):
        hi, rest = split_series(series)
        drawn = False
        for s in rest:
            for key in ("base", "res"):
                if s[key]:
                    ax.plot(*finite_only(s[key]), color=REST_COLOR, lw=0.7, zorder=1,
                            label=rest_label(rest) if not drawn else None)
                    drawn = True
            mark_nonfinite(ax, s, REST_COLOR, False)
        for k, s in enumerate(hi):
            color = SERIES_COLORS[k % len(SERIES_COLORS)]
            if s["base"]:
                ax.plot(*finite_only(s["base"]), color=color, lw=1.3, zorder=2, label=series_label(s))
            if s["res"]:
                ax.plot(*finite_only(s["res"]), color=color, lw=0, marker="x", ms=4, mew=1.0, zorder=3,
                        label=None if s["base"] else series_label(s))
            mark_nonfinite(ax, s, color, True)
            drawn = drawn or bool(s["base"] or s["res"])
        for at in sorted({s["save_at"] for s in series if s["save_at"] is not None}):
            ax.axvline(at, color="0.3", ls="--", lw=0.9, zorder=0)
            ax.annotate("save at %d" % at, (at, 0), xycoords=("data", "axes fraction"), xytext=(-3, 4),
                        textcoords="offset points", fontsize=7, color="0.3", ha="right")
        if not drawn:
            ax.text(0.5, 0.5, "no metrics (scenarios errored)", ha="center", va="center", transform=ax.transAxes,
                    fontsize=8)
        style_panel(ax, group_title(group, series, sum(1 for s in series if s["base"] or s["res"])), "iteration",
                    "lm loss")
        panel_legend(ax, shapes[group][0], [rest_label(rest)] if rest else None)
    fig.suptitle("Loss per scenario group: baseline (line) vs resumed (x); a bit-exact resume puts every x "
                 "on its line", fontsize=10)
    return fig


def build_dloss_figure(plt, run_dir, index):
    from matplotlib.ticker import FixedLocator, NullFormatter
    groups = by_group(index)
    all_series = {g: [s for s in load_group_series(run_dir, m, g) if s["dloss"] and s["dloss"][0]]
                  for g, m in groups.items()}
    # A group that is bit-exact throughout would be a panel with one row of zeros: it becomes one
    # line of text under the figure instead.
    exact_groups = [g for g, series in all_series.items() if bit_exact_group(groups[g], series)]
    all_series = {g: s for g, s in all_series.items() if g not in exact_groups}
    if not all_series:
        fig, ax = plt.subplots(figsize=(9.0, 1.6), layout="constrained")
        ax.set_axis_off()
        ax.text(0.5, 0.5, bit_exact_line(exact_groups, groups), ha="center", va="center", fontsize=9, wrap=True,
                color="#2e7d32", gid="bit-exact-groups")
        fig.suptitle("|d lm loss| per iteration after resume", fontsize=10)
        return fig
    shapes = {g: legend_shape(legend_labels_dloss(s)) for g, s in all_series.items()}
    fig, axes = panel_figure(plt, [shapes[g][1] for g in all_series])
    if exact_groups:
        fig.supxlabel(bit_exact_line(exact_groups, groups), fontsize=8, color="#2e7d32", wrap=True).set_gid(
            "bit-exact-groups")
    for ax, (group, series) in zip(axes, all_series.items()):
        style_panel(ax, group_title(group, groups[group], len(series)), "iteration after resume", "|d lm loss|")
        if not series:
            ax.text(0.5, 0.5, "no resumed iterations to compare", ha="center", va="center", transform=ax.transAxes,
                    fontsize=8)
            ax.set_yticks([])
            continue
        values = [v for s in series for v in s["dloss"][1]]
        zero_y = zero_row_y(values)
        pos = [v for v in values if v > 0 and math.isfinite(v)]
        has_bad = any(not math.isfinite(v) for v in values)
        top = max(pos) if pos else zero_y * 1e3
        bad_y = top * 5          # non-finite differences: triangles along the top
        ax.set_yscale("log")
        ax.axhspan(zero_y / 3, zero_y * 3, color="#e6f4ea", zorder=0)
        hi, rest, exact = dloss_split(series)
        width = 0.7 / max(1, len(hi) + (1 if exact else 0))
        offset = lambda k: (k - (len(hi) + (1 if exact else 0) - 1) / 2) * width
        labelled = False
        for s in rest:
            its, d = s["dloss"]
            nz = [(i, v) for i, v in zip(its, d) if v > 0 and math.isfinite(v)]
            label = None if labelled else rest_label(rest)
            if nz:
                ax.plot([i for i, _ in nz], [v for _, v in nz], color=REST_COLOR, lw=0.7, zorder=1, label=label)
                label, labelled = None, True
            zeros = [i for i, v in zip(its, d) if v == 0]
            if zeros:
                ax.plot(zeros, [zero_y] * len(zeros), ls="none", marker="o", ms=2.5, color=REST_COLOR, zorder=1,
                        label=label, gid="zeros:" + s["name"])
                labelled = True
            bad = [i for i, v in zip(its, d) if not math.isfinite(v)]
            if bad:
                ax.plot(bad, [bad_y] * len(bad), ls="none", marker="^", ms=4, color=REST_COLOR, zorder=1,
                        gid="nonfinite:" + s["name"])
        for k, s in enumerate(hi):
            color = SERIES_COLORS[k % len(SERIES_COLORS)]
            its, d = s["dloss"]
            nz = [(i, v) for i, v in zip(its, d) if v > 0 and math.isfinite(v)]
            if nz:
                ax.plot([i for i, _ in nz], [v for _, v in nz], color=color, marker="o", ms=3, lw=1.1, zorder=3,
                        label=series_label(s))
            zeros = [i + offset(k) for i, v in zip(its, d) if v == 0]
            if zeros:
                ax.plot(zeros, [zero_y] * len(zeros), ls="none", marker="s", ms=4, mfc="none", mec=color, mew=1.1,
                        zorder=3, label=None if nz else series_label(s), gid="zeros:" + s["name"])
            bad = [i for i, v in zip(its, d) if not math.isfinite(v)]
            if bad:
                ax.plot(bad, [bad_y] * len(bad), ls="none", marker="^", ms=5, color=color, mec="#c62828", zorder=3,
                        label=None if nz or zeros else series_label(s), gid="nonfinite:" + s["name"])
                ax.annotate("not finite", (bad[0], bad_y), xytext=(0, 5), textcoords="offset points", fontsize=7,
                            color="#c62828", ha="center")
        if exact:
            its = sorted({i for s in exact for i in s["dloss"][0]})
            ax.plot([i + offset(len(hi)) for i in its], [zero_y] * len(its), ls="none", marker="s", ms=4,
                    color="0.15", zorder=2, label=exact_label(exact), gid="zeros:bit-exact")
        if pos or has_bad:
            ax.axhline(zero_y * 6, color="0.6", lw=0.8, ls=":")
            ax.set_ylim(zero_y / 3, top * 10)
            lo_dec, hi_dec = int(math.floor(math.log10(zero_y))) + 1, int(math.ceil(math.log10(top * 10)))
            step = max(1, int(math.ceil((hi_dec - lo_dec) / 5.0)))
            ticks = [10.0 ** e for e in range(hi_dec, lo_dec - 1, -step)][::-1]
            ticks = [t for t in ticks if zero_y * 10 <= t <= top * 10]
            ax.yaxis.set_major_locator(FixedLocator([zero_y] + ticks))
            minor = [10.0 ** e for e in range(lo_dec, hi_dec + 1)]
            minor = [t for t in minor if zero_y * 10 <= t <= top * 10 and t not in ticks]
            ax.yaxis.set_minor_locator(FixedLocator(minor))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_yticklabels(["0 (bit-exact)"] + ["%.0e" % t for t in ticks])
        else:
            ax.set_ylim(zero_y / 3, zero_y * 30)
            ax.yaxis.set_major_locator(FixedLocator([zero_y]))
            ax.yaxis.set_minor_locator(FixedLocator([]))
            ax.set_yticklabels(["0 (bit-exact)"])
            ax.text(0.5, 0.62, "%s: |d loss| = 0 at every\niteration after resume"
                    % ("the scenario" if len(series) == 1 else "all %d scenarios" % len(series)),
                    ha="center", va="center", transform=ax.transAxes, fontsize=8, color="#2e7d32")
        panel_legend(ax, shapes[group][0], [rest_label(rest)] if rest else None)
    fig.suptitle("|d lm loss| per iteration after resume, log scale; bottom band = exactly 0 (bit-exact): "
                 "hollow squares per scenario, filled black for the scenarios that are 0 throughout", fontsize=10)
    return fig


def build_disk_figure(plt, storage):
    """Horizontal stacked bars, one per storage configuration (save policy and dtype per key kind;
    identical configurations are already one row of storage.csv), grouped into one panel per policy."""
    from matplotlib.patches import Patch
    combos = {}
    for row in storage:
        c = combos.setdefault(row["storage"], {"policy": row["save_policy"], "bytes": {}, "row": row})
        c["bytes"][row["kind"]] = c["bytes"].get(row["kind"], 0.0) + float(row["bytes"])
    policies = [p for p in POLICY_ORDER if any(c["policy"] == p for c in combos.values())]
    policies += sorted({c["policy"] for c in combos.values()} - set(policies))
    if not policies:
        fig, ax = plt.subplots(figsize=(6.4, 2.5), layout="constrained")
        ax.text(0.5, 0.5, "no checkpoint sizes (no scenario wrote a disk.csv)", ha="center", va="center")
        ax.set_axis_off()
        return fig
    per_policy = {p: sorted([(lab, c) for lab, c in combos.items() if c["policy"] == p],
                            key=lambda lc: -sum(lc[1]["bytes"].values())) for p in policies}
    n = len(combos)
    biggest = max([sum(c["bytes"].values()) for c in combos.values()] + [1.0])
    unit, scale = ("MiB", 2.0 ** 20) if biggest >= 2.0 ** 21 else ("KiB", 2.0 ** 10)
    row_h = min(0.3, (MAX_HEIGHT_PX / DPI - 1.3 - 0.45 * len(policies)) / (n + 0.8))
    font = 8 if row_h >= 0.22 else 6.5
    height = min(MAX_HEIGHT_PX / DPI, 1.3 + 0.45 * len(policies) + row_h * (n + 0.8))
    # One panel per policy and, at the bottom, a row for the key-kind legend.
    ratios = [len(per_policy[p]) + 0.6 for p in policies] + [0.8]
    fig, all_axes = plt.subplots(len(policies) + 1, 1, figsize=(min(MAX_WIDTH_PX / DPI, 12.0), height),
                                 sharex=True, squeeze=False, layout="constrained",
                                 gridspec_kw={"height_ratios": ratios})
    axes, legend_ax = all_axes[:-1], all_axes[-1, 0]
    used = [k for k in DISK_KINDS if any(k in c["bytes"] for c in combos.values())]
    for ax, policy in zip(axes[:, 0], policies):
        rows = per_policy[policy]
        left = [0.0] * len(rows)
        for kind in used:
            vals = [c["bytes"].get(kind, 0.0) / scale for _, c in rows]
            if any(vals):
                ax.barh(range(len(rows)), vals, left=left, color=KIND_COLORS[kind], height=0.7, label=kind)
                left = [a + v for a, v in zip(left, vals)]
        for y, (_, c) in enumerate(rows):
            ax.annotate("%.2f %s, %s" % (left[y], unit, size_change_text(c["row"])), (left[y], y), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=font)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([storage_keys(lab) for lab, _ in rows], fontsize=font)
        ax.set_ylim(len(rows) - 0.4, -0.6)
        plural = "s" if len(rows) > 1 else ""
        ax.set_title("save policy %s (%d storage configuration%s)" % (policy, len(rows), plural), loc="left",
                     fontsize=9, fontweight="bold")
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(axis="x", color="0.9", lw=0.6)
        ax.set_axisbelow(True)
    axes[-1, 0].set_xlabel("checkpoint " + unit, fontsize=9)
    axes[-1, 0].set_xlim(0, biggest / scale * 1.45)   # room for the annotation after the longest bar
    axes[-1, 0].tick_params(axis="x", labelbottom=True)  # sharex hid it: the legend row is the bottom one
    handles = [Patch(color=KIND_COLORS[k], label=k) for k in used]
    legend_ax.set_axis_off()
    legend_ax.legend(handles=handles, loc="center", ncol=len(used), fontsize=8, frameon=False, handlelength=1.2,
                     columnspacing=1.2, title="key kind (metadata: safetensors headers and the manifest)",
                     title_fontsize=8)
    fig.suptitle("Checkpoint bytes by key kind per storage configuration (save policy: dtype per key kind), "
                 "size change vs the fp32 policy", fontsize=10)
    return fig


def ulp_text(text):
    if not text:
        return "\u2014"
    return text if len(text) <= 6 else "%.1e" % float(text)


def expectation_text(row):
    """The heat map's first column: what the scenario declared, with a cross when it missed that."""
    exp = row.get("expectation", "") or "?"
    return exp + (" \u2717" if row.get("passed") != "1" else "")


def build_ulp_figure(plt, summary):
    """Max ULP after load, one row per scenario and one column per key kind some checkpoint holds,
    after a column with the scenario's expectation. A difference the scenario was declared to show
    (it met its expectation: a fault caught, a lossy policy within tolerance) is shaded blue; a row
    that missed its expectation is shaded red and its name is red. 0 is white, an absent key light
    grey. Long matrices are split into side-by-side blocks to stay on a page."""
    import numpy as np
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import ListedColormap, Normalize
    kinds = [k for k in ULP_KINDS if any(r.get("max_ulp_" + k, "") != "" for r in summary)] or ULP_KINDS
    summary, shown_note = ulp_rows_shown(summary, kinds)
    n = len(summary)
    data = np.full((n, len(kinds)), np.nan)
    for i, r in enumerate(summary):
        for j, k in enumerate(kinds):
            if r.get("max_ulp_" + k, ""):
                data[i, j] = math.log10(1.0 + float(r["max_ulp_" + k]))
    failed = [r.get("passed") != "1" for r in summary]
    vmax = max(1.0, float(np.nanmax(data)) if np.isfinite(data).any() else 1.0)
    norm = Normalize(vmin=0, vmax=vmax)
    # Light end cut off: white stays "0 = bit-exact", the lightest shade is already a difference.
    ok_cmap, bad_cmap = (ListedColormap(plt.get_cmap(c)(np.linspace(0.18, 1.0, 256))) for c in ("Blues", "Reds"))
    blocks = max(1, (n + ULP_ROWS_PER_BLOCK - 1) // ULP_ROWS_PER_BLOCK)
    per = (n + blocks - 1) // blocks if n else 1
    row_h = min(0.3, (MAX_HEIGHT_PX / DPI - 1.7) / max(1, per))
    font = 7 if row_h >= 0.24 else 6
    cell_w = 0.62 if font == 7 else 0.55
    cols = len(kinds) + 1                      # column 0: the expectation
    longest = max([len(r["scenario"]) for r in summary] + [10])
    block_w = 0.0078 * font * longest + cell_w * cols + 0.25
    width = min(MAX_WIDTH_PX / DPI, max(6.4, blocks * block_w + 1.2))
    height = min(MAX_HEIGHT_PX / DPI, max(3.2, 1.7 + row_h * per))
    fig, axes = plt.subplots(1, blocks, figsize=(width, height), squeeze=False, layout="constrained")
    any_bad = any(f and np.isfinite(data[i]).any() and np.nanmax(data[i]) > 0 for i, f in enumerate(failed))
    headers = ["expected"] + [k.replace("_", "_\n", 1) if len(k) > 8 else k for k in kinds]
    for b, ax in enumerate(axes[0]):
        lo, hi = b * per, min(n, (b + 1) * per)
        rgba = np.zeros((per, cols, 4))
        rgba[:, :, :] = (1.0, 1.0, 1.0, 0.0)
        for i in range(lo, hi):
            rgba[i - lo, 0] = (1.0, 0.92, 0.92, 1.0) if failed[i] else (0.97, 0.97, 0.97, 1.0)
            ax.text(0, i - lo, expectation_text(summary[i]), ha="center", va="center", fontsize=font,
                    color="#c62828" if failed[i] else "0.25", fontweight="bold" if failed[i] else "normal")
            cmap = bad_cmap if failed[i] else ok_cmap
            for j in range(len(kinds)):
                v = data[i, j]
                rgba[i - lo, j + 1] = (0.93, 0.93, 0.93, 1.0) if not np.isfinite(v) else \
                    ((1.0, 1.0, 1.0, 1.0) if v == 0 else cmap(norm(v)))
                txt = ulp_text(summary[i].get("max_ulp_" + kinds[j], ""))
                color = "0.55" if not np.isfinite(v) else ("white" if v > vmax * 0.55 else "black")
                ax.text(j + 1, i - lo, txt, ha="center", va="center", fontsize=font, color=color)
        ax.imshow(rgba, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(cols))
        ax.set_xticklabels(headers, fontsize=font + 0.5)
        ax.xaxis.tick_top()
        ax.set_yticks(range(hi - lo))
        ax.set_yticklabels([summary[i]["scenario"] for i in range(lo, hi)], fontsize=font)
        for t, i in zip(ax.get_yticklabels(), range(lo, hi)):
            if failed[i]:
                t.set_color("#c62828")
                t.set_fontweight("bold")
        ax.set_xticks([x - 0.5 for x in range(1, cols)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(1, per)], minor=True)
        ax.grid(which="minor", color="white", lw=0.6)
        ax.axvline(0.5, color="0.6", lw=0.8)
        ax.tick_params(which="minor", length=0)
        ax.tick_params(which="major", length=2)
        ax.set_ylim(per - 0.5, -0.5)
    # Colour bars in ULP (log scale): ticks at 1, 10, 100, ... placed at log10(1 + ulp).
    decades = [e for e in range(0, int(vmax) + 1, max(1, int(math.ceil((vmax + 1) / 6.0))))]
    ticks = [math.log10(1.0 + 10.0 ** e) for e in decades]
    tick_labels = ["1" if e == 0 else "10" if e == 1 else "1e%d" % e for e in decades]
    bars = [(ok_cmap, "max ULP, an expected difference")] + ([(bad_cmap, "max ULP, expectation missed")]
                                                             if any_bad else [])
    for cmap, label in bars:
        bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=list(axes[0]), shrink=0.4, pad=0.01, aspect=25,
                           ticks=ticks)
        bar.ax.set_yticklabels(tick_labels)
        bar.set_label(label, fontsize=8)
        bar.ax.tick_params(labelsize=7)
    fig.suptitle("Max ULP after load per key kind\nwhite: 0 (bit-exact); blue: a difference the scenario expects "
                 "(expectation met);\nred: expectation missed (\u2717); grey \u2014: key not in the checkpoint"
                 + shown_note, fontsize=9)
    return fig


def ulp_rows_shown(summary, kinds, limit=None):
    """(rows to draw, a title line saying what was left out): every row when there are at most
    MAX_ULP_ROWS, else the rows that missed their expectation, then those with the largest max
    ULP, drawn in their summary order."""
    limit = MAX_ULP_ROWS if limit is None else limit
    if len(summary) <= limit:
        return summary, ""

    def worst(r):
        vals = [float(r["max_ulp_" + k]) for k in kinds if r.get("max_ulp_" + k, "") not in ("", "nan")]
        return max(vals) if vals else -1.0
    order = sorted(range(len(summary)), key=lambda i: (summary[i].get("passed") == "1", -worst(summary[i]), i))
    keep = sorted(order[:limit])
    return ([summary[i] for i in keep],
            "\n%d of %d scenarios shown: every one that missed its expectation, then the largest differences "
            "(the report's tables list all)" % (limit, len(summary)))


def build_figures(plt, run_dir):
    """{png name: figure} for a run directory whose plots/index.csv and plots/storage.csv exist.
    Raises OSError / csv.Error / KeyError / ValueError on bad input."""
    plots = os.path.join(run_dir, "plots")
    summary = read_csv(os.path.join(run_dir, "summary.csv"))
    index = read_csv(os.path.join(plots, "index.csv"))
    storage = read_csv(os.path.join(plots, "storage.csv"))
    figs = {}
    try:
        figs["loss_curves.png"] = build_loss_figure(plt, run_dir, index)
        figs["dloss.png"] = build_dloss_figure(plt, run_dir, index)
        figs["disk_bytes.png"] = build_disk_figure(plt, storage)
        figs["ulp_heatmap.png"] = build_ulp_figure(plt, summary)
    except BaseException:
        for f in figs.values():
            plt.close(f)
        raise
    return figs


def save_figure(plt, fig, out):
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
    try:
        figs = build_figures(plt, run_dir)
    except (OSError, csv.Error, KeyError, ValueError) as e:
        print("plots.py: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        return 2
    for name in PNG_NAMES:
        save_figure(plt, figs[name], os.path.join(run_dir, "plots", name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
