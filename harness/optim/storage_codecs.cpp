// Vectorized storage codecs (see storage_codecs.h). Every routine is a short sequence of
// elementwise LibTorch ops on int32 bit views or fp32 values, each op exactly rounded (or exact),
// so the result is a pure function of the input bits.
#include "harness/optim/storage_codecs.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace rh::optim::codec {
namespace {

// fp32 bit patterns used by the E4M3 encoder.
constexpr int32_t kAbsMask = 0x7FFFFFFF;
constexpr int32_t kExpMask = 0x7F800000;
constexpr int32_t kSignMask = static_cast<int32_t>(0x80000000u);
constexpr int32_t kBitsOne = 0x3F800000;   // 1.0f

void check_float(const torch::Tensor& x, const char* what) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && x.is_contiguous(), what, ": expected a contiguous fp32 tensor, got ",
              x.scalar_type());
}

}   // namespace

namespace {
// A NaN scalar as the GPU computes it (canonical 0x7FFFFFFF, see canonicalize_nan_).
float canon(float f) {
  if (!std::isnan(f)) return f;
  const uint32_t u = 0x7FFFFFFFu;
  std::memcpy(&f, &u, 4);
  return f;
}
}   // namespace

Scaling scaling_from_scale(float scale_in, bool fp8, bool guard) {
  const float scale = canon(scale_in);
  Scaling scaling;
  scaling.scale = scale;
  // 1.0f / scale is IEEE division, correctly rounded: torch's reciprocal on CUDA (no fast-math)
  // and __frcp_rn both round to nearest.
  const float reciprocal = 1.0f / scale;
  const bool unusable = !std::isfinite(reciprocal);   // scale 0 (-> inf) or below 2^-128
  if (fp8) {
    scaling.mult = canon(guard && unusable && !std::isnan(scale) ? 1.0f : reciprocal);   // quantizer.scale = 1/scale
    scaling.scale_inv = canon(1.0f / scaling.mult);                                      // __frcp_rn(quantizer.scale)
  } else {
    scaling.mult = scale > 0.0f && !(guard && unusable) ? reciprocal : 0.0f;   // rscale
    scaling.scale_inv = scale;                                                 // decode multiplies by scale
  }
  return scaling;
}

Scaling make_scaling(float amax, bool fp8, bool guard) {
  // torch.div(absmax, max_range, out=scale): one fp32 division (NaN amax -> NaN scale).
  return scaling_from_scale(amax / (fp8 ? kFp8Range : kFp16Range), fp8, guard);
}

float abs_max(const torch::Tensor& x) {
  if (x.numel() == 0) return 0.0f;
  auto min_max = torch::aminmax(x);
  const float lo = std::get<0>(min_max).item<float>();
  const float hi = std::get<1>(min_max).item<float>();
  if (std::isnan(lo) || std::isnan(hi)) return std::numeric_limits<float>::quiet_NaN();
  return std::max(hi, -lo);
}

bool canonicalize_nan_(const torch::Tensor& x) {
  check_float(x, "canonicalize_nan_");
  auto nan = torch::isnan(x);
  if (!nan.any().item<bool>()) return false;
  x.view(torch::kInt).masked_fill_(nan, static_cast<int32_t>(0x7FFFFFFF));
  return true;
}

void canonical_nan_16_(const torch::Tensor& h, const torch::Tensor& src) {
  auto nan = torch::isnan(src.reshape(h.sizes()));
  if (nan.any().item<bool>()) h.view(torch::kShort).masked_fill_(nan, static_cast<int16_t>(0x7FFF));
}

void Fp8Scratch::ensure(int64_t n) {
  if (!a.defined() || a.numel() < n) {
    a = torch::empty({n}, torch::kInt);
    b = torch::empty({n}, torch::kInt);
  }
}

