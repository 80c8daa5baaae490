// How the MoE transformer's parameters are held and how its ops compute (ModelConfig.param_dtype
// and .compute resolved against a device). Every layer goes through these helpers so the choice
// lives in one place.
//
// The choice, and why:
//  - fp32 params: everything runs in fp32.
//  - bf16 params, compute "native": ops run in bf16, as on a GPU. This CPU has no bf16 units, so
//    native bf16 matmuls are ~10x slower than fp32 ones.
//  - bf16 params, compute "fp32": each op casts its bf16 weight to fp32 (autograd through the cast
//    puts a bf16 grad on the bf16 param) and every activation a bf16 model would hold (linear,
//    attention, norm, residual and expert outputs) is rounded to bf16 and kept in an fp32
//    container. That emulates bf16 activations at fp32 matmul speed; it is not bit-equal to native.
//  - "auto" = native on CUDA, fp32 on CPU.
// In every mode the router logits, the softmaxes, the norms' statistics and the losses are fp32.
// Both modes are deterministic: same inputs, same bits.
#pragma once
#include <torch/torch.h>

namespace rh::models {

struct Numerics {
  torch::Dtype param_dtype = torch::kFloat;     // what parameters are held in
  torch::Dtype compute_dtype = torch::kFloat;   // what matmuls run in
  bool round_to_bf16 = false;                   // emulate bf16 activations in fp32 containers

  // A parameter as an op's operand: cast to the compute dtype (no copy when it already is).
  torch::Tensor weight(const torch::Tensor& p) const {
    return p.scalar_type() == compute_dtype ? p : p.to(compute_dtype);
  }
  // An activation as the model holds it between ops: in the compute dtype, rounded to bf16 when
  // emulating. Input may be fp32 (e.g. an fp32 softmax) in any mode.
  torch::Tensor act(const torch::Tensor& x) const {
    if (round_to_bf16) return x.to(torch::kBFloat16).to(torch::kFloat);
    return x.scalar_type() == compute_dtype ? x : x.to(compute_dtype);
  }
  torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w) const {
    return act(torch::linear(x, weight(w)));
  }
  std::string name() const;   // "fp32", "bf16/fp32-compute" or "bf16/native"
};

struct ModelConfig;
// cfg must be valid (validate_config); device picks what "auto" means.
Numerics resolve_numerics(const ModelConfig& cfg, const torch::Device& device);

// Inverted dropout with a mask drawn only from `gen` (on gen's device, then moved to x's), so the
// caller owns the random state. Returns fp32; the caller rounds with Numerics::act. No-op (fp32
// copy of x) when !training or p == 0. Throws std::invalid_argument if a mask is needed but gen is
// null.
torch::Tensor dropout_fp32(const torch::Tensor& x, double p, bool training, torch::Generator* gen);

}   // namespace rh::models
