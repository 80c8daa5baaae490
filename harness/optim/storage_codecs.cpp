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
constexpr int32_t kBits448 = 0x43E00000;      // 448.0f: every |x| above saturates here
constexpr int32_t kBitsMinNormal = 0x3C800000;  // 2^-6, smallest normal E4M3 magnitude
constexpr int32_t kBitsMagic = 0x46800000;    // 16384.0f: its ulp is 2^-9, the subnormal step
// Re-biasing a rounded fp32 pattern (top 12 bits = exponent + 3 mantissa bits) to E4M3:
// (127 - 7) << 3 = 960.
constexpr int32_t kRebias = 960;

void check_float(const torch::Tensor& x, const char* what) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && x.is_contiguous(), what,
              ": expected a contiguous fp32 tensor, got ", x.scalar_type());
}

}  // namespace

float scale_from_amax(float amax, float range) {
  const float s = amax / range;
  return s > 0.0f || std::isnan(s) ? s : 1.0f;   // zero (or underflowed) amax: see header
}

float abs_max(const torch::Tensor& x) {
  if (x.numel() == 0) return 0.0f;
  auto mm = torch::aminmax(x);
  const float lo = std::get<0>(mm).item<float>();
  const float hi = std::get<1>(mm).item<float>();
  if (std::isnan(lo) || std::isnan(hi)) return std::numeric_limits<float>::quiet_NaN();
  return std::max(hi, -lo);
}

void Fp8Scratch::ensure(int64_t n) {
  if (!a.defined() || a.numel() < n) {
    a = torch::empty({n}, torch::kInt);
    b = torch::empty({n}, torch::kInt);
    mask = torch::empty({n}, torch::kBool);
  }
}

void fp8_encode_into(const torch::Tensor& x, const torch::Tensor& out, Fp8Scratch& s,
                     bool may_have_nan) {
  check_float(x, "fp8_encode");
  const int64_t n = x.numel();
  TORCH_CHECK(out.scalar_type() == torch::kByte && out.numel() == n && out.is_contiguous(),
              "fp8_encode: output must be contiguous kByte with ", n, " elements");
  s.ensure(n);
  auto xi = x.view({-1}).view(torch::kInt);
  auto a = s.a.narrow(0, 0, n);
  auto b = s.b.narrow(0, 0, n);
  auto mask = s.mask.narrow(0, 0, n);
  // |x| as bits, saturated at 448 (this also maps +-inf and NaN patterns to 448; NaN is fixed
  // up at the end).
  at::bitwise_and_out(a, xi, kAbsMask);
  at::clamp_max_out(a, a, kBits448);
  at::lt_out(mask, a, kBitsMinNormal);
  // Normal codes: round the fp32 pattern to 3 mantissa bits (nearest, ties to even: add
  // 0x7FFFF plus the lowest kept bit), then re-bias the exponent. A carry into the exponent is
  // the correct next binade.
  at::bitwise_right_shift_out(b, a, 20);
  at::bitwise_and_out(b, b, 1);
  at::add_out(b, b, a);
  at::add_out(b, b, 0x7FFFF);
  at::bitwise_right_shift_out(b, b, 20);
  at::sub_out(b, b, kRebias);
  // Subnormal codes (|x| < 2^-6, step 2^-9): one fp32 add of 16384 rounds |x| to a multiple of
  // 2^-9 (nearest, ties to even, a single rounding of the exact sum); the code is the pattern
  // difference. Yields 8 (= code of 2^-6) when rounding reaches the normal range.
  auto af = a.view(torch::kFloat);
  at::add_out(af, af, 16384.0);
  at::sub_out(a, a, kBitsMagic);
  at::where_out(a, mask, a, b);
  if (may_have_nan) {
    at::ne_out(mask, x.view({-1}), x.view({-1}));
    a.masked_fill_(mask, 0x7F);
  }
  // Sign bit 31 -> bit 7 (arithmetic shift keeps it; the mask drops the rest).
  at::bitwise_right_shift_out(b, xi, 24);
  at::bitwise_and_out(b, b, 0x80);
  at::bitwise_or_out(a, a, b);
  out.view({-1}).copy_(a);
}

