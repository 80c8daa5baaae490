// Internal to the optimizer room: per-parameter state as PrecisionAdam holds it, and the chunked
// fp32 Adam update over it (adam_step.cpp). Not part of the public API.
#pragma once
#include <torch/torch.h>

#include <string>

#include "harness/optim/precision_adam.h"
#include "harness/optim/storage_codecs.h"

namespace rh::optim::detail {

struct ParamState {
  std::string name;
  size_t group = 0;
  torch::Tensor param;       // the model parameter (shares storage with the model), (N...)
  StoredState master;        // fp32 / fp16 master, or the int16 remainder
  StoredState exp_avg;       // fp32 | bf16 | fp16+scale | fp8 bytes+scale
  StoredState exp_avg_sq;
  torch::Tensor main_grad;   // fp32 or bf16, shape of param
  bool has_grad = false;
};

// The scalars of one step, each already rounded to fp32 exactly as the kernel uses them.
struct StepScalars {
  float beta1, one_minus_beta1;   // one_minus = 1.0f - beta1 in fp32, as the TE kernel computes
  float beta2, one_minus_beta2;
  float bc1, bc2;                 // 1 - beta^t evaluated in double, then rounded to fp32
  float eps, weight_decay, lr;
  bool adam_w_mode;
};
StepScalars make_step_scalars(const OptimizerConfig& cfg, double group_weight_decay, double lr,
                              int64_t step);

// Chunk buffers reused across params and steps; the full-length buffers hold the new fp32
// fp16/fp8 moments until their scale (amax of the whole tensor) is known.
struct Workspace {
  int64_t chunk = 0;
  torch::Tensor p, g, m, v, t1, t2;   // (chunk,) kFloat
  torch::Tensor bits;                 // (chunk,) kInt: the joined master's bits (remainders)
  torch::Tensor idx;                  // (chunk,) kInt: fp8 decode-table index
  codec::Fp8Scratch fp8;
  torch::Tensor m_full, v_full;       // (max N,) kFloat
  void ensure(int64_t chunk_elems, int64_t full_elems);
};

// One Adam update of one parameter in place (master, moments, model param), in fp32 with the op
// order documented in adam_step.cpp.
void adam_update(ParamState& ps, MasterMode mode, const StepScalars& k, Workspace& ws);

}  // namespace rh::optim::detail
