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
# Heat map rows drawn at most: every cell is a text object, and 1,000 rows took 80 s to draw (a
# 100,000-row summary ran past the plot step's limit); past this, or past what fits the page, the map
# shows the rows that missed their expectation, then the largest differences, and says so.
MAX_ULP_ROWS = 280
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


# The heat map is laid out in pixels: every text ULP_FONT pt, every row ULP_ROW_PX tall, every data
# column as wide as its widest number, so 190 rows stay readable (a size derived from the row count
# squeezed them into 15-px columns with overprinted labels). One panel per scenario group; the rows
# with nothing to show (met the expectation, 0 ULP in every key) are counted on one line per group.
ULP_FONT = 7             # pt, every text of the map (9.7 px at DPI 100)
ULP_ROW_PX = 13          # a 7-pt label with descenders is 11 px tall
ULP_BAND_PX = 26         # above a panel: the group name and the two-line column headers
ULP_LINE_PX = 13         # under a panel: the line counting the rows not drawn
ULP_GAP_PX = 8           # between the panels of a column
ULP_COL_GAP_PX = 14      # between columns of panels
ULP_MARGIN_PX = 6
ULP_BARS_PX = 48         # the colour bars at the bottom
ULP_FOOTER_LINES = 6     # at most, for the groups without a panel
ULP_MIN_CELL_PX = 26
ULP_HEADERS = {"model": "model", "master_param": "master\nparam", "remainder": "remain-\nder", "exp_avg": "exp_\navg",
               "exp_avg_sq": "exp_\navg_sq", "scale": "scale"}


def ulp_text(text):
    """A max ULP as its cell shows it: up to 5 digits exactly (32768 is bf16's rounding of an fp32
    value), larger ones as 9.9e8, so every number fits a narrow column."""
    if not text:
        return "\u2014"
    v = float(text)
    if not math.isfinite(v):
        return text
    if v < 1e5:
        return "%d" % v if v == int(v) else "%.3g" % v
    mant, exp = ("%.1e" % v).split("e")
    return "%se%d" % (mant, int(exp))


def expectation_text(row):
    """The heat map's first column: what the scenario declared, with a cross when it missed that."""
    exp = row.get("expectation", "") or "?"
    return exp + (" \u2717" if row.get("passed") != "1" else "")


def scenario_group(name):
    return name.split("/", 1)[0]


def ulp_row_class(row, kinds):
    """'drawn' (it missed its expectation, or a key differs), 'exact' (it met it with 0 ULP in every
    key it holds) or 'no-keys' (it met it and no key was compared, e.g. a load refused as declared)."""
    if row.get("passed") != "1":
        return "drawn"
    present = [row["max_ulp_" + k] for k in kinds if row.get("max_ulp_" + k, "") != ""]
    if not present:
        return "no-keys"
    return "exact" if all(float(v) == 0 for v in present) else "drawn"


def plural(n, word):
    return "%d %s%s" % (n, word, "" if n == 1 else "s")


def ulp_count_line(exact, no_keys, cut):
    """The line under a group's panel: the group's scenarios that have no row."""
    parts = ([plural(exact, "scenario") + " bit-exact in every key"] if exact else []) + \
        ([plural(no_keys, "scenario") + " with no key compared"] if no_keys else []) + \
        ([plural(cut, "more scenario") + " with a difference, not drawn (row limit)"] if cut else [])
    return "; ".join(parts)


def ulp_footer_entry(group, exact, no_keys, cut):
    parts = (["%d bit-exact" % exact] if exact else []) + (["%d no key compared" % no_keys] if no_keys else []) + \
        (["%d not drawn" % cut] if cut else [])
    return "%s (%s)" % (group, ", ".join(parts))


