// Vectorized (LibTorch) encoders/decoders for the optimizer's storage formats: fp8 E4M3 bytes,
// per-tensor fp16/fp8 scaling, and the bf16-weight + int16-remainder split of an fp32 master.
// Used by PrecisionAdam's step and state accessors; the tests check them against the scalar
// Eigen reference in tests/optim_reference.h. All inputs/outputs are contiguous CPU tensors.
#pragma once
#include <torch/torch.h>

#include <cstdint>

namespace rh::optim::codec {

// Storage ranges: scale = amax(|state|) / range (TransformerEngine FusedAdam).
constexpr float kFp16Range = 32752.0f;  // fp16 max (65504) / 2
constexpr float kFp8Range = 448.0f;     // E4M3 max finite

// The scale an fp16/fp8 moment is stored with: amax / range in fp32. An all-zero tensor (or one
// whose amax/range underflows to 0) gets scale 1.0: any positive scale decodes stored zeros back
// to exactly 0, and 1.0 keeps `state / scale` finite (upstream fp8 would divide 0 by 0 -> NaN
// bytes) and the scale itself an ordinary value a checkpoint can save and validate (> 0).
float scale_from_amax(float amax, float range);
// max |x| over a float tensor (NaN if any element is NaN); 0 for an empty tensor.
float abs_max(const torch::Tensor& x);

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
void fp8_encode_into(const torch::Tensor& x, const torch::Tensor& out, Fp8Scratch& s,
                     bool may_have_nan = true);
// decode: kByte -> kFloat. fp8_decode_into writes decode(codes) * scale into `out` (kFloat, same
// numel) with `scratch` (kInt, same numel) by bit arithmetic, falling back to the table below
// when a NaN code (0x7F / 0xFF) is present; the result is bitwise the table's value * scale.
torch::Tensor fp8_decode(const torch::Tensor& codes);
void fp8_decode_into(const torch::Tensor& codes, const torch::Tensor& out,
                     const torch::Tensor& scratch, float scale);
const torch::Tensor& fp8_decode_table();   // (256,) kFloat, built once from the format's rules

// Scaled storage of a fp32 state in fp16 or fp8: returns the stored tensor, sets `scale`.
torch::Tensor scaled_encode(const torch::Tensor& state, bool fp8, float& scale);
torch::Tensor scaled_decode(const torch::Tensor& stored, bool fp8, float scale);

// Remainder split: master fp32 -> (bf16 weight, int16 remainder). remainder = low 16 bits as
// int16; weight bits = high 16 bits, plus one when the remainder is negative (round to nearest,
// ties away from zero). In int32 arithmetic: r = (int16)bits, w = (int16)((bits - r) / 2^16).
void remainder_split(const torch::Tensor& master, torch::Tensor& weight_bf16,
                     torch::Tensor& remainder_i16);
// Join: bits = int32(weight bits) * 2^16 + int32(remainder), which is the "decrement the weight
// when the remainder is negative, then glue the halves" rule folded into one wrapping add.
torch::Tensor remainder_join(const torch::Tensor& weight_bf16, const torch::Tensor& remainder_i16);

// Allocation-free forms on flat contiguous slices (the optimizer's hot loop): `bits` is kInt
// (the fp32 master's pattern), `scratch` a kInt buffer of the same length.
void remainder_join_into(const torch::Tensor& weight_bf16, const torch::Tensor& remainder_i16,
                         const torch::Tensor& bits);
void remainder_split_into(const torch::Tensor& bits, const torch::Tensor& weight_bf16,
                          const torch::Tensor& remainder_i16, const torch::Tensor& scratch);

}  // namespace rh::optim::codec
