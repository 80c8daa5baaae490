// The train state's JSON form and the scheduler's field table; see train_state.h.
#include "harness/checkpoint/train_state.h"

#include <type_traits>

#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/checked_io.h"

namespace rh::ckpt {

const std::vector<SchedulerField>& scheduler_fields() {
  using S = OptParamSchedulerState;
  static const std::vector<SchedulerField> fields = {
      {"max_lr", "learning rate", 0, &S::max_lr},
      {"lr_warmup_steps", "warmup iterations", 2, &S::lr_warmup_steps},
      {"num_steps", nullptr, -1, &S::num_steps},
      {"lr_decay_style", "learning rate decay style", 4, &S::lr_decay_style},
      {"lr_decay_steps", "total number of iterations", 3, &S::lr_decay_steps},
      {"min_lr", "minimum learning rate", 1, &S::min_lr},
      {"start_wd", "start weight decay", 5, &S::start_wd},
      {"end_wd", "end weight decay", 6, &S::end_wd},
      {"wd_incr_style", "weight decay incr style", 8, &S::wd_incr_style},
      {"wd_incr_steps", "total number of weight decay iterations", 7, &S::wd_incr_steps},
  };
  return fields;
}

nlohmann::json to_json(const OptParamSchedulerState& s) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : scheduler_fields()) std::visit([&](auto m) { j[f.key] = s.*m; }, f.member);
  return j;
}

nlohmann::json rng_states_json(const std::map<std::string, std::vector<uint8_t>>& rng) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, bytes] : rng) j[name] = hex_encode(bytes);
  return j;
}

nlohmann::json to_json(const TrainState& s) {
  // Megatron's OptimizerParamScheduler.state_dict(), its keys and values
  // (megatron/core/optimizer_param_scheduler.py state_dict; checkpointing.py saves it as
  // state_dict['opt_param_scheduler']).
  return {{"iteration", s.iteration},
          {"consumed_samples", s.consumed_samples},
          {"opt_param_scheduler", to_json(s.opt_param_scheduler)},
          {"rng_states", rng_states_json(s.rng_states)}};
}

std::vector<uint8_t> parse_hex(const JsonField& f, size_t exact_len) {
  const std::string s = f.str();
  if (exact_len && s.size() != exact_len)
    f.fail("expected " + std::to_string(exact_len) + " hex digits, got '" + quote_text(s) + "'");
  if (s.size() % 2) f.fail("expected hex digits of even length, got '" + quote_text(s) + "'");
  auto nibble = [&](char c) -> uint8_t {
    if (c >= '0' && c <= '9') return static_cast<uint8_t>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<uint8_t>(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return static_cast<uint8_t>(c - 'A' + 10);
    f.fail("expected hex digits, got '" + quote_text(s) + "'");
  };
  std::vector<uint8_t> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(nibble(s[2 * i]) << 4 | nibble(s[2 * i + 1]));
  return out;
}

std::map<std::string, std::vector<uint8_t>> parse_rng_states(const JsonField& j) {
  std::map<std::string, std::vector<uint8_t>> out;
  j.each_member([&](const std::string& name, const JsonField& v) { out[name] = parse_hex(v); });
  return out;
}

OptParamSchedulerState parse_scheduler_state(const JsonField& j, int64_t max_counter) {
  OptParamSchedulerState s;
  for (const auto& f : scheduler_fields()) {
    const JsonField v = j[f.key];
    std::visit(
        [&](auto m) {
          using T = std::decay_t<decltype(s.*m)>;
          if constexpr (std::is_same_v<T, double>) s.*m = v.number();
          else if constexpr (std::is_same_v<T, int64_t>) s.*m = v.i64(0, max_counter);
          else s.*m = v.str();
        },
        f.member);
  }
  return s;
}

TrainState parse_train_state(const JsonField& j, int64_t iteration, int64_t max_counter) {
  TrainState s;
  s.iteration = j["iteration"].i64(0, max_counter);
  if (s.iteration != iteration)
    j["iteration"].fail(std::to_string(s.iteration) + " differs from /iteration " + std::to_string(iteration));
  s.consumed_samples = j["consumed_samples"].i64(0, max_counter);
  s.opt_param_scheduler = parse_scheduler_state(j["opt_param_scheduler"], max_counter);
  s.rng_states = parse_rng_states(j["rng_states"]);
  return s;
}

}   // namespace rh::ckpt
