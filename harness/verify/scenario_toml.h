// Reading a scenario file's TOML values: every read that can fail names the file, the line toml++
// gives for the value and the key ("scenarios/x.toml:12: save_at: expected an integer"), as a
// ScenarioError. The pieces of the scenario reader (settings, checks, matrices) share these.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "harness/train/config.h"

namespace rh::scenario_file {

// "file:line" of a value.
std::string where(const std::string& file, const toml::node& node);
// Throws ScenarioError "file:line: key: what".
[[noreturn]] void fail(const std::string& file, const toml::node& node, const std::string& key,
                       const std::string& what);

std::string need_string(const std::string& file, const toml::node& node, const std::string& key);
int64_t need_int(const std::string& file, const toml::node& node, const std::string& key);
double need_number(const std::string& file, const toml::node& node, const std::string& key);   // integer or float
bool need_bool(const std::string& file, const toml::node& node, const std::string& key);
const toml::table& need_table(const std::string& file, const toml::node& node, const std::string& key);
std::vector<std::string> need_strings(const std::string& file, const toml::node& node, const std::string& key);

// A value as the run config's field table reads it (config.h SettingValue), quoted as TOML
// writes it.
SettingValue setting_value(const toml::node& node);

// An axis value as text for a canonical name: a string as is, a number or boolean as TOML writes
// it ("3", "true").
std::string value_text(const toml::node& node);

}   // namespace rh::scenario_file
