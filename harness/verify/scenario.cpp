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
  if (const auto* d = root.get("defaults")) sf::apply_settings(base, sf::need_table(path, *d, "defaults"), path);
  if (const auto* sc = root.get("scenario")) {
    if (!sc->is_array_of_tables()) sf::fail(path, *sc, "scenario", "expected [[scenario]] tables");
    for (const auto& n : *sc->as_array()) {
      const auto& t = *n.as_table();
      Scenario s = base;
      const auto* nm = t.get("name");
      if (!nm) sf::fail(path, t, "scenario", "needs a name");
      s.name = sf::need_string(path, *nm, "scenario.name");
      sf::check_name_part(path, *nm, "scenario.name", s.name, /*slash_groups=*/true);
      sf::apply_settings(s, t, path, {"name"});
      sf::check_complete(s, t);
      out.push_back(std::move(s));
    }
  }
  if (const auto* mx = root.get("matrix")) {
    if (!mx->is_array_of_tables()) sf::fail(path, *mx, "matrix", "expected [[matrix]] tables");
    for (const auto& n : *mx->as_array()) sf::expand_matrix(*n.as_table(), base, path, out);
  }
  std::set<std::string> seen;
  std::map<std::string, std::string> dirs;   // directory name -> scenario name
  for (const auto& s : out) {
    if (!seen.insert(s.name).second)
      throw ScenarioError(path + ": scenario name " + quote_name(s.name) + " appears twice");
    const std::string d = safe_name(s.name);
    auto [it, fresh] = dirs.emplace(d, s.name);
    if (!fresh)
      throw ScenarioError(path + ": scenarios " + quote_name(it->second) + " and " + quote_name(s.name) +
                          " would share the directory " + quote_name(d));
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
