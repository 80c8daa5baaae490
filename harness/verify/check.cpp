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
  std::map<std::string, std::string> mb(b.begin(), b.end());
  std::vector<std::string> out;
  for (const auto& [k, h] : a) {
    auto it = mb.find(k);
    if (it == mb.end() || it->second != h) out.push_back(k);
  }
  std::map<std::string, std::string> ma(a.begin(), a.end());
  for (const auto& [k, h] : b)
    if (!ma.count(k)) out.push_back(k);
  return out;
}

bool is_optimizer_key(const std::string& k) {
  const auto kind = key_kind(k);
  return kind == "master_param" || kind == "remainder" || kind == "exp_avg" || kind == "exp_avg_sq";
}

// The resumed run: a new process of the tool that loads the cell's checkpoint and trains K+1..N.
// Returns false when it refused the load (load_result.json says so, and it exited with 2, or 1
// for a damaged checkpoint); throws when it failed any other way.
bool resume(const Scenario& s, const CellRuns& runs, const CheckOptions& o, CheckResult& r) {
  const fs::path dir(o.work_dir), cfg = dir / "config.json", log = dir / "resumed.log";
  write_text(cfg.string(), to_json(s.cfg).dump(2) + "\n");
  std::vector<std::string> argv = {o.tool,          "train",
                                   "--config",      cfg.string(),
                                   "--out",         (dir / "resumed").string(),
                                   "--dump-states", "--quiet",
                                   "--load",        runs.checkpoint.string(),
                                   "--fault",       to_string(s.fault)};
  if (s.allow_lossy) argv.push_back("--allow-lossy");
  if (s.exact_master_conversion) argv.push_back("--exact-master-conversion");
  if (s.resume_dp() > 1) argv.insert(argv.end(), {"--nproc", std::to_string(s.resume_dp())});
  const auto e = run_process(argv, log.string(), o.timeout_s, /*prestarted=*/true);
  const fs::path result = dir / "resumed" / kLoadResultFile;
  const bool exited_bad_input = (e.exit_code == 2 || e.exit_code == 1) && !e.killed && fs::exists(result);
  const LoadResult load = exited_bad_input ? read_load_result(result.string()) : LoadResult{};
  if (exited_bad_input && !load.loaded) {
    r.outcome = Outcome::load_refused;
    r.load_error = load.message;
    r.first_divergence = "load refused";
    r.control_fresh_differs = true;   // nothing was loaded; the control is moot
    return false;
  }
  if (!e.ok()) throw std::runtime_error("resumed process " + e.describe() + ": " + tail_of_file(log.string(), 600));
  return true;
}

// Checkpoint bytes (stored and uncompressed) per parameter, and its disk.csv beside the results.
void measure(const CellRuns& runs, const fs::path& dir, CheckResult& r) {
  const auto size = ckpt::measure_checkpoint(runs.checkpoint.string());
  r.num_params = size.num_params;
  r.checkpoint_bytes = size.stored_bytes;
  r.raw_checkpoint_bytes = size.raw_bytes;
  const double n = static_cast<double>(r.num_params);
  r.bytes_per_param = r.num_params ? static_cast<double>(r.checkpoint_bytes) / n : 0;
  r.raw_bytes_per_param = r.num_params ? static_cast<double>(r.raw_checkpoint_bytes) / n : 0;
  const fs::path disk = fs::path(size.iter_dir) / "disk.csv";
  if (fs::exists(disk)) copy_text_file(disk.string(), (dir / "disk.csv").string());
}

// Right after load: the fingerprints (same layout only), and the dumps joined across shards.
void compare_after_load(const Scenario& s, const CellRuns& runs, const fs::path& dir, const Fingerprints& fb,
                        const Fingerprints& fr, CheckResult& r) {
  const int64_t K = s.save_at;
  if (!s.resharded()) {
    auto after = differing_keys(fb.at(K), fr.at(K));
    if (!after.empty()) r.first_divergence = "after load: " + after.front();
  }
  r.after_load =
      compare_state_dumps((runs.baseline / "state_at_save").string(), (dir / "resumed" / "state_after_load").string());
  for (const auto& d : r.after_load)
    if (!d.identical() && r.after_load_differs.empty()) r.after_load_differs = d.key;
  if (s.resharded() && !r.after_load_differs.empty()) r.first_divergence = "after load: " + r.after_load_differs;
  for (const auto& d : r.after_load) {
    auto& u = r.max_ulp_after_load[d.kind];
    u = std::max(u, d.max_ulp);
    auto it = r.bit_equal_after_load.find(d.kind);
    if (it == r.bit_equal_after_load.end() || d.bit_equal_fraction < it->second)
      r.bit_equal_after_load[d.kind] = d.bit_equal_fraction;
  }
}

