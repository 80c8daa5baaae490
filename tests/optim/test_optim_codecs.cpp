// Storage codecs of the precision-aware Adam, exhaustively where the domain allows: remainder
// split/join over every bf16 high half, every E4M3 code and midpoint, bf16 rounding, the scale
// rule. The LibTorch codecs (harness/optim/storage_codecs.h) are checked against the format's
// definition and against the independent scalar reference (tests/optim_reference.h).
#include <gtest/gtest.h>

#include <cstring>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "harness/optim/storage_codecs.h"
#include "tests/optim_test_util.h"
#include "tests/optim_reference.h"

namespace codec = rh::optim::codec;
namespace ref = rh::optim_ref;

namespace {


torch::Tensor floats_from_bits(const std::vector<uint32_t>& bits) {
  auto t = torch::empty({static_cast<int64_t>(bits.size())}, torch::kInt);
  std::memcpy(t.data_ptr<int32_t>(), bits.data(), bits.size() * 4);
  return t.view(torch::kFloat);
}

// --- remainders ---------------------------------------------------------------------------
// Every bf16 high half with representative low halves: 0, 1, the largest below the tie, the
// exact tie 0x8000 (every high half has one), just above it, and the largest.
const uint32_t kLows[] = {0x0000, 0x0001, 0x1234, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF};

TEST(Remainder, SplitJoinExhaustiveOverHighHalves) {
  std::vector<uint32_t> bits;
  for (uint32_t hi = 0; hi < 0x10000; ++hi)
    for (uint32_t lo : kLows) bits.push_back((hi << 16) | lo);
  auto x = floats_from_bits(bits);
  torch::Tensor w, r;
  codec::remainder_split(x, w, r);
  auto joined = codec::remainder_join(w, r);
  const int16_t* wp = reinterpret_cast<const int16_t*>(w.data_ptr());
  const int16_t* rp = r.data_ptr<int16_t>();
  const uint32_t* jp = reinterpret_cast<const uint32_t*>(joined.data_ptr());
  int64_t finite = 0, ties = 0;
  for (size_t i = 0; i < bits.size(); ++i) {
    uint16_t rw;
    int16_t rr;
    ref::split(ref::u2f(bits[i]), rw, rr);
    ASSERT_EQ(static_cast<uint16_t>(wp[i]), rw) << "weight of bits 0x" << std::hex << bits[i];
    ASSERT_EQ(rp[i], rr) << "remainder of bits 0x" << std::hex << bits[i];
    // The round trip is bitwise for every pattern (NaN payloads included).
    ASSERT_EQ(jp[i], bits[i]) << "join(split(x)) of bits 0x" << std::hex << bits[i];
    ASSERT_EQ(ref::f2u(ref::join(rw, rr)), bits[i]) << "reference join, bits 0x" << std::hex << bits[i];
    const float f = ref::u2f(bits[i]);
    if (std::isfinite(f)) {
      ++finite;
      // Round to nearest, ties away from zero (differs from RNE only on exact ties).
      ASSERT_EQ(rw, ref::bf16_ties_away(f)) << "ties-away weight, bits 0x" << std::hex << bits[i];
      if ((bits[i] & 0xFFFF) == 0x8000) {
        ++ties;
        ASSERT_GT(std::fabs(ref::bf16_to_f(rw)), std::fabs(f)) << "tie must round away from 0";
      } else if ((bits[i] & 0xFFFF) != 0) {
        // Off a tie the weight is the nearest bf16, which is also what RNE gives.
        ASSERT_EQ(rw, ref::bf16_rne(f)) << "bits 0x" << std::hex << bits[i];
      }
    }
  }
  EXPECT_EQ(ties, 0x10000 - 2 * 0x80);   // all ties except the inf/NaN high halves
  EXPECT_GT(finite, 500000);
}

TEST(Remainder, ZeroRemainderJoinsToTheWeight) {
  auto w = torch::randn({1000}).to(torch::kBFloat16);
  auto j = codec::remainder_join(w, torch::zeros({1000}, torch::kShort));
  EXPECT_TRUE(torch::equal(j, w.to(torch::kFloat)));
}

// --- fp8 E4M3 -----------------------------------------------------------------------------
TEST(Fp8, AllCodesDecodeAsTheFormatDefines) {
  auto codes = torch::arange(256, torch::kInt).to(torch::kByte);
  auto dec = codec::fp8_decode(codes);
  const float* d = dec.data_ptr<float>();
  for (int c = 0; c < 256; ++c) {
    const float want = ref::e4m3_decode(static_cast<uint8_t>(c));
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(d[c])) << "code " << c << " is NaN in E4M3FN";
      continue;
    }
    EXPECT_FALSE(std::isinf(d[c])) << "E4M3FN has no infinities, code " << c;
    EXPECT_EQ(ref::f2u(d[c]), ref::f2u(want)) << "code 0x" << std::hex << c;
  }
  // Spot values from the format's definition.
  EXPECT_EQ(d[0x7E], 448.0f);
  EXPECT_EQ(d[0xFE], -448.0f);
  EXPECT_EQ(d[0x08], std::ldexp(1.0f, -6));   // smallest normal
  EXPECT_EQ(d[0x01], std::ldexp(1.0f, -9));   // smallest subnormal
  EXPECT_EQ(d[0x38], 1.0f);
  EXPECT_TRUE(std::signbit(d[0x80]) && d[0x80] == 0.0f);
}

