// Baselines: the uninterrupted runs a resume check compares with. Cells of a matrix that differ
// only in what happens at save or load (save policy, overrides, compression, faults, the resumed
// data-parallel size) train the same thing up to N, so they share one baseline: it trains once and
// writes at K every checkpoint its cells resume from (one per distinct save policy), one state dump
// at K, one set of fingerprints and metrics, and the final state. A resharded cell also needs the
// uninterrupted run at its resumed size (its reference): the baseline of that size when the plan
// has one, else a baseline that saves nothing.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "harness/train/job.h"
#include "harness/verify/scenario.h"

namespace rh {

struct Baseline {
  std::string id;              // "b07": its directory under <run dir>/baselines
  std::filesystem::path dir;   // metrics.csv, fingerprints.csv, state_at_save/, state_final/, checkpoints/
  RunConfig cfg;
  int64_t dp_size = 1;
  int64_t save_at = -1;            // K; -1 for a reference that saves nothing
  std::vector<SaveTarget> saves;   // one per distinct save policy of its cells
};

// One cell of the plan: the scenario, its baseline and the checkpoint of it (index into
// saves), and its reference (the baseline itself unless resharded).
struct PlannedCell {
  size_t scenario = 0, baseline = 0, save = 0, reference = 0;
};

struct CheckPlan {
  std::vector<Baseline> baselines;
  std::vector<PlannedCell> cells;   // in scenario order
};

// Groups scenarios by (run config, data-parallel size, K) and their save policies; baselines are
// numbered in the order their first cell appears. Deterministic.
CheckPlan plan_checks(const std::vector<Scenario>& scenarios, const std::filesystem::path& baselines_dir);

// Trains the baseline (in this process at one rank, else `tool train --nproc M --save-plan FILE`
// with its output in dir/train.log), saving every checkpoint of its plan at K. Removes and
// recreates b.dir first. Throws std::runtime_error naming the baseline and the log's tail.
void run_baseline(const Baseline& b, const std::string& tool, double timeout_s);

// Removes what only the checks needed (checkpoints, state dumps), keeping metrics and fingerprints.
void prune_baseline(const Baseline& b);

}   // namespace rh