MetricDiff metric_diff(int64_t i, const std::string& name, const IterMetrics& b, const IterMetrics& q) {
  MetricDiff d;
  d.iteration = i;
  d.metric = name;
  d.baseline = metric_value(b, name);
  d.resumed = metric_value(q, name);
  d.bit_equal = std::memcmp(&d.baseline, &d.resumed, sizeof(double)) == 0;
  d.abs_diff = std::fabs(d.baseline - d.resumed);
  if (std::isnan(d.abs_diff)) d.abs_diff = d.bit_equal ? 0 : std::numeric_limits<double>::infinity();
  d.rel_diff = d.baseline != 0 ? d.abs_diff / std::fabs(d.baseline) : (d.abs_diff == 0 ? 0 : INFINITY);
  // lm/aux/total losses are fp32 values; grad norm and lr are doubles.
  d.ulp = (name == "grad_norm" || name == "lr" || name == "num_zeros")
              ? ulp_distance(d.baseline, d.resumed)
              : ulp_distance(static_cast<float>(d.baseline), static_cast<float>(d.resumed));
  return d;
}

// Every metric of K+1..N and, while nothing differs yet, every fingerprint of those iterations.
void compare_iterations(const Scenario& s, const CellRuns& runs, const fs::path& dir, const Fingerprints& fc,
                        const Fingerprints& fr, CheckResult& r) {
  const int64_t K = s.save_at, N = s.cfg.train.iterations;
  const auto mb = read_metrics_csv((runs.reference / "metrics.csv").string());
  const auto mr = read_metrics_csv((dir / "resumed" / "metrics.csv").string());
  if (mr.size() != static_cast<size_t>(N - K))
    throw std::runtime_error("resumed run wrote " + std::to_string(mr.size()) + " metric rows, expected " +
                             std::to_string(N - K));
  for (int64_t i = K + 1; i <= N; ++i) {
    for (const auto& name : metric_names()) {
      const auto d = metric_diff(i, name, mb.at(static_cast<size_t>(i - 1)), mr.at(static_cast<size_t>(i - K - 1)));
      if (name == "lm_loss") r.max_abs_dloss = std::max(r.max_abs_dloss, d.abs_diff);
      if (!d.bit_equal && r.first_divergence.empty())
        r.first_divergence = "iteration " + std::to_string(i) + ": metric " + name;
      r.metric_diffs.push_back(d);
    }
    if (r.first_divergence.empty()) {
      auto keys = differing_keys(fc.at(i), fr.at(i));
      if (!keys.empty()) r.first_divergence = "iteration " + std::to_string(i) + ": " + keys.front();
    }
  }
}

// Everything the resumed run left, against the baseline (and the reference when resharded).
void compare(const Scenario& s, const CellRuns& runs, const fs::path& dir, const Fingerprints& fb, CheckResult& r) {
  const int64_t K = s.save_at;
  const auto fc = s.resharded() ? read_fingerprints((runs.reference / "fingerprints.csv").string()) : fb;
  const auto fr = read_fingerprints((dir / "resumed" / "fingerprints.csv").string());
  // Negative control 1: a fresh optimizer (before loading) differs from the saved state.
  for (const auto& k : differing_keys(fr.at(-1), fc.at(K)))
    r.control_fresh_differs = r.control_fresh_differs || is_optimizer_key(k);
  compare_after_load(s, runs, dir, fb, fr, r);
  compare_iterations(s, runs, dir, fc, fr, r);
  r.final_state =
      compare_state_dumps((runs.reference / "state_final").string(), (dir / "resumed" / "state_final").string());
  for (const auto& d : r.final_state)
    if (!d.identical() && r.first_divergence.empty()) r.first_divergence = "final state: " + d.key;
  r.outcome = r.first_divergence.empty() ? Outcome::identical : Outcome::diverged;
}