void fp8_encode_into(const torch::Tensor& x, const torch::Tensor& out, Fp8Scratch& scratch, bool may_have_nan) {
  check_float(x, "fp8_encode");
  const int64_t n = x.numel();
  TORCH_CHECK(out.scalar_type() == torch::kByte && out.numel() == n && out.is_contiguous(),
              "fp8_encode: output must be contiguous kByte with ", n, " elements");
  scratch.ensure(n);
  // Constants as 0-dim tensors: LibTorch 1.13's out= ops with a Scalar operand take a slow
  // path (several times slower than a 0-dim tensor operand); the values are exact either way.
  static const auto kAbs = torch::scalar_tensor(kAbsMask, torch::kInt);
  static const auto kExp = torch::scalar_tensor(kExpMask, torch::kInt);
  static const auto kSign = torch::scalar_tensor(kSignMask, torch::kInt);
  static const auto kOne = torch::scalar_tensor(kBitsOne, torch::kInt);
  static const auto k2p20 = torch::scalar_tensor(std::ldexp(1.0f, 20));
  static const auto k2m120 = torch::scalar_tensor(std::ldexp(1.0f, -120));
  static const auto k64 = torch::scalar_tensor(64.0f);
  auto xi = x.view({-1}).view(torch::kInt);
  torch::Tensor ai = scratch.a.narrow(0, 0, n), bi = scratch.b.narrow(0, 0, n);
  auto af = ai.view(torch::kFloat), bf = bi.view(torch::kFloat);
  // a = |x|, saturated at 448 (+-inf too; NaN is fixed up below).
  at::bitwise_and_out(ai, xi, kAbs);
  at::clamp_max_out(af, af, 448.0);
  // M = max(2^E, 2^-6) * 2^20 for |x| in [2^E, 2^(E+1)): the ulp of a + M is 2^(E-3) (normal
  // E4M3 step: 3 mantissa bits) or 2^-9 (the subnormal step), so the single fp32 rounding of
  // a + M is round-to-nearest-even onto the E4M3 grid, and (a + M) - M is exact.
  at::bitwise_and_out(bi, ai, kExp);
  at::clamp_min_out(bf, bf, std::ldexp(1.0, -6));
  at::mul_out(bf, bf, k2p20);
  at::add_out(af, af, bf);
  at::sub_out(af, af, bf);
  // Code of the E4M3 value r: the fp32 pattern of r * 2^-120 is exactly code << 20 (for codes
  // below 8 it is an fp32 subnormal, which is exact too). int -> fp32 conversion of that pattern
  // is exact (at most 7 significant bits), and so is the scaling by 2^-20.
  at::mul_out(af, af, k2m120);
  // The sign is folded in as code + 64 - 64 * s with s = +-1.0 from x's sign bit (0 or 128).
  // These steps are integer-valued and exact, so a fused multiply-add inside add/sub with an
  // alpha cannot change them.
  bf.copy_(ai);
  at::add_out(bf, k64, bf, std::ldexp(1.0, -20));   // 64 + code
  at::bitwise_and_out(ai, xi, kSign);
  at::bitwise_or_out(ai, ai, kOne);
  at::sub_out(bf, bf, af, 64.0);
  if (may_have_nan) {
    auto nan = torch::isnan(x.view({-1}));
    // 0x7F | sign = 127 + 64 - 64 * s (af still holds s = +-1.0)
    if (nan.any().item<bool>()) bf.copy_(torch::where(nan, 191.0f - af * 64.0f, bf));
  }
  ai.copy_(bf);   // exact small integers; fp32 -> int32 -> uint8 is the fast conversion path
  out.view({-1}).copy_(ai);
}

torch::Tensor fp8_encode(const torch::Tensor& x) {
  auto xc = x.contiguous();
  check_float(xc, "fp8_encode");
  auto out = torch::empty(xc.sizes(), torch::kByte);
  Fp8Scratch scratch;
  fp8_encode_into(xc, out, scratch, true);
  return out;
}

