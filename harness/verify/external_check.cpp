// The check of an external trainer's cell; see external_check.h. check_external_cell runs run_cell,
// which reads as its phases: determinism (the uninterrupted runs against each other), interrupted
// (its rows up to K), saved state (the checkpoint at K), round trip, resumed (the state after load,
// the rows after K), final state, conclude; each phase diagnoses the first divergence it finds
// (diagnosis.h), and the first diagnosis stays. Then judge and write. The runs are external_run.h,
// the comparisons external_compare.h (metrics, probe) and external_checkpoints.h.
#include "harness/verify/external_check.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>

#include "harness/base/data_files.h"
#include "harness/base/text.h"
#include "harness/checkpoint/errors.h"
#include "harness/verify/diagnosis.h"
#include "harness/verify/external_cell_dir.h"
#include "harness/verify/external_checkpoints.h"
#include "harness/verify/external_compare.h"
#include "harness/verify/external_run.h"
#include "harness/verify/writers.h"

namespace fs = std::filesystem;

namespace rh {
namespace {

using external::CheckpointReader;
using external::compare_checkpoints;
using external::compare_probe_steps;
using external::compare_rows;
using external::Difference;
using external::first_differing;
using external::offer_missing;
using external::probe_step;
using external::ProbeRecord;
using external::Runner;
using external::RunOut;

constexpr int64_t kFirst = std::numeric_limits<int64_t>::min(), kLast = std::numeric_limits<int64_t>::max();

bool present(const fs::path& p) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(p, ec));
}

void resolution_notes(const MetricLog& log, bool bitwise_elsewhere, std::vector<std::string>& notes) {
  for (const auto& [name, res] : log.resolution)
    if (!res.empty())
      notes.push_back(name + " printed with " + res + " here" +
                      (bitwise_elsewhere ? "; the checkpoint/probe comparison is bitwise"
                                         : "; nothing else is compared bitwise (add trainer.checkpoint or the probe)"));
}

// The first diagnosis stays: `where` becomes the first divergence, the facts and the diagnosis's
// cause (diagnosis.h) its explanation.
// A cause other than the diagnosis's own when the evidence names a narrower one.
void diagnose(CheckResult& result, Diagnosis diagnosis, const std::string& where, const std::string& facts,
              const char* narrower_cause = nullptr) {
  if (!result.diagnosis.empty() && result.diagnosis != to_string(Diagnosis::none)) return;
  result.diagnosis = to_string(diagnosis);
  result.first_divergence = where;
  const std::string cause = narrower_cause ? narrower_cause : cause_of(diagnosis);
  result.explanation = cause.empty() ? facts : facts + ": " + cause;
}

// One cell: what every phase reads, and the runs so far.
struct Cell {
  Cell(const Scenario& s, const CheckOptions& opts, Runner& runner)
      : trainer(*s.trainer),
        K(s.save_at),
        N(s.cfg.train.iterations),
        ckpts(!trainer.checkpoint.path.empty()),
        per_iteration(trainer.checkpoint.path.find("{iteration") != std::string::npos),
        run(runner),
        reader(trainer, fs::path(opts.work_dir) / "flat") {}

  const ExternalTrainer& trainer;
  const int64_t K, N;
  const bool ckpts;           // trainer.checkpoint.path is set
  const bool per_iteration;   // ... and names one per iteration (the state at K is compared)
  Runner& run;
  CheckpointReader reader;
  std::vector<RunOut> uninterrupted_runs;
  RunOut interrupted, resumed;
  fs::path saved_at_k;                    // the interrupted run's checkpoint (ckpts)
  bool saved_state_known_equal = false;   // the checkpoint at K equals the uninterrupted run's
  bool after_load_equal = false;          // the probed state after load equals the state at K
  std::set<std::string> run_varying;      // non-tensor keys two uninterrupted runs saved differently
  std::set<std::string> unused;           // RNG streams no run draws from (external_compare.h)
  std::string metadata_diff;              // the first comparison where only metadata differed
  bool noisy = false;                     // trainer.noise and the uninterrupted runs differ: judged by noise

