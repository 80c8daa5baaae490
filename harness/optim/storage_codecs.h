// Vectorized (LibTorch) encoders/decoders for the optimizer's storage formats: fp8 E4M3 bytes,
// per-tensor fp16/fp8 scaling, and the bf16-weight + int16-remainder split of an fp32 master.
// Used by PrecisionAdam's step and state accessors; the tests check them against the scalar
// Eigen reference in tests/optim_reference.h. All inputs/outputs are contiguous CPU tensors.
#pragma once
#include <torch/torch.h>

#include <cstdint>

namespace rh::optim::codec {

// Storage ranges: scale = amax(|state|) / range (TransformerEngine FusedAdam: `dtype_to_range_map`
// in transformer_engine/pytorch/optimizers/fused_adam.py, FusedAdam.__init__).
constexpr float kFp16Range = 32752.0f;   // torch.finfo(torch.float16).max / 2
constexpr float kFp8Range = 448.0f;      // E4M3 max finite

// One tensor's scaling exactly as TE's FusedAdam._apply_scale leaves it (fused_adam.py @d0067d0):
//   scale = amax / range                      (torch.div(absmax, max_range, out=scale); fp32)
//   fp16: rscale = scale > 0 ? 1/scale : 0    (torch.where(scale > 0, scale.reciprocal(), 0.0))
//         code = fp16(x * rscale); decode = float(code) * scale        (get_unscaled_state)
//   fp8:  quantizer.scale = 1/scale           (inf for an all-zero tensor: no guard upstream)
//         code = e4m3_satfinite(x * quantizer.scale)  (common/util/vectorized_pointwise.h,
//                unary_kernel: `temp = temp * s`, cast through __nv_fp8_e4m3 = SATFINITE)
//         scale_inv = __frcp_rn(quantizer.scale)       (common/utils.cuh, reciprocal<float>)
//         decode = float(code) * scale_inv            (common/util/dequantize_fp8.cuh)
// So an all-zero fp16 tensor stores zeros with scale 0 (decodes to 0), and an all-zero fp8 tensor
// stores 0 * inf = NaN codes (0x7F) with scale_inv = 0: it decodes to NaN.
// `guard` (scenario option scale_zero_guard) is the fix we would propose upstream: when 1/scale
// is not finite (scale 0, or subnormal below 2^-128) fp8 quantizes with scale 1 (zeros stay zero,
// scale_inv 1) and fp16 uses rscale 0 (upstream's own zero rule, extended to tiny scales).
struct Scaling {
  float scale = 1.0f;       // TE's self._scales[param][name]
  float mult = 1.0f;        // what encode multiplies by: fp16 rscale, fp8 quantizer scale
  float scale_inv = 1.0f;   // what decode multiplies by: fp16 `scale`, fp8 `_scale_inv`
};
Scaling make_scaling(float amax, bool fp8, bool guard);
// The scaling a stored `scale` implies (what set_scaled_state would derive from it): fp8's
// scale_inv = frcp(1/scale) (guarded as above). A checkpoint's (scale, scale_inv) pair must match.
Scaling scaling_from_scale(float scale, bool fp8, bool guard);
// TE's fresh state (FusedAdam._initialize_state): scale 1, quantizer scale 1, scale_inv 1.
inline Scaling initial_scaling() { return {}; }

// The fp32 value of a moment's whole fp16/fp8 tensor, or NaN when any element is NaN (aminmax and
// torch.maximum propagate NaN); 0 for an empty tensor.
float abs_max(const torch::Tensor& x);

// NaN results of fp32 arithmetic on the GPU are the canonical NaN 0x7FFFFFFF (PTX ISA: NaN results
// are canonical), and its casts give bf16 / fp16 0x7FFF (cuda_bf16.hpp / cuda_fp16.hpp,
// __float2bfloat16 / __float2half) and E4M3 0x7F (cuda_fp8.hpp, sign of the canonical NaN is 0).
// The CPU keeps NaN payloads and signs (x86: 0 * inf = 0xFFC00000), so every value the emulated
// kernel produces is canonicalized where a NaN can appear. In place on a kFloat tensor; returns
// whether it held a NaN.
bool canonicalize_nan_(const torch::Tensor& x);
// Writes 0x7FFF into every element of a bf16/fp16 tensor `h` whose fp32 source `src` is NaN.
void canonical_nan_16_(const torch::Tensor& h, const torch::Tensor& src);

// E4M3 (the "FN" variant: no infinities; 0x7F/0xFF are NaN; max finite 448).
// encode: round to nearest, ties to even; |x| > 448 (and +-inf) saturates to +-448; NaN -> 0x7F
// with the sign bit of the input. `x` is kFloat, result kByte of the same shape.
torch::Tensor fp8_encode(const torch::Tensor& x);
// Scratch buffers for the allocation-free encode; grown on demand, reused across calls.
struct Fp8Scratch {
  torch::Tensor a, b;   // (n,) kInt
  void ensure(int64_t n);
};
// Writes fp8_encode(x) into `out` (kByte, same numel): the form the optimizer's hot loop uses.
// `may_have_nan` = false skips the NaN fix-up (callers that know x is NaN-free, e.g. because
// its amax is finite); the result is identical whenever x really has no NaN.
void fp8_encode_into(const torch::Tensor& x, const torch::Tensor& out, Fp8Scratch& scratch, bool may_have_nan = true);
// decode: kByte -> kFloat. fp8_decode_into writes decode(codes) * scale into `out` (kFloat, same
// numel) with `scratch` (kInt, same numel) by bit arithmetic, falling back to the table below
// when a NaN code (0x7F / 0xFF) is present; the result is bitwise the table's value * scale.
torch::Tensor fp8_decode(const torch::Tensor& codes);
void fp8_decode_into(const torch::Tensor& codes, const torch::Tensor& out, const torch::Tensor& scratch, float scale);
const torch::Tensor& fp8_decode_table();   // (256,) kFloat, built once from the format's rules

// Scaled storage of an fp32 state in fp16 or fp8 (TE _apply_scale): returns the stored tensor and
// sets `scaling` from the whole tensor's amax. `encode_scaled_into` encodes with a given scaling.
torch::Tensor scaled_encode(const torch::Tensor& state, bool fp8, bool guard, Scaling& scaling);
// `q_buf`: a kFloat scratch of x's numel; `out`: kHalf or kByte of x's numel.
void encode_scaled_into(const torch::Tensor& x, const torch::Tensor& out, bool fp8, const Scaling& scaling,
                        const torch::Tensor& q_buf, Fp8Scratch& scratch, bool may_have_nan);
// decode(code) * decode_mult (fp16: `scale`, fp8: `scale_inv`), NaNs canonical.
torch::Tensor scaled_decode(const torch::Tensor& stored, bool fp8, float decode_mult);

// Remainder split: master fp32 -> (bf16 weight, int16 remainder). remainder = low 16 bits as
// int16; weight bits = high 16 bits, plus one when the remainder is negative (round to nearest,
// ties away from zero). In int32 arithmetic: r = (int16)bits, w = (int16)((bits - r) / 2^16).
void remainder_split(const torch::Tensor& master, torch::Tensor& weight_bf16, torch::Tensor& remainder_i16);
// Join: bits = int32(weight bits) * 2^16 + int32(remainder), which is the "decrement the weight
// when the remainder is negative, then glue the halves" rule folded into one wrapping add.
torch::Tensor remainder_join(const torch::Tensor& weight_bf16, const torch::Tensor& remainder_i16);

// Allocation-free forms on flat contiguous slices (the optimizer's hot loop): `bits` is kInt
// (the fp32 master's pattern), `scratch` a kInt buffer of the same length.
void remainder_join_into(const torch::Tensor& weight_bf16, const torch::Tensor& remainder_i16,
                         const torch::Tensor& bits);
void remainder_split_into(const torch::Tensor& bits, const torch::Tensor& weight_bf16,
                          const torch::Tensor& remainder_i16, const torch::Tensor& scratch);

}   // namespace rh::optim::codec
