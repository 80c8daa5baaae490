// The settings a scenario table holds ([defaults], [[scenario]], [[matrix]], an axis preset, a
// [[matrix.expect]]): the scenario's own keys (save_at, save_policy, expect, ...), the [trainer]
// table of an external trainer, and the run-config sections model/optimizer/train, which are read
// through the run config's field table (config.h SectionSettings), so a scenario takes exactly
// the keys and Megatron names a config.json does. Each applies on top of what earlier tables set.
#pragma once
#include <set>
#include <string>

#include <toml++/toml.h>

#include "harness/verify/scenario.h"

namespace rh::scenario_file {

// Applies one setting: a scenario key and its value.
void apply_setting(Scenario& scenario, const std::string& key, const toml::node& node, const std::string& file);
// Applies every key of a table except those in `skip` (a table's structural keys: name, when).
void apply_settings(Scenario& scenario, const toml::table& table, const std::string& file,
                    const std::set<std::string>& skip = {});
// Applies an axis key: a scenario key ("save_policy"), a run-config field ("optimizer.exp_avg_dtype",
// by its key or its Megatron name), or "trainer.args" (the value split at spaces and appended).
void apply_dotted(Scenario& scenario, const std::string& dotted, const toml::node& node, const std::string& file);

}   // namespace rh::scenario_file