def ulp_rows_shown(summary, kinds, limit=None):
    """(rows to draw, a title line saying what was left out): every row when there are at most
    `limit` (MAX_ULP_ROWS), else the rows that missed their expectation, then those with the largest
    max ULP, drawn in their summary order."""
    limit = MAX_ULP_ROWS if limit is None else limit
    if len(summary) <= limit:
        return summary, ""

    def worst(r):
        vals = [float(r["max_ulp_" + k]) for k in kinds if r.get("max_ulp_" + k, "") not in ("", "nan")]
        return max(vals) if vals else -1.0
    order = sorted(range(len(summary)), key=lambda i: (summary[i].get("passed") == "1", -worst(summary[i]), i))
    keep = sorted(order[:limit])
    return ([summary[i] for i in keep],
            "\n%d of %d scenarios shown (of those that differ or missed): every one that missed its expectation, "
            "then the largest differences (the report's tables list all)" % (limit, len(summary)))


def ulp_footer_lines(entries, line_w, text_w):
    """The line "Groups without a panel: a (3 bit-exact), b (...)" wrapped to line_w px, at most
    ULP_FOOTER_LINES lines (the last then says how many groups it leaves out)."""
    lines, entries, text = [], list(entries), "Groups without a panel: "
    if not entries:
        return []
    while entries:
        piece = entries[0] + (", " if len(entries) > 1 else "")
        if text_w(text + piece) <= line_w or not text.strip() or text.endswith(": "):
            text += piece
            entries.pop(0)
        else:
            lines.append(text.rstrip())
            text = "  "
            if len(lines) == ULP_FOOTER_LINES - 1:
                text += "and %d more groups (the report's tables list all)" % len(entries)
                entries = []
    return lines + [text.rstrip()]


