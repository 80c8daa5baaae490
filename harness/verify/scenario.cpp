// Scenario files: TOML parsing, matrix expansion, canonical names; see scenario.h and
// scenarios/README.md for the format.
#include "harness/verify/scenario.h"

#include "harness/train/metrics.h"
#include "harness/verify/outcome.h"

#include <toml++/toml.h>

#include <fnmatch.h>

#include <cmath>
#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/checked_io.h"

#include <cstdio>

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>

namespace rh {
namespace {

std::string where(const std::string& file, const toml::node& n) {
  return file + ":" + std::to_string(n.source().begin.line);
}

[[noreturn]] void fail(const std::string& file, const toml::node& n, const std::string& key,
                       const std::string& what) {
  throw ScenarioError(where(file, n) + ": " + key + ": " + what);
}

nlohmann::json to_json_value(const toml::node& n) {
  if (auto v = n.as_integer()) return v->get();
  if (auto v = n.as_floating_point()) return v->get();
  if (auto v = n.as_boolean()) return v->get();
  if (auto v = n.as_string()) return v->get();
  if (auto a = n.as_array()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& e : *a) j.push_back(to_json_value(e));
    return j;
  }
  if (auto t = n.as_table()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : *t) j[std::string(k.str())] = to_json_value(v);
    return j;
  }
  return nullptr;
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

bool need_bool(const std::string& file, const toml::node& n, const std::string& key) {
  if (!n.is_boolean()) fail(file, n, key, "expected true or false");
  return n.as_boolean()->get();
}

// Merges a [trainer] table into the scenario's external trainer (creating it): scalars replace,
// `args` appends (so [defaults], a matrix and each axis value can add arguments).
void apply_trainer(Scenario& s, const toml::table& t, const std::string& file) {
  if (!s.trainer) {
    s.trainer.emplace();
    s.trainer->scenario_dir = std::filesystem::path(file).parent_path().string();
  }
  ExternalTrainer& x = *s.trainer;
  for (const auto& [k, v] : t) {
    const std::string key(k.str()), full = "trainer." + key;
    if (key == "command") x.command = need_strings(file, v, full);
    else if (key == "resume_command") x.resume_command = need_strings(file, v, full);
    else if (key == "args") for (auto& a : need_strings(file, v, full)) x.args.push_back(std::move(a));
    else if (key == "cwd") x.cwd = need_string(file, v, full);
    else if (key == "env") {
      for (const auto& [ek, ev] : need_table(file, v, full)) {
        const std::string name(ek.str());
        if (name.empty() || name.find('=') != std::string::npos) fail(file, ev, full + "." + name, "not an environment variable name");
        x.env.emplace_back(name, need_string(file, ev, full + "." + name));
      }
    } else if (key == "timeout_s") x.timeout_s = need_number(file, v, full);
    else if (key == "output_cap_mb") {
      const int64_t mb = need_int(file, v, full);
      if (mb < 1 || mb > 65536) fail(file, v, full, "expected 1 to 65536");
      x.output_cap_bytes = static_cast<uint64_t>(mb) << 20;
    } else if (key == "determinism_runs") x.determinism_runs = static_cast<int>(std::clamp<int64_t>(need_int(file, v, full), -1, 1000));
    else if (key == "round_trip") x.round_trip = need_bool(file, v, full);
    else if (key == "probe") x.probe = need_bool(file, v, full);
    else if (key == "iterations") {
      const int64_t n = need_int(file, v, full);
      if (n < 2 || n > 1000000) fail(file, v, full, "expected 2 to 1000000");
      s.cfg.train.iterations = n;
    } else if (key == "metrics") {
      for (const auto& [mk, mv] : need_table(file, v, full)) {
        const std::string m(mk.str()), mfull = full + "." + m;
        if (m == "stdout_regex") x.metrics.stdout_regex = need_string(file, mv, mfull), x.metrics.file.clear();
        else if (m == "file") x.metrics.file = need_string(file, mv, mfull), x.metrics.stdout_regex.clear();
        else if (m == "format") x.metrics.format = need_string(file, mv, mfull);
        else fail(file, mv, mfull, "unknown key (expected stdout_regex, file, format)");
      }
    } else if (key == "checkpoint") {
      for (const auto& [ck, cv] : need_table(file, v, full)) {
        const std::string c(ck.str()), cfull = full + "." + c;
        if (c == "path") x.checkpoint.path = need_string(file, cv, cfull);
        else if (c == "format") x.checkpoint.format = need_string(file, cv, cfull);
        else if (c == "trust_pickle") x.checkpoint.trust_pickle = need_bool(file, cv, cfull);
        else fail(file, cv, cfull, "unknown key (expected path, format, trust_pickle)");
      }
    } else {
      fail(file, v, full, "unknown key (expected command, resume_command, args, cwd, env, timeout_s, output_cap_mb, "
                          "determinism_runs, round_trip, probe, iterations, metrics, checkpoint)");
    }
  }
}

// Applies one setting (a top-level scenario key or a model/optimizer/train section).
void apply_setting(Scenario& s, const std::string& key, const toml::node& v, const std::string& file) {
  try {
    if (key == "model" || key == "optimizer" || key == "train") {
      for (const auto& [k, val] : need_table(file, v, key)) {
        const std::string sub(k.str());
        nlohmann::json j;
        j[key][sub] = to_json_value(val);
        apply_json(s.cfg, j, where(file, val));
      }
    } else if (key == "trainer") {
      apply_trainer(s, need_table(file, v, key), file);
    } else if (key == "expect_diagnosis") {
      s.expect_diagnosis = need_string(file, v, key);
      if (!is_diagnosis_code(s.expect_diagnosis))
        fail(file, v, key, "expected one of " + diagnosis_codes() + ", got '" + s.expect_diagnosis + "'");
    } else if (key == "expect_first_divergence") {
      s.expect_first_divergence = need_string(file, v, key);
    } else if (key == "description") {
      s.description = need_string(file, v, key);
    } else if (key == "save_at") {
      s.save_at = need_int(file, v, key);
    } else if (key == "save_policy") {
      s.policy.kind = ckpt::parse_save_policy(need_string(file, v, key));
    } else if (key == "compress") {
      s.policy.compress = ckpt::parse_compression(need_string(file, v, key));
    } else if (key == "save_overrides") {
      for (const auto& [k, val] : need_table(file, v, key)) {
        const std::string sub(k.str());
        if (sub != "master_param" && sub != "exp_avg" && sub != "exp_avg_sq")
          fail(file, val, key + "." + sub, "expected one of master_param, exp_avg, exp_avg_sq");
        s.policy.overrides[sub] = optim::parse_dtype(need_string(file, val, sub), key + "." + sub);
      }
    } else if (key == "fault") {
      s.fault = parse_fault(need_string(file, v, key));
    } else if (key == "dp_size") {
      s.dp_size = need_int(file, v, key);
    } else if (key == "resume_dp_size") {
      s.resume_dp_size = need_int(file, v, key);
    } else if (key == "allow_lossy") {
      if (!v.is_boolean()) fail(file, v, key, "expected true or false");
      s.allow_lossy = v.as_boolean()->get();
    } else if (key == "exact_master_conversion") {
      if (!v.is_boolean()) fail(file, v, key, "expected true or false");
      s.exact_master_conversion = v.as_boolean()->get();
    } else if (key == "expect") {
      const std::string e = need_string(file, v, key);
      if (e == "exact") s.expect.kind = Expectation::Kind::exact;
      else if (e == "tolerance") s.expect.kind = Expectation::Kind::tolerance;
      else if (e == "diverge") s.expect.kind = Expectation::Kind::diverge;
      else if (e == "refused") s.expect.kind = Expectation::Kind::refused;
      else fail(file, v, key, "expected exact, tolerance, diverge or refused, got '" + e + "'");
    } else if (key == "reason") {
      s.expect.reason = need_string(file, v, key);
    } else if (key == "tolerance") {
      s.expect.tolerances.clear();
      for (const auto& [k, val] : need_table(file, v, key)) {
        const std::string metric(k.str());
        bool known = false;
        for (const auto& m : metric_names()) known = known || m == metric;
        if (!known) fail(file, val, key + "." + metric, "not a metric name (lm_loss, aux_loss, total_loss, grad_norm, lr, num_zeros)");
        Tolerance tol;
        for (const auto& [tk, tv] : need_table(file, val, key + "." + metric)) {
          double* dst = tk.str() == "atol" ? &tol.atol : tk.str() == "rtol" ? &tol.rtol : nullptr;
          if (!dst) fail(file, tv, key + "." + metric + "." + std::string(tk.str()), "expected atol or rtol");
          *dst = need_number(file, tv, std::string(tk.str()));
          // inf would let any difference (a deliberate fault) pass; NaN compares false.
          if (!std::isfinite(*dst) || *dst < 0)
            fail(file, tv, key + "." + metric + "." + std::string(tk.str()), "expected a finite number >= 0");
        }
        s.expect.tolerances[metric] = tol;
      }
    } else {
      fail(file, v, key, "unknown key (expected model, optimizer, train, description, save_at, "
                         "save_policy, compress, save_overrides, fault, dp_size, resume_dp_size, allow_lossy, exact_master_conversion, expect, reason, tolerance, "
                         "trainer, expect_diagnosis, expect_first_divergence)");
    }
  } catch (const ScenarioError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    // Errors from the config layer already carry file:line; others get it here.
    const std::string msg = e.what();
    if (msg.rfind(file + ":", 0) == 0) throw ScenarioError(msg);
    throw ScenarioError(where(file, v) + ": " + key + ": " + msg);
  }
}

void apply_settings(Scenario& s, const toml::table& t, const std::string& file,
                    const std::set<std::string>& skip = {}) {
  for (const auto& [k, v] : t) {
    const std::string key(k.str());
    if (!skip.count(key)) apply_setting(s, key, v, file);
  }
}

// Sets a dotted key ("optimizer.exp_avg_dtype" or "save_policy") to a value.
void apply_dotted(Scenario& s, const std::string& dotted, const toml::node& v, const std::string& file) {
  const auto dot = dotted.find('.');
  if (dot == std::string::npos) return apply_setting(s, dotted, v, file);
  const std::string section = dotted.substr(0, dot);
  if (dotted == "trainer.args") {
    // One axis value, split at spaces, is appended to the trainer's arguments.
    toml::table t;
    toml::array a;
    std::istringstream words(need_string(file, v, dotted));
    for (std::string w; words >> w;) a.push_back(w);
    t.insert("args", std::move(a));
    return apply_trainer(s, t, file);
  }
  if (section != "model" && section != "optimizer" && section != "train")
    fail(file, v, dotted, "axis key must be a scenario key, trainer.args or model./optimizer./train.<field>");
  nlohmann::json j;
  j[section][dotted.substr(dot + 1)] = to_json_value(v);
  try {
    apply_json(s.cfg, j, where(file, v));
  } catch (const std::invalid_argument& e) {
    throw ScenarioError(e.what());
  }
}

void check_complete(const Scenario& s, const toml::node& at) {
  if (s.trainer) {
    try {
      validate_trainer(*s.trainer);
    } catch (const std::invalid_argument& e) {
      fail(s.file, at, s.name, e.what());
    }
    if (s.fault != Fault::none || s.dp_size != 1 || s.resume_dp_size > 1 || s.allow_lossy || s.exact_master_conversion)
      fail(s.file, at, s.name, "fault, dp_size, resume_dp_size, allow_lossy and exact_master_conversion are the built-in trainer's; "
                               "an external trainer's own flags go in trainer.args");
  } else if (!s.expect_diagnosis.empty()) {
    fail(s.file, at, s.name, "expect_diagnosis needs an external trainer ([trainer])");
  }
  if (s.expect.kind != Expectation::Kind::exact && s.expect.reason.empty())
    fail(s.file, at, s.name, "expect = \"" + to_string(s.expect.kind) + "\" needs a reason");
  if (s.expect.kind == Expectation::Kind::tolerance && s.expect.tolerances.empty())
    fail(s.file, at, s.name, "expect = \"tolerance\" needs a [tolerance] table of metrics");
  if (s.save_at < 1 || s.save_at >= s.cfg.train.iterations)
    fail(s.file, at, s.name, "save_at (" + std::to_string(s.save_at) + ") must be in [1, iterations - 1 = " +
                                 std::to_string(s.cfg.train.iterations - 1) + "]");
  if (s.dp_size < 1 || s.dp_size > 64) fail(s.file, at, s.name, "dp_size must be in [1, 64]");
  if (s.resume_dp_size < 0 || s.resume_dp_size > 64)
    fail(s.file, at, s.name, "resume_dp_size must be in [0, 64] (0: the same as dp_size)");
  const int64_t n_micro = s.cfg.train.micro_batch > 0 ? s.cfg.train.global_batch / s.cfg.train.micro_batch : 0;
  for (int64_t dp : {s.dp_size, s.resume_dp()})
    if (n_micro > 0 && n_micro % dp != 0)
      fail(s.file, at, s.name, std::to_string(dp) + " data-parallel ranks do not divide the " + std::to_string(n_micro) +
                                   " micro-batches of an iteration (train.global_batch / train.micro_batch)");
  try {
    validate(s.cfg);
  } catch (const std::invalid_argument& e) {
    fail(s.file, at, s.name, e.what());
  }
}

struct Axis {
  std::string name, key;
  std::vector<std::string> values;
  std::vector<const toml::node*> value_nodes;       // scalar values (key axes)
  std::map<std::string, const toml::table*> presets;  // preset axes
};

bool when_matches(const toml::table& when, const std::map<std::string, std::string>& cell,
                  const std::string& file) {
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

// A name the file gives (scenario.name, matrix.name, an axis name or value): it becomes part of a
// directory name, so no control characters, no '\\', no '.', '..' or empty names. '/' groups
// scenario names ("approx/fp32-moments-saved-bf16"; safe_name maps it to "__"), so a scenario
// name may hold it between non-empty segments other than '.' and '..'; matrix, axis names and
// values may not (the canonical name "matrix/axis=value,..." is built from them).
void check_name_part(const std::string& file, const toml::node& n, const std::string& key,
                     const std::string& name, bool slash_groups = false) {
  if (name.find('\\') != std::string::npos)
    fail(file, n, key, quote_name(name) + " contains a path separator ('\\')");
  if (!slash_groups && name.find('/') != std::string::npos)
    fail(file, n, key, quote_name(name) + " contains a path separator ('/')");
  try {
    (void)safe_name(name);
  } catch (const ScenarioError& e) {
    fail(file, n, key, e.what());
  }
  size_t b = 0;
  while (slash_groups) {
    const size_t e = name.find('/', b);
    const std::string seg = name.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (seg.empty() || seg == "." || seg == "..")
      fail(file, n, key, quote_name(name) + " has an empty, '.' or '..' path segment");
    if (e == std::string::npos) break;
    b = e + 1;
  }
}

std::string value_text(const toml::node& n) {
  if (auto s = n.as_string()) return s->get();
  std::ostringstream os;
  if (auto b = n.as_boolean()) os << (b->get() ? "true" : "false");
  else if (auto i = n.as_integer()) os << i->get();
  else if (auto f = n.as_floating_point()) os << f->get();
  return os.str();
}

// One [[matrix.axis]]: a name, values, and either a key each value sets or a preset per value.
Axis parse_axis(const toml::table& at, const std::string& file, const std::string& mname) {
  Axis ax;
  for (const auto& [k, v] : at) {
    const std::string key(k.str());
    if (key == "name") {
      ax.name = need_string(file, v, "axis.name");
      check_name_part(file, v, "axis.name", ax.name);
    }
    else if (key == "key") ax.key = need_string(file, v, "axis.key");
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

void expand_matrix(const toml::table& m, const Scenario& base, const std::string& file,
                   std::vector<Scenario>& out) {
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
    else if (!e->is_array_of_tables()) fail(file, *e, mname + ".expect", "expected a string or [[matrix.expect]] tables");
    else for (const auto& x : *e->as_array()) expects.push_back(x.as_table());
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

}  // namespace

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
    text = ckpt::read_regular_file(path, kMaxScenarioFileBytes);   // no FIFO, no /dev/zero
  } catch (const ckpt::CheckpointError& e) {
    throw ScenarioError("scenario file " + std::string(e.what()));
  }
  return load_scenarios_text(text, path);
}

std::vector<Scenario> load_scenarios_text(const std::string& text, const std::string& path) {
  // ASCII only: toml++ 3.3.0 has undefined behaviour on some non-ASCII code points (json_guard.h).
  if (const auto where = ckpt::non_ascii_position(text); !where.empty())
    throw ScenarioError(path + ":" + where);
  if (const auto where = ckpt::toml_nesting_position(text); !where.empty()) throw ScenarioError(path + ":" + where);
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw ScenarioError(path + ":" + std::to_string(e.source().begin.line) + ": " +
                        std::string(e.description()));
  }
  Scenario base;
  base.file = path;
  std::vector<Scenario> out;
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key != "defaults" && key != "scenario" && key != "matrix")
      fail(path, v, key, "unknown top-level key (expected defaults, [[scenario]], [[matrix]])");
  }
  if (const auto* d = root.get("defaults")) apply_settings(base, need_table(path, *d, "defaults"), path);
  if (const auto* sc = root.get("scenario")) {
    if (!sc->is_array_of_tables()) fail(path, *sc, "scenario", "expected [[scenario]] tables");
    for (const auto& n : *sc->as_array()) {
      const auto& t = *n.as_table();
      Scenario s = base;
      const auto* nm = t.get("name");
      if (!nm) fail(path, t, "scenario", "needs a name");
      s.name = need_string(path, *nm, "scenario.name");
      check_name_part(path, *nm, "scenario.name", s.name, /*slash_groups=*/true);
      apply_settings(s, t, path, {"name"});
      check_complete(s, t);
      out.push_back(std::move(s));
    }
  }
  if (const auto* mx = root.get("matrix")) {
    if (!mx->is_array_of_tables()) fail(path, *mx, "matrix", "expected [[matrix]] tables");
    for (const auto& n : *mx->as_array()) expand_matrix(*n.as_table(), base, path, out);
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

}  // namespace rh