  const RunOut& uninterrupted() const { return uninterrupted_runs.front(); }
  // The RNG streams constant within every uninterrupted run and within `also` (when given).
  std::set<std::string> unused_streams(const RunOut* also = nullptr) const {
    std::vector<const std::vector<ProbeRecord>*> probes;
    for (const auto& r : uninterrupted_runs) probes.push_back(&r.probe);
    if (also) probes.push_back(&also->probe);
    return trainer.probe ? external::unused_streams(probes) : std::set<std::string>{};
  }
};

// Keeps what a checkpoint comparison matched or left out (once per key) and, for a phase other than
// after_load / final, its rows for state_compare.csv; notes the first metadata-only difference.
void keep(Cell& cell, CheckResult& result, const std::string& phase, external::Comparison& cmp) {
  auto add = [](std::vector<std::pair<std::string, std::string>>& to,
                const std::vector<std::pair<std::string, std::string>>& from) {
    for (const auto& row : from)
      if (std::none_of(to.begin(), to.end(), [&](const auto& have) { return have.first == row.first; }))
        to.push_back(row);
  };
  add(result.harness_varied, cmp.varied);
  add(result.ignored, cmp.ignored);
  if (cmp.first_state().empty() && !cmp.first_metadata.empty() && cell.metadata_diff.empty())
    cell.metadata_diff = phase + ": " + cmp.first_metadata;
  if (phase == "determinism" || phase == "round_trip") result.other_state.emplace_back(phase, cmp.diffs);
}

std::string count_of(const external::Comparison& cmp) {
  return cmp.changed.size() > 1 ? "; " + std::to_string(cmp.changed.size()) + " keys differ, every one in state_compare.csv"
                                : "";
}

// What the first probed state two uninterrupted runs differ in says about the cause.
std::string what_differs_first(const std::string& probe_where) {
  const size_t colon = probe_where.find(": ");
  const std::string key = colon == std::string::npos ? probe_where : probe_where.substr(colon + 2);
  if (key.rfind("data/", 0) == 0) return "the first state they differ in is the batch: the data order is not reproducible";
  if (key.rfind("rng/", 0) == 0) return "the first state they differ in is " + key + ": that RNG stream is not seeded";
  if (key.rfind("param/", 0) == 0 || key.rfind("optimizer/", 0) == 0 || key.rfind("buffer/", 0) == 0)
    return "the first state they differ in is " + key +
           " with the batch and every RNG stream equal (where recorded): the kernels are not deterministic";
  return "the first state they differ in is " + key;
}

// 1. Determinism: the uninterrupted run, determinism_runs times, every run against the first.
// False when their computation differs (nondeterministic: resume is not judged). Non-tensor values
// that differ while every tensor and metric is equal are kept as run-varying (metadata).
bool check_determinism(Cell& cell, CheckResult& result) {
  for (int d = 1; d <= cell.trainer.determinism_runs; ++d)
    cell.uninterrupted_runs.push_back(
        cell.run.run("uninterrupted_" + std::to_string(d), false, cell.N, {}, std::nullopt));
  const RunOut& uninterrupted = cell.uninterrupted();
  if (uninterrupted.metrics.rows.empty())
    throw std::runtime_error("the uninterrupted run logged no metric rows (trainer.metrics matched nothing in " +
                             (uninterrupted.dir / "stdout.log").string() + ")");
  cell.unused = cell.unused_streams();
  for (size_t d = 1; d < cell.uninterrupted_runs.size(); ++d) {
    const RunOut& other = cell.uninterrupted_runs[d];
    Difference diff = compare_rows(uninterrupted.metrics, other.metrics, kFirst, kLast, other.label, nullptr);
    offer_missing(uninterrupted.metrics, other.metrics, kFirst, kLast, other.label, diff);
    Difference probe_diff = compare_probe_steps(uninterrupted.probe, other.probe, 0, cell.N, cell.unused);
    if (probe_diff.found() && probe_diff.iteration <= diff.iteration) diff = probe_diff;
    external::Comparison cmp;
    const fs::path ckpt_first = cell.ckpts ? cell.run.checkpoint(uninterrupted, cell.N, cell.N, {}) : fs::path(),
                   ckpt_other = cell.ckpts ? cell.run.checkpoint(other, cell.N, cell.N, {}) : fs::path();
    if (!diff.found() && cell.ckpts && present(ckpt_first) && present(ckpt_other)) {
      cmp = compare_checkpoints(cell.reader, ckpt_first, ckpt_other, &uninterrupted.side, &other.side, "determinism");
      for (const auto& row : cmp.diffs)
        if ((row.kind == "value" || row.kind == "metadata") && !row.identical()) cell.run_varying.insert(row.key);
      if (cmp.first_tensor.empty() && !cmp.changed.empty() && cell.metadata_diff.empty())
        cell.metadata_diff = "the uninterrupted runs' final checkpoints: " +
                             (!cmp.first_value.empty() ? cmp.first_value : cmp.first_metadata);
      keep(cell, result, "determinism", cmp);
    }
    if (diff.found() || !cmp.first_tensor.empty()) {
      const std::string where = diff.found() ? diff.what : "final checkpoint: " + cmp.first_tensor;
      const std::string why = probe_diff.found() ? what_differs_first(probe_diff.what) : "";
      if (cell.trainer.noise) {   // measured instead of refused: the spread is the yardstick
        cell.noisy = true;
        result.notes.push_back("two uninterrupted runs differ (" + where + (why.empty() ? "" : "; " + why) +
                               "): judged against their run-to-run spread");
        continue;
      }
      result.outcome = Outcome::nondeterministic;
      const std::string cause =
          std::string(cause_of(Diagnosis::nondeterministic)) + (why.empty() ? "" : "; " + why) +
          ". With trainer.noise = true (and determinism_runs >= 2) it is judged against run-to-run noise instead";
      diagnose(result, Diagnosis::nondeterministic, "uninterrupted runs differ: " + where,
               "two uninterrupted runs of the same command differ (" + where + count_of(cmp) + ")", cause.c_str());
      return false;
    }
  }
  // Controls: the comparison can fail (the metrics change over iterations), and the resumed run
  // is compared on at least one iteration after K (check_resumed).
  for (const auto& row : uninterrupted.metrics.rows)
    if (row.values != uninterrupted.metrics.rows.front().values) result.control_k_differs = true;
  return true;
}

