// The optimizer's options as Megatron names them, the storage dtypes, the master-weight modes and
// the state keys: the values PrecisionAdam is built from and its state is named by, apart from the
// class (optimizer_config.cpp: names, Megatron's validation rules, the mode in effect).
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>

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
  Dtype main_grads_dtype = Dtype::fp32;    // fp32 | bf16
  Dtype main_params_dtype = Dtype::fp32;   // fp32 | fp16
  Dtype exp_avg_dtype = Dtype::fp32;       // fp32 | bf16 | fp16 | fp8
  Dtype exp_avg_sq_dtype = Dtype::fp32;    // fp32 | bf16 | fp16 | fp8
  bool store_param_remainders = true;      // effective only with fp32 master and bf16 params
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;   // default for "decay" groups (ParamGroup::weight_decay
                               // is what step() applies)
  bool adam_w_mode = true;     // false: L2 mode (decay folded into the gradient)
  // Not an upstream option: the guard we would propose to TransformerEngine for fp16/fp8 states
  // whose scale has no finite reciprocal (an all-zero tensor: a dead MoE expert). Off = upstream.
  bool scale_zero_guard = false;
  // Data parallel only. Megatron's param/grad buffer layout (shard_layout.h): --ddp-bucket-size
  // (<= 0: one bucket, upstream's default without --overlap-grad-reduce) and
  // --ddp-pad-buckets-for-high-nccl-busbw. These are DDP options upstream; the harness builds the
  // layout in the optimizer, as DistributedOptimizer._compute_per_buffer_param_layout does.
  int64_t ddp_bucket_size = 0;
  bool ddp_pad_buckets_for_high_nccl_busbw = false;
  // Not an upstream option. Off (upstream): each rank's fp16/fp8 states (moments, fp16 master)
  // are scaled from its own shard's amax, as TE's FusedAdam holding only that shard does. On: a
  // split param's ranks all-reduce the amax and share one scale, so the state is what a single
  // process holds (dp N equals dp 1 bit for bit, and a native checkpoint reshards losslessly).
  bool shared_dp_scale = false;
};

// Refuses the combinations Megatron refuses; throws std::invalid_argument with a clear message.
void validate(const OptimizerConfig& cfg, torch::ScalarType param_dtype);
// The master mode actually in effect for these options and parameter dtype.
MasterMode effective_master_mode(const OptimizerConfig& cfg, torch::ScalarType param_dtype);

enum class StateKey { master_param, exp_avg, exp_avg_sq };
const char* key_name(StateKey k);   // "master_param", "exp_avg", "exp_avg_sq"

}   // namespace rh::optim
