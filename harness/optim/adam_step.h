// Internal to the optimizer room: per-parameter state as PrecisionAdam holds it, and the chunked
// fp32 Adam update over it (adam_step.cpp). Not part of the public API.
#pragma once
#include <torch/torch.h>

#include <string>

#include "harness/optim/optimizer_config.h"
#include "harness/optim/storage_codecs.h"
#include "harness/optim/stored_state.h"

namespace rh::optim::detail {

struct ParamState {
  std::string name;
  size_t group = 0;
  torch::Tensor param;          // the model parameter (shares storage with the model), (N...)
  int64_t begin = 0, end = 0;   // the part of the param this rank owns (ShardLayout::piece); the
                                // states below hold only that part: param-shaped when it is the
                                // whole param, else 1-D of end - begin elements
  StoredState master;           // fp32 / fp16 master, or the int16 remainder
  StoredState exp_avg;          // fp32 | bf16 | fp16+scale | fp8 bytes+scale
  StoredState exp_avg_sq;
  torch::Tensor main_grad;   // fp32 or bf16, shape of param (the whole param on every rank)
  bool has_grad = false;
};

// fp16/fp8 states carry a scale (moments, and an fp16 master: TE's _apply_scale scales every
// state that is neither fp32 nor bf16, master_param included).
inline bool is_scaled(Dtype d) { return d == Dtype::fp16 || d == Dtype::fp8; }

// The scalars of one step, each already rounded to fp32 exactly as the kernel uses them.
struct StepScalars {
  float beta1, one_minus_beta1;   // one_minus = 1.0f - beta1 in fp32, as the TE kernel computes
  float beta2, one_minus_beta2;
  float bc1, bc2;   // TE (adam.cu, multi_tensor_adam*_cuda): `1 - std::pow(beta1,
                    // step)` with `const float beta1`, int step: pow(double, double)
                    // of the fp32 beta, 1 - in double, one rounding to fp32
  float eps, weight_decay, lr;
  bool adam_w_mode;
  bool scale_zero_guard;
};
StepScalars make_step_scalars(const OptimizerConfig& cfg, double group_weight_decay, double lr, int64_t step);

// Chunk buffers reused across params and steps; the full-length buffers hold the new fp32
// fp16/fp8 moments until their scale (amax of the whole tensor) is known.
struct Workspace {
  int64_t chunk = 0;
  torch::Tensor p, g, m, v, t1, t2;   // (chunk,) kFloat
  torch::Tensor bits;                 // (chunk,) kInt: the joined master's bits (remainders)
  torch::Tensor idx;                  // (chunk,) kInt: fp8 decode-table index
  codec::Fp8Scratch fp8;
  torch::Tensor m_full, v_full, p_full;   // (max N,) kFloat
  void ensure(int64_t chunk_elems, int64_t full_elems);
};

// Only with OptimizerConfig::shared_dp_scale (not upstream): a split parameter's fp16/fp8 states
// cannot be stored until the amax over every rank's piece is known, so adam_update leaves the new
// fp32 values here with this piece's amax, and store_scaled encodes them once the group has
// agreed on the amax (all-reduce max). By default (upstream) each piece is scaled by its own amax
// at once, as TE's FusedAdam holding only that shard does.
struct Deferred {
  torch::Tensor m_full, v_full, p_full;                // (end - begin,) kFloat, owned by this struct
  float m_amax = 0.0f, v_amax = 0.0f, p_amax = 0.0f;   // p: an fp16 master
};

// One Adam update of the owned part of one parameter in place (master, moments, model param), in
// fp32 with the op order documented in adam_step.cpp. With `defer`, scaled moments are left in it
// instead of being stored.
void adam_update(ParamState& param_state, MasterMode mode, const StepScalars& scalars, Workspace& ws,
                 Deferred* defer = nullptr);
// Scale from `amax` (TE _apply_scale), then encode `full` (kFloat, state's numel) into state chunk by
// chunk.
void store_scaled(StoredState& state, const torch::Tensor& full, float amax, bool guard, Workspace& ws);

}   // namespace rh::optim::detail
