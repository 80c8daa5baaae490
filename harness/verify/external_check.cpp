// The check of an external trainer's cell; see external_check.h. check_external_cell runs run_cell,
// which reads as its phases: determinism (the uninterrupted runs against each other), interrupted
// (its rows up to K), saved state (the checkpoint at K), round trip, resumed (the state after load,
// the rows after K), final state, conclude; each phase diagnoses the first divergence it finds
// (diagnosis.h), and the first diagnosis stays. Then judge and write. The runs are external_run.h,
// the comparisons external_compare.h (metrics, probe) and external_checkpoints.h.
#include "harness/verify/external_check.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <stdexcept>

#include "harness/base/data_files.h"
#include "harness/checkpoint/errors.h"
#include "harness/verify/diagnosis.h"
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
void diagnose(CheckResult& result, Diagnosis diagnosis, const std::string& where, const std::string& facts) {
  if (!result.diagnosis.empty() && result.diagnosis != to_string(Diagnosis::none)) return;
  result.diagnosis = to_string(diagnosis);
  result.first_divergence = where;
  const std::string cause = cause_of(diagnosis);
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
  bool saved_state_known_equal = false;   // the state at K or after load equals the uninterrupted run's

  const RunOut& uninterrupted() const { return uninterrupted_runs.front(); }
};