def ulp_flow(panels, ncols, col_h):
    """Stacks the group panels ((group, rows, line) in matrix order) top-down into at most `ncols`
    columns of height col_h px; a group longer than what is left of a column continues at the top
    of the next one. [[(group, rows, line or None, continued, y)]] per column, or None if they do not fit."""
    cols, y = [[]], 0
    for group, rows, line in panels:
        start = 0
        while True:
            left = len(rows) - start
            tail = ULP_LINE_PX if line else 0
            space = col_h - y
            if ULP_BAND_PX + left * ULP_ROW_PX + tail <= space:
                cols[-1].append((group, rows[start:], line, start > 0, y))
                y += ULP_BAND_PX + left * ULP_ROW_PX + tail + ULP_GAP_PX
                break
            fit = min(left - 1, (space - ULP_BAND_PX) // ULP_ROW_PX)
            if fit >= min(3, left - 1) and fit >= 1:
                cols[-1].append((group, rows[start:start + fit], None, start > 0, y))
                start += fit
            elif not cols[-1]:
                return None       # not even one row fits an empty column
            if len(cols) == ncols:
                return None
            cols.append([])
            y = 0
    return cols


def ulp_column_height(cols):
    return max([p[4] + ULP_BAND_PX + len(p[1]) * ULP_ROW_PX + (ULP_LINE_PX if p[2] else 0) for c in cols for p in c]
               + [0])


def build_ulp_figure(plt, summary):
    """Max ULP after load per key kind some checkpoint holds, one panel per scenario group and in it
    one row per scenario that missed its expectation or holds a key that differs, after a column
    with the expectation; one line under the panel counts the group's other scenarios (bit-exact in
    every key, or no key compared), and a group with no row gets no panel, only its counts in the
    line under the panels. A difference the scenario was declared to show (it met its expectation: a
    fault caught, a lossy policy within tolerance) is shaded blue; a row that missed its expectation
    is shaded red and its name is red. 0 is white, an absent key light grey. Panels are stacked in
    as few columns as fit MAX_HEIGHT_PX; past that, and past MAX_ULP_ROWS, the rows that missed
    their expectation and then the largest differences are drawn, and the title says so."""
    import numpy as np
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import ListedColormap, Normalize
    from matplotlib.font_manager import FontProperties
    kinds = [k for k in ULP_KINDS if any(r.get("max_ulp_" + k, "") != "" for r in summary)] or ULP_KINDS
    fig = plt.figure(dpi=DPI)
    renderer = fig.canvas.get_renderer()
    fonts = {}

    def text_w(s, size=ULP_FONT, weight="normal"):
        key = (s, size, weight)
        if key not in fonts:
            prop = FontProperties(size=size, weight=weight)
            fonts[key] = max(renderer.get_text_width_height_descent(t, prop, ismath=False)[0]
                             for t in s.split("\n"))
        return fonts[key]

    groups, members = [], {}
    for r in summary:
        g = scenario_group(r["scenario"])
        if g not in members:
            groups.append(g)
            members[g] = []
        members[g].append(r)
    classes = {id(r): ulp_row_class(r, kinds) for r in summary}
    candidates = [r for r in summary if classes[id(r)] == "drawn"]
    failed = lambda r: r.get("passed") != "1"

    # Column edges in px: the expectation, then each kind as wide as its widest number or header.
    widths = [max([text_w(expectation_text(r), weight="bold" if failed(r) else "normal") + 6 for r in candidates] +
                  [text_w("expected") + 4])]
    widths += [max([text_w(ulp_text(r.get("max_ulp_" + k, ""))) + 6 for r in candidates] +
                   [text_w(ULP_HEADERS[k]) + 2, ULP_MIN_CELL_PX]) for k in kinds]
    edges = [0]
    for w in widths:
        edges.append(edges[-1] + math.ceil(w))
    exp_w, data_w = edges[1], edges[-1]
    centre = lambda j: (edges[j] + edges[j + 1]) / 2.0
    max_label_w = MAX_WIDTH_PX - 2 * ULP_MARGIN_PX - data_w - 4

    def label(r):
        """The row's name without "group/", cut with an ellipsis if it cannot fit the page."""
        name = short_name(r["scenario"], scenario_group(r["scenario"]))
        if text_w(name) <= max_label_w:
            return name
        lo, hi = 0, len(name)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if text_w(name[:mid] + "\u2026") <= max_label_w else (lo, mid - 1)
        return name[:lo] + "\u2026"

    title = ("Max ULP after load per key kind; per group, the scenarios that differ or missed their expectation "
             "(one line counts the rest)\nwhite: 0 (bit-exact); blue: a difference the scenario expects "
             "(expectation met);\nred: expectation missed (\u2717); grey \u2014: key not in the checkpoint")

    def plan(limit):
        """The layout drawing `limit` of the candidate rows, or None if it does not fit the page."""
        shown, note = ulp_rows_shown(candidates, kinds, limit)
        shown_ids = {id(r) for r in shown}
        panels, footer = [], []
        for g in groups:
            rows = [r for r in members[g] if id(r) in shown_ids]
            count = lambda c: sum(1 for r in members[g] if classes[id(r)] == c)
            cut = count("drawn") - len(rows)
            if rows:
                panels.append((g, rows, ulp_count_line(count("exact"), count("no-keys"), cut) or None))
            else:
                footer.append(ulp_footer_entry(g, count("exact"), count("no-keys"), cut))
        labels = {id(r): label(r) for r in shown}
        label_w = math.ceil(max([text_w(s) for s in labels.values()] +
                                [text_w(g + " (continued)", ULP_FONT + 1, "bold") for g, _, _ in panels] + [40]) + 4)
        panel_w = label_w + data_w
        full_title = title + note
        title_w = max(text_w(t, 9) for t in full_title.split("\n")) + 24
        width = min(MAX_WIDTH_PX, max(640, title_w))
        max_cols = max(1, int((MAX_WIDTH_PX - 2 * ULP_MARGIN_PX + ULP_COL_GAP_PX) // (panel_w + ULP_COL_GAP_PX)))
        top = 6 + 15 * full_title.count("\n") + 15 + 6
        need = sum(ULP_BAND_PX + len(rows) * ULP_ROW_PX + (ULP_LINE_PX if line else 0) + ULP_GAP_PX
                   for _, rows, line in panels)
        for ncols in range(1, max_cols + 1):
            used = ncols * panel_w + (ncols - 1) * ULP_COL_GAP_PX + 2 * ULP_MARGIN_PX
            lines = ulp_footer_lines(footer, max(width, used) - 2 * ULP_MARGIN_PX, text_w)
            bottom = (12 * len(lines) + 6 if lines else 0) + ULP_BARS_PX + ULP_MARGIN_PX
            avail = MAX_HEIGHT_PX - top - bottom
            col_h = max(ULP_BAND_PX + ULP_ROW_PX + ULP_LINE_PX, int(need / ncols) - ULP_GAP_PX)
            while col_h <= avail:
                cols = ulp_flow(panels, ncols, col_h)
                if cols is not None:
                    # as wide as the columns used, and as the footer wrapped for ncols of them
                    used = len(cols) * panel_w + (len(cols) - 1) * ULP_COL_GAP_PX + 2 * ULP_MARGIN_PX
                    foot_w = max([text_w(t) for t in lines] + [0]) + 2 * ULP_MARGIN_PX
                    return {"cols": cols, "labels": labels, "label_w": label_w, "panel_w": panel_w, "note": note,
                            "title": full_title, "footer": lines, "top": top, "bottom": bottom,
                            "width": math.ceil(max(width, used, foot_w)), "col_h": ulp_column_height(cols)}
                col_h += ULP_ROW_PX
        return None

    limit = min(len(candidates), MAX_ULP_ROWS)
    layout = plan(limit)
    if layout is None:           # the largest row count that fits the page
        lo, hi = 0, limit - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if plan(mid) is not None else (lo, mid - 1)
        layout = plan(lo)
    # At least 240 px tall: a matrix with one differing row still gets a figure of sensible size.
    W, H = layout["width"], max(240, layout["top"] + layout["col_h"] + layout["bottom"])
    fig.set_size_inches(W / DPI, H / DPI)

    def frac(x, y, w=0, h=0):
        """Figure coordinates of a box given in px from the top-left corner."""
        return [x / W, 1 - (y + h) / H, w / W, h / H]

    data = {}
    for r in summary:
        data[id(r)] = [math.log10(1.0 + float(r["max_ulp_" + k])) if r.get("max_ulp_" + k, "") else float("nan")
                       for k in kinds]
    finite = [v for vals in data.values() for v in vals if math.isfinite(v)]
    vmax = max([1.0] + finite)
    norm = Normalize(vmin=0, vmax=vmax)
    # Light end cut off: white stays "0 = bit-exact", the lightest shade is already a difference.
    ok_cmap, bad_cmap = (ListedColormap(plt.get_cmap(c)(np.linspace(0.18, 1.0, 256))) for c in ("Blues", "Reds"))
    drawn_rows = [r for c in layout["cols"] for p in c for r in p[1]]
    any_bad = any(failed(r) and any(math.isfinite(v) and v > 0 for v in data[id(r)]) for r in drawn_rows)
    used_w = len(layout["cols"]) * layout["panel_w"] + (len(layout["cols"]) - 1) * ULP_COL_GAP_PX
    x0 = (W - used_w) / 2
    for c, col in enumerate(layout["cols"]):
        cx = x0 + c * (layout["panel_w"] + ULP_COL_GAP_PX)
        ax_x = cx + layout["label_w"]
        for group, rows, line, continued, y in col:
            y += layout["top"]
            n = len(rows)
            gtitle = "%s (continued)" % group if continued else "%s (%d)" % (group, len(members[group]))
            fig.text(*frac(cx, y + ULP_BAND_PX - 3)[:2], gtitle, fontsize=ULP_FONT + 1, fontweight="bold",
                     va="bottom", ha="left")
            for x, head in [(centre(0), "expected")] + [(centre(j + 1), ULP_HEADERS[k]) for j, k in enumerate(kinds)]:
                fig.text(*frac(ax_x + x, y + ULP_BAND_PX - 2)[:2], head, fontsize=ULP_FONT, va="bottom",
                         ha="center", linespacing=1.0, color="0.2")
            ax = fig.add_axes(frac(ax_x, y + ULP_BAND_PX, data_w, n * ULP_ROW_PX))
            ax.set_gid("ulp-panel:" + group)
            exp_rgba = np.zeros((n, 1, 4))
            cells = np.zeros((n, len(kinds), 4))
            for i, r in enumerate(rows):
                bad = failed(r)
                exp_rgba[i, 0] = (1.0, 0.92, 0.92, 1.0) if bad else (0.97, 0.97, 0.97, 1.0)
                ax.text(centre(0), i + 0.5, expectation_text(r), ha="center", va="center", fontsize=ULP_FONT,
                        color="#c62828" if bad else "0.25", fontweight="bold" if bad else "normal")
                cmap = bad_cmap if bad else ok_cmap
                for j, k in enumerate(kinds):
                    v = data[id(r)][j]
                    cells[i, j] = (0.93, 0.93, 0.93, 1.0) if not math.isfinite(v) else \
                        ((1.0, 1.0, 1.0, 1.0) if v == 0 else cmap(norm(v)))
                    color = "0.55" if not math.isfinite(v) else ("white" if v > vmax * 0.55 else "black")
                    ax.text(centre(j + 1), i + 0.5, ulp_text(r.get("max_ulp_" + k, "")), ha="center",
                            va="center", fontsize=ULP_FONT, color=color)
            # One image per column (the columns differ in width), each cell one pixel of it.
            ax.imshow(exp_rgba, aspect="auto", interpolation="nearest", extent=(0, exp_w, n, 0))
            for j in range(len(kinds)):
                ax.imshow(cells[:, j:j + 1], aspect="auto", interpolation="nearest",
                          extent=(edges[j + 1], edges[j + 2], n, 0))
            ax.set_xlim(0, data_w)
            ax.set_ylim(n, 0)
            ax.vlines(edges[2:-1], 0, n, color="white", lw=0.8)
            ax.hlines(range(1, n), 0, data_w, color="white", lw=0.8)
            ax.axvline(exp_w, color="0.6", lw=0.8)
            ax.set_xticks([])
            ax.set_yticks([i + 0.5 for i in range(n)])
            ax.set_yticklabels([layout["labels"][id(r)] for r in rows], fontsize=ULP_FONT)
            ax.tick_params(axis="y", length=0, pad=3)
            for t, r in zip(ax.get_yticklabels(), rows):
                if failed(r):
                    t.set_color("#c62828")
            for s in ax.spines.values():
                s.set_color("0.75")
                s.set_linewidth(0.6)
            if line:
                fig.text(*frac(cx, y + ULP_BAND_PX + n * ULP_ROW_PX + ULP_LINE_PX - 1)[:2], line, fontsize=ULP_FONT,
                         va="bottom", ha="left", color="#2e7d32", gid="ulp-collapsed:" + group)
    if layout["footer"]:
        fig.text(*frac(ULP_MARGIN_PX, layout["top"] + layout["col_h"] + 4)[:2], "\n".join(layout["footer"]),
                 fontsize=ULP_FONT, va="top", ha="left", color="#2e7d32", gid="ulp-collapsed-groups",
                 linespacing=1.25)
    # Colour bars in ULP (log scale) along the bottom: ticks at 1, 10, 100, ... placed at log10(1 + ulp).
    decades = [e for e in range(0, int(vmax) + 1, max(1, int(math.ceil((vmax + 1) / 6.0))))]
    ticks = [math.log10(1.0 + 10.0 ** e) for e in decades]
    tick_labels = ["1" if e == 0 else "10" if e == 1 else "1e%d" % e for e in decades]
    bars = [(ok_cmap, "max ULP, an expected difference")] + ([(bad_cmap, "max ULP, expectation missed")]
                                                             if any_bad else [])
    bar_w = 260
    bx = (W - len(bars) * bar_w - (len(bars) - 1) * 40) / 2
    for b, (cmap, text) in enumerate(bars):
        cax = fig.add_axes(frac(bx + b * (bar_w + 40), H - ULP_MARGIN_PX - ULP_BARS_PX + 14, bar_w, 9))
        bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=cax, orientation="horizontal", ticks=ticks)
        bar.ax.set_xticklabels(tick_labels)
        bar.ax.tick_params(labelsize=ULP_FONT, length=2, pad=1)
        bar.ax.set_title(text, fontsize=ULP_FONT + 1, pad=2)
    fig.suptitle(layout["title"], fontsize=9, y=1 - 6 / H, va="top")
    return fig


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