// The optimizer decodes by bit arithmetic unless a NaN code is present; both paths must give
// the table's value times the scale, bit for bit.
TEST(Fp8, DecodeIntoMatchesTableTimesScaleOnBothPaths) {
  for (bool with_nan : {false, true}) {
    std::vector<int> cs;
    for (int rep = 0; rep < 3; ++rep)
      for (int c = 0; c < 256; ++c)
        if (with_nan || (c & 0x7F) != 0x7F) cs.push_back(c);
    auto codes = torch::tensor(cs, torch::kInt).to(torch::kByte);
    const float scale = 0.3712f;
    auto out = torch::empty({codes.numel()});
    codec::fp8_decode_into(codes, out, torch::empty({codes.numel()}, torch::kInt), scale);
    for (size_t i = 0; i < cs.size(); ++i) {
      const float want = codec::fp8_decode_table()[cs[i]].item<float>() * scale;
      const float got = out[i].item<float>();
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << "code " << cs[i];
      } else {
        EXPECT_EQ(ref::f2u(got), ref::f2u(want)) << "code 0x" << std::hex << cs[i];
      }
    }
  }
}

TEST(Fp8, EncodeOfDecodeIsIdentityOnFiniteCodes) {
  std::vector<float> vals;
  std::vector<int> cs;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7F) != 0x7F) vals.push_back(ref::e4m3_decode(c)), cs.push_back(c);
  auto enc = codec::fp8_encode(torch::tensor(vals));
  for (size_t i = 0; i < cs.size(); ++i) {
    EXPECT_EQ(enc[i].item<int>(), cs[i]) << "value " << vals[i];
    EXPECT_EQ(ref::e4m3_encode(vals[i]), cs[i]) << "reference, value " << vals[i];
  }
}

TEST(Fp8, MidpointsRoundToEvenAndNeighboursToNearest) {
  std::vector<float> x;
  std::vector<int> want;
  for (int c = 0; c < 0x7E; ++c) {   // consecutive positive codes c, c+1
    const double lo = ref::e4m3_decode(c), hi = ref::e4m3_decode(c + 1);
    const float mid = static_cast<float>((lo + hi) / 2);   // exact in fp32
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const int even = (c % 2 == 0) ? c : c + 1;
    for (float s : {1.0f, -1.0f}) {
      const int sign = s < 0 ? 0x80 : 0;
      x.push_back(s * mid), want.push_back(even | sign);
      x.push_back(s * std::nextafter(mid, 0.0f)), want.push_back(c | sign);
      x.push_back(s * std::nextafter(mid, 1000.0f)), want.push_back((c + 1) | sign);
    }
  }
  auto enc = codec::fp8_encode(torch::tensor(x));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(enc[i].item<int>(), want[i]) << "x = " << x[i];
    ASSERT_EQ(ref::e4m3_encode(x[i]), want[i]) << "reference, x = " << x[i];
  }
}

