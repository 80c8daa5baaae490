// The files a check and a matrix run write, from results already judged (so result.json,
// summary.csv, summary.json and junit.xml always agree): per cell result.json,
// metrics_compare.csv and state_compare.csv; per run summary.csv, summary.json, junit.xml.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "harness/verify/check_result.h"
#include "harness/verify/scenario.h"

namespace rh {

// The result.json object of one cell (summary.json lists these).
nlohmann::json result_json(const Scenario& scenario, const CheckResult& result);

// result.json, metrics_compare.csv, state_compare.csv into dir (opened from its run directory
// without following links: check.h open_work_dir). Throws WriteError, or SymlinkRefused for a link.
void write_cell_outputs(const std::string& dir, const Scenario& scenario, const CheckResult& result);

// junit.xml: one testcase per scenario, failure message = verdict.
void write_junit(const std::string& path, const std::string& suite, const std::vector<CheckResult>& results);

struct RunSummary {
  std::string file, filter, run_dir;
  int jobs = 1;
  double seconds = 0;
  std::string file_xxh3;                   // XXH3-64 of the scenario file's bytes, 16 hex digits
  int shard_index = 0, shard_count = 0;    // a --shard run (0: not sharded)
  std::vector<std::string> matrix_cells;   // a shard's whole selection, in order (merge.h checks it)
};
// summary.csv and summary.json into run_dir (scenarios and results in the same order; either may
// be empty: a shard with no cells).
// summary.json: file, file_xxh3, filter, scenarios (result.json objects + dir), failed, total,
// seconds, environment, and for a shard "shard": {index, count, cells}.
void write_summary(const RunSummary& run, const std::vector<Scenario>& scenarios,
                   const std::vector<CheckResult>& results);

}   // namespace rh
