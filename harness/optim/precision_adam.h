// Precision-aware Adam/AdamW with TransformerEngine FusedAdam semantics (see
// shared/docs/BACKGROUND.md, "The optimizer being emulated"). It owns, per parameter, the master
// weight (fp32, fp16, or bf16 weight + int16 remainder), exp_avg and exp_avg_sq in their storage
// dtypes (fp16/fp8 with one fp32 scale per tensor), and the main gradient buffer.
// It knows nothing of models or checkpoints: it sees named tensors in parameter groups.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rh::optim {

// Storage dtypes. int16 appears only as the remainder of a master weight.
enum class Dtype { fp32, bf16, fp16, fp8, int16 };
std::string to_string(Dtype d);
// Parses "fp32|bf16|fp16|fp8" (and "int16"); throws std::invalid_argument naming `what`.
Dtype parse_dtype(const std::string& s, const std::string& what);
torch::ScalarType storage_scalar_type(Dtype d);   // fp8 -> kByte, int16 -> kShort
int64_t itemsize(Dtype d);

enum class MasterMode { fp32, fp16, remainders };
std::string to_string(MasterMode m);

// Option names mirror Megatron's.
struct OptimizerConfig {
  bool use_precision_aware_optimizer = false;
  Dtype main_grads_dtype = Dtype::fp32;   // fp32 | bf16
  Dtype main_params_dtype = Dtype::fp32;  // fp32 | fp16
  Dtype exp_avg_dtype = Dtype::fp32;      // fp32 | bf16 | fp16 | fp8
  Dtype exp_avg_sq_dtype = Dtype::fp32;   // fp32 | bf16 | fp16 | fp8
  bool store_param_remainders = true;     // effective only with fp32 master and bf16 params
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;             // default for "decay" groups (ParamGroup::weight_decay
                                         // is what step() applies)
  bool adam_w_mode = true;                // false: L2 mode (decay folded into the gradient)
};

// Refuses the combinations Megatron refuses; throws std::invalid_argument with a clear message.
void validate(const OptimizerConfig& cfg, torch::ScalarType param_dtype);
// The master mode actually in effect for these options and parameter dtype.
MasterMode effective_master_mode(const OptimizerConfig& cfg, torch::ScalarType param_dtype);

enum class StateKey { master_param, exp_avg, exp_avg_sq };
const char* key_name(StateKey k);   // "master_param", "exp_avg", "exp_avg_sq"

// One state exactly as held in memory.
struct StoredState {
  torch::Tensor data;          // shape of the param; kFloat, kBFloat16, kHalf, kByte (fp8 E4M3
                               // bytes) or kShort (remainder)
  Dtype dtype = Dtype::fp32;
  std::optional<float> scale;  // fp16 / fp8 moments only: value = decode(data) * scale
};

struct ParamGroup {
  std::string name;                                          // e.g. "decay", "no_decay"
  std::vector<std::pair<std::string, torch::Tensor>> params; // (name, model parameter)
  double weight_decay = 0.0;  // applied to this group's params by step(); OptimizerConfig's
                              // weight_decay is the value callers give their "decay" groups
};

class PrecisionAdam {
 public:
  // Validates cfg against the params' dtype (all params share one dtype). Master weights are
  // initialized from the params (remainders start at 0), moments at 0, step counters at 0.
  PrecisionAdam(std::vector<ParamGroup> groups, OptimizerConfig cfg);
  ~PrecisionAdam();
  PrecisionAdam(PrecisionAdam&&) noexcept;
  PrecisionAdam& operator=(PrecisionAdam&&) noexcept;
  PrecisionAdam(const PrecisionAdam&) = delete;             // owns per-param state buffers
  PrecisionAdam& operator=(const PrecisionAdam&) = delete;

  const OptimizerConfig& config() const;
  MasterMode master_mode() const;        // the mode in effect (reported, never silently changed)
  std::string describe() const;          // one line: mode, dtypes

  // --- gradients (main_grad buffers, in main_grads_dtype) ---
  void accumulate_grads();               // main_grad += param.grad for params with a grad; then
                                         // param.grad is reset; marks the param as having a grad
  void zero_grads();                     // main_grad = 0 and "has grad" cleared for every param
  double grad_norm() const;              // global L2 norm of all main grads, accumulated in fp32
  void scale_grads(float coef);          // main_grad *= coef (clipping)
  int64_t count_zeros() const;           // number of zero elements in the main grads
  const torch::Tensor& main_grad(const std::string& param) const;

  // --- the update ---
  // Advances every group's step counter (even for params without a grad, which are skipped),
  // updates the master and moments in fp32 with the FusedAdam op order, re-applies storage, and
  // writes the new model param (bf16 or fp32) in place. Main grads are left as they are (the
  // caller zero_grads() before the next accumulation).
  void step(double lr);

  // --- state access ---
  std::vector<std::string> param_names() const;   // deterministic: group order, then param order
  const torch::Tensor& param(const std::string& name) const;
  size_t num_groups() const;
  const std::string& group_name(size_t g) const;
  size_t group_of(const std::string& param) const;
  int64_t step_count(size_t g) const;
  void set_step_count(size_t g, int64_t step);

  // Upstream get_unscaled_state / set_scaled_state: fp32 values. For master_param in remainder
  // mode the value is the joined fp32 master (bf16 weight + remainder); setting it splits it
  // back into the weight (written into the model param) and the remainder.
  torch::Tensor get_unscaled_state(const std::string& param, StateKey key) const;
  void set_scaled_state(const std::string& param, StateKey key, const torch::Tensor& value);

  // The raw stored representation, for lossless checkpoints. In remainder mode master_param is
  // the int16 remainder (the bf16 half lives in the model param). set_stored checks dtype and
  // shape against what this optimizer holds and throws std::invalid_argument otherwise.
  // set_stored never writes the model param: a restore puts the model's bf16/fp32 weights back
  // bit for bit itself (in remainder mode they are the master's high half).
  const StoredState& stored(const std::string& param, StateKey key) const;
  void set_stored(const std::string& param, StateKey key, const StoredState& s);

 private:
  struct Impl;                  // per-param state, workspaces (precision_adam.cpp)
  std::unique_ptr<Impl> impl_;
};

}  // namespace rh::optim
