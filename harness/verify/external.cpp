// Placeholders and validation of an external trainer's table; see external.h.
#include "harness/verify/external.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <stdexcept>

#include "harness/verify/external_metrics.h"

namespace rh {
namespace {

// Calls f(name, spec) for every {name[:spec]} of text and returns the text with each replaced by
// f's result; "{{" / "}}" are literal braces.
template <class F>
std::string walk(const std::string& text, F&& f) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if ((c == '{' || c == '}') && i + 1 < text.size() && text[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c == '}') throw std::invalid_argument("'" + text + "': unmatched '}' (write '}}' for a literal brace)");
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t end = text.find('}', i);
    if (end == std::string::npos)
      throw std::invalid_argument("'" + text + "': unmatched '{' (write '{{' for a literal brace)");
    const std::string inner = text.substr(i + 1, end - i - 1);
    const size_t colon = inner.find(':');
    out += f(inner.substr(0, colon), colon == std::string::npos ? std::string() : inner.substr(colon + 1));
    i = end;
  }
  return out;
}

// "07" pads an integer to 7 digits with zeros; nothing else is a valid spec.
std::string apply_spec(const std::string& value, const std::string& spec, const std::string& name) {
  if (spec.empty()) return value;
  if (spec.size() < 2 || spec[0] != '0' || !std::all_of(spec.begin() + 1, spec.end(), ::isdigit) || spec.size() > 3)
    throw std::invalid_argument("{" + name + ":" + spec + "}: the only format is a zero-padded width such as {" + name +
                                ":07}");
  if (value.empty() || !std::all_of(value.begin(), value.end(), ::isdigit))
    throw std::invalid_argument("{" + name + ":" + spec + "}: '" + value + "' is not an integer");
  const size_t width = static_cast<size_t>(std::atoi(spec.c_str() + 1));
  return value.size() >= width ? value : std::string(width - value.size(), '0') + value;
}

}   // namespace

std::string expand_placeholders(const std::string& text, const std::map<std::string, std::string>& vars) {
  return walk(text, [&](const std::string& name, const std::string& spec) {
    auto it = vars.find(name);
    if (it == vars.end()) throw std::invalid_argument("placeholder {" + name + "} has no value here");
    return apply_spec(it->second, spec, name);
  });
}

void check_placeholders(const std::string& text, const std::vector<std::string>& allowed) {
  walk(text, [&](const std::string& name, const std::string& spec) {
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "{" : ", {") + a + "}";
      throw std::invalid_argument("'" + text + "': unknown placeholder {" + name + "} (expected " + list + ")");
    }
    if (!spec.empty()) apply_spec("1", spec, name);
    return std::string();
  });
}

const char* const kMegatronLogRegex =
    R"(\biteration\s+(?P<iteration>\d+)/\s*\d+ \|.* learning rate: (?P<lr>[-+.\w]+) \|.* lm loss: (?P<lm_loss>[-+.\w]+) \|)";

void apply_preset_defaults(ExternalTrainer& t, const std::string& preset) {
  if (preset != "megatron") throw std::invalid_argument("trainer.preset: expected megatron, got '" + preset + "'");
  t.preset = preset;
  t.metrics = {};
  t.metrics.stdout_regex = kMegatronLogRegex;
  t.checkpoint.path = "{save_dir}/iter_{iteration:07}";
  t.checkpoint.format = "auto";
  t.resume_command.clear();
}

void finish_preset(ExternalTrainer& t) {
  if (t.preset.empty()) return;
  // megatron/training/training.py (main 001b00c): --exit-interval stops after the iteration that is
  // a multiple of it and saves there (checkpoint_and_decide_exit); --save-interval saves every K;
  // --load of a directory without latest_checkpointed_iteration.txt starts from scratch.
  const std::vector<std::pair<std::string, std::string>> flags = {{"--exit-interval", "{iterations}"},
                                                                   {"--save-interval", "{save_at}"},
                                                                   {"--save", "{save_dir}"},
                                                                   {"--load", "{load_dir}"},
                                                                   {"--log-interval", "1"}};
  auto named = [&](const std::string& flag) {
    for (const auto* argv : {&t.command, &t.args})
      for (const auto& a : *argv)
        if (a == flag || a.rfind(flag + "=", 0) == 0) return true;
    return false;
  };
  for (const auto& [flag, value] : flags)
    if (!named(flag)) t.args.insert(t.args.end(), {flag, value});
  if (t.resume_command.empty()) t.resume_command = t.command;
}

void validate_trainer(const ExternalTrainer& t) {
  static const std::vector<std::string> run_vars = {"iterations", "save_at", "save_dir", "load_dir", "run_dir", "tool"};
  if (t.command.empty()) throw std::invalid_argument("trainer.command: expected a non-empty array of strings");
  if (t.resume_command.empty())
    throw std::invalid_argument("trainer.resume_command: expected a non-empty array of strings");
  for (const auto* cmd : {&t.command, &t.resume_command, &t.args})
    for (const auto& a : *cmd) check_placeholders(a, run_vars);
  for (const auto& [k, v] : t.env) check_placeholders(v, run_vars);
  check_placeholders(t.cwd, {});
  if (!(t.timeout_s > 0) || t.timeout_s > 7 * 24 * 3600.0)
    throw std::invalid_argument("trainer.timeout_s: expected seconds in (0, 604800]");
  if (t.determinism_runs < 1 || t.determinism_runs > 10)
    throw std::invalid_argument("trainer.determinism_runs: expected 1 to 10");
  const bool by_regex = !t.metrics.stdout_regex.empty(), by_file = !t.metrics.file.empty();
  if (by_regex == by_file) throw std::invalid_argument("trainer.metrics: expected exactly one of stdout_regex or file");
  if (by_regex) {
    if (const auto p = regex_problem(t.metrics.stdout_regex); !p.empty())
      throw std::invalid_argument("trainer.metrics.stdout_regex: " + p);
    if (!t.metrics.format.empty()) throw std::invalid_argument("trainer.metrics.format: only with metrics.file");
  } else {
    check_placeholders(t.metrics.file, run_vars);
    if (t.metrics.format != "csv" && t.metrics.format != "jsonl")
      throw std::invalid_argument("trainer.metrics.format: expected csv or jsonl, got '" + t.metrics.format + "'");
  }
  if (!t.checkpoint.path.empty()) {
    auto vars = run_vars;
    vars.push_back("iteration");
    check_placeholders(t.checkpoint.path, vars);
  }
  const auto& f = t.checkpoint.format;
  if (f != "auto" && f != "safetensors" && f != "torch")
    throw std::invalid_argument("trainer.checkpoint.format: expected auto, safetensors or torch, got '" + f + "'");
  if (t.round_trip && t.checkpoint.path.empty())
    throw std::invalid_argument(
        "trainer.round_trip: needs trainer.checkpoint.path (the round trip compares checkpoints)");
}

}   // namespace rh