torch::Tensor fp8_encode(const torch::Tensor& x) {
  auto xc = x.contiguous();
  check_float(xc, "fp8_encode");
  auto out = torch::empty(xc.sizes(), torch::kByte);
  Fp8Scratch s;
  fp8_encode_into(xc, out, s, true);
  return out;
}

const torch::Tensor& fp8_decode_table() {
  static const torch::Tensor table = [] {
    auto t = torch::empty({256}, torch::kFloat);
    float* p = t.data_ptr<float>();
    for (int c = 0; c < 256; ++c) {
      const int e = (c >> 3) & 0xF;
      const int m = c & 0x7;
      float v;
      if (e == 0xF && m == 0x7) {
        v = std::numeric_limits<float>::quiet_NaN();   // E4M3FN: the only NaN pattern
      } else if (e == 0) {
        v = std::ldexp(static_cast<float>(m), -9);        // subnormal: m * 2^-9
      } else {
        v = std::ldexp(static_cast<float>(8 + m), e - 10);  // (1 + m/8) * 2^(e-7)
      }
      p[c] = (c & 0x80) ? -v : v;
    }
    return t;
  }();
  return table;
}

torch::Tensor fp8_decode(const torch::Tensor& codes) {
  TORCH_CHECK(codes.scalar_type() == torch::kByte, "fp8_decode: expected kByte codes, got ",
              codes.scalar_type());
  auto idx = codes.reshape({-1}).to(torch::kInt);
  return torch::index_select(fp8_decode_table(), 0, idx).view(codes.sizes());
}

torch::Tensor scaled_encode(const torch::Tensor& state, bool fp8, float& scale) {
  auto x = state.to(torch::kFloat).contiguous();
  const float am = abs_max(x);
  scale = scale_from_amax(am, fp8 ? kFp8Range : kFp16Range);
  auto q = torch::div(x, static_cast<double>(scale));
  if (!fp8) return q.to(torch::kHalf);
  auto out = torch::empty(q.sizes(), torch::kByte);
  Fp8Scratch s;
  fp8_encode_into(q, out, s, !std::isfinite(am));
  return out;
}

torch::Tensor scaled_decode(const torch::Tensor& stored, bool fp8, float scale) {
  auto v = fp8 ? fp8_decode(stored) : stored.to(torch::kFloat);
  return torch::mul(v, static_cast<double>(scale));
}

void remainder_split(const torch::Tensor& master, torch::Tensor& weight_bf16,
                     torch::Tensor& remainder_i16) {
  check_float(master, "remainder_split");
  auto bits = master.view({-1}).view(torch::kInt);
  auto r = bits.to(torch::kShort);                     // low half, wrapping: signed int16
  auto hi = torch::sub(bits, r);                       // low half cleared, +1 in the high half
  at::bitwise_right_shift_out(hi, hi, 16);             // when r < 0 (ties away from zero)
  weight_bf16 = hi.to(torch::kShort).view(torch::kBFloat16).view(master.sizes());
  remainder_i16 = r.view(master.sizes());
}

torch::Tensor remainder_join(const torch::Tensor& weight_bf16, const torch::Tensor& remainder_i16) {
  TORCH_CHECK(weight_bf16.scalar_type() == torch::kBFloat16 &&
                  remainder_i16.scalar_type() == torch::kShort &&
                  weight_bf16.sizes() == remainder_i16.sizes(),
              "remainder_join: expected bf16 weight and int16 remainder of one shape, got ",
              weight_bf16.scalar_type(), weight_bf16.sizes(), " and ",
              remainder_i16.scalar_type(), remainder_i16.sizes());
  auto w = weight_bf16.contiguous().view(torch::kShort).to(torch::kInt);
  at::bitwise_left_shift_out(w, w, 16);
  at::add_out(w, w, remainder_i16.contiguous());
  return w.view(torch::kFloat);
}

}  // namespace rh::optim::codec
