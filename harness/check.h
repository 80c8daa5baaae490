// The resume check of one scenario: the baseline trains 0..N uninterrupted (in this process when
// it has one rank, else as `train --nproc M`),
// saving the scenario's checkpoint at K on the way (a save only reads state, and the fingerprints
// before and after it prove that); a new process loads that checkpoint and trains K+1..N. Then every state
// right after load is compared with what was saved, every metric of K+1..N bit for bit, the final
// states key by key, negative controls are checked, and the first divergence is named.
// Resharded scenarios (resume_dp_size != dp_size) also run a reference: 0..N uninterrupted at the
// resumed size. The resumed run's metrics and states are compared with the reference (reduction
// order differs between sizes), and its state right after load with the saved state, joined
// across shards, which must be bit for bit equal whatever the expectation.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "harness/compare.h"
#include "harness/scenario.h"

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
  std::string outcome;                 // identical | within-tolerance | diverged | load-refused | error
  std::string first_divergence;        // "" when none: "iteration 11 metric lm_loss" / "after load: key"
  std::string load_error;              // the resumed process's error when it refused the load
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
};

struct CheckOptions {
  std::string tool;              // path of the resume-harness executable to run children with
  std::string work_dir;          // per-scenario directory (created)
  bool keep_checkpoints = false;
  double timeout_s = 900;        // per child process
};

// Runs the scenario (never throws for scenario outcomes; a child that crashes is an "error"
// outcome) and writes result.json, metrics_compare.csv, state_compare.csv, disk.csv into
// work_dir.
CheckResult run_check(const Scenario& s, const CheckOptions& opts);

// Applies the expectation to a filled result (sets passed, verdict). Exposed for tests.
void judge(const Scenario& s, CheckResult& r);

}  // namespace rh
