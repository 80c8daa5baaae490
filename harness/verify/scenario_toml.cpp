// Reading a scenario file's TOML values with file:line:key messages; see scenario_toml.h.
#include "harness/verify/scenario_toml.h"

#include <sstream>

#include "harness/base/input.h"
#include "harness/verify/scenario_name.h"

namespace rh::scenario_file {

std::string where(const std::string& file, const toml::node& node) {
  return file + ":" + std::to_string(node.source().begin.line);
}

void fail(const std::string& file, const toml::node& node, const std::string& key, const std::string& what) {
  throw ScenarioError(where(file, node) + ": " + key + ": " + what);
}

std::string need_string(const std::string& file, const toml::node& node, const std::string& key) {
  if (!node.is_string()) fail(file, node, key, "expected a string");
  return node.as_string()->get();
}

int64_t need_int(const std::string& file, const toml::node& node, const std::string& key) {
  if (!node.is_integer()) fail(file, node, key, "expected an integer");
  return node.as_integer()->get();
}

double need_number(const std::string& file, const toml::node& node, const std::string& key) {
  if (node.is_integer()) return static_cast<double>(node.as_integer()->get());
  if (!node.is_floating_point()) fail(file, node, key, "expected a number");
  return node.as_floating_point()->get();
}

bool need_bool(const std::string& file, const toml::node& node, const std::string& key) {
  if (!node.is_boolean()) fail(file, node, key, "expected true or false");
  return node.as_boolean()->get();
}

const toml::table& need_table(const std::string& file, const toml::node& node, const std::string& key) {
  if (!node.is_table()) fail(file, node, key, "expected a table");
  return *node.as_table();
}

std::vector<std::string> need_strings(const std::string& file, const toml::node& node, const std::string& key) {
  if (!node.is_array()) fail(file, node, key, "expected an array of strings");
  std::vector<std::string> out;
  for (const auto& e : *node.as_array()) out.push_back(need_string(file, e, key));
  return out;
}

SettingValue setting_value(const toml::node& node) {
  SettingValue setting;
  if (const auto* s = node.as_string()) {
    setting.value = s->get();
    setting.shown = quote_json(s->get());   // "text", as a config file's message quotes it
    return setting;
  }
  if (node.is_table()) {
    setting.shown = "a table";   // toml++ would print a [section] over several lines
    return setting;
  }
  if (const auto* i = node.as_integer()) setting.value = i->get();
  else if (const auto* f = node.as_floating_point()) setting.value = f->get();
  else if (const auto* b = node.as_boolean()) setting.value = b->get();
  std::ostringstream os;   // as TOML writes it: 2.0, inf, [ 1, 2 ], 1979-05-27
  node.visit([&os](const auto& x) { os << x; });
  setting.shown = quote_text(os.str());
  return setting;
}

std::string value_text(const toml::node& node) {
  if (auto s = node.as_string()) return s->get();
  std::ostringstream os;
  if (auto b = node.as_boolean()) os << (b->get() ? "true" : "false");
  else if (auto i = node.as_integer()) os << i->get();
  else if (auto f = node.as_floating_point()) os << f->get();
  return os.str();
}

}   // namespace rh::scenario_file
