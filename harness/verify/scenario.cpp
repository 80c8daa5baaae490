// Scenario files: the file as a whole ([defaults], [[scenario]], [[matrix]]), unique names, and
// selection by name. The pieces live beside it: scenario_toml.* (values with file:line messages),
// scenario_settings.* (the keys a table sets), scenario_matrix.* (axes into cells),
// scenario_check.* (what a scenario must satisfy). The format is in scenarios/README.md.
#include "harness/verify/scenario.h"

#include <fnmatch.h>

#include <map>
#include <set>

#include <toml++/toml.h>

#include "harness/base/input.h"
#include "harness/verify/scenario_check.h"
#include "harness/verify/scenario_matrix.h"
#include "harness/verify/scenario_settings.h"
#include "harness/verify/scenario_toml.h"

namespace rh {

std::string to_string(Expectation::Kind k) {
  switch (k) {
    case Expectation::Kind::exact: return "exact";
    case Expectation::Kind::tolerance: return "tolerance";
    case Expectation::Kind::diverge: return "diverge";
    case Expectation::Kind::refused: return "refused";
    case Expectation::Kind::within_noise: return "within-noise";
  }
  return "?";
}

std::vector<Scenario> load_scenarios(const std::string& path) {
  std::string text;
  try {
    text = read_regular_file(path, kMaxScenarioFileBytes);   // no FIFO, no /dev/zero
  } catch (const InputError& e) {
    throw ScenarioError("scenario file " + std::string(e.what()));
  }
  return load_scenarios_text(text, path);
}

std::vector<Scenario> load_scenarios_text(const std::string& text, const std::string& path) {
  namespace sf = scenario_file;
  // ASCII only: toml++ 3.3.0 has undefined behaviour on some non-ASCII code points (base/input.h).
  if (const auto at = non_ascii_position(text); !at.empty()) throw ScenarioError(path + ":" + at);
  if (const auto at = toml_nesting_position(text); !at.empty()) throw ScenarioError(path + ":" + at);
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw ScenarioError(path + ":" + std::to_string(e.source().begin.line) + ": " + std::string(e.description()));
  }
  Scenario base;
  base.file = path;
  std::vector<Scenario> out;
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key != "defaults" && key != "scenario" && key != "matrix")
      sf::fail(path, v, key, "unknown top-level key (expected defaults, [[scenario]], [[matrix]])");
  }
  if (const auto* defaults = root.get("defaults"))
    sf::apply_settings(base, sf::need_table(path, *defaults, "defaults"), path);
  if (const auto* scenarios = root.get("scenario")) {
    if (!scenarios->is_array_of_tables()) sf::fail(path, *scenarios, "scenario", "expected [[scenario]] tables");
    for (const auto& entry : *scenarios->as_array()) {
      const auto& table = *entry.as_table();
      Scenario scenario = base;
      const auto* name_node = table.get("name");
      if (!name_node) sf::fail(path, table, "scenario", "needs a name");
      scenario.name = sf::need_string(path, *name_node, "scenario.name");
      sf::check_name_part(path, *name_node, "scenario.name", scenario.name, /*slash_groups=*/true);
      sf::apply_settings(scenario, table, path, {"name"});
      if (scenario.trainer) finish_preset(*scenario.trainer);
      sf::check_complete(scenario, table);
      out.push_back(std::move(scenario));
    }
  }
  if (const auto* matrices = root.get("matrix")) {
    if (!matrices->is_array_of_tables()) sf::fail(path, *matrices, "matrix", "expected [[matrix]] tables");
    for (const auto& entry : *matrices->as_array()) sf::expand_matrix(*entry.as_table(), base, path, out);
  }
  std::set<std::string> seen;
  std::map<std::string, std::string> dirs;   // directory name -> scenario name
  for (const auto& scenario : out) {
    if (!seen.insert(scenario.name).second)
      throw ScenarioError(path + ": scenario name " + quote_name(scenario.name) + " appears twice");
    const std::string dir = safe_name(scenario.name);
    auto [it, fresh] = dirs.emplace(dir, scenario.name);
    if (!fresh)
      throw ScenarioError(path + ": scenarios " + quote_name(it->second) + " and " + quote_name(scenario.name) +
                          " would share the directory " + quote_name(dir));
  }
  if (out.empty()) throw ScenarioError(path + ": no scenarios ([[scenario]] or [[matrix]])");
  return out;
}

std::vector<Scenario> select_scenarios(const std::vector<Scenario>& all, const std::string& filter) {
  if (filter.empty()) return all;
  std::vector<Scenario> out;
  for (const auto& s : all)
    if (s.name == filter) return {s};
  const bool glob = filter.find('*') != std::string::npos;
  for (const auto& s : all)
    if (glob ? fnmatch(filter.c_str(), s.name.c_str(), 0) == 0 : s.name.find(filter) != std::string::npos)
      out.push_back(s);
  return out;
}

}   // namespace rh