// 1. Determinism: the uninterrupted run, determinism_runs times, every run against the first.
// False when they differ (nondeterministic: resume is not judged).
bool check_determinism(Cell& cell, CheckResult& result) {
  for (int d = 1; d <= cell.trainer.determinism_runs; ++d)
    cell.uninterrupted_runs.push_back(
        cell.run.run("uninterrupted_" + std::to_string(d), false, cell.N, {}, std::nullopt));
  const RunOut& uninterrupted = cell.uninterrupted();
  if (uninterrupted.metrics.rows.empty())
    throw std::runtime_error("the uninterrupted run logged no metric rows (trainer.metrics matched nothing in " +
                             (uninterrupted.dir / "stdout.log").string() + ")");
  for (size_t d = 1; d < cell.uninterrupted_runs.size(); ++d) {
    const RunOut& other = cell.uninterrupted_runs[d];
    Difference diff = compare_rows(uninterrupted.metrics, other.metrics, kFirst, kLast, other.label, nullptr);
    offer_missing(uninterrupted.metrics, other.metrics, kFirst, kLast, other.label, diff);
    Difference probe_diff = compare_probe_steps(uninterrupted.probe, other.probe, 0, cell.N);
    if (probe_diff.found() && probe_diff.iteration <= diff.iteration) diff = probe_diff;
    std::string key;
    const fs::path ckpt_first = cell.ckpts ? cell.run.checkpoint(uninterrupted, cell.N, cell.N, {}) : fs::path(),
                   ckpt_other = cell.ckpts ? cell.run.checkpoint(other, cell.N, cell.N, {}) : fs::path();
    if (!diff.found() && cell.ckpts && present(ckpt_first) && present(ckpt_other))
      key = compare_checkpoints(cell.reader, ckpt_first, ckpt_other, "determinism", nullptr);
    if (diff.found() || !key.empty()) {
      result.outcome = Outcome::nondeterministic;
      const std::string where = diff.found() ? diff.what : "final checkpoint: " + key;
      diagnose(result, Diagnosis::nondeterministic, "uninterrupted runs differ: " + where,
               "two uninterrupted runs of the same command differ (" + where + ")");
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
  Difference probe_diff = compare_probe_steps(uninterrupted.probe, cell.interrupted.probe, kFirst, cell.K);
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
  const std::string key =
      compare_checkpoints(cell.reader, uninterrupted_at_k, cell.saved_at_k, "saved_at_k", &result.after_load);
  if (!key.empty())
    diagnose(result, Diagnosis::saved_state, "saved state at " + std::to_string(K) + ": " + key,
             "the checkpoint the interrupted run saved at " + std::to_string(K) +
                 " differs from the one the uninterrupted run saved at " + std::to_string(K) + " (first key " + key +
                 ")");
  else cell.saved_state_known_equal = true;
}

// 4. The round trip (trainer.round_trip): load K, train nothing, save.
void check_round_trip(Cell& cell, CheckResult& result) {
  if (!cell.trainer.round_trip) return;
  const fs::path& load_dir = cell.interrupted.save_dir;
  RunOut round_trip = cell.run.run("round_trip", true, cell.K, load_dir, load_dir);
  const std::string key =
      compare_checkpoints(cell.reader, cell.saved_at_k, cell.run.checkpoint(round_trip, cell.K, cell.K, load_dir),
                          "round_trip", nullptr);
  if (!key.empty())
    diagnose(result, Diagnosis::round_trip, "round trip: " + key,
             "loading the checkpoint at " + std::to_string(cell.K) + " and saving it again without training changes " +
                 key);
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
  if (key.empty()) key = first_differing(at_k->state, loaded->state, "data/");
  if (!key.empty())
    diagnose(result, Diagnosis::after_load, "after load: " + key,
             "the state right after loading differs from the uninterrupted run's state at " + std::to_string(K) +
                 " (first " + key + ")");
  else cell.saved_state_known_equal = true;
}

// 5. The resumed run: its state after load (the probe), then its rows (and probe records) after K.
void check_resumed(Cell& cell, CheckResult& result) {
  const int64_t K = cell.K, N = cell.N;
  const RunOut& uninterrupted = cell.uninterrupted();
  cell.resumed = cell.run.run("resumed", true, N, cell.interrupted.save_dir, cell.interrupted.save_dir);
  if (cell.trainer.probe) check_after_load(cell, result);
  Difference diff =
      compare_rows(uninterrupted.metrics, cell.resumed.metrics, kFirst, N, "resumed", &result.metric_diffs);
  offer_missing(uninterrupted.metrics, cell.resumed.metrics, K + 1, N, "resumed", diff);
  for (const auto& row : cell.resumed.metrics.rows)
    result.control_fresh_differs = result.control_fresh_differs || (row.iteration > K && row.iteration <= N);
  Difference probe_diff = compare_probe_steps(uninterrupted.probe, cell.resumed.probe, K + 1, N);
  std::string where = diff.found() ? diff.what : "";
  if (probe_diff.found() && probe_diff.iteration <= diff.iteration) where = probe_diff.what;
  for (const auto& metric_diff : result.metric_diffs)
    if (metric_diff.metric == "loss" || metric_diff.metric == "lm_loss" || metric_diff.metric == "lm loss")
      result.max_abs_dloss = std::max(result.max_abs_dloss, metric_diff.abs_diff);
  if (where.empty()) return;
  if (cell.saved_state_known_equal)
    diagnose(result, Diagnosis::not_in_checkpoint, where, where + " while the saved state is identical");
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
  const std::string key =
      compare_checkpoints(cell.reader, final_uninterrupted,
                          cell.run.checkpoint(cell.resumed, cell.N, cell.N, cell.interrupted.save_dir), "final",
                          &result.final_state);
  if (!key.empty())
    diagnose(result, Diagnosis::final_state, "final state: " + key,
             "every compared metric is equal but the final checkpoint differs at " + key);
}

// The notes, the diagnosis when nothing differs, the outcome.
void conclude(const Cell& cell, CheckResult& result) {
  resolution_notes(cell.uninterrupted().metrics, cell.ckpts || cell.trainer.probe, result.notes);
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
  } catch (const std::exception& e) {
    result.outcome = Outcome::error;
    result.diagnosis = "";
    result.first_divergence = e.what();
  }
  result.trainer_seconds = run.trainer_seconds();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  judge(scenario, result);
  if (!opts.keep_checkpoints) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(opts.work_dir, ec))
      if (entry.is_directory() && !fs::is_symlink(entry.symlink_status())) fs::remove_all(entry.path() / "save", ec);
    fs::remove_all(fs::path(opts.work_dir) / "flat", ec);
  }
  try {
    write_cell_outputs(opts.work_dir, scenario, result);
  } catch (const std::exception& e) {
    result.passed = false;
    result.verdict = std::string("FAIL: cannot write results: ") + e.what();
  }
  return result;
}

}   // namespace rh
