// What the resume check of one cell found (check.h fills it): the verdict and outcome, the first
// divergence, the per-metric and per-tensor differences, sizes and times. A value type on its own,
// so the writers and the matrix read results without the check's machinery.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "harness/verify/compare.h"
#include "harness/verify/outcome.h"

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
  std::string expectation;   // exact | tolerance | diverge
  bool passed = false;
  std::string verdict;   // "PASS: ..." / "FAIL: ..." one line
  Outcome outcome = Outcome::error;
  std::string first_divergence;   // "" when none: "iteration 11 metric lm_loss" / "after load: key"
  std::string load_error;         // load_result.json's message when the resumed run refused the load
  double max_abs_dloss = 0;       // max |d lm_loss| over K+1..N
  std::map<std::string, uint64_t> max_ulp_after_load;   // per key kind
  std::map<std::string, double> bit_equal_after_load;   // per key kind: min fraction
  bool control_fresh_differs = false;                   // negative control: fresh optimizer != saved state
  bool control_k_differs = false;                       // negative control: state at K != state at K-1
  uint64_t checkpoint_bytes = 0;
  double bytes_per_param = 0;
  // The same checkpoint uncompressed (== the above unless compress = "zstd").
  uint64_t raw_checkpoint_bytes = 0;
  double raw_bytes_per_param = 0;
  int64_t num_params = 0;
  double seconds = 0;
  std::vector<MetricDiff> metric_diffs;
  std::vector<TensorDiff> after_load, final_state;
  std::string after_load_differs;   // first key whose state after load differs from the saved one
  // External cells (external_check.h): the diagnosis code (diagnosis.h) and the diagnosis in words,
  // notes on what the comparison could see (a metric's printed resolution), and the seconds the
  // trainer's own runs took (the rest of `seconds` is the harness's overhead).
  std::string diagnosis, explanation;
  std::vector<std::string> notes;
  double trainer_seconds = 0;
  // Saved keys that differed only by what the harness varied between the runs (key -> what they
  // were matched as, external/run_varied.h) and keys left out by trainer.checkpoint.ignore (key ->
  // its reason); the other checkpoint comparisons by phase ("determinism", "round_trip"), every key.
  std::vector<std::pair<std::string, std::string>> harness_varied, ignored;
  std::vector<std::pair<std::string, std::vector<TensorDiff>>> other_state;
  bool bad_input = false;   // an external trainer's output or checkpoint could not be read (exit 2)
  bool disk_failed = false;   // the disk failed under an external cell (base/text.h DiskError; exit 4)
};

}   // namespace rh
