// Phase 3 of load_checkpoint (load_phases.h): the plan carried out on the optimizer, the model and
// its buffers, and the optimizer's step counts.
//
// Stored states and model weights are adopted, not copied: verify_checkpoint_dir read every file
// into staging memory while hashing it (one pass over the bytes), so the verified staging tensors
// become the state (PrecisionAdam::adopt_stored, Tensor::set_data). The tensors the state held
// before are only released, never written, so a refusal puts them back as they were. What is
// written in place (set_scaled_state re-stores a converted state) is snapshotted first, only where
// some conversion is planned. The model's weights need no snapshot: set_scaled_state never writes
// the model param (precision_adam.h), and set_data only replaces them.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "harness/checkpoint/checkpoint.h"
#include "harness/checkpoint/load_phases.h"
#include "harness/checkpoint/manifest.h"
#include "harness/checkpoint/policy.h"

namespace rh::ckpt::detail {

namespace {

using Params = torch::OrderedDict<std::string, torch::Tensor>;

// What a refusal puts back: adopted states and replaced weights by the handles they held before,
// converted states from their copies, the step counts from theirs.
class Undo {
 public:
  Undo(optim::PrecisionAdam& opt, const Params& params) : opt_(opt), params_(params) {}

  // Before anything changes: copies of what set_scaled_state will overwrite (and the step
  // counts), only when the plan converts some state.
  void snapshot(const LoadPlan& plan) {
    bool need_snapshot = false;
    for (const Action& action : plan.actions) need_snapshot |= !action.use_stored;
    if (!need_snapshot) return;
    for (const Action& action : plan.actions)
      if (!action.use_stored) {
        optim::StoredState before = opt_.stored(action.param, action.key);
        before.data = before.data.clone();
        converted_.emplace_back(&action, std::move(before));
      }
    for (size_t g = 0; g < opt_.num_groups(); ++g) steps_.push_back(opt_.step_count(g));
  }
  void adopted(const Action& a, optim::StoredState before) { adopted_.emplace_back(&a, std::move(before)); }
  void replaced_param(torch::Tensor old) { old_params_.push_back(std::move(old)); }

  void run() {
    torch::NoGradGuard ng;
    for (auto it = adopted_.rbegin(); it != adopted_.rend(); ++it)
      opt_.adopt_stored(it->first->param, it->first->key, it->second);
    for (size_t i = 0; i < old_params_.size(); ++i) params_[i].value().set_data(old_params_[i]);
    for (const auto& [a, s] : converted_) opt_.set_stored(a->param, a->key, s);
    for (size_t g = 0; g < steps_.size(); ++g) opt_.set_step_count(g, steps_[g]);
  }

 private:
  optim::PrecisionAdam& opt_;
  const Params& params_;
  std::vector<std::pair<const Action*, optim::StoredState>> adopted_;     // the state each replaced
  std::vector<std::pair<const Action*, optim::StoredState>> converted_;   // a copy of what each overwrote
  std::vector<torch::Tensor> old_params_;                                 // the weights set_data replaced
  std::vector<int64_t> steps_;
};

// Apply, first: the stored states become the verified staging tensors.
void adopt_states(const LoadPlan& plan, optim::PrecisionAdam& opt, Undo& undo) {
  for (const Action& action : plan.actions)
    if (action.use_stored) {
      optim::StoredState before = opt.stored(action.param, action.key);   // a handle: nothing is copied
      opt.adopt_stored(action.param, action.key, action.stored);
      undo.adopted(action, std::move(before));
    }
}

// Apply, second: converted states through set_scaled_state, as upstream re-stores them. A value
// that does not come back bit for bit refuses the load, or with allow_lossy is noted.
void restore_converted(const VerifiedLoad& checkpoint, const LoadPlan& plan, optim::PrecisionAdam& opt,
                       const LoadOptions& opts, std::vector<std::string>& notes) {
  std::vector<std::string> inexact;
  for (const Action& action : plan.actions) {
    if (action.use_stored) continue;
    opt.set_scaled_state(action.param, action.key, action.value);
    torch::Tensor got = unscaled(opt, action.param, action.key);
    if (!bits_equal(got, action.value_owned)) {
      const int64_t num_changed = count_bits_differ(got, action.value_owned);
      inexact.push_back(where(checkpoint.v, action.file, action.tkey) + ": " + std::to_string(num_changed) + " of " +
                        std::to_string(got.numel()) + " values change when the optimizer re-applies " +
                        optim::to_string(opt.stored(action.param, action.key).dtype) + " storage");
    }
  }
  if (inexact.empty()) return;
  if (!opts.allow_lossy) {
    std::string msg = "conversion is not exact, refusing without allow_lossy: " + inexact[0];
    if (inexact.size() > 1) msg += " (and " + std::to_string(inexact.size() - 1) + " more)";
    throw CheckpointError(msg);
  }
  for (const auto& s : inexact) notes.push_back("lossy on load: " + s);
}

// Apply, third: the model's weights become the model file's tensors, except where a remainder
// optimizer split a saved master: there the weight that belongs to its remainder.
void restore_weights(const SafetensorsFile& model_file, const LoadPlan& plan, const Params& params, Undo& undo) {
  std::map<std::string, torch::Tensor> split_weight;
  for (const Action& action : plan.actions)
    if (action.weight.defined()) split_weight[action.param] = action.weight;
  for (const auto& param : params) {
    auto it = split_weight.find(param.key());
    torch::Tensor weight = it != split_weight.end() ? it->second : model_file.tensor(param.key());
    undo.replaced_param(param.value().detach());   // shares the old storage; set_data leaves it be
    param.value().set_data(weight.is_contiguous() ? weight : weight.contiguous());
  }
}

}   // namespace

void apply_load(const VerifiedLoad& checkpoint, const LoadPlan& plan, torch::nn::Module& model,
                optim::PrecisionAdam& opt, const LoadOptions& opts, std::vector<std::string>& notes) {
  const SafetensorsFile& model_file = checkpoint.v.files.at(kModelFile);
  const Params params = model.named_parameters(true);
  Undo undo(opt, params);
  undo.snapshot(plan);
  try {
    torch::NoGradGuard ng;
    // Optimizer states first: the last refusal (an inexact conversion) comes before the buffers,
    // the only tensors written in place that no undo covers.
    adopt_states(plan, opt, undo);
    restore_converted(checkpoint, plan, opt, opts, notes);
    if (!opts.skip_keys.count("model")) restore_weights(model_file, plan, params, undo);
    // Persistent buffers, exactly as saved (a router's fp32 expert_bias); after the last refusal.
    if (!opts.skip_keys.count("buffers"))
      for (const auto& b : model.named_buffers(true)) b.value().detach().copy_(model_file.tensor(b.key()));
    if (!opts.skip_keys.count("step")) {
      const auto& groups = checkpoint.v.manifest["optimizer"]["groups"];
      for (size_t g = 0; g < opt.num_groups(); ++g) opt.set_step_count(g, groups[g]["step"].get<int64_t>());
    }
  } catch (const std::exception& e) {
    undo.run();
    if (dynamic_cast<const CheckpointError*>(&e)) throw;
    throw CheckpointError("checkpoint " + checkpoint.v.dir + ": restoring state failed: " + e.what());
  }
}

}   // namespace rh::ckpt::detail