// 2. The interrupted run: every row up to K must equal the uninterrupted run's.
void check_interrupted(Cell& cell, CheckResult& result) {
  const RunOut& uninterrupted = cell.uninterrupted();
  cell.interrupted = cell.run.run("interrupted", false, cell.K, {}, std::nullopt);
  Difference diff =
      compare_rows(uninterrupted.metrics, cell.interrupted.metrics, kFirst, cell.K, "interrupted", nullptr);
  offer_missing(uninterrupted.metrics, cell.interrupted.metrics, kFirst, cell.K, "interrupted", diff);
  Difference probe_diff = compare_probe_steps(uninterrupted.probe, cell.interrupted.probe, kFirst, cell.K,
                                              cell.unused_streams(&cell.interrupted));
  if (probe_diff.found() && probe_diff.iteration <= diff.iteration) diff = probe_diff;
  if (diff.found())
    diagnose(result, Diagnosis::before_save, "interrupted run: " + diff.what,
             "the interrupted run ({iterations} = " + std::to_string(cell.K) +
                 ") differs from the uninterrupted run before any save (" + diff.what + ")");
}

// 3. The saved state at K against the uninterrupted run's (a checkpoint per iteration only).
void check_saved_state(Cell& cell, CheckResult& result) {
  const int64_t K = cell.K, N = cell.N;
  cell.saved_at_k = cell.ckpts ? cell.run.checkpoint(cell.interrupted, K, K, {}) : fs::path();
  if (!cell.ckpts) return;
  if (!present(cell.saved_at_k))
    throw std::runtime_error("checkpoint " + cell.saved_at_k.string() +
                             " was not written by the interrupted run (trainer.checkpoint.path)");
  if (!cell.per_iteration) return;
  const fs::path uninterrupted_at_k = cell.run.checkpoint(cell.uninterrupted(), N, K, {});
  if (!present(uninterrupted_at_k)) {
    result.notes.push_back("the saved state at K was not compared: the uninterrupted run left no " +
                           uninterrupted_at_k.string());
    return;
  }
  auto cmp = compare_checkpoints(cell.reader, uninterrupted_at_k, cell.saved_at_k, &cell.uninterrupted().side,
                                 &cell.interrupted.side, "saved_at_k", cell.run_varying);
  result.after_load = cmp.diffs;
  keep(cell, result, "saved at " + std::to_string(K), cmp);
  const std::string key = cmp.first_state();
  if (!key.empty())
    diagnose(result, Diagnosis::saved_state, "saved state at " + std::to_string(K) + ": " + key,
             "the checkpoint the interrupted run saved at " + std::to_string(K) +
                 " differs from the one the uninterrupted run saved at " + std::to_string(K) + " (first key " + key +
                 count_of(cmp) + ")");
  else cell.saved_state_known_equal = true;
}

