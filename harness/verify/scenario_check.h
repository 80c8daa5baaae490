// What a scenario file must say to be run: a complete scenario (an expectation with its reason,
// save_at inside the run, data-parallel sizes that divide the batch, a valid run config, an
// external trainer's rules), and names that are safe as directory names. Each failure is a
// ScenarioError naming the file, the line and the scenario or key.
#pragma once
#include <string>

#include <toml++/toml.h>

#include "harness/verify/scenario.h"

namespace rh::scenario_file {

// Checks a scenario once all its tables are applied; `at` is the table that defined it (its line).
void check_complete(const Scenario& s, const toml::node& at);

// A name the file gives (scenario.name, matrix.name, an axis name or value): it becomes part of a
// directory name, so no control characters, no '\\', no '.', '..' or empty names. '/' groups
// scenario names ("approx/fp32-moments-saved-bf16"; safe_name maps it to "__"), so a scenario
// name may hold it between non-empty segments other than '.' and '..' (slash_groups); matrix,
// axis names and values may not (the canonical name "matrix/axis=value,..." is built from them).
void check_name_part(const std::string& file, const toml::node& n, const std::string& key, const std::string& name,
                     bool slash_groups = false);

}   // namespace rh::scenario_file
