// Global-norm gradient clipping as Megatron computes it with TransformerEngine's kernels.
//
// megatron/core/optimizer/clip_grads.py (NVIDIA/Megatron-LM main d98e8a6, lines 136 and 179-191):
// get_grad_norm_fp32 returns `total_norm.pow(1.0 / norm_type)` as an fp32 tensor (the TE branch:
// multi_tensor_scale_tensor is available), and clip_grad_by_total_norm_fp32 computes
//     clip_coeff = max_norm / (total_norm + 1.0e-6)      # an fp32 tensor
//     clip_coeff.clamp_max_(1.0)
//     multi_tensor_scale_tensor(grads, grads, clip_coeff)
// so every grad is multiplied by the coefficient, which is 1.0 (an exact no-op) unless
// total_norm + 1e-6 exceeds max_norm. The fp32 arithmetic, step by step:
//   - `total_norm + 1.0e-6`: a Python scalar added to an fp32 tensor is an fp32 add of
//     float(1e-6);
//   - `max_norm / tensor` is Tensor.__rtruediv__, which PyTorch implements as
//     `tensor.reciprocal() * max_norm` (torch/_tensor.py __rdiv__): an fp32 reciprocal, then an
//     fp32 multiply by float(max_norm).
// The grads are then scaled only when the coefficient is below 1 (scaling by exactly 1 changes
// no bit, so this is the clamp's effect). The threshold is therefore total_norm + 1e-6 > max_norm
// in fp32, not total_norm > max_norm.
#pragma once

namespace rh::optim {

// The factor the main grads are multiplied by; 1.0f means "leave them alone". max_norm > 0.
// A NaN norm gives a NaN factor, as torch's clamp_max propagates NaN (every grad becomes NaN, as
// upstream); an infinite norm gives 0.
inline float clip_coefficient(float total_norm, double max_norm) {
  volatile float denom = total_norm + 1.0e-6f;   // volatile: one fp32 rounding per step, no FMA
  volatile float recip = 1.0f / denom;
  const float coeff = recip * static_cast<float>(max_norm);
  return coeff >= 1.0f ? 1.0f : coeff;
}

}   // namespace rh::optim
