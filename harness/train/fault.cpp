// The fault table; see fault.h.
#include "harness/train/fault.h"

#include <stdexcept>

#include "harness/train/config.h"
#include "harness/train/trainer.h"

namespace rh {

const std::vector<FaultSpec>& fault_specs() {
  using ckpt::TrainState;
  static const std::vector<FaultSpec> specs = {
      {Fault::none, "none", "nothing"},
      {Fault::skip_rng_restore, "skip_rng_restore", "generators keep their fresh state", nullptr, true},
      {Fault::skip_data_position_restore, "skip_data_position_restore", "data restarts at sample 0", nullptr, false,
       [](const RunConfig&, Trainer&, TrainState& st) { st.consumed_samples = 0; }},
      {Fault::reset_step_counter, "reset_step_counter", "optimizer step counters back to 0", nullptr, false,
       [](const RunConfig&, Trainer& tr, TrainState&) {
         for (size_t g = 0; g < tr.optimizer().num_groups(); ++g) tr.optimizer().set_step_count(g, 0);
       }},
      {Fault::skip_exp_avg_restore, "skip_exp_avg_restore", "exp_avg stays at its fresh value (0)", "exp_avg"},
      {Fault::reset_lr_schedule, "reset_lr_schedule", "scheduler counter (num_steps) back to 0", nullptr, false,
       [](const RunConfig&, Trainer&, TrainState& st) { st.opt_param_scheduler.num_steps = 0; }},
      {Fault::drop_remainders, "drop_remainders", "load weights only: remainders stay 0", "remainder"},
      {Fault::reset_wd_schedule, "reset_wd_schedule",
       "the scheduler's weight-decay part falls back to a constant optimizer.weight_decay (start = end = it, "
       "style constant)",
       nullptr, false,
       [](const RunConfig& cfg, Trainer&, TrainState& st) {
         st.opt_param_scheduler.start_wd = st.opt_param_scheduler.end_wd = cfg.optim.weight_decay;
         st.opt_param_scheduler.wd_incr_style = "constant";
       }},
      {Fault::wrong_lr_decay_style, "wrong_lr_decay_style",
       "the LR schedule is saved, but restored with another decay style (cosine <-> linear, any other -> "
       "cosine), past upstream's check",
       nullptr, false,
       [](const RunConfig&, Trainer&, TrainState& st) {
         auto& style = st.opt_param_scheduler.lr_decay_style;
         style = style == "cosine" ? "linear" : "cosine";
       }},
      {Fault::skip_expert_bias_restore, "skip_expert_bias_restore",
       "the model's persistent buffers (routers' expert_bias) keep their fresh value (0)", "buffers"},
  };
  return specs;
}

const FaultSpec& spec_of(Fault f) { return fault_specs().at(static_cast<size_t>(f)); }

std::string to_string(Fault f) { return spec_of(f).name; }

const std::vector<std::string>& fault_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& s : fault_specs()) v.push_back(s.name);
    return v;
  }();
  return names;
}

Fault parse_fault(const std::string& name) {
  for (const auto& f : fault_specs())
    if (name == f.name) return f.fault;
  std::string all;
  for (const auto& n : fault_names()) all += (all.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown fault '" + name + "' (expected one of: " + all + ")");
}

std::set<std::string> fault_skip_keys(Fault f) {
  const FaultSpec& spec = spec_of(f);
  if (!spec.skip_key) return {};
  return {spec.skip_key};
}

void inject_state_fault(Fault f, const RunConfig& cfg, Trainer& trainer, ckpt::TrainState& train_state) {
  if (const auto fn = spec_of(f).on_state) fn(cfg, trainer, train_state);
}

}   // namespace rh
