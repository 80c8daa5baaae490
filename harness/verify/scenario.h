// Scenarios: what one resume check runs and what it must find. Scenario files are TOML (data, not
// code); a file holds named [[scenario]] entries and [[matrix]] blocks that expand named axes as a
// cartesian product, with excludes and per-cell expectations. Every expanded scenario has a
// canonical name built from its axis values ("states/exp_avg=bf16,master=fp32,policy=native"),
// which `check` accepts, so a failing line is its own reproduction command.
// The file format is documented in scenarios/README.md.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/checkpoint/checkpoint.h"
#include "harness/train/config.h"
#include "harness/train/job.h"
#include "harness/verify/external.h"
#include "harness/verify/scenario_name.h"

namespace rh {

struct Tolerance {
  double atol = 0.0;
  double rtol = 0.0;
};

struct Expectation {
  // refused: the resumed run's load must be refused (exit 2, load_result.json says so).
  enum class Kind { exact, tolerance, diverge, refused, within_noise } kind = Kind::exact;
  std::map<std::string, Tolerance> tolerances;   // metric name -> tolerance (kind == tolerance)
  std::string reason;                            // required unless exact
};
std::string to_string(Expectation::Kind k);

struct Scenario {
  std::string name;   // canonical name
  std::string file;   // the file it came from
  std::string description;
  RunConfig cfg;          // cfg.train.iterations is N
  int64_t save_at = 10;   // K
  ckpt::SavePolicy policy;
  Fault fault = Fault::none;
  int64_t dp_size = 1;          // data-parallel ranks of the run that saves
  int64_t resume_dp_size = 0;   // ranks of the resumed run (0: dp_size); differing = resharding
  int64_t resume_dp() const { return resume_dp_size > 0 ? resume_dp_size : dp_size; }
  bool resharded() const { return resume_dp() != dp_size; }
  bool allow_lossy = false;               // the load accepts lossy conversions (policies that lose bits)
  bool exact_master_conversion = false;   // the load converts master modes exactly (not upstream)
  // The resumed run's --ddp-bucket-size (-1: the saved run's). Another bucket layout is refused by
  // a dp_reshardable load as upstream (load_layout.cpp) unless exact_rebucket (not upstream).
  int64_t resume_ddp_bucket_size = -1;
  bool exact_rebucket = false;
  Expectation expect;
  // An external trainer's commands instead of the built-in model (external.h); cfg then only
  // gives N (cfg.train.iterations, set by trainer.iterations).
  std::optional<ExternalTrainer> trainer;
  std::string expect_diagnosis;          // the diagnosis code the check must reach ("" = any)
  std::string expect_first_divergence;   // text the first divergence must contain ("" = any)
};

// Parses and expands a scenario file (a regular file of at most kMaxScenarioFileBytes; a matrix
// of at most kMaxMatrixCells cells). Throws ScenarioError ("file:line: key: what was expected").
constexpr uint64_t kMaxScenarioFileBytes = 4u << 20;
constexpr uint64_t kMaxMatrixCells = 4096;
std::vector<Scenario> load_scenarios(const std::string& path);
// The same for a file's text already read (`path` is only named in messages).
std::vector<Scenario> load_scenarios_text(const std::string& text, const std::string& path);

// Scenarios whose canonical name equals `filter`, or contains it when no name equals it exactly;
// a filter with '*' is matched as a glob. Empty filter selects all.
std::vector<Scenario> select_scenarios(const std::vector<Scenario>& all, const std::string& filter);

}   // namespace rh
