// The report subcommand and the report document: which sections report.md / report.html hold and
// the sentences around the tables (see reports/README.md for what each section means).
#include "reports/report.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <utility>

#include "harness/base/no_follow.h"
#include "harness/base/version.h"
#include "reports/compare_runs.h"
#include "reports/document.h"
#include "reports/projection.h"
#include "reports/report_writer.h"

namespace fs = std::filesystem;

namespace rh {
namespace report {
namespace {

const char* outcome_meaning(Outcome o) {
  switch (o) {
    case Outcome::identical: return "bit-exact: every metric after resume and every state equal bit for bit";
    case Outcome::within_tolerance: return "differs, within the scenario's declared tolerance";
    case Outcome::diverged: return "differs after resume (the first divergence is named)";
    case Outcome::load_refused: return "the resumed run refused the checkpoint";
    case Outcome::error: return "the check could not run";
    case Outcome::nondeterministic: return "the trainer's uninterrupted runs differ from each other: resume not judged";
  }
  return "unknown outcome";
}

// A name as one POSIX shell word: single-quoted, each ' written as '\''.
std::string shell_word(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The first thing a reader needs: which scenarios did not meet their expectation, what diverged
// first, and the command that reruns exactly that scenario.
void failing_list(Document& doc, const RunData& run) {
  std::vector<std::string> items;
  const std::string file = run.matrix_file.empty() ? "" : " --file " + shell_word(run.matrix_file);
  for (const auto& s : run.scenarios) {
    if (s.row.passed) continue;
    std::string item =
        s.row.scenario + " (expected " + s.row.expectation + ", found " + to_string(s.row.outcome) + "): ";
    item += s.row.first_divergence.empty() ? s.row.verdict : "first divergence " + s.row.first_divergence;
    if (!s.row.diagnosis.empty() && s.row.diagnosis != "none")
      item += "; diagnosis " + s.row.diagnosis + ": " + s.row.explanation;
    item += "; reproduce: resume-harness check" + file + " " + shell_word(s.row.scenario);
    items.push_back(item);
  }
  doc.heading("Scenarios that did not meet their expectation");
  if (items.empty()) doc.paragraph("None: every scenario met its expectation.");
  else doc.bullets(std::move(items));
}

// The first screen: the verdict and the scenarios that did not meet their expectation.
void overview(Document& doc, const RunData& run, const PlotOutcome& plots) {
  const StatusCounts counts = status_counts(run);
  doc.status = status_line(counts);
  doc.status_ok = counts.passed();
  doc.paragraph("Run directory " + run.dir +
                "; each scenario's files are in a directory of scenarios/ named after it, with every slash "
                "written as two underscores and every comma as a plus sign (states/moments=bf16,policy=native: "
                "scenarios/states__moments=bf16+policy=native); report.html links each from its row of the matrix.");
  failing_list(doc, run);
  if (!plots.ok) doc.paragraph("Plots not drawn: " + plots.message + ". The tables below are complete.");
}

// Outcome counts, the per-group lines and one outcome grid per group.
// Each scenario group in first-seen order: its scenarios (indices into run.scenarios), how many
// met their expectation and how many resumed bit-exactly.
struct GroupTally {
  std::string name;
  std::vector<size_t> members;
  size_t met = 0, exact = 0;
};
std::vector<GroupTally> group_tallies(const RunData& run) {
  std::vector<GroupTally> groups;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < run.scenarios.size(); ++i) {
    const auto& scenario = run.scenarios[i];
    const auto [at, added] = index.emplace(scenario.group, groups.size());
    if (added) groups.push_back({scenario.group, {}, 0, 0});
    GroupTally& group = groups[at->second];
    group.members.push_back(i);
    group.met += scenario.row.passed;
    group.exact += scenario.row.outcome == Outcome::identical;
  }
  return groups;
}

void outcomes_section(Document& doc, const RunData& run) {
  std::map<Outcome, std::pair<size_t, size_t>> outcomes;   // outcome -> (count, met)
  for (const auto& scenario : run.scenarios) {
    auto& tally = outcomes[scenario.row.outcome];
    ++tally.first;
    tally.second += scenario.row.passed;
  }
  doc.heading("Outcomes");
  Table table;
  table.header = {"outcome", "meaning", "scenarios", "met expectation"};
  table.right = {false, false, true, true};
  for (const auto& [outcome, tally] : outcomes)
    table.rows.push_back(
        {to_string(outcome), outcome_meaning(outcome), std::to_string(tally.first), std::to_string(tally.second)});
  doc.table(table);
  std::vector<std::string> items;
  // Met expectation and bit-exact apart: a fault or lossy-policy group passes by diverging.
  for (const auto& group : group_tallies(run))
    items.push_back(group.name + ": " + std::to_string(group.met) + " of " + std::to_string(group.members.size()) +
                    " met their expectation, " + std::to_string(group.exact) + " bit-exact");
  doc.bullets(std::move(items));
  doc.paragraph(
      "Outcome grids: one per scenario group; the columns are the combinations of the axes (name parts "
      "a=v) with the most values that fit 6 columns, the rows the other axes; each cell is how that "
      "scenario ended (identical / within tolerance / diverged as expected / failed), with its verdict and "
      "first divergence on hover in report.html.");
  for (auto& grid : outcome_grids(run)) {
    doc.heading(grid.group, 3);
    if (!grid.note.empty()) doc.paragraph(grid.note + ".");
    doc.table(std::move(grid.table));
  }
}

void matrix_section(Document& doc, const RunData& run, const std::vector<int>& refs, const PlotOutcome& plots) {
  doc.heading("Matrix");
  doc.paragraph(
      "One row per scenario, in the order of summary.csv, with its numbers exactly as summary.csv holds "
      "them. max |d loss| is over the iterations after resume; max ULP is the largest distance, in "
      "representable values of the saved dtype, between a state right after load and the state that was "
      "saved (0 = bit-exact; \u2014 = the checkpoint has no key of that kind). The reduction compares "
      "the checkpoint's bytes with the fp32-policy checkpoint of the same run configuration. In report.html "
      "the matrix is one folded table per scenario group (open where a scenario failed), the verdict is the "
      "outcome's hover text, the first divergence is under the name, and each name links its directory.");
  Table all = matrix_table(run, refs);
  // report.html: a table per group, in first-seen order, each folded under its counts. The
  // per-row fields are copied row by row; the layout (header, columns, classes) once.
  Table layout = all;
  layout.rows.clear(), layout.row_class.clear(), layout.cell_class.clear(), layout.cell_title.clear();
  layout.row_href.clear(), layout.row_group.clear();
  for (const auto& group : group_tallies(run)) {
    Table part = layout;
    for (const size_t i : group.members) {
      part.rows.push_back(all.rows[i]);
      part.row_class.push_back(all.row_class[i]);
      part.cell_title.push_back(all.cell_title[i]);
      part.row_href.push_back(all.row_href[i]);
      part.row_group.push_back(group.name);
    }
    const size_t n = group.members.size();
    part.html_fold_summary = group.name + ": " + std::to_string(n) + (n == 1 ? " scenario, " : " scenarios, ") +
                             std::to_string(group.met) + " met their expectation, " + std::to_string(group.exact) +
                             " bit-exact";
    part.html_fold_id = "group-" + group.name;
    part.html_fold_open = group.met < n;
    doc.table(std::move(part), Block::Only::html);
  }
  doc.table(std::move(all), Block::Only::markdown);
  if (std::count(plots.written.begin(), plots.written.end(), std::string("plots/") + kUlpPlot))
    doc.image(std::string("plots/") + kUlpPlot,
              "Max ULP per state key kind right after load, one panel per scenario group: a row for each "
              "scenario that differs or missed its expectation, one line per group counting those bit-exact in "
              "every key (white: 0; blue: a difference the scenario expects; red: expectation missed; grey: key "
              "not in the checkpoint)");
}

void loss_section(Document& doc, const PlotOutcome& plots) {
  doc.heading("Loss after resume");
  doc.paragraph(
      "Baseline (uninterrupted) and resumed lm loss per iteration, one panel per scenario group; the dashed "
      "line marks the save point. Below: |d loss| per iteration after resume on a log scale; exact zeros "
      "(bit-exact iterations) are drawn as markers on their own row, not hidden.");
  for (const char* p : {kLossPlot, kDlossPlot})
    if (std::count(plots.written.begin(), plots.written.end(), std::string("plots/") + p))
      doc.image(std::string("plots/") + p,
                std::string(p) == kLossPlot
                    ? "Loss per scenario group, baseline (line) vs resumed (x)"
                    : "|d loss| per iteration after resume, log scale; bottom row: exactly 0 (bit-exact)");
}

// Returns the headline of the section ("" when nothing resumed bit-exactly with a reference).
std::string disk_section(Document& doc, const RunData& run, const std::vector<Combo>& combos,
                         const PlotOutcome& plots) {
  doc.heading("Checkpoint size per key");
  doc.paragraph(
      "One row per storage combination: the save policy and the dtype each key kind was written in, measured "
      "from disk.csv of the first scenario that wrote it. metadata = safetensors headers and the manifest. "
      "The reduction compares the total with the fp32-policy checkpoint of the same run configuration.");
  Table disk = disk_table(run, combos);
  // report.html: folded under its size (the plot below shows the same bytes); report.md: as is.
  disk.html_fold_summary = "Bytes per key kind of " + std::to_string(disk.rows.size()) +
                           (disk.rows.size() == 1 ? " storage combination" : " storage combinations") + " (table)";
  doc.table(std::move(disk));
  const Combo* best = nullptr;
  for (const auto& c : combos)
    if (c.has_reduction && run.scenarios[c.scenario].row.outcome == Outcome::identical &&
        (!best || c.reduction_pct > best->reduction_pct))
      best = &c;
  std::string headline;
  if (best)
    headline = "Largest saving with a bit-exact resume: " + best->label + ", " + reduction_text(best->reduction_pct) +
               " smaller than the fp32 policy (measured in " + run.scenarios[best->scenario].row.scenario + ").";
  if (!headline.empty()) doc.paragraph(headline);
  if (std::count(plots.written.begin(), plots.written.end(), std::string("plots/") + kDiskPlot))
    doc.image(std::string("plots/") + kDiskPlot,
              "Checkpoint bytes stacked by key kind, one bar per storage configuration grouped by save "
              "policy, with the reduction vs the fp32 policy");
  return headline;
}

// Returns one line per projection that has a published size to compare with.
// `shown_models` names the models file in the report: the path given, or the default's name
// (where the tool's copy is installed differs between machines; the report must not).
std::vector<std::string> projection_section(Document& doc, const std::vector<Combo>& combos,
                                            const std::string& models_file, const std::string& shown_models,
                                            const std::string& run_dir) {
  doc.heading("Projection to real model sizes");
  if (!fs::exists(models_file)) {
    doc.paragraph("No projection: models file " + shown_models + " not found (pass --models FILE).");
    return {};
  }
  const auto models = load_models(models_file);
  const auto rows = project(models, combos);
  doc.paragraph("Projected bytes = measured bytes per parameter x the model's parameter count (models from " +
                shown_models +
                "). Bytes per parameter count the model and optimizer tensors only: the fixed "
                "metadata (safetensors headers, manifest) does not grow with the model and is left out. GB = 1e9 "
                "bytes. Published sizes apply to checkpoints with bf16 weights, an fp32 master and both moments in "
                "the published dtype; the reduction difference is in percentage points (pp). Every model and "
                "configuration, at full precision: projection.csv.");
  bool compressed = false;
  for (const auto& c : combos) compressed = compressed || c.compress != "none";
  if (compressed)
    doc.paragraph(
        "Rows \"POLICY + zstd\" are compressed checkpoints (byte planes + zstd), projected with the bytes "
        "per parameter this run's tiny model compressed to. A tiny model's entropy may not match a real "
        "one's: weights and moments of a trained 16 B model can compress better or worse, so these rows "
        "are an estimate, not a measurement; the published sizes are uncompressed and never apply to them.");
  doc.table(projection_table(models, combos, rows));
  write_report_file((fs::path(run_dir) / "projection.csv").string(), projection_csv(models, combos, rows));
  // One finding per model and stored dtypes: policies that store the same dtypes project the same
  // bytes, so they share a line ("policies native, fp32") instead of repeating it.
  std::vector<std::string> keys;   // model + dtypes + sentence, first-seen order
  std::map<std::string, std::vector<std::string>> policies;
  std::map<std::string, std::string> head, tail;
  for (const auto& r : rows) {
    if (!r.published) continue;
    const std::string& label = combos[r.combo].label;   // "policy: model BF16, ..."
    const size_t colon = label.find(": ");
    const std::string dtypes = colon == std::string::npos ? label : label.substr(colon + 2);
    std::string s = ": projected " + fmt("%.1f", r.gb) + " GB vs published " + fmt("%.1f", r.published->gb) + " GB (" +
                    fmt("%+.1f %%", r.published_diff_pct) + ")";
    if (r.has_published_reduction && r.published->states != "fp32")
      s += "; reduction " + reduction_text(combos[r.combo].payload_reduction_pct) + " vs published " +
           reduction_text(r.published_reduction_pct) + " (" + fmt("%+.2f pp", r.delta_pp) + ")";
    if (!r.published->source.empty()) s += "; source: " + r.published->source;
    const std::string key = models[r.model].name + "\n" + dtypes + "\n" + s;
    if (!policies.count(key)) {
      keys.push_back(key);
      head[key] = models[r.model].name + ", " + dtypes;
      tail[key] = s;
    }
    policies[key].push_back(combos[r.combo].policy);
  }
  std::vector<std::string> items;
  for (const auto& k : keys) {
    const auto& p = policies[k];
    std::string who = p.size() == 1 ? " (policy " : " (policies ";
    for (size_t i = 0; i < p.size(); ++i) who += (i ? ", " : "") + p[i];
    items.push_back(head[k] + who + ")" + tail[k]);
  }
  if (!items.empty()) doc.bullets(items);
  return items;
}

void notes_section(Document& doc, const RunData& run) {
  std::vector<std::string> items;
  for (const auto& scenario : run.scenarios) {
    std::string note;
    if (scenario.row.outcome == Outcome::error) note += "the check errored: " + scenario.row.first_divergence + ". ";
    // A refused load trains no resumed run: its missing resumed/metrics.csv is the refusal itself
    // (the matrix row says so), not something to note.
    std::vector<std::string> missing;
    for (const auto& file : scenario.missing)
      if (!(scenario.row.outcome == Outcome::load_refused && file == "resumed/metrics.csv")) missing.push_back(file);
    if (!missing.empty()) {
      note += "missing in " + scenario.rel_dir + ":";
      for (const auto& file : missing) note += " " + file;
      note += " (the tables and plots that need them leave this scenario out).";
    }
    if (!note.empty()) items.push_back(scenario.row.scenario + ": " + note);
  }
  if (items.empty()) return;
  doc.heading("Scenario notes");
  doc.bullets(std::move(items));
}

}   // namespace

ReportFiles generate_report(const std::string& run_dir, const std::string& models_file, std::ostream& log,
                            bool md_image_links, bool verbose) {
  // What this writes below the run directory (plots.py writes only inside plots/, whose old
  // files write_plot_inputs removes first): a planted link is refused, never followed.
  std::vector<std::string> outputs = {"report.md",       "report.html",       "projection.csv", "plots",
                                      "plots/index.csv", "plots/storage.csv", "plots/plots.log"};
  for (const char* p : {kLossPlot, kDlossPlot, kDiskPlot, kUlpPlot}) outputs.push_back(std::string("plots/") + p);
  refuse_symlinks_below(run_dir, outputs);
  const RunData run = load_run(run_dir);
  const std::string models = models_file.empty() ? default_models_file() : models_file;
  if (!models_file.empty() && !fs::exists(models_file)) throw ReportError(models_file + ": models file not found");
  if (verbose) {
    log << "report: read " << run.scenarios.size() << " scenarios from " << (fs::path(run_dir) / "summary.csv").string()
        << (run.matrix_file.empty() ? std::string() : " (matrix file " + run.matrix_file + ")")
        << (run.has_summary_json ? "" : "; no summary.json") << "\n";
    log << "report: projection models from " << models << (fs::exists(models) ? "" : " (not found: no projection)")
        << "\n";
  }
  const auto refs = fp32_references(run);
  const auto combos = storage_combos(run, refs);
  if (fs::exists(models)) load_models(models);   // a malformed models file fails before any plotting
  write_plot_inputs(run, combos);
  ReportFiles out;
  out.plots = run_plots(run);
  if (!out.plots.ok) log << "report: plots not drawn: " << out.plots.message << "\n";

  Document doc;
  doc.title = "Resume report: " + (run.matrix_file.empty() ? run.dir : run.matrix_file);
  overview(doc, run, out.plots);
  const size_t findings_at = doc.blocks.size();
  outcomes_section(doc, run);
  matrix_section(doc, run, refs, out.plots);
  loss_section(doc, out.plots);
  const std::string saving = disk_section(doc, run, combos, out.plots);
  auto findings =
      projection_section(doc, combos, models, models_file.empty() ? kDefaultModelsName : models_file, run_dir);
  // Key findings repeat the sections' headline sentences right under the overview.
  if (!saving.empty()) findings.insert(findings.begin(), saving);
  size_t fold_from = findings_at;   // the verdict, failures and key findings stay unfolded in report.md
  if (!findings.empty()) {
    Document k;
    k.heading("Key findings");
    k.bullets(findings);
    doc.blocks.insert(doc.blocks.begin() + static_cast<std::ptrdiff_t>(findings_at), k.blocks.begin(), k.blocks.end());
    fold_from += k.blocks.size();
  }
  doc.fold_from = fold_from;
  notes_section(doc, run);
  doc.heading("Environment");
  if (!run.has_summary_json) doc.paragraph("summary.json is missing: the environment of this run is unknown.");
  doc.table(environment_table(run));

  out.markdown = (fs::path(run_dir) / "report.md").string();
  out.html = (fs::path(run_dir) / "report.html").string();
  write_report_file(out.markdown, render_markdown(doc, md_image_links));
  write_report_file(out.html, render_html(doc, run_dir));
  if (verbose) {
    for (const auto& p : out.plots.written) log << "report: wrote " << (fs::path(run_dir) / p).string() << "\n";
    if (fs::exists(models)) log << "report: wrote " << (fs::path(run_dir) / "projection.csv").string() << "\n";
  }
  log << "report: wrote " << out.markdown << " and " << out.html << " (" << out.plots.written.size() << " plots)\n";
  return out;
}

}   // namespace report

bool ReportCommand::active() const { return cmd != nullptr && static_cast<bool>(*cmd); }

void register_report_command(CLI::App& app, ReportCommand& rc) {
  rc.cmd = app.add_subcommand("report",
                              "write report.md and report.html (with plots) for a matrix run "
                              "directory, or compare two run directories");
  auto* dir = rc.cmd->add_option("RUN_DIR", rc.run_dir, "run directory written by `matrix`");
  rc.cmd->add_option("--models", rc.models_file, "projection models (default reports/models.toml)");
  rc.cmd->add_flag("--md-image-links", rc.md_image_links,
                   "link the plots from report.md as images (plots/*.png, for reading it in the run directory); "
                   "by default report.md names them in text, so it can be posted as a PR comment or CI summary");
  rc.cmd
      ->add_option_function<std::vector<std::string>>(
          "--compare",
          [&rc](const std::vector<std::string>& v) {
            rc.compare_a = v.at(0);
            rc.compare_b = v.at(1);
          },
          "print what changed from RUN_A to RUN_B as Markdown; exit 1 if a scenario that passed in RUN_A "
          "fails in RUN_B")
      ->expected(2)
      ->type_name("RUN_A RUN_B")
      ->excludes(dir);
  rc.cmd->add_flag("--json", rc.json,
                   "with --compare: print the comparison as one JSON object (keys in docs/running.md) instead of "
                   "Markdown");
  rc.cmd
      ->add_option("--merge", rc.merge,
                   "OUT_DIR SHARD_DIR...: merge the run directories of `matrix --shard I/N` runs into OUT_DIR "
                   "(summary.csv, summary.json, junit.xml and cell directories as one unsharded run writes them), "
                   "then write the report there; exit 1 if a merged cell failed, 2 if the shards are not one matrix")
      ->expected(2, 4096)
      ->type_name("OUT_DIR SHARD_DIR...")
      ->excludes(dir)
      ->excludes("--compare")
      ->excludes("--json");
  rc.cmd->footer(
      "Exit codes: 0 written (or no regression), 1 --compare found a regression or --merge a failed "
      "cell, 2 missing or malformed run directory, or --merge shards that are not one matrix.");
}

int run_report_command(const ReportCommand& rc, std::ostream& out) {
  if (!rc.compare_a.empty()) {
    try {
      return report::compare_runs(rc.compare_a, rc.compare_b, out, rc.json);
    } catch (const std::exception& e) {
      std::cerr << kErrorPrefix << e.what() << "\n";
      return 2;
    }
  }
  if (rc.json) {
    std::cerr << kErrorPrefix << "report: --json needs --compare RUN_A RUN_B\n";
    return 2;
  }
  if (rc.run_dir.empty()) {
    std::cerr << kErrorPrefix << "report: give RUN_DIR, or --compare RUN_A RUN_B\n";
    return 2;
  }
  return write_report(rc.run_dir, rc.models_file, out, rc.md_image_links, rc.verbose);
}

int write_report(const std::string& run_dir, std::ostream& out) { return write_report(run_dir, "", out); }

int write_report(const std::string& run_dir, const std::string& models_file, std::ostream& out, bool md_image_links,
                 bool verbose) {
  try {
    report::generate_report(run_dir, models_file, out, md_image_links, verbose);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << kErrorPrefix << "report: " << e.what() << "\n";
    return 2;
  }
}

}   // namespace rh
