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
  for (const auto& [k, v] : when) {
    const std::string axis(k.str());
    auto it = cell.find(axis);
    if (it == cell.end()) fail(file, v, "when." + axis, "no axis of that name");
    bool hit = false;
    if (auto a = v.as_array()) {
      for (const auto& e : *a) hit = hit || need_string(file, e, "when." + axis) == it->second;
    } else {
      hit = need_string(file, v, "when." + axis) == it->second;
    }
    if (!hit) return false;
  }
  return true;
}

// One [[matrix.axis]]: a name, values, and either a key each value sets or a preset per value.
Axis parse_axis(const toml::table& at, const std::string& file, const std::string& mname) {
  Axis ax;
  for (const auto& [k, v] : at) {
    const std::string key(k.str());
    if (key == "name") {
      ax.name = need_string(file, v, "axis.name");
      check_name_part(file, v, "axis.name", ax.name);
    } else if (key == "key") ax.key = need_string(file, v, "axis.key");
    else if (key == "values") {
      if (!v.is_array()) fail(file, v, "axis.values", "expected an array");
      for (const auto& e : *v.as_array()) {
        ax.values.push_back(value_text(e));
        check_name_part(file, e, "axis.values", ax.values.back());
        ax.value_nodes.push_back(&e);
      }
    } else if (key == "presets") {
      for (const auto& [pk, pv] : need_table(file, v, "axis.presets"))
        ax.presets[std::string(pk.str())] = &need_table(file, pv, "axis.presets." + std::string(pk.str()));
    } else {
      fail(file, v, "axis." + key, "unknown key (expected name, key, values, presets)");
    }
  }
  if (ax.name.empty() || ax.values.empty()) fail(file, at, mname, "each axis needs a name and values");
  if (ax.key.empty() == ax.presets.empty()) fail(file, at, "axis " + ax.name, "needs exactly one of key or presets");
  for (const auto& v : ax.values)
    if (!ax.key.empty() ? false : !ax.presets.count(v))
      fail(file, at, "axis " + ax.name, "value '" + v + "' has no preset");
  return ax;
}

// One cell: the matrix's settings, each axis's value (its key or preset), then every
// [[matrix.expect]] whose `when` matches (marked used).
Scenario build_cell(const Scenario& mbase, const std::vector<Axis>& axes, const std::vector<size_t>& idx,
                    const std::string& name, const std::map<std::string, std::string>& cell,
                    const std::vector<const toml::table*>& expects, std::vector<bool>& expect_used,
                    const std::string& file, const std::string& mname, const toml::table& m) {
  Scenario s = mbase;
  s.name = name;
  for (size_t a = 0; a < axes.size(); ++a) {
    if (!axes[a].key.empty()) apply_dotted(s, axes[a].key, *axes[a].value_nodes[idx[a]], file);
    else apply_settings(s, *axes[a].presets.at(axes[a].values[idx[a]]), file);
  }
  for (size_t i = 0; i < expects.size(); ++i) {
    const auto* e = expects[i];
    const auto* when = e->get("when");
    if (!when) fail(file, *e, mname + ".expect", "needs a when table");
    if (when_matches(need_table(file, *when, "when"), cell, file)) {
      expect_used[i] = true;
      apply_settings(s, *e, file, {"when"});
    }
  }
  check_complete(s, m);
  return s;
}

}   // namespace

void expand_matrix(const toml::table& m, const Scenario& base, const std::string& file, std::vector<Scenario>& out) {
  const auto* name_node = m.get("name");
  if (!name_node) fail(file, m, "matrix", "needs a name");
  const std::string mname = need_string(file, *name_node, "matrix.name");
  check_name_part(file, *name_node, "matrix.name", mname);
  std::vector<Axis> axes;
  const auto* axis_arr = m.get("axis");
  if (!axis_arr || !axis_arr->is_array_of_tables()) fail(file, m, mname, "needs [[matrix.axis]] entries");
  for (const auto& an : *axis_arr->as_array()) axes.push_back(parse_axis(*an.as_table(), file, mname));
  Scenario mbase = base;
  static const std::set<std::string> structural = {"name", "axis", "exclude", "expect"};
  apply_settings(mbase, m, file, structural);
  std::vector<const toml::table*> excludes, expects;
  if (const auto* e = m.get("exclude")) {
    if (!e->is_array_of_tables()) fail(file, *e, mname + ".exclude", "expected [[matrix.exclude]] tables");
    for (const auto& x : *e->as_array()) excludes.push_back(x.as_table());
  }
  if (const auto* e = m.get("expect")) {
    // expect = "diverge" sets every cell; [[matrix.expect]] tables set the cells they match.
    if (e->is_string()) apply_setting(mbase, "expect", *e, file);
    else if (!e->is_array_of_tables())
      fail(file, *e, mname + ".expect", "expected a string or [[matrix.expect]] tables");
    else
      for (const auto& x : *e->as_array()) expects.push_back(x.as_table());
  }
  // The cells are counted before any is built: a product of many axes must not exhaust memory.
  uint64_t cells = 1;
  for (const auto& ax : axes)
    if (__builtin_mul_overflow(cells, static_cast<uint64_t>(ax.values.size()), &cells) || cells > kMaxMatrixCells)
      fail(file, m, mname, "expands to more than " + std::to_string(kMaxMatrixCells) + " cells");
  std::vector<bool> exclude_used(excludes.size()), expect_used(expects.size());
  auto check_used = [&] {
    for (size_t i = 0; i < excludes.size(); ++i)
      if (!exclude_used[i]) fail(file, *excludes[i], mname + ".exclude", "matches no cell of the matrix");
    for (size_t i = 0; i < expects.size(); ++i)
      if (!expect_used[i]) fail(file, *expects[i], mname + ".expect", "'when' matches no cell of the matrix");
  };
  // Odometer over the axes, first axis slowest.
  std::vector<size_t> idx(axes.size(), 0);
  while (true) {
    std::map<std::string, std::string> cell;
    std::string name = mname + "/";
    for (size_t a = 0; a < axes.size(); ++a) {
      cell[axes[a].name] = axes[a].values[idx[a]];
      name += (a ? "," : "") + axes[a].name + "=" + axes[a].values[idx[a]];
    }
    bool excluded = false;
    for (size_t i = 0; i < excludes.size(); ++i)
      if (when_matches(*excludes[i], cell, file)) excluded = exclude_used[i] = true;
    if (!excluded) out.push_back(build_cell(mbase, axes, idx, name, cell, expects, expect_used, file, mname, m));
    size_t a = axes.size();
    while (a > 0) {
      --a;
      if (++idx[a] < axes[a].values.size()) break;
      idx[a] = 0;
      if (a == 0) return check_used();
    }
    if (axes.empty()) return check_used();
  }
}

}   // namespace rh::scenario_file