// Iterations a run logged in [lo, hi], as "10" or "10-12" or "10, 12".
std::string iterations_text(const std::vector<int64_t>& its) {
  std::string out;
  for (size_t i = 0; i < its.size();) {
    size_t j = i;
    while (j + 1 < its.size() && its[j + 1] == its[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(its[i]) + (j > i ? "-" + std::to_string(its[j]) : "");
    i = j + 1;
  }
  return out;
}

// 4. The round trip (trainer.round_trip): load K, train nothing, save.
void check_round_trip(Cell& cell, CheckResult& result) {
  if (!cell.trainer.round_trip) return;
  const fs::path& load_dir = cell.interrupted.save_dir;
  RunOut round_trip = cell.run.run("round_trip", true, cell.K, load_dir, load_dir);
  std::vector<int64_t> trained;
  for (const auto& row : round_trip.metrics.rows) trained.push_back(row.iteration);
  if (!trained.empty())
    result.notes.push_back("the round trip ({iterations} = " + std::to_string(cell.K) + ", loading " +
                           std::to_string(cell.K) + ") logged iteration " + iterations_text(trained) +
                           ": it trained instead of only loading and saving");
  auto cmp = compare_checkpoints(cell.reader, cell.saved_at_k,
                                 cell.run.checkpoint(round_trip, cell.K, cell.K, load_dir), &cell.interrupted.side,
                                 &round_trip.side, "round_trip", cell.run_varying);
  keep(cell, result, "round_trip", cmp);
  const std::string key = cmp.first_state();
  if (key.empty()) return;
  if (!trained.empty())   // a step trained where none should be: the loop's start, not the load
    diagnose(result, Diagnosis::round_trip, "round trip: trained iteration " + iterations_text(trained) + "; " + key,
             "loading the checkpoint at " + std::to_string(cell.K) + " with {iterations} = " + std::to_string(cell.K) +
                 " should train nothing, but the run trained iteration " + iterations_text(trained) + " and saved " +
                 key + " changed" + count_of(cmp),
             "a resumed run starts at the iteration it loaded instead of the next one (it repeats a finished step): "
             "the saved iteration count and the loop's first iteration disagree");
  else
    diagnose(result, Diagnosis::round_trip, "round trip: " + key,
             "loading the checkpoint at " + std::to_string(cell.K) + " and saving it again without training changes " +
                 key + count_of(cmp));
}

// probe = "auto": the state the resumed run's first step (K+1) starts from against the state the
// uninterrupted run's step K+1 started from, whatever order the trainer restored things in.
void check_before_first_step(Cell& cell, CheckResult& result) {
  const int64_t K = cell.K;
  auto before = [&](const std::vector<ProbeRecord>& records) -> const ProbeRecord* {
    for (const auto& record : records)
      if (record.event == "before_step" && record.iteration == K + 1) return &record;
    return nullptr;
  };
  const ProbeRecord *resumed = before(cell.resumed.probe), *uninterrupted = before(cell.uninterrupted().probe);
  if (!resumed || !uninterrupted)
    throw std::runtime_error(std::string("trainer.probe = \"auto\" but the ") +
                             (!resumed ? "resumed" : "uninterrupted") + " run recorded no state before step " +
                             std::to_string(K + 1) +
                             " (does it step a torch.optim optimizer, once per iteration? see its stderr for "
                             "rhckpt.autoprobe)");
  const std::string key = first_differing(uninterrupted->state, resumed->state, "data/", cell.unused);
  if (!key.empty())
    diagnose(result, Diagnosis::after_load, "after load: " + key,
             "the state the resumed run's first step (" + std::to_string(K + 1) +
                 ") starts from differs from the uninterrupted run's before the same step (first " + key + ")");
  else cell.after_load_equal = true;
}

// The resumed run's state right after load (the probe) against the uninterrupted run's at K.
void check_after_load(Cell& cell, CheckResult& result) {
  const int64_t K = cell.K;
  const ProbeRecord* loaded = nullptr;
  for (const auto& record : cell.resumed.probe)
    if (record.event == "after_load") loaded = &record;
  const ProbeRecord* at_k = probe_step(cell.uninterrupted().probe, K);
  if (!loaded || !at_k)
    throw std::runtime_error(std::string("trainer.probe = true but ") +
                             (!loaded ? "the resumed run recorded no probe.after_load"
                                      : "the uninterrupted run recorded no probe.after_step at " + std::to_string(K)) +
                             " (is RH_PROBE_DIR reaching the trainer, and does it call the probe?)");
  std::string key = loaded->iteration != K ? "iteration (restored " + std::to_string(loaded->iteration) + ")" : "";
  if (key.empty()) key = first_differing(at_k->state, loaded->state, "data/", cell.unused);
  if (!key.empty())
    diagnose(result, Diagnosis::after_load, "after load: " + key,
             "the state right after loading differs from the uninterrupted run's state at " + std::to_string(K) +
                 " (first " + key + ")");
  else cell.after_load_equal = true;
}

// What the resumed run logged of iterations the interrupted run also logged, or skipped: facts.
void overlap_notes(const Cell& cell, CheckResult& result) {
  std::vector<int64_t> again, skipped;
  for (const auto& row : cell.resumed.metrics.rows)
    if (row.iteration <= cell.K && cell.interrupted.metrics.find(row.iteration)) again.push_back(row.iteration);
  for (const auto& row : cell.uninterrupted().metrics.rows)
    if (row.iteration > cell.K && row.iteration <= cell.N && !cell.resumed.metrics.find(row.iteration))
      skipped.push_back(row.iteration);
  if (!again.empty())
    result.notes.push_back("the resumed run logged iteration " + iterations_text(again) +
                           ", which the interrupted run logged too; those rows were compared with the uninterrupted "
                           "run's (a checkpoint \"at K\" that holds the state before step K repeats K by design)");
  if (!skipped.empty())
    result.notes.push_back("the resumed run did not log iteration " + iterations_text(skipped) +
                           ", which the uninterrupted run logged");
  for (const auto& repeat : cell.resumed.metrics.repeated)
    result.notes.push_back("the resumed run logged iteration " + std::to_string(repeat.iteration) +
                           " more than once (lines " + std::to_string(repeat.first_line) + " and " +
                           std::to_string(repeat.line) + " of its log); each row was compared with the uninterrupted "
                           "run's");
}

// 5. The resumed run: its state after load (the probe), then its rows (and probe records) after K.
void check_resumed(Cell& cell, CheckResult& result) {
  const int64_t K = cell.K, N = cell.N;
  const RunOut& uninterrupted = cell.uninterrupted();
  cell.resumed = cell.run.run("resumed", true, N, cell.interrupted.save_dir, cell.interrupted.save_dir);
  if (cell.trainer.probe) {
    cell.unused = cell.unused_streams(&cell.resumed);   // a stream the resumed run draws from is compared
    if (cell.trainer.probe_auto) check_before_first_step(cell, result);
    else check_after_load(cell, result);
  }
  overlap_notes(cell, result);
  Difference diff =
      compare_rows(uninterrupted.metrics, cell.resumed.metrics, kFirst, N, "resumed", &result.metric_diffs);
  offer_missing(uninterrupted.metrics, cell.resumed.metrics, K + 1, N, "resumed", diff);
  for (const auto& row : cell.resumed.metrics.rows)
    result.control_fresh_differs = result.control_fresh_differs || (row.iteration > K && row.iteration <= N);
  Difference probe_diff = compare_probe_steps(uninterrupted.probe, cell.resumed.probe, K + 1, N, cell.unused);
  std::string where = diff.found() ? diff.what : "";
  if (probe_diff.found() && probe_diff.iteration <= diff.iteration) where = probe_diff.what;
  for (const auto& metric_diff : result.metric_diffs)
    if (metric_diff.metric == "loss" || metric_diff.metric == "lm_loss" || metric_diff.metric == "lm loss")
      result.max_abs_dloss = std::max(result.max_abs_dloss, metric_diff.abs_diff);
  if (where.empty()) return;
  // The dtype audit of what was saved: optimizer state narrower than its parameters.
  std::vector<std::string> lossy;
  if (cell.ckpts && present(cell.saved_at_k))
    lossy = external::lossy_optimizer_state(cell.reader.read({cell.saved_at_k}, "audit").front());
  if (!lossy.empty())
    result.notes.push_back("lossy save: " + std::to_string(lossy.size()) +
                           " optimizer-state tensor(s) saved narrower than the parameters of their shape (" +
                           lossy.front() + (lossy.size() > 1 ? "; ..." : "") + ")");
  if (cell.saved_state_known_equal && !lossy.empty())
    diagnose(result, Diagnosis::lossy_save, "lossy save: " + lossy.front(),
             where + " after resume while the saved state equals the uninterrupted run's, and the checkpoint holds " +
                 lossy.front());
  else if (cell.after_load_equal)
    diagnose(result, Diagnosis::not_in_checkpoint, where, where + " while the probed state after load is identical");
  else if (cell.saved_state_known_equal)
    diagnose(result, Diagnosis::not_restored, where,
             where + " after resume while the checkpoint at " + std::to_string(K) +
                 " equals the uninterrupted run's" + (cell.trainer.round_trip ? " and round-trips" : ""));
  else
    diagnose(result, Diagnosis::resumed_metrics, where,
             where + " after resume" +
                 (cell.ckpts ? ""
                             : "; only the logged metrics were compared (add trainer.checkpoint or the probe to "
                               "localize)"));
}

// 6. The final state: the resumed run's last checkpoint against the uninterrupted run's.
void check_final_state(Cell& cell, CheckResult& result) {
  if (!cell.ckpts) return;
  const fs::path final_uninterrupted = cell.run.checkpoint(cell.uninterrupted(), cell.N, cell.N, {});
  if (!present(final_uninterrupted)) {
    result.notes.push_back("the final state was not compared: the uninterrupted run left no " +
                           final_uninterrupted.string());
    return;
  }
  auto cmp = compare_checkpoints(cell.reader, final_uninterrupted,
                                 cell.run.checkpoint(cell.resumed, cell.N, cell.N, cell.interrupted.save_dir),
                                 &cell.uninterrupted().side, &cell.resumed.side, "final", cell.run_varying);
  result.final_state = cmp.diffs;
  keep(cell, result, "final state", cmp);
  const std::string key = cmp.first_state();
  if (!key.empty())
    diagnose(result, Diagnosis::final_state, "final state: " + key,
             "every compared metric is equal but the final checkpoint differs at " + key + count_of(cmp));
}

// The run-to-run spread: metric -> iteration -> the largest |a - b| over every pair of runs at that
// iteration or before it.
using Spread = std::map<std::string, std::map<int64_t, double>>;

Spread spread_of(const std::vector<RunOut>& runs) {
  Spread spread;
  for (size_t a = 0; a < runs.size(); ++a)
    for (size_t b = a + 1; b < runs.size(); ++b)
      for (const auto& row : runs[a].metrics.rows) {
        const MetricRow* other = runs[b].metrics.find(row.iteration);
        if (!other) continue;
        for (const auto& [name, text] : row.values)
          for (const auto& [other_name, other_text] : other->values)
            if (other_name == name) {
              double d = std::fabs(metric_number(text) - metric_number(other_text));
              if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
              double& s = spread[name][row.iteration];
              s = std::max(s, d);
            }
      }
  // The envelope: run-to-run differences grow as training goes on, and one iteration's sample of
  // them can be small by chance; the yardstick at i is the largest spread seen up to i.
  for (auto& [name, by_iteration] : spread) {
    double so_far = 0;
    for (auto& [iteration, value] : by_iteration) so_far = value = std::max(so_far, value);
  }
  return spread;
}

std::string three_digits(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", v);
  return text;
}

// The largest deviation of `got`'s rows in [lo, hi] from `ref`'s, relative to factor x spread.
struct NoiseJudgement {
  bool beyond = false;
  int64_t iteration = 0;
  std::string metric;
  double deviation = -1, spread = 0;
  std::string text() const {
    return "iteration " + std::to_string(iteration) + ": metric " + metric + " (|d| " + three_digits(deviation) +
           " against a spread of " + three_digits(spread) + ")";
  }
};

NoiseJudgement judge_noise(const MetricLog& ref, const MetricLog& got, int64_t lo, int64_t hi, const Spread& spread,
                           double factor) {
  NoiseJudgement worst;   // the first beyond, else the largest deviation relative to its band
  double worst_ratio = -1;
  for (const auto& row : got.rows) {
    if (row.iteration < lo || row.iteration > hi) continue;
    const MetricRow* ref_row = ref.find(row.iteration);
    if (!ref_row) continue;
    for (const auto& [name, text] : row.values)
      for (const auto& [ref_name, ref_text] : ref_row->values) {
        if (ref_name != name) continue;
        double d = std::fabs(metric_number(text) - metric_number(ref_text));
        if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
        double band = 0;
        if (auto m = spread.find(name); m != spread.end())
          if (auto it = m->second.find(row.iteration); it != m->second.end()) band = it->second;
        const bool beyond = d > factor * band;
        if (beyond && (!worst.beyond || row.iteration < worst.iteration)) worst = {true, row.iteration, name, d, band};
        const double ratio = band > 0 ? d / band : (d > 0 ? INFINITY : 0);
        if (!worst.beyond && ratio > worst_ratio) worst_ratio = ratio, worst = {false, row.iteration, name, d, band};
      }
  }
  return worst;
}

// trainer.noise with uninterrupted runs that differ: the interrupted run (up to K) and the resumed
// run (after K) against the first uninterrupted run, each metric within noise_factor times the
// spread at its iteration. The checkpoints and probe records are not compared bitwise.
void check_within_noise(Cell& cell, CheckResult& result) {
  const int64_t K = cell.K, N = cell.N;
  const RunOut& uninterrupted = cell.uninterrupted();
  const Spread spread = spread_of(cell.uninterrupted_runs);
  const double factor = cell.trainer.noise_factor;
  cell.interrupted = cell.run.run("interrupted", false, K, {}, std::nullopt);
  cell.resumed = cell.run.run("resumed", true, N, cell.interrupted.save_dir, cell.interrupted.save_dir);
  overlap_notes(cell, result);
  (void)compare_rows(uninterrupted.metrics, cell.resumed.metrics, kFirst, N, "resumed", &result.metric_diffs);
  for (const auto& row : cell.resumed.metrics.rows)
    result.control_fresh_differs = result.control_fresh_differs || (row.iteration > K && row.iteration <= N);
  const auto before = judge_noise(uninterrupted.metrics, cell.interrupted.metrics, kFirst, K, spread, factor);
  const auto after = judge_noise(uninterrupted.metrics, cell.resumed.metrics, K + 1, N, spread, factor);
  result.notes.push_back("judged against run-to-run noise: a metric may differ from the first uninterrupted run's by "
                         "up to " + three_digits(factor) + " x the largest difference between the " +
                         std::to_string(cell.uninterrupted_runs.size()) +
                         " uninterrupted runs at its iteration or before (trainer.noise_factor); checkpoints and probe records "
                         "are not compared bitwise");
  for (const auto* judged : {&before, &after})
    if (judged->beyond) {
      const std::string run = judged == &before ? "interrupted run" : "resumed run";
      diagnose(result, Diagnosis::beyond_noise, run + ": " + judged->text(),
               "the " + run + " diverges beyond run-to-run noise from " + judged->text());
      result.outcome = Outcome::diverged;
      return;
    }
  result.diagnosis = to_string(Diagnosis::within_noise);
  result.explanation = "every metric of the interrupted and resumed runs is within run-to-run noise (largest " +
                       (after.deviation >= 0 ? after.text() : std::string("none")) + ", noise_factor " +
                       three_digits(factor) + ")";
  result.outcome = Outcome::within_tolerance;
}

std::string listed(const std::vector<std::pair<std::string, std::string>>& rows, const char* joiner) {
  std::string out;
  for (size_t i = 0; i < rows.size() && i < 8; ++i)
    out += (i ? ", " : "") + rows[i].first + " (" + joiner + rows[i].second + ")";
  if (rows.size() > 8) out += " and " + std::to_string(rows.size() - 8) + " more (result.json)";
  return out;
}

// The notes, the diagnosis when nothing differs, the outcome.
void conclude(const Cell& cell, CheckResult& result) {
  resolution_notes(cell.uninterrupted().metrics, cell.ckpts || cell.trainer.probe, result.notes);
  if (!result.harness_varied.empty())
    result.notes.push_back("saved values that differ only by what the harness gave each run, compared as that: " +
                           listed(result.harness_varied, ""));
  if (!result.ignored.empty())
    result.notes.push_back("left out by trainer.checkpoint.ignore: " + listed(result.ignored, "reason: "));
  for (const auto& stream : cell.unused)
    result.notes.push_back(stream + " never changes within a run (the trainer does not draw from it during the "
                                    "recorded steps): left out of the probe's verdict");
  if (result.diagnosis.empty() && !cell.metadata_diff.empty())
    diagnose(result, Diagnosis::metadata, "metadata: " + cell.metadata_diff,
             "only non-tensor values differ (" + cell.metadata_diff + ")");
  if (result.diagnosis.empty()) {
    result.diagnosis = to_string(Diagnosis::none);
    result.explanation = "every logged metric" + std::string(cell.ckpts ? ", every checkpoint key" : "") +
                         (cell.trainer.probe ? " and every probed state" : "") +
                         " of the resumed run equals the uninterrupted run's";
  }
  if (result.outcome != Outcome::nondeterministic)
    result.outcome = result.diagnosis == to_string(Diagnosis::none) ? Outcome::identical : Outcome::diverged;
}

void run_cell(const Scenario& scenario, const CheckOptions& opts, CheckResult& result, Runner& run) {
  Cell cell(scenario, opts, run);
  if (!check_determinism(cell, result)) return;
  if (cell.noisy) {
    check_within_noise(cell, result);
    resolution_notes(cell.uninterrupted().metrics, false, result.notes);
    return;
  }
  check_interrupted(cell, result);
  check_saved_state(cell, result);
  check_round_trip(cell, result);
  check_resumed(cell, result);
  check_final_state(cell, result);
  conclude(cell, result);
}

}   // namespace

std::string python_package_dir() {
  if (const char* e = std::getenv("RH_PYTHON_DIR"); e && *e) return e;
  // Beside the tool with its other data files, in a build tree as in an install.
  const std::string data = data_dir();
  std::error_code ec;
  if (data.empty() || !fs::is_directory(fs::path(data) / "python" / "rhckpt", ec)) return "";
  return (fs::path(data) / "python").string();
}

std::string python_interpreter() {
  if (const char* e = std::getenv("RH_PYTHON"); e && *e) return e;
  return fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
}

CheckResult check_external_cell(const Scenario& scenario, const CheckOptions& opts) {
  CheckResult result;
  result.name = scenario.name;
  result.expectation = to_string(scenario.expect.kind);
  const auto t0 = std::chrono::steady_clock::now();
  external::Runner run(scenario, opts);
  try {
    run_cell(scenario, opts, result, run);
  } catch (const ckpt::CheckpointError& e) {   // a checkpoint the trainer wrote is unreadable or hostile
    result.outcome = Outcome::error;
    result.diagnosis = "";
    result.first_divergence = e.what();
    result.bad_input = true;
  } catch (const std::invalid_argument& e) {   // its log, metrics file or probe records are malformed
    result.outcome = Outcome::error;
    result.diagnosis = "";
    result.first_divergence = e.what();
    result.bad_input = true;
  } catch (const DiskError& e) {   // e.g. no space for the trainer's captured output: not the trainer's fault
    result.outcome = Outcome::error;
    result.diagnosis = "";
    result.first_divergence = e.what();
    result.disk_failed = true;
  } catch (const std::exception& e) {
    result.outcome = Outcome::error;
    result.diagnosis = "";
    result.first_divergence = e.what();
  }
  result.trainer_seconds = run.trainer_seconds();
  if (!opts.keep_checkpoints) {
    try {   // every save/ and flat/, never through a link (a link at the cell's level is refused)
      external::clean_cell(opts.work_dir);
    } catch (const std::exception& e) {
      const bool first = result.outcome != Outcome::error;
      result.outcome = Outcome::error;
      result.diagnosis = "";
      result.first_divergence = first ? e.what() : result.first_divergence + "; then: " + e.what();
      result.bad_input = true;
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  judge(scenario, result);
  try {
    write_cell_outputs(opts.work_dir, scenario, result);
  } catch (const std::exception& e) {
    result.passed = false;
    result.verdict = std::string("FAIL: cannot write results: ") + e.what();
  }
  return result;
}

}   // namespace rh
