// The settings of a scenario table, one table of keys; see scenario_settings.h.
#include "harness/verify/scenario_settings.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <vector>

#include "harness/base/suggest.h"
#include "harness/checkpoint/save_policy.h"
#include "harness/train/metrics.h"
#include "harness/verify/diagnosis.h"
#include "harness/verify/scenario_toml.h"

namespace rh::scenario_file {
namespace {

// A model, optimizer or train table, key by key through the run config's field table (each key's
// own line in its messages; a setting given under its key and its Megatron name is refused).
void apply_config_section(RunConfig& cfg, const std::string& section, const toml::table& table,
                          const std::string& file) {
  try {
    SectionSettings settings(cfg, section, where(file, table));
    for (const auto& [k, v] : table) settings.set(std::string(k.str()), setting_value(v), where(file, v));
  } catch (const ScenarioError&) {
    throw;
  } catch (const std::invalid_argument& e) {   // the field table's messages start with file:line
    throw ScenarioError(e.what());
  }
}

// checkpoint.ignore = [{ key = "run_info/*", reason = "wall-clock time and host name" }, ...]:
// appends (a matrix or an axis value can add keys); every entry needs both, a reason not blank.
void apply_checkpoint_ignore(ExternalTrainer& trainer, const toml::node& node, const std::string& file,
                             const std::string& full) {
  const toml::array* entries = node.as_array();
  if (!entries) fail(file, node, full, "expected an array of { key = \"<glob>\", reason = \"...\" } tables");
  for (size_t i = 0; i < entries->size(); ++i) {
    const std::string entry_key = full + "[" + std::to_string(i) + "]";
    ExternalTrainer::Checkpoint::Ignore rule;
    for (const auto& [ik, iv] : need_table(file, (*entries)[i], entry_key)) {
      const std::string field(ik.str());
      if (field == "key") rule.key = need_string(file, iv, entry_key + ".key");
      else if (field == "reason") rule.reason = need_string(file, iv, entry_key + ".reason");
      else fail(file, iv, entry_key + "." + field, "unknown key (expected key, reason)");
    }
    if (rule.key.empty()) fail(file, (*entries)[i], entry_key + ".key", "expected a non-empty key glob");
    if (rule.reason.find_first_not_of(" \t") == std::string::npos)
      fail(file, (*entries)[i], entry_key + ".reason", "expected the reason this key may differ between runs");
    trainer.checkpoint.ignore.push_back(std::move(rule));
  }
}

// An unknown key of a table: the keys it takes, and the closest one when a key looks mistyped.
[[noreturn]] void unknown_key(const std::string& file, const toml::node& node, const std::string& full,
                              const std::string& key, const std::vector<std::string>& names) {
  std::string list;
  for (const auto& name : names) list += (list.empty() ? "" : ", ") + name;
  fail(file, node, full, "unknown key (expected " + list + ")" + did_you_mean(key, names));
}

// Merges a [trainer] table into the scenario's external trainer (creating it): scalars replace,
// `args` appends (so [defaults], a matrix and each axis value can add arguments).
void apply_trainer(Scenario& scenario, const toml::table& table, const std::string& file) {
  if (!scenario.trainer) {
    scenario.trainer.emplace();
    scenario.trainer->scenario_dir = std::filesystem::path(file).parent_path().string();
  }
  ExternalTrainer& trainer = *scenario.trainer;
  if (const toml::node* preset = table.get("preset")) {   // first: this table's other keys override it
    try {
      apply_preset_defaults(trainer, need_string(file, *preset, "trainer.preset"));
    } catch (const std::invalid_argument& e) {
      fail(file, *preset, "trainer.preset", std::string(e.what()).substr(std::string("trainer.preset: ").size()));
    }
  }
  for (const auto& [k, node] : table) {
    const std::string key(k.str()), full = "trainer." + key;
    if (key == "preset") continue;
    if (key == "command") trainer.command = need_strings(file, node, full);
    else if (key == "resume_command") trainer.resume_command = need_strings(file, node, full);
    else if (key == "args")
      for (auto& a : need_strings(file, node, full)) trainer.args.push_back(std::move(a));
    else if (key == "cwd") trainer.cwd = need_string(file, node, full);
    else if (key == "env") {
      for (const auto& [ek, ev] : need_table(file, node, full)) {
        const std::string name(ek.str());
        if (name.empty() || name.find('=') != std::string::npos)
          fail(file, ev, full + "." + name, "not an environment variable name");
        trainer.env.emplace_back(name, need_string(file, ev, full + "." + name));
      }
    } else if (key == "timeout_s") trainer.timeout_s = need_number(file, node, full);
    else if (key == "output_cap_mb") {
      const int64_t cap_mb = need_int(file, node, full);
      if (cap_mb < 1 || cap_mb > 65536) fail(file, node, full, "expected 1 to 65536");
      trainer.output_cap_bytes = static_cast<uint64_t>(cap_mb) << 20;
    } else if (key == "determinism_runs")
      trainer.determinism_runs = static_cast<int>(std::clamp<int64_t>(need_int(file, node, full), -1, 1000));
    else if (key == "round_trip") trainer.round_trip = need_bool(file, node, full);
    else if (key == "probe") {
      if (node.is_string() && node.value<std::string>() == std::string("auto")) trainer.probe = trainer.probe_auto = true;
      else if (node.is_boolean()) trainer.probe = need_bool(file, node, full), trainer.probe_auto = false;
      else fail(file, node, full, "expected true, false or \"auto\"");
    }
    else if (key == "noise") trainer.noise = need_bool(file, node, full);
    else if (key == "noise_factor") {
      trainer.noise_factor = need_number(file, node, full);
      if (!(trainer.noise_factor >= 1 && trainer.noise_factor <= 1000)) fail(file, node, full, "expected 1 to 1000");
    }
    else if (key == "iterations") {
      const int64_t iterations = need_int(file, node, full);
      if (iterations < 2 || iterations > 1000000) fail(file, node, full, "expected 2 to 1000000");
      scenario.cfg.train.iterations = iterations;
    } else if (key == "metrics") {
      for (const auto& [mk, mv] : need_table(file, node, full)) {
        const std::string m(mk.str()), mfull = full + "." + m;
        if (m == "stdout_regex")
          trainer.metrics.stdout_regex = need_string(file, mv, mfull), trainer.metrics.file.clear();
        else if (m == "file") trainer.metrics.file = need_string(file, mv, mfull), trainer.metrics.stdout_regex.clear();
        else if (m == "format") trainer.metrics.format = need_string(file, mv, mfull);
        else unknown_key(file, mv, mfull, m, {"stdout_regex", "file", "format"});
      }
    } else if (key == "checkpoint") {
      for (const auto& [ck, cv] : need_table(file, node, full)) {
        const std::string c(ck.str()), cfull = full + "." + c;
        if (c == "path") trainer.checkpoint.path = need_string(file, cv, cfull);
        else if (c == "format") trainer.checkpoint.format = need_string(file, cv, cfull);
        else if (c == "trust_pickle") trainer.checkpoint.trust_pickle = need_bool(file, cv, cfull);
        else if (c == "ignore") apply_checkpoint_ignore(trainer, cv, file, cfull);
        else unknown_key(file, cv, cfull, c, {"path", "format", "trust_pickle", "ignore"});
      }
    } else {
      unknown_key(file, node, full, key,
                  {"command", "resume_command", "args", "cwd", "env", "timeout_s", "output_cap_mb", "determinism_runs",
                   "round_trip", "probe", "noise", "noise_factor", "iterations", "metrics", "checkpoint", "preset"});
    }
  }
}

// tolerance = { lm_loss = { atol = 1e-3, rtol = 0.05 } }: replaces the scenario's tolerances.
void apply_tolerance(Scenario& scenario, const std::string& key, const toml::node& node, const std::string& file) {
  scenario.expect.tolerances.clear();
  for (const auto& [k, val] : need_table(file, node, key)) {
    const std::string metric(k.str());
    bool known = false;
    for (const auto& m : metric_names()) known = known || m == metric;
    if (!known)
      fail(file, val, key + "." + metric,
           "not a metric name (lm_loss, aux_loss, total_loss, grad_norm, lr, num_zeros)");
    Tolerance tol;
    for (const auto& [tk, tv] : need_table(file, val, key + "." + metric)) {
      const std::string full = key + "." + metric + "." + std::string(tk.str());
      double* dst = tk.str() == "atol" ? &tol.atol : tk.str() == "rtol" ? &tol.rtol : nullptr;
      if (!dst) fail(file, tv, full, "expected atol or rtol");
      *dst = need_number(file, tv, full);
      // inf would let any difference (a deliberate fault) pass; NaN compares false.
      if (!std::isfinite(*dst) || *dst < 0) fail(file, tv, full, "expected a finite number >= 0");
    }
    scenario.expect.tolerances[metric] = tol;
  }
}

Expectation::Kind parse_expectation(const std::string& file, const toml::node& node, const std::string& key) {
  const std::string name = need_string(file, node, key);
  for (auto k :
       {Expectation::Kind::exact, Expectation::Kind::tolerance, Expectation::Kind::diverge, Expectation::Kind::refused,
        Expectation::Kind::within_noise})
    if (name == to_string(k)) return k;
  fail(file, node, key, "expected exact, tolerance, diverge, refused or within-noise, got '" + name + "'");
}

// The scenario's keys, each once: the order is the one the unknown-key message lists.
struct ScenarioKey {
  const char* key;
  void (*apply)(Scenario& scenario, const std::string& key, const toml::node& node, const std::string& file);
};

void apply_config_key(Scenario& scenario, const std::string& key, const toml::node& node, const std::string& file) {
  apply_config_section(scenario.cfg, key, need_table(file, node, key), file);
}

const std::vector<ScenarioKey>& scenario_keys() {
  using N = const toml::node&;
  using F = const std::string&;
  static const std::vector<ScenarioKey> keys = {
      {"model", apply_config_key},
      {"optimizer", apply_config_key},
      {"train", apply_config_key},
      {"description", [](Scenario& s, F key, N v, F file) { s.description = need_string(file, v, key); }},
      {"save_at", [](Scenario& s, F key, N v, F file) { s.save_at = need_int(file, v, key); }},
      // The save policy's text forms are checkpoint/save_policy.h's.
      {"save_policy",
       [](Scenario& s, F key, N v, F file) { s.policy.kind = ckpt::parse_save_policy(need_string(file, v, key)); }},
      {"compress",
       [](Scenario& s, F key, N v, F file) { s.policy.compress = ckpt::parse_compression(need_string(file, v, key)); }},
      {"save_overrides",
       [](Scenario& s, F key, N v, F file) {
         for (const auto& [k, val] : need_table(file, v, key)) {
           const std::string sub(k.str()), dtype = need_string(file, val, key + "." + sub);
           try {   // the key and dtype checks are the save policy's own (checkpoint/save_policy.h)
             ckpt::set_override(s.policy, sub, dtype, key + "." + sub);
           } catch (const std::invalid_argument& e) {
             throw ScenarioError(where(file, val) + ": " + e.what());
           }
         }
       }},
      {"fault", [](Scenario& s, F key, N v, F file) { s.fault = parse_fault(need_string(file, v, key)); }},
      {"dp_size", [](Scenario& s, F key, N v, F file) { s.dp_size = need_int(file, v, key); }},
      {"resume_dp_size", [](Scenario& s, F key, N v, F file) { s.resume_dp_size = need_int(file, v, key); }},
      {"allow_lossy", [](Scenario& s, F key, N v, F file) { s.allow_lossy = need_bool(file, v, key); }},
      {"resume_ddp_bucket_size",
       [](Scenario& s, F key, N v, F file) {
         s.resume_ddp_bucket_size = need_int(file, v, key);
         if (s.resume_ddp_bucket_size < 0) fail(file, v, key, "expected an element count >= 0 (0: one bucket)");
       }},
      {"exact_rebucket", [](Scenario& s, F key, N v, F file) { s.exact_rebucket = need_bool(file, v, key); }},
      {"exact_master_conversion",
       [](Scenario& s, F key, N v, F file) { s.exact_master_conversion = need_bool(file, v, key); }},
      {"expect", [](Scenario& s, F key, N v, F file) { s.expect.kind = parse_expectation(file, v, key); }},
      {"reason", [](Scenario& s, F key, N v, F file) { s.expect.reason = need_string(file, v, key); }},
      {"tolerance", apply_tolerance},
      {"trainer", [](Scenario& s, F key, N v, F file) { apply_trainer(s, need_table(file, v, key), file); }},
      {"expect_diagnosis",
       [](Scenario& s, F key, N v, F file) {
         s.expect_diagnosis = need_string(file, v, key);
         if (!is_diagnosis_code(s.expect_diagnosis))
           fail(file, v, key, "expected one of " + diagnosis_codes() + ", got '" + s.expect_diagnosis + "'");
       }},
      {"expect_first_divergence",
       [](Scenario& s, F key, N v, F file) { s.expect_first_divergence = need_string(file, v, key); }},
  };
  return keys;
}

}   // namespace

void apply_setting(Scenario& scenario, const std::string& key, const toml::node& node, const std::string& file) {
  const auto& keys = scenario_keys();
  const auto hit = std::find_if(keys.begin(), keys.end(), [&](const ScenarioKey& k) { return key == k.key; });
  if (hit == keys.end()) {
    std::vector<std::string> names;
    std::string list;
    for (const auto& k : keys) names.push_back(k.key), list += (list.empty() ? "" : ", ") + std::string(k.key);
    fail(file, node, key, "unknown key (expected " + list + ")" + did_you_mean(key, names));
  }
  try {
    hit->apply(scenario, key, node, file);
  } catch (const ScenarioError&) {
    throw;
  } catch (const std::invalid_argument& e) {   // the save policy's, a fault's or a dtype's parser
    throw ScenarioError(where(file, node) + ": " + key + ": " + e.what());
  }
}

void apply_settings(Scenario& scenario, const toml::table& table, const std::string& file,
                    const std::set<std::string>& skip) {
  for (const auto& [k, node] : table) {
    const std::string key(k.str());
    if (!skip.count(key)) apply_setting(scenario, key, node, file);
  }
}

void apply_dotted(Scenario& scenario, const std::string& dotted, const toml::node& node, const std::string& file) {
  const auto dot = dotted.find('.');
  if (dot == std::string::npos) return apply_setting(scenario, dotted, node, file);
  const std::string section = dotted.substr(0, dot);
  if (dotted == "trainer.args") {
    // One axis value, split at spaces, is appended to the trainer's arguments.
    toml::table table;
    toml::array args;
    std::istringstream words(need_string(file, node, dotted));
    for (std::string word; words >> word;) args.push_back(word);
    table.insert("args", std::move(args));
    return apply_trainer(scenario, table, file);
  }
  if (section != "model" && section != "optimizer" && section != "train")
    fail(file, node, dotted, "axis key must be a scenario key, trainer.args or model./optimizer./train.<field>");
  try {
    SectionSettings(scenario.cfg, section, where(file, node))
        .set(dotted.substr(dot + 1), setting_value(node), where(file, node));
  } catch (const std::invalid_argument& e) {
    throw ScenarioError(e.what());
  }
}

}   // namespace rh::scenario_file
