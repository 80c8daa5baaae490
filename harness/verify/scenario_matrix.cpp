// Matrix expansion; see scenario_matrix.h and scenarios/README.md.
#include "harness/verify/scenario_matrix.h"

#include <map>
#include <set>

#include "harness/verify/scenario_check.h"
#include "harness/verify/scenario_settings.h"
#include "harness/verify/scenario_toml.h"

namespace rh::scenario_file {
namespace {

struct Axis {
  std::string name, key;
  std::vector<std::string> values;
  std::vector<const toml::node*> value_nodes;          // scalar values (key axes)
  std::map<std::string, const toml::table*> presets;   // preset axes
};

bool when_matches(const toml::table& when, const std::map<std::string, std::string>& cell, const std::string& file) {
  for (const auto& [k, node] : when) {
    const std::string axis(k.str());
    auto it = cell.find(axis);
    if (it == cell.end()) fail(file, node, "when." + axis, "no axis of that name");
    bool hit = false;
    if (auto values = node.as_array()) {
      for (const auto& e : *values) hit = hit || need_string(file, e, "when." + axis) == it->second;
    } else {
      hit = need_string(file, node, "when." + axis) == it->second;
    }
    if (!hit) return false;
  }
  return true;
}

// One [[matrix.axis]]: a name, values, and either a key each value sets or a preset per value.
Axis parse_axis(const toml::table& axis_table, const std::string& file, const std::string& matrix_name) {
  Axis axis;
  for (const auto& [k, node] : axis_table) {
    const std::string key(k.str());
    if (key == "name") {
      axis.name = need_string(file, node, "axis.name");
      check_name_part(file, node, "axis.name", axis.name);
    } else if (key == "key") axis.key = need_string(file, node, "axis.key");
    else if (key == "values") {
      if (!node.is_array()) fail(file, node, "axis.values", "expected an array");
      for (const auto& e : *node.as_array()) {
        axis.values.push_back(value_text(e));
        check_name_part(file, e, "axis.values", axis.values.back());
        axis.value_nodes.push_back(&e);
      }
    } else if (key == "presets") {
      for (const auto& [pk, pv] : need_table(file, node, "axis.presets"))
        axis.presets[std::string(pk.str())] = &need_table(file, pv, "axis.presets." + std::string(pk.str()));
    } else {
      fail(file, node, "axis." + key, "unknown key (expected name, key, values, presets)");
    }
  }
  if (axis.name.empty() || axis.values.empty())
    fail(file, axis_table, matrix_name, "each axis needs a name and values");
  if (axis.key.empty() == axis.presets.empty())
    fail(file, axis_table, "axis " + axis.name, "needs exactly one of key or presets");
  for (const auto& value : axis.values)
    if (!axis.key.empty() ? false : !axis.presets.count(value))
      fail(file, axis_table, "axis " + axis.name, "value '" + value + "' has no preset");
  return axis;
}

// One cell: the matrix's settings, each axis's value (its key or preset), then every
// [[matrix.expect]] whose `when` matches (marked used).
Scenario build_cell(const Scenario& matrix_base, const std::vector<Axis>& axes, const std::vector<size_t>& odometer,
                    const std::string& name, const std::map<std::string, std::string>& cell,
                    const std::vector<const toml::table*>& expects, std::vector<bool>& expect_used,
                    const std::string& file, const std::string& matrix_name, const toml::table& matrix) {
  Scenario scenario = matrix_base;
  scenario.name = name;
  for (size_t a = 0; a < axes.size(); ++a) {
    if (!axes[a].key.empty()) apply_dotted(scenario, axes[a].key, *axes[a].value_nodes[odometer[a]], file);
    else apply_settings(scenario, *axes[a].presets.at(axes[a].values[odometer[a]]), file);
  }
  for (size_t i = 0; i < expects.size(); ++i) {
    const auto* expect = expects[i];
    const auto* when = expect->get("when");
    if (!when) fail(file, *expect, matrix_name + ".expect", "needs a when table");
    if (when_matches(need_table(file, *when, "when"), cell, file)) {
      expect_used[i] = true;
      apply_settings(scenario, *expect, file, {"when"});
    }
  }
  if (scenario.trainer) finish_preset(*scenario.trainer);
  check_complete(scenario, matrix);
  return scenario;
}

}   // namespace

void expand_matrix(const toml::table& matrix, const Scenario& base, const std::string& file,
                   std::vector<Scenario>& out) {
  const auto* name_node = matrix.get("name");
  if (!name_node) fail(file, matrix, "matrix", "needs a name");
  const std::string matrix_name = need_string(file, *name_node, "matrix.name");
  check_name_part(file, *name_node, "matrix.name", matrix_name);
  std::vector<Axis> axes;
  const auto* axis_arr = matrix.get("axis");
  if (!axis_arr || !axis_arr->is_array_of_tables()) fail(file, matrix, matrix_name, "needs [[matrix.axis]] entries");
  for (const auto& axis_node : *axis_arr->as_array())
    axes.push_back(parse_axis(*axis_node.as_table(), file, matrix_name));
  Scenario matrix_base = base;
  static const std::set<std::string> structural = {"name", "axis", "exclude", "expect"};
  apply_settings(matrix_base, matrix, file, structural);
  std::vector<const toml::table*> excludes, expects;
  if (const auto* entries = matrix.get("exclude")) {
    if (!entries->is_array_of_tables())
      fail(file, *entries, matrix_name + ".exclude", "expected [[matrix.exclude]] tables");
    for (const auto& x : *entries->as_array()) excludes.push_back(x.as_table());
  }
  if (const auto* entries = matrix.get("expect")) {
    // expect = "diverge" sets every cell; [[matrix.expect]] tables set the cells they match.
    if (entries->is_string()) apply_setting(matrix_base, "expect", *entries, file);
    else if (!entries->is_array_of_tables())
      fail(file, *entries, matrix_name + ".expect", "expected a string or [[matrix.expect]] tables");
    else
      for (const auto& x : *entries->as_array()) expects.push_back(x.as_table());
  }
  // The cells are counted before any is built: a product of many axes must not exhaust memory.
  uint64_t cells = 1;
  for (const auto& axis : axes)
    if (__builtin_mul_overflow(cells, static_cast<uint64_t>(axis.values.size()), &cells) || cells > kMaxMatrixCells)
      fail(file, matrix, matrix_name, "expands to more than " + std::to_string(kMaxMatrixCells) + " cells");
  std::vector<bool> exclude_used(excludes.size()), expect_used(expects.size());
  auto check_used = [&] {
    for (size_t i = 0; i < excludes.size(); ++i)
      if (!exclude_used[i]) fail(file, *excludes[i], matrix_name + ".exclude", "matches no cell of the matrix");
    for (size_t i = 0; i < expects.size(); ++i)
      if (!expect_used[i]) fail(file, *expects[i], matrix_name + ".expect", "'when' matches no cell of the matrix");
  };
  // Odometer over the axes, first axis slowest.
  std::vector<size_t> odometer(axes.size(), 0);
  while (true) {
    std::map<std::string, std::string> cell;
    std::string name = matrix_name + "/";
    for (size_t a = 0; a < axes.size(); ++a) {
      cell[axes[a].name] = axes[a].values[odometer[a]];
      name += (a ? "," : "") + axes[a].name + "=" + axes[a].values[odometer[a]];
    }
    bool excluded = false;
    for (size_t i = 0; i < excludes.size(); ++i)
      if (when_matches(*excludes[i], cell, file)) excluded = exclude_used[i] = true;
    if (!excluded)
      out.push_back(
          build_cell(matrix_base, axes, odometer, name, cell, expects, expect_used, file, matrix_name, matrix));
    size_t a = axes.size();
    while (a > 0) {
      --a;
      if (++odometer[a] < axes[a].values.size()) break;
      odometer[a] = 0;
      if (a == 0) return check_used();
    }
    if (axes.empty()) return check_used();
  }
}

}   // namespace rh::scenario_file
