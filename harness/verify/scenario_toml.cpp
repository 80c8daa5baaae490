// Reading a scenario file's TOML values with file:line:key messages; see scenario_toml.h.
#include "harness/verify/scenario_toml.h"

#include <sstream>

#include "harness/base/input.h"
#include "harness/verify/scenario_name.h"

namespace rh::scenario_file {

std::string where(const std::string& file, const toml::node& n) {
  return file + ":" + std::to_string(n.source().begin.line);
}

void fail(const std::string& file, const toml::node& n, const std::string& key, const std::string& what) {
  throw ScenarioError(where(file, n) + ": " + key + ": " + what);
}

std::string need_string(const std::string& file, const toml::node& n, const std::string& key) {
  if (!n.is_string()) fail(file, n, key, "expected a string");
  return n.as_string()->get();
}

int64_t need_int(const std::string& file, const toml::node& n, const std::string& key) {
  if (!n.is_integer()) fail(file, n, key, "expected an integer");
  return n.as_integer()->get();
}

double need_number(const std::string& file, const toml::node& n, const std::string& key) {
  if (n.is_integer()) return static_cast<double>(n.as_integer()->get());
  if (!n.is_floating_point()) fail(file, n, key, "expected a number");
  return n.as_floating_point()->get();
}

bool need_bool(const std::string& file, const toml::node& n, const std::string& key) {
  if (!n.is_boolean()) fail(file, n, key, "expected true or false");
  return n.as_boolean()->get();
}

const toml::table& need_table(const std::string& file, const toml::node& n, const std::string& key) {
  if (!n.is_table()) fail(file, n, key, "expected a table");
  return *n.as_table();
}

std::vector<std::string> need_strings(const std::string& file, const toml::node& n, const std::string& key) {
  if (!n.is_array()) fail(file, n, key, "expected an array of strings");
  std::vector<std::string> out;
  for (const auto& e : *n.as_array()) out.push_back(need_string(file, e, key));
  return out;
}

SettingValue setting_value(const toml::node& n) {
  SettingValue v;
  if (const auto* s = n.as_string()) {
    v.value = s->get();
    v.shown = quote_json(s->get());   // "text", as a config file's message quotes it
    return v;
  }
  if (n.is_table()) {
    v.shown = "a table";   // toml++ would print a [section] over several lines
    return v;
  }
  if (const auto* i = n.as_integer()) v.value = i->get();
  else if (const auto* f = n.as_floating_point()) v.value = f->get();
  else if (const auto* b = n.as_boolean()) v.value = b->get();
  std::ostringstream os;   // as TOML writes it: 2.0, inf, [ 1, 2 ], 1979-05-27
  n.visit([&os](const auto& x) { os << x; });
  v.shown = quote_text(os.str());
  return v;
}

std::string value_text(const toml::node& n) {
  if (auto s = n.as_string()) return s->get();
  std::ostringstream os;
  if (auto b = n.as_boolean()) os << (b->get() ? "true" : "false");
  else if (auto i = n.as_integer()) os << i->get();
  else if (auto f = n.as_floating_point()) os << f->get();
  return os.str();
}

}   // namespace rh::scenario_file
