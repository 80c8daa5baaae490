// The resume check of one scenario cell. Its baseline (baseline.h: 0..N uninterrupted, saving the
// cell's checkpoint at K on the way; shared by the cells that differ only at save or load) has run;
// the check starts a new process that loads that checkpoint and trains K+1..N (it reports the load
// in load_result.json), then compares every state right after load with what was saved, every
// metric of K+1..N bit for bit, the final states key by key, checks the negative controls, names
// the first divergence, and judges the expectation (and the golden metrics, when asked) before it
// writes anything. Resharded cells (resume_dp_size != dp_size) are compared with their reference,
// the uninterrupted run at the resumed size (the reduction order differs between sizes); their
// state right after load, joined across shards, must equal the saved state bit for bit whatever the
// expectation.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "harness/verify/compare.h"
#include "harness/verify/outcome.h"
#include "harness/verify/scenario.h"

namespace rh {

struct MetricDiff {
  int64_t iteration = 0;
  std::string metric;
  double baseline = 0, resumed = 0;
  double abs_diff = 0, rel_diff = 0;
  uint64_t ulp = 0;
  bool bit_equal = false;
};

struct CheckResult {
  std::string name;
  std::string expectation;             // exact | tolerance | diverge
  bool passed = false;
  std::string verdict;                 // "PASS: ..." / "FAIL: ..." one line
  Outcome outcome = Outcome::error;
  std::string first_divergence;        // "" when none: "iteration 11 metric lm_loss" / "after load: key"
  std::string load_error;              // load_result.json's message when the resumed run refused the load
  double max_abs_dloss = 0;            // max |d lm_loss| over K+1..N
  std::map<std::string, uint64_t> max_ulp_after_load;   // per key kind
  std::map<std::string, double> bit_equal_after_load;   // per key kind: min fraction
  bool control_fresh_differs = false;  // negative control: fresh optimizer != saved state
  bool control_k_differs = false;      // negative control: state at K != state at K-1
  uint64_t checkpoint_bytes = 0;
  double bytes_per_param = 0;
  // The same checkpoint uncompressed (== the above unless compress = "zstd").
  uint64_t raw_checkpoint_bytes = 0;
  double raw_bytes_per_param = 0;
  int64_t num_params = 0;
  double seconds = 0;
  std::vector<MetricDiff> metric_diffs;
  std::vector<TensorDiff> after_load, final_state;
  std::string after_load_differs;      // first key whose state after load differs from the saved one
  // External cells (external_check.h): the diagnosis code (outcome.h) and the diagnosis in words,
  // notes on what the comparison could see (a metric's printed resolution), and the seconds the
  // trainer's own runs took (the rest of `seconds` is the harness's overhead).
  std::string diagnosis, explanation;
  std::vector<std::string> notes;
  double trainer_seconds = 0;
  bool bad_input = false;   // an external trainer's output or checkpoint could not be read (exit 2)
};

struct CheckOptions {
  std::string tool;              // path of the resume-harness executable to run children with
  std::string work_dir;          // per-scenario directory (removed and created)
  bool keep_checkpoints = false;
  double timeout_s = 900;        // per child process
  std::string golden_csv;        // if set: the baseline's metrics must equal this file bit for bit
  bool update_golden = false;    // write golden_csv from the baseline instead
};

// What the shared runs left for one cell: its baseline, the checkpoint it resumes from, its
// reference (== baseline unless resharded). baseline_error: the baseline or reference failed.
struct CellRuns {
  std::filesystem::path baseline, checkpoint, reference;
  std::string baseline_error;
};

// Removes and creates a cell's work directory; refuses one that names "", ".", ".." or a root.
void reset_work_dir(const std::string& work_dir);

// The check of one cell whose runs are done (never throws for scenario outcomes; a child that
// crashes is an "error" outcome). Writes result.json, metrics_compare.csv, state_compare.csv,
// disk.csv and baseline/metrics.csv (a copy, for the report) into opts.work_dir, which must exist.
CheckResult check_cell(const Scenario& s, const CellRuns& runs, const CheckOptions& opts);

// One scenario on its own: resets work_dir, runs its baseline (and reference) there, then
// check_cell.
CheckResult run_check(const Scenario& s, const CheckOptions& opts);

// Applies the expectation to a filled result (sets passed, verdict), then an external cell's
// expect_diagnosis / expect_first_divergence. Exposed for tests.
void judge(const Scenario& s, CheckResult& r);
void judge_expectation(const Scenario& s, CheckResult& r);   // the expectation alone

}  // namespace rh