const torch::Tensor& fp8_decode_table() {
  static const torch::Tensor table = [] {
    auto t = torch::empty({256}, torch::kFloat);
    float* values = t.data_ptr<float>();
    for (int c = 0; c < 256; ++c) {
      const int e = (c >> 3) & 0xF;
      const int m = c & 0x7;
      float v;
      if (e == 0xF && m == 0x7) {
        v = std::numeric_limits<float>::quiet_NaN();   // E4M3FN: the only NaN pattern
      } else if (e == 0) {
        v = std::ldexp(static_cast<float>(m), -9);   // subnormal: m * 2^-9
      } else {
        v = std::ldexp(static_cast<float>(8 + m), e - 10);   // (1 + m/8) * 2^(e-7)
      }
      values[c] = (c & 0x80) ? -v : v;
    }
    return t;
  }();
  return table;
}

void fp8_decode_into(const torch::Tensor& codes, const torch::Tensor& out_buf, const torch::Tensor& scratch_buf,
                     float scale) {
  TORCH_CHECK(codes.scalar_type() == torch::kByte, "fp8_decode: expected kByte codes, got ", codes.scalar_type());
  static const auto k7F = torch::scalar_tensor(0x7F, torch::kInt);
  static const auto k80 = torch::scalar_tensor(0x80, torch::kInt);
  static const auto k2p20 = torch::scalar_tensor(1 << 20, torch::kInt);
  static const auto k2p120 = torch::scalar_tensor(std::ldexp(1.0f, 120));
  torch::Tensor out = out_buf, code_bits = scratch_buf;   // out= ops take non-const references
  const auto scale_t = torch::scalar_tensor(scale, torch::kFloat);
  code_bits.copy_(codes.view({-1}));
  torch::Tensor mag = out.view(torch::kInt);
  at::bitwise_and_out(mag, code_bits, k7F);
  if (mag.max().item<int32_t>() == 0x7F) {   // a NaN code: take the table
    at::index_select_out(out, fp8_decode_table(), 0, code_bits);
    at::mul_out(out, out, scale_t);
    return;
  }
  // The fp32 pattern (code & 0x7F) << 20 is decode(code) * 2^-120 (an fp32 subnormal for codes
  // below 8, exactly representable), so one exact multiply by +-2^120 gives the value.
  at::mul_out(mag, mag, k2p20);
  at::bitwise_and_out(code_bits, code_bits, k80);
  auto sign = code_bits.view(torch::kFloat);
  sign.copy_(code_bits);                                   // 0 or 128
  at::sub_out(sign, k2p120, sign, std::ldexp(1.0, 114));   // 2^120 - s * 2^114: +-2^120, exact
  at::mul_out(out, out, sign);
  at::mul_out(out, out, scale_t);   // the one rounding: decode(code) * scale
}

torch::Tensor fp8_decode(const torch::Tensor& codes) {
  auto out = torch::empty(codes.sizes(), torch::kFloat);
  auto scratch = torch::empty({codes.numel()}, torch::kInt);
  fp8_decode_into(codes.contiguous(), out.view({-1}), scratch, 1.0f);
  return out;
}

void encode_scaled_into(const torch::Tensor& x, const torch::Tensor& out, bool fp8, const Scaling& scaling,
                        const torch::Tensor& q_buf, Fp8Scratch& scratch, bool may_have_nan) {
  torch::Tensor q = q_buf;   // out= ops take non-const references
  // x * mult: one fp32 multiply (the kernel's `temp * s`, fp16's unscaled_state.mul_(rscale)).
  // NaN appears only from NaN/inf inputs or a non-finite / zero multiplier (0 * inf, inf * 0).
  at::mul_out(q, x.view({-1}), torch::scalar_tensor(scaling.mult, torch::kFloat));
  const bool nan_possible = may_have_nan || !std::isfinite(scaling.mult) || scaling.mult == 0.0f;
  if (nan_possible) canonicalize_nan_(q);
  if (fp8) {
    fp8_encode_into(q, out, scratch, nan_possible);   // canonical NaN has sign 0: code 0x7F
  } else {
    out.view({-1}).copy_(q);   // RNE to fp16 (|q| <= ~32752: no overflow)
    if (nan_possible) canonical_nan_16_(out.view({-1}), q);
  }
}

