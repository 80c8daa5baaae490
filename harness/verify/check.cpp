// The resume check; see check.h. check_cell reads as its phases: resume (a new process), measure
// the checkpoint, compare (controls, after load, metrics, final state), judge, write.
#include "harness/verify/check.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "harness/base/no_follow.h"
#include "harness/base/phases.h"
#include "harness/base/text.h"
#include "harness/checkpoint/checkpoint.h"
#include "harness/process/process.h"
#include "harness/train/metrics.h"
#include "harness/verify/baseline.h"
#include "harness/verify/external_check.h"
#include "harness/verify/golden.h"
#include "harness/verify/writers.h"

namespace fs = std::filesystem;

namespace rh {
namespace {

// Keys whose fingerprints differ between two fingerprint lists (by key), in a's order.
std::vector<std::string> differing_keys(const std::vector<std::pair<std::string, std::string>>& a,
                                        const std::vector<std::pair<std::string, std::string>>& b) {
  std::map<std::string, std::string> b_by_key(b.begin(), b.end());
  std::vector<std::string> out;
  for (const auto& [k, h] : a) {
    auto it = b_by_key.find(k);
    if (it == b_by_key.end() || it->second != h) out.push_back(k);
  }
  std::map<std::string, std::string> a_by_key(a.begin(), a.end());
  for (const auto& [k, h] : b)
    if (!a_by_key.count(k)) out.push_back(k);
  return out;
}

bool is_optimizer_key(const std::string& key) {
  const auto kind = key_kind(key);
  return kind == "master_param" || kind == "remainder" || kind == "exp_avg" || kind == "exp_avg_sq";
}

// The resumed run: a new process of the tool that loads the cell's checkpoint and trains K+1..N.
// Returns false when it refused the load (load_result.json says so, and it exited with 2, or 1
// for a damaged checkpoint); throws when it failed any other way.
bool resume(const Scenario& scenario, const CellRuns& runs, const CheckOptions& opts, CheckResult& result) {
  const fs::path dir(opts.work_dir), cfg = dir / "config.json", log = dir / "resumed.log";
  write_text(cfg.string(), to_json(scenario.cfg).dump(2) + "\n");
  std::vector<std::string> argv = {opts.tool,       "train",
                                   "--config",      cfg.string(),
                                   "--out",         (dir / "resumed").string(),
                                   "--dump-states", "--quiet",
                                   "--load",        runs.checkpoint.string(),
                                   "--fault",       to_string(scenario.fault)};
  if (scenario.allow_lossy) argv.push_back("--allow-lossy");
  if (scenario.exact_master_conversion) argv.push_back("--exact-master-conversion");
  if (scenario.exact_rebucket) argv.push_back("--exact-rebucket");
  if (scenario.resume_ddp_bucket_size >= 0)
    argv.insert(argv.end(), {"--ddp-bucket-size", std::to_string(scenario.resume_ddp_bucket_size)});
  if (scenario.resume_dp() > 1) argv.insert(argv.end(), {"--nproc", std::to_string(scenario.resume_dp())});
  const auto child = run_process(argv, log.string(), opts.timeout_s, /*prestarted=*/true);
  const fs::path load_result_file = dir / "resumed" / kLoadResultFile;
  const bool exited_bad_input =
      (child.exit_code == 2 || child.exit_code == 1) && !child.killed && fs::exists(load_result_file);
  const LoadResult load = exited_bad_input ? read_load_result(load_result_file.string()) : LoadResult{};
  if (exited_bad_input && !load.loaded) {
    result.outcome = Outcome::load_refused;
    result.load_error = load.message;
    result.first_divergence = "load refused";
    result.control_fresh_differs = true;   // nothing was loaded; the control is moot
    return false;
  }
  if (!child.ok())
    throw std::runtime_error("resumed process " + child.describe() + ": " + tail_of_file(log.string(), 600));
  return true;
}

// Checkpoint bytes (stored and uncompressed) per parameter, and its disk.csv beside the results.
void measure(const CellRuns& runs, const fs::path& dir, CheckResult& result) {
  const auto size = ckpt::measure_checkpoint(runs.checkpoint.string());
  result.num_params = size.num_params;
  result.checkpoint_bytes = size.stored_bytes;
  result.raw_checkpoint_bytes = size.raw_bytes;
  const double num_params = static_cast<double>(result.num_params);
  result.bytes_per_param = result.num_params ? static_cast<double>(result.checkpoint_bytes) / num_params : 0;
  result.raw_bytes_per_param = result.num_params ? static_cast<double>(result.raw_checkpoint_bytes) / num_params : 0;
  const fs::path disk = fs::path(size.iter_dir) / "disk.csv";
  if (fs::exists(disk)) copy_text_file(disk.string(), (dir / "disk.csv").string());
}

// Right after load: the fingerprints (same layout only), and the dumps joined across shards.
void compare_after_load(const Scenario& scenario, const CellRuns& runs, const fs::path& dir,
                        const Fingerprints& baseline_fingerprints, const Fingerprints& resumed_fingerprints,
                        CheckResult& result) {
  const int64_t K = scenario.save_at;
  if (!scenario.resharded()) {
    auto after = differing_keys(baseline_fingerprints.at(K), resumed_fingerprints.at(K));
    if (!after.empty()) result.first_divergence = "after load: " + after.front();
  }
  result.after_load =
      compare_state_dumps((runs.baseline / "state_at_save").string(), (dir / "resumed" / "state_after_load").string());
  for (const auto& diff : result.after_load)
    if (!diff.identical() && result.after_load_differs.empty()) result.after_load_differs = diff.key;
  if (scenario.resharded() && !result.after_load_differs.empty())
    result.first_divergence = "after load: " + result.after_load_differs;
  for (const auto& diff : result.after_load) {
    auto& max_ulp = result.max_ulp_after_load[diff.kind];
    max_ulp = std::max(max_ulp, diff.max_ulp);
    auto it = result.bit_equal_after_load.find(diff.kind);
    if (it == result.bit_equal_after_load.end() || diff.bit_equal_fraction < it->second)
      result.bit_equal_after_load[diff.kind] = diff.bit_equal_fraction;
  }
}

MetricDiff metric_diff(int64_t iteration, const std::string& name, const IterMetrics& baseline,
                       const IterMetrics& resumed) {
  MetricDiff diff;
  diff.iteration = iteration;
  diff.metric = name;
  diff.baseline = metric_value(baseline, name);
  diff.resumed = metric_value(resumed, name);
  diff.bit_equal = std::memcmp(&diff.baseline, &diff.resumed, sizeof(double)) == 0;
  diff.abs_diff = std::fabs(diff.baseline - diff.resumed);
  if (std::isnan(diff.abs_diff)) diff.abs_diff = diff.bit_equal ? 0 : std::numeric_limits<double>::infinity();
  diff.rel_diff = diff.baseline != 0 ? diff.abs_diff / std::fabs(diff.baseline) : (diff.abs_diff == 0 ? 0 : INFINITY);
  // lm/aux/total losses are fp32 values; grad norm and lr are doubles.
  diff.ulp = (name == "grad_norm" || name == "lr" || name == "num_zeros")
                 ? ulp_distance(diff.baseline, diff.resumed)
                 : ulp_distance(static_cast<float>(diff.baseline), static_cast<float>(diff.resumed));
  return diff;
}

// Every metric of K+1..N and, while nothing differs yet, every fingerprint of those iterations.
void compare_iterations(const Scenario& scenario, const CellRuns& runs, const fs::path& dir,
                        const Fingerprints& reference_fingerprints, const Fingerprints& resumed_fingerprints,
                        CheckResult& result) {
  const int64_t K = scenario.save_at, N = scenario.cfg.train.iterations;
  const auto reference_metrics = read_metrics_csv((runs.reference / "metrics.csv").string());
  const auto resumed_metrics = read_metrics_csv((dir / "resumed" / "metrics.csv").string());
  if (resumed_metrics.size() != static_cast<size_t>(N - K))
    throw std::runtime_error("resumed run wrote " + std::to_string(resumed_metrics.size()) + " metric rows, expected " +
                             std::to_string(N - K));
  for (int64_t i = K + 1; i <= N; ++i) {
    for (const auto& name : metric_names()) {
      const auto diff = metric_diff(i, name, reference_metrics.at(static_cast<size_t>(i - 1)),
                                    resumed_metrics.at(static_cast<size_t>(i - K - 1)));
      if (name == "lm_loss") result.max_abs_dloss = std::max(result.max_abs_dloss, diff.abs_diff);
      if (!diff.bit_equal && result.first_divergence.empty())
        result.first_divergence = "iteration " + std::to_string(i) + ": metric " + name;
      result.metric_diffs.push_back(diff);
    }
    if (result.first_divergence.empty()) {
      auto keys = differing_keys(reference_fingerprints.at(i), resumed_fingerprints.at(i));
      if (!keys.empty()) result.first_divergence = "iteration " + std::to_string(i) + ": " + keys.front();
    }
  }
}

// Everything the resumed run left, against the baseline (and the reference when resharded).
void compare(const Scenario& scenario, const CellRuns& runs, const fs::path& dir,
             const Fingerprints& baseline_fingerprints, CheckResult& result) {
  const int64_t K = scenario.save_at;
  const auto reference_fingerprints =
      scenario.resharded() ? read_fingerprints((runs.reference / "fingerprints.csv").string()) : baseline_fingerprints;
  const auto resumed_fingerprints = read_fingerprints((dir / "resumed" / "fingerprints.csv").string());
  // Negative control 1: a fresh optimizer (before loading) differs from the saved state.
  for (const auto& k : differing_keys(resumed_fingerprints.at(-1), reference_fingerprints.at(K)))
    result.control_fresh_differs = result.control_fresh_differs || is_optimizer_key(k);
  compare_after_load(scenario, runs, dir, baseline_fingerprints, resumed_fingerprints, result);
  compare_iterations(scenario, runs, dir, reference_fingerprints, resumed_fingerprints, result);
  result.final_state =
      compare_state_dumps((runs.reference / "state_final").string(), (dir / "resumed" / "state_final").string());
  for (const auto& diff : result.final_state)
    if (!diff.identical() && result.first_divergence.empty()) result.first_divergence = "final state: " + diff.key;
  result.outcome = result.first_divergence.empty() ? Outcome::identical : Outcome::diverged;
}

// Negative control 2: the state at K differs from the state at K-1.
void control_k(const Scenario& scenario, const Fingerprints& baseline_fingerprints, CheckResult& result) {
  for (const auto& k :
       differing_keys(baseline_fingerprints.at(scenario.save_at), baseline_fingerprints.at(scenario.save_at - 1)))
    result.control_k_differs = result.control_k_differs || is_optimizer_key(k);
}

// The expectation, then the golden metrics: the verdict is final before anything is written.
void decide(const Scenario& scenario, const CellRuns& runs, const CheckOptions& opts, CheckResult& result) {
  judge(scenario, result);
  if (result.outcome == Outcome::diverged && scenario.expect.kind == Expectation::Kind::tolerance && result.passed)
    result.outcome = Outcome::within_tolerance;
  if (opts.golden_csv.empty() || result.outcome == Outcome::error) return;
  const std::string failure =
      golden_failure(opts.golden_csv, (runs.baseline / "metrics.csv").string(), opts.update_golden);
  if (!failure.empty()) {
    result.passed = false;
    result.verdict = "FAIL: " + failure;
  }
}

// The baseline's metrics and config beside the cell's results (the report plots them).
void copy_baseline_metrics(const CellRuns& runs, const fs::path& dir) {
  fs::create_directories(dir / "baseline");
  if (fs::equivalent(runs.baseline, dir / "baseline")) return;   // run_check: the baseline ran there
  for (const char* f : {"metrics.csv", "config.json"})
    if (fs::exists(runs.baseline / f)) copy_text_file((runs.baseline / f).string(), (dir / "baseline" / f).string());
}

}   // namespace

void judge(const Scenario& scenario, CheckResult& result) {
  judge_expectation(scenario, result);
  // An external cell's diagnosis and first divergence, where the scenario asserts them.
  if (!result.passed || !scenario.trainer) return;
  if (!scenario.expect_diagnosis.empty() && result.diagnosis != scenario.expect_diagnosis) {
    result.passed = false;
    result.verdict = "FAIL: expected diagnosis " + scenario.expect_diagnosis + ", got " +
                     (result.diagnosis.empty() ? "none" : result.diagnosis) + ": " +
                     (result.explanation.empty() ? result.first_divergence : result.explanation);
  } else if (!scenario.expect_first_divergence.empty() &&
             result.first_divergence.find(scenario.expect_first_divergence) == std::string::npos) {
    result.passed = false;
    result.verdict = "FAIL: expected a first divergence naming '" + scenario.expect_first_divergence + "', got '" +
                     result.first_divergence + "'";
  } else if (!scenario.expect_diagnosis.empty() && result.diagnosis != "none") {
    result.verdict += " [" + result.diagnosis + "]";
  }
}

void judge_expectation(const Scenario& scenario, CheckResult& result) {
  const bool controls_ok = result.control_fresh_differs && result.control_k_differs;
  const bool refused = result.outcome == Outcome::load_refused;
  auto set = [&](bool pass, const std::string& why) {
    result.passed = pass;
    result.verdict = std::string(pass ? "PASS" : "FAIL") + ": " + why;
  };
  if (result.outcome == Outcome::error) return set(false, "error: " + result.first_divergence);
  if (scenario.trainer && !controls_ok && result.outcome != Outcome::nondeterministic)
    return set(false, std::string("negative control failed: ") +
                          (!result.control_fresh_differs
                               ? "the resumed run logged no iteration after save_at, so nothing was compared"
                               : "every row the uninterrupted run logged is the same, so a difference could not show"));
  if (!controls_ok && !refused && !scenario.trainer)
    return set(false, std::string("negative control failed: ") + (!result.control_fresh_differs
                                                                      ? "a fresh optimizer equals the saved state"
                                                                      : "the state at K equals the state at K-1"));
  if (scenario.resharded() && !result.after_load_differs.empty() && !refused &&
      scenario.expect.kind != Expectation::Kind::diverge)
    return set(false, "resharded load (" + std::to_string(scenario.dp_size) + " -> " +
                          std::to_string(scenario.resume_dp()) + " ranks) is not exact: " + result.after_load_differs +
                          " differs from the saved state");
  const bool identical = result.first_divergence.empty() && !refused;
  const std::string found = refused ? "load refused: " + result.load_error : result.first_divergence;
  switch (scenario.expect.kind) {
    case Expectation::Kind::exact:
      if (identical) return set(true, "bit-exact resume");
      return set(false, "expected bit-exact resume; first divergence: " + found);
    case Expectation::Kind::refused:
      if (refused) return set(true, "load refused as expected: " + result.load_error);
      return set(false, "expected the load to be refused (" + scenario.expect.reason + ") but it loaded" +
                            (identical ? " and resumed bit-exact" : "; first divergence: " + found));
    case Expectation::Kind::within_noise:
      if (identical) return set(true, result.explanation.empty() ? "within run-to-run noise" : result.explanation);
      return set(false, "expected a resume within run-to-run noise; " + found);
    case Expectation::Kind::diverge:
      if (!identical) return set(true, "difference caught as expected: " + found);
      return set(false, "expected a difference (" + scenario.expect.reason + ") but the resume was bit-exact");
    case Expectation::Kind::tolerance: {
      if (refused) return set(false, "load refused: " + result.load_error);
      for (const auto& diff : result.metric_diffs) {
        // Only the metrics the scenario declares are judged (as Megatron's approximate mode
        // judges lm loss); the others are reported in metrics_compare.csv.
        auto it = scenario.expect.tolerances.find(diff.metric);
        if (diff.bit_equal || it == scenario.expect.tolerances.end()) continue;
        const double bound = it->second.atol + it->second.rtol * std::fabs(diff.baseline);
        if (!(diff.abs_diff <= bound))
          return set(false, "metric " + diff.metric + " at iteration " + std::to_string(diff.iteration) +
                                " differs by " + exact_decimal(diff.abs_diff) +
                                " > atol + rtol*|baseline| = " + exact_decimal(bound));
      }
      return set(true, identical ? "bit-exact (within any tolerance)"
                                 : "within declared tolerance; first divergence: " + result.first_divergence);
    }
  }
}

void reset_work_dir(const std::string& work_dir) {
  const fs::path dir(work_dir), name = dir.filename();
  // The work directory is removed first: never one that names "", ".", ".." or a root.
  if (name.empty() || name == "." || name == ".." || dir.lexically_normal() == dir.root_path())
    throw std::invalid_argument("run_check: work directory '" + work_dir +
                                "' must name a scenario directory (not '', '.', '..' or a root)");
  // A planted link (the cell, or the scenarios directory above it) is refused, never followed.
  remove_tree_below(dir.parent_path().parent_path(), dir.parent_path().filename() / name);
  open_work_dir(work_dir, {}, /*create=*/true);
}

BeneathDir open_work_dir(const std::string& work_dir, const fs::path& below, bool create) {
  // The run directory (the user's: followed if a link) is two levels up; scenarios/<cell> and
  // everything below are walked without following links.
  const fs::path dir = fs::path(work_dir).lexically_normal(), root = dir.parent_path().parent_path();
  return BeneathDir::open(root, dir.parent_path().filename() / dir.filename() / below, create);
}

CheckResult check_cell(const Scenario& scenario, const CellRuns& runs, const CheckOptions& opts) {
  CheckResult result;
  result.name = scenario.name;
  result.expectation = to_string(scenario.expect.kind);
  const fs::path dir(opts.work_dir);
  const auto t0 = std::chrono::steady_clock::now();
  PhaseTimes phases;   // phases.json: where this check's time went (bench_matrix)
  try {
    if (!runs.baseline_error.empty()) throw std::runtime_error(runs.baseline_error);
    bool loaded = false;
    {
      PhaseTimes::Scope timed(phases, "copy_baseline");
      copy_baseline_metrics(runs, dir);
    }
    {
      PhaseTimes::Scope timed(phases, "resumed_process");
      loaded = resume(scenario, runs, opts, result);
    }
    {
      PhaseTimes::Scope timed(phases, "compare");
      measure(runs, dir, result);
      const auto baseline_fingerprints = read_fingerprints((runs.baseline / "fingerprints.csv").string());
      control_k(scenario, baseline_fingerprints, result);
      if (loaded) compare(scenario, runs, dir, baseline_fingerprints, result);
    }
    PhaseTimes::Scope timed(phases, "cleanup");
    if (!opts.keep_checkpoints)
      for (const char* dump : {"state_after_load", "state_final"}) remove_tree_below(dir, fs::path("resumed") / dump);
  } catch (const std::exception& e) {
    result.outcome = Outcome::error;
    result.first_divergence = e.what();
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  decide(scenario, runs, opts, result);
  try {
    {
      PhaseTimes::Scope timed(phases, "write_results");
      write_cell_outputs(dir.string(), scenario, result);
    }
    open_work_dir(dir.string()).write_file("phases.json", nlohmann::json({{"seconds", phases.seconds()}}).dump(2) + "\n");
  } catch (const std::exception& e) {
    result.passed = false;
    result.verdict = std::string("FAIL: cannot write results: ") + e.what();
  }
  return result;
}

CheckResult run_check(const Scenario& scenario, const CheckOptions& opts) {
  reset_work_dir(opts.work_dir);
  if (scenario.trainer) return check_external_cell(scenario, opts);
  const fs::path dir(opts.work_dir);
  CheckPlan plan = plan_checks({scenario}, dir);
  // One cell: its baseline in <work dir>/baseline (its checkpoint in baseline/checkpoints/0), a
  // reference (resharded) in <work dir>/reference.
  plan.baselines[0].dir = dir / "baseline";
  plan.baselines[0].saves[0].root = (dir / "baseline" / "checkpoints" / "0").string();
  if (plan.baselines.size() > 1) plan.baselines[1].dir = dir / "reference";
  CellRuns runs;
  const PlannedCell& cell = plan.cells.front();
  runs.baseline = plan.baselines[cell.baseline].dir;
  runs.reference = plan.baselines[cell.reference].dir;
  runs.checkpoint = plan.baselines[cell.baseline].saves[cell.save].root;
  try {
    for (const auto& baseline : plan.baselines) run_baseline(baseline, opts.tool, opts.timeout_s);
  } catch (const std::exception& e) {
    runs.baseline_error = e.what();
  }
  auto result = check_cell(scenario, runs, opts);
  if (!opts.keep_checkpoints)
    for (const auto& baseline : plan.baselines) prune_baseline(baseline);
  return result;
}

}   // namespace rh