TEST(Fp8, SaturatesAndMapsNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {448.0f,
                          463.9f,
                          464.0f,
                          465.0f,
                          1e6f,
                          3e38f,
                          inf,
                          -464.0f,
                          -inf,
                          nan,
                          -nan,
                          1e-30f,
                          -1e-30f,
                          std::ldexp(1.0f, -10),
                          std::ldexp(1.0f, -10) * 1.0001f};
  std::vector<int> want = {0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE, 0x7F, 0xFF, 0x00, 0x80, 0x00, 0x01};
  auto enc = codec::fp8_encode(torch::tensor(x));
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(enc[i].item<int>(), want[i]) << "x = " << x[i];
    EXPECT_EQ(ref::e4m3_encode(x[i]), want[i]) << "reference, x = " << x[i];
  }
}

TEST(Fp8, RandomValuesMatchTheReference) {
  torch::manual_seed(7);
  auto x = torch::randn({200000}) * torch::exp(torch::randn({200000}) * 4.0);
  auto enc = codec::fp8_encode(x);
  const float* xp = x.data_ptr<float>();
  const uint8_t* ep = enc.data_ptr<uint8_t>();
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(ep[i], ref::e4m3_encode(xp[i])) << "x = " << xp[i];
}

// --- bf16 / fp16 casts used by storage ----------------------------------------------------
TEST(Casts, TorchBf16AndFp16CastsAreRoundToNearestEven) {
  std::vector<uint32_t> bits;
  for (uint32_t hi = 0; hi < 0x10000; hi += 3)
    for (uint32_t lo : kLows) bits.push_back((hi << 16) | lo);
  auto x = floats_from_bits(bits);
  auto keep = torch::isfinite(x);
  x = x.masked_select(keep);
  auto b = x.to(torch::kBFloat16).view(torch::kShort);
  auto h = x.to(torch::kHalf).view(torch::kShort);
  const float* xp = x.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(static_cast<uint16_t>(b[i].item<int16_t>()), ref::bf16_rne(xp[i])) << xp[i];
    ASSERT_EQ(static_cast<uint16_t>(h[i].item<int16_t>()), ref::fp16_rne(xp[i])) << xp[i];
  }
}

// The fp16-master mode writes the model param as the bf16 cast of the fp16 master.
TEST(Casts, HalfToBf16IsRneOfTheHalfValue) {
  auto h = torch::arange(65536, torch::kInt).to(torch::kShort).view(torch::kHalf);
  auto b = torch::empty({65536}, torch::kBFloat16);
  b.copy_(h);
  auto bits = b.view(torch::kShort);
  for (int i = 0; i < 65536; ++i) {
    const float f = ref::fp16_to_f(static_cast<uint16_t>(i));
    if (std::isnan(f)) continue;
    ASSERT_EQ(static_cast<uint16_t>(bits[i].item<int16_t>()), ref::bf16_rne(f))
        << "fp16 bits 0x" << std::hex << i << " = " << f;
  }
}

// --- scale rule ---------------------------------------------------------------------------
struct ScaleCase {
  bool fp8;
  const char* name;
};
class Scaled : public ::testing::TestWithParam<ScaleCase> {};

TEST_P(Scaled, ScaleIsAmaxOverRangeAndRoundTripIsClose) {
  const bool fp8 = GetParam().fp8;
  const float range = fp8 ? 448.0f : 32752.0f;
  torch::manual_seed(3);
  auto x = torch::randn({5000}) * 0.01;
  codec::Scaling sc;
  auto st = codec::scaled_encode(x, fp8, false, sc);
  EXPECT_EQ(sc.scale, x.abs().max().item<float>() / range);
  EXPECT_EQ(sc.mult, 1.0f / sc.scale) << "encode multiplies by the reciprocal";
  EXPECT_EQ(sc.scale_inv, fp8 ? 1.0f / (1.0f / sc.scale) : sc.scale);
  auto back = codec::scaled_decode(st, fp8, sc.scale_inv);
  // The amax element lands on the top of the range (fp8: code 0x7E = 448).
  EXPECT_NEAR(back.abs().max().item<float>(), x.abs().max().item<float>(), x.abs().max().item<float>() * 1e-6);
  // Relative error bound of the format: fp8 3 mantissa bits (2^-4), fp16 10 bits (2^-11), for
  // values in the normal range of the scaled format.
  auto normal = x.abs() / sc.scale >= (fp8 ? std::ldexp(1.0f, -6) : std::ldexp(1.0f, -14));
  auto rel = ((back - x).abs() / x.abs()).masked_select(normal);
  EXPECT_LE(rel.max().item<float>(), fp8 ? 1.0f / 16 : 1.0f / 2048);
}