torch::Tensor scaled_encode(const torch::Tensor& state, bool fp8, bool guard, Scaling& scaling) {
  auto x = state.to(torch::kFloat).contiguous();
  const float amax = abs_max(x);
  scaling = make_scaling(amax, fp8, guard);
  auto out = torch::empty(x.sizes(), fp8 ? torch::kByte : torch::kHalf);
  auto q = torch::empty({x.numel()}, torch::kFloat);
  Fp8Scratch scratch;
  encode_scaled_into(x, out, fp8, scaling, q, scratch, !std::isfinite(amax));
  return out;
}

torch::Tensor scaled_decode(const torch::Tensor& stored, bool fp8, float decode_mult) {
  auto decoded = fp8 ? fp8_decode(stored) : stored.to(torch::kFloat);
  auto out = torch::mul(decoded, torch::scalar_tensor(decode_mult, torch::kFloat)).contiguous();
  canonicalize_nan_(out);
  return out;
}

void remainder_join_into(const torch::Tensor& weight_bf16, const torch::Tensor& remainder_i16,
                         const torch::Tensor& bits_out) {
  torch::Tensor bits = bits_out;   // out= ops take non-const references
  static const auto k2p16 = torch::scalar_tensor(65536, torch::kInt);
  bits.copy_(weight_bf16.view(torch::kShort));   // sign-extending: the weight's high half
  at::mul_out(bits, bits, k2p16);                // exact: |w| * 2^16 < 2^31
  at::add_out(bits, bits, remainder_i16);        // the one wrapping add of the rule
}

void remainder_split_into(const torch::Tensor& bits, const torch::Tensor& weight_bf16,
                          const torch::Tensor& remainder_i16, const torch::Tensor& scratch_buf) {
  torch::Tensor scratch = scratch_buf;   // out= ops take non-const references
  static const auto k2m16 = torch::scalar_tensor(std::ldexp(1.0f, -16));
  remainder_i16.copy_(bits);                   // int32 -> int16 keeps the low half (wrapping)
  at::sub_out(scratch, bits, remainder_i16);   // (w << 16): low half cleared, +1 if r < 0
  // Divide by 2^16 through fp32 (LibTorch 1.13's integer shifts are not vectorized): a multiple
  // of 2^16 with at most 16 significant bits converts exactly, and the scaling is exact.
  auto f = scratch.view(torch::kFloat);
  f.copy_(scratch);
  at::mul_out(f, f, k2m16);
  scratch.copy_(f);
  weight_bf16.view(torch::kShort).copy_(scratch);   // 32768 (from NaN 0x7FFF + 1) wraps
}

void remainder_split(const torch::Tensor& master, torch::Tensor& weight_bf16, torch::Tensor& remainder_i16) {
  check_float(master, "remainder_split");
  weight_bf16 = torch::empty(master.sizes(), torch::kBFloat16);
  remainder_i16 = torch::empty(master.sizes(), torch::kShort);
  auto scratch = torch::empty({master.numel()}, torch::kInt);
  remainder_split_into(master.view({-1}).view(torch::kInt), weight_bf16.view({-1}), remainder_i16.view({-1}), scratch);
}

torch::Tensor remainder_join(const torch::Tensor& weight_bf16, const torch::Tensor& remainder_i16) {
  TORCH_CHECK(weight_bf16.scalar_type() == torch::kBFloat16 && remainder_i16.scalar_type() == torch::kShort &&
                  weight_bf16.sizes() == remainder_i16.sizes(),
              "remainder_join: expected bf16 weight and int16 remainder of one shape, got ", weight_bf16.scalar_type(),
              weight_bf16.sizes(), " and ", remainder_i16.scalar_type(), remainder_i16.sizes());
  auto bits = torch::empty(weight_bf16.sizes(), torch::kInt);
  remainder_join_into(weight_bf16.contiguous().view({-1}), remainder_i16.contiguous().view({-1}), bits.view({-1}));
  return bits.view(torch::kFloat);
}

}   // namespace rh::optim::codec
