// The files a check and a matrix run write, from results already judged (so result.json,
// summary.csv, summary.json and junit.xml always agree): per cell result.json,
// metrics_compare.csv and state_compare.csv; per run summary.csv, summary.json, junit.xml.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "harness/verify/check.h"

namespace rh {

// The result.json object of one cell (summary.json lists these).
nlohmann::json result_json(const Scenario& s, const CheckResult& r);

// result.json, metrics_compare.csv, state_compare.csv into dir. Throws WriteError.
void write_cell_outputs(const std::string& dir, const Scenario& s, const CheckResult& r);

// junit.xml: one testcase per scenario, failure message = verdict.
void write_junit(const std::string& path, const std::string& suite, const std::vector<CheckResult>& results);

struct RunSummary {
  std::string file, filter, run_dir;
  int jobs = 1;
  double seconds = 0;
};
// summary.csv and summary.json into run_dir (scenarios and results in the same order).
void write_summary(const RunSummary& run, const std::vector<Scenario>& scenarios,
                   const std::vector<CheckResult>& results);

}  // namespace rh