// TE _apply_scale's all-zero case (fused_adam.py @d0067d0): scale = 0; fp16 rscale 0 -> zeros,
// decode 0 * 0 = 0; fp8 quantizer scale 1/0 = inf -> codes E4M3(0 * inf = NaN) = 0x7F (the GPU's
// NaN is positive), scale_inv = frcp(inf) = 0, decode NaN * 0 = NaN (canonical 0x7FFFFFFF).
// The guard keeps zeros (fp8 quantizer scale 1, scale_inv 1).
TEST_P(Scaled, AllZeroTensorFollowsUpstreamOrTheGuard) {
  const bool fp8 = GetParam().fp8;
  for (bool guard : {false, true}) {
    codec::Scaling sc;
    auto st = codec::scaled_encode(torch::zeros({17}), fp8, guard, sc);
    EXPECT_EQ(sc.scale, 0.0f);
    auto back = codec::scaled_decode(st, fp8, sc.scale_inv);
    if (fp8 && !guard) {
      EXPECT_TRUE(std::isinf(sc.mult)) << "quantizer scale 1/0";
      EXPECT_EQ(sc.scale_inv, 0.0f);
      EXPECT_TRUE(torch::equal(st, torch::full({17}, 0x7F, torch::kByte)));
      EXPECT_TRUE(torch::equal(back.view(torch::kInt), torch::full({17}, 0x7FFFFFFF, torch::kInt)));
    } else {
      EXPECT_EQ(sc.scale_inv, fp8 ? 1.0f : 0.0f);
      EXPECT_EQ(st.to(torch::kInt).abs().sum().item<int>(), 0);
      EXPECT_TRUE(torch::equal(back, torch::zeros({17})));
    }
  }
  // An amax whose scale is subnormal below 2^-128 has no finite reciprocal either: upstream
  // quantizes with inf (the non-zero values saturate, zeros become NaN); the guard takes scale 1.
  const codec::Scaling tiny = codec::make_scaling(1e-40f, fp8, false), tiny_g = codec::make_scaling(1e-40f, fp8, true);
  EXPECT_GT(tiny.scale, 0.0f);
  EXPECT_TRUE(fp8 ? std::isinf(tiny.mult) : std::isinf(tiny.mult));
  EXPECT_EQ(tiny_g.mult, fp8 ? 1.0f : 0.0f);
}

// Multiplying by the reciprocal is not dividing by the scale: fp16 codes that differ, with the
// expected codes from numpy (float32 arithmetic, numpy's own RNE float16 cast):
//   amax = f32(0.0123456); s = amax / f32(32752); r = f32(1) / s; code = float16(x * r)
TEST(Scaled, Fp16EncodeMultipliesByTheReciprocal) {
  auto f = [](uint32_t u) {
    float v;
    std::memcpy(&v, &u, 4);
    return v;
  };
  const float amax = f(0x3c4a4533u);
  EXPECT_EQ(codec::make_scaling(amax, false, false).scale, f(0x34ca5e7fu));
  EXPECT_EQ(codec::make_scaling(amax, false, false).mult, f(0x4a21ec04u));
  const std::vector<std::pair<uint32_t, uint16_t>> cases = {{0x3b18b72fu, 0x6e0a},
                                                            {0xba0da604u, 0xe59a},
                                                            {0x3b64f329u, 0x7087}};   // numpy; x / s gives code - 1
  std::vector<float> xs = {amax};
  for (auto [x, c] : cases) xs.push_back(f(x));
  codec::Scaling sc;
  auto st = codec::scaled_encode(torch::tensor(xs), false, false, sc);
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(static_cast<uint16_t>(st[i + 1].view(torch::kShort).item<int16_t>()), cases[i].second) << i;
}

INSTANTIATE_TEST_SUITE_P(Formats, Scaled, ::testing::Values(ScaleCase{false, "fp16"}, ScaleCase{true, "fp8"}),
                         [](const auto& i) { return std::string(i.param.name); });

}   // namespace
