// TransformerEngine FusedAdam's scalar rules, pinned against an independent numpy computation
// (tests/te_reference.py, run by this test with Debian's /usr/bin/python3 + python3-numpy):
//  - bias correction: transformer_engine/common/multi_tensor/adam.cu @d0067d0 (TE main),
//    multi_tensor_adam*_cuda: `bias_correction1 = 1 - std::pow(beta1, step)` with a float beta;
//  - the fp32-policy round trip of fp16/fp8 scaling: fused_adam.py @d0067d0 _apply_scale /
//    get_unscaled_state, common/utils.cuh reciprocal<float>, common/util/dequantize_fp8.cuh,
//    on a strided subset of the amax values bench_scale_roundtrip covers exhaustively.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/python_reference.h"
#include "bench/scale_roundtrip.h"
#include "harness/optim/adam_step.h"

namespace {

using namespace rh::optim;

const nlohmann::json& te_reference() { return rh::testing::python_reference("te_reference.py", "te_reference.json"); }

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(TeBiasCorrection, FloatBetaThenDoublePowMatchesNumpy) {
  OptimizerConfig cfg;   // beta1 0.9, beta2 0.95
  for (const auto& e : te_reference().at("bias_correction")) {
    const int64_t t = e.at("step");
    const auto k = rh::optim::detail::make_step_scalars(cfg, 0.0, 1e-3, t);
    EXPECT_EQ(bits(k.bc1), e.at("bc1").get<uint32_t>()) << "bc1, step " << t;
    EXPECT_EQ(bits(k.bc2), e.at("bc2").get<uint32_t>()) << "bc2, step " << t;
    if (t == 1) {
      EXPECT_EQ(bits(k.bc1), 0x3DCCCCD0u) << "0.100000024: beta rounded to fp32 first";
      EXPECT_NE(bits(k.bc1), e.at("bc1_from_double_beta").get<uint32_t>()) << "the old double-beta rule differs";
    }
  }
}

struct RtCase {
  bool fp8;
  const char* name;
};
class TeScaleRoundTrip : public ::testing::TestWithParam<RtCase> {};

TEST_P(TeScaleRoundTrip, StridedAmaxCountsMatchNumpy) {
  const bool fp8 = GetParam().fp8;
  const auto& want = te_reference().at("roundtrip").at(GetParam().name);
  const uint32_t stride = te_reference().at("roundtrip_stride");
  const auto probe = rh::bench::probe_codes(fp8, 64);
  int64_t n = 0, sc = 0, si = 0, co = 0;
  for (uint32_t u = 0x3F800000u; u < 0x40000000u; u += stride, ++n) {
    float a;
    std::memcpy(&a, &u, 4);
    const auto r = rh::bench::roundtrip(a, fp8, probe);
    sc += r.scale_changed, si += r.scale_inv_changed, co += r.codes_changed;
  }
  EXPECT_EQ(n, want.at("amax_values").get<int64_t>());
  EXPECT_EQ(sc, want.at("scale_changed").get<int64_t>()) << "kept scale changes";
  EXPECT_EQ(si, want.at("scale_inv_changed").get<int64_t>()) << "decode scale changes";
  EXPECT_EQ(co, want.at("codes_changed").get<int64_t>()) << "codes change";
  if (fp8) {
    EXPECT_GT(sc, 0) << "fp8's kept scale = amax/448 is not always recovered from 448 * scale_inv";
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, TeScaleRoundTrip, ::testing::Values(RtCase{false, "fp16"}, RtCase{true, "fp8"}),
                         [](const auto& i) { return std::string(i.param.name); });

}   // namespace
