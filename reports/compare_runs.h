// `report --compare RUN_A RUN_B`: what changed between two matrix runs (verdicts, first
// divergences, checkpoint bytes, scenarios added or removed), as Markdown for a CI job to post
// on a merge request. Reads only each run's summary.csv.
#pragma once
#include <ostream>
#include <string>

namespace rh::report {

// Writes the Markdown to out, or with json one JSON object with the same content (keys in
// docs/running.md, "report --compare --json"). Returns 0, or 1 when a scenario present in both
// runs passed in A and fails in B (a regression). Throws ReportError for a missing or malformed
// summary.csv.
int compare_runs(const std::string& run_a, const std::string& run_b, std::ostream& out, bool json = false);

}   // namespace rh::report