// Negative control 2: the state at K differs from the state at K-1.
void control_k(const Scenario& s, const Fingerprints& fb, CheckResult& r) {
  for (const auto& k : differing_keys(fb.at(s.save_at), fb.at(s.save_at - 1)))
    r.control_k_differs = r.control_k_differs || is_optimizer_key(k);
}

// The expectation, then the golden metrics: the verdict is final before anything is written.
void decide(const Scenario& s, const CellRuns& runs, const CheckOptions& o, CheckResult& r) {
  judge(s, r);
  if (r.outcome == Outcome::diverged && s.expect.kind == Expectation::Kind::tolerance && r.passed)
    r.outcome = Outcome::within_tolerance;
  if (o.golden_csv.empty() || r.outcome == Outcome::error) return;
  const std::string failure = golden_failure(o.golden_csv, (runs.baseline / "metrics.csv").string(), o.update_golden);
  if (!failure.empty()) {
    r.passed = false;
    r.verdict = "FAIL: " + failure;
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

void judge(const Scenario& s, CheckResult& r) {
  judge_expectation(s, r);
  // An external cell's diagnosis and first divergence, where the scenario asserts them.
  if (!r.passed || !s.trainer) return;
  if (!s.expect_diagnosis.empty() && r.diagnosis != s.expect_diagnosis) {
    r.passed = false;
    r.verdict = "FAIL: expected diagnosis " + s.expect_diagnosis + ", got " +
                (r.diagnosis.empty() ? "none" : r.diagnosis) + ": " +
                (r.explanation.empty() ? r.first_divergence : r.explanation);
  } else if (!s.expect_first_divergence.empty() &&
             r.first_divergence.find(s.expect_first_divergence) == std::string::npos) {
    r.passed = false;
    r.verdict = "FAIL: expected a first divergence naming '" + s.expect_first_divergence + "', got '" +
                r.first_divergence + "'";
  } else if (!s.expect_diagnosis.empty() && r.diagnosis != "none") {
    r.verdict += " [" + r.diagnosis + "]";
  }
}

void judge_expectation(const Scenario& s, CheckResult& r) {
  const bool controls_ok = r.control_fresh_differs && r.control_k_differs;
  const bool refused = r.outcome == Outcome::load_refused;
  auto set = [&](bool pass, const std::string& why) {
    r.passed = pass;
    r.verdict = std::string(pass ? "PASS" : "FAIL") + ": " + why;
  };
  if (r.outcome == Outcome::error) return set(false, "error: " + r.first_divergence);
  if (s.trainer && !controls_ok && r.outcome != Outcome::nondeterministic)
    return set(false, std::string("negative control failed: ") +
                          (!r.control_fresh_differs
                               ? "the resumed run logged no iteration after save_at, so nothing was compared"
                               : "every row the uninterrupted run logged is the same, so a difference could not show"));
  if (!controls_ok && !refused && !s.trainer)
    return set(false, std::string("negative control failed: ") + (!r.control_fresh_differs
                                                                      ? "a fresh optimizer equals the saved state"
                                                                      : "the state at K equals the state at K-1"));
  if (s.resharded() && !r.after_load_differs.empty() && !refused && s.expect.kind != Expectation::Kind::diverge)
    return set(false, "resharded load (" + std::to_string(s.dp_size) + " -> " + std::to_string(s.resume_dp()) +
                          " ranks) is not exact: " + r.after_load_differs + " differs from the saved state");
  const bool identical = r.first_divergence.empty() && !refused;
  const std::string found = refused ? "load refused: " + r.load_error : r.first_divergence;
  switch (s.expect.kind) {
    case Expectation::Kind::exact:
      if (identical) return set(true, "bit-exact resume");
      return set(false, "expected bit-exact resume; first divergence: " + found);
    case Expectation::Kind::refused:
      if (refused) return set(true, "load refused as expected: " + r.load_error);
      return set(false, "expected the load to be refused (" + s.expect.reason + ") but it loaded" +
                            (identical ? " and resumed bit-exact" : "; first divergence: " + found));
    case Expectation::Kind::diverge:
      if (!identical) return set(true, "difference caught as expected: " + found);
      return set(false, "expected a difference (" + s.expect.reason + ") but the resume was bit-exact");
    case Expectation::Kind::tolerance: {
      if (refused) return set(false, "load refused: " + r.load_error);
      for (const auto& m : r.metric_diffs) {
        // Only the metrics the scenario declares are judged (as Megatron's approximate mode
        // judges lm loss); the others are reported in metrics_compare.csv.
        auto it = s.expect.tolerances.find(m.metric);
        if (m.bit_equal || it == s.expect.tolerances.end()) continue;
        const double bound = it->second.atol + it->second.rtol * std::fabs(m.baseline);
        if (!(m.abs_diff <= bound))
          return set(false, "metric " + m.metric + " at iteration " + std::to_string(m.iteration) + " differs by " +
                                exact_decimal(m.abs_diff) + " > atol + rtol*|baseline| = " + exact_decimal(bound));
      }
      return set(true, identical ? "bit-exact (within any tolerance)"
                                 : "within declared tolerance; first divergence: " + r.first_divergence);
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
  fs::create_directories(dir);
}

CheckResult check_cell(const Scenario& s, const CellRuns& runs, const CheckOptions& o) {
  CheckResult r;
  r.name = s.name;
  r.expectation = to_string(s.expect.kind);
  const fs::path dir(o.work_dir);
  const auto t0 = std::chrono::steady_clock::now();
  PhaseTimes phases;   // phases.json: where this check's time went (bench_matrix)
  try {
    if (!runs.baseline_error.empty()) throw std::runtime_error(runs.baseline_error);
    bool loaded = false;
    {
      PhaseTimes::Scope t(phases, "copy_baseline");
      copy_baseline_metrics(runs, dir);
    }
    {
      PhaseTimes::Scope t(phases, "resumed_process");
      loaded = resume(s, runs, o, r);
    }
    {
      PhaseTimes::Scope t(phases, "compare");
      measure(runs, dir, r);
      const auto fb = read_fingerprints((runs.baseline / "fingerprints.csv").string());
      control_k(s, fb, r);
      if (loaded) compare(s, runs, dir, fb, r);
    }
    PhaseTimes::Scope t(phases, "cleanup");
    if (!o.keep_checkpoints)
      for (const char* d : {"state_after_load", "state_final"}) remove_tree_below(dir, fs::path("resumed") / d);
  } catch (const std::exception& e) {
    r.outcome = Outcome::error;
    r.first_divergence = e.what();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  decide(s, runs, o, r);
  try {
    {
      PhaseTimes::Scope t(phases, "write_results");
      write_cell_outputs(dir.string(), s, r);
    }
    write_text((dir / "phases.json").string(), nlohmann::json({{"seconds", phases.seconds()}}).dump(2) + "\n");
  } catch (const std::exception& e) {
    r.passed = false;
    r.verdict = std::string("FAIL: cannot write results: ") + e.what();
  }
  return r;
}

CheckResult run_check(const Scenario& s, const CheckOptions& o) {
  reset_work_dir(o.work_dir);
  if (s.trainer) return check_external_cell(s, o);
  const fs::path dir(o.work_dir);
  CheckPlan plan = plan_checks({s}, dir);
  // One cell: its baseline in <work dir>/baseline (its checkpoint in baseline/checkpoints/0), a
  // reference (resharded) in <work dir>/reference.
  plan.baselines[0].dir = dir / "baseline";
  plan.baselines[0].saves[0].root = (dir / "baseline" / "checkpoints" / "0").string();
  if (plan.baselines.size() > 1) plan.baselines[1].dir = dir / "reference";
  CellRuns runs;
  const PlannedCell& c = plan.cells.front();
  runs.baseline = plan.baselines[c.baseline].dir;
  runs.reference = plan.baselines[c.reference].dir;
  runs.checkpoint = plan.baselines[c.baseline].saves[c.save].root;
  try {
    for (const auto& b : plan.baselines) run_baseline(b, o.tool, o.timeout_s);
  } catch (const std::exception& e) {
    runs.baseline_error = e.what();
  }
  auto r = check_cell(s, runs, o);
  if (!o.keep_checkpoints)
    for (const auto& b : plan.baselines) prune_baseline(b);
  return r;
}

}   // namespace rh
