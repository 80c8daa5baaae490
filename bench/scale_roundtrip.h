// The fp32-policy round trip of one fp16/fp8 state, on TE's formulas (storage_codecs.h, Scaling):
// a state stored after a step with amax `a` holds the code of the range at its amax element and
// any other codes, with scale = a / range (and fp8 scale_inv = frcp(1/scale)). Saving it through
// the `fp32` policy writes the decoded values (code * decode multiplier); loading re-applies
// storage (set_scaled_state): amax' = the decoded amax, scale', scale_inv', codes'.
// `roundtrip` reports what changed for one amax and a probe set of codes. Shared by
// bench/bench_scale_roundtrip.cpp (every amax in [1, 2)) and tests/optim/test_te_numerics.cpp (a
// strided subset, against numpy's independent computation).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "harness/optim/storage_codecs.h"
#include "tests/optim_reference.h"

namespace rh::bench {

struct RoundTrip {
  bool scale_changed = false, scale_inv_changed = false, codes_changed = false;
};

// The reference codecs (tests/optim_reference.h); E4M3 through a table of its decoded values
// (the reference's search, without its std::pow per probe) so 10^9 round trips take seconds.
struct E4M3Table {
  float v[128];
  E4M3Table() {
    for (int c = 0; c < 128; ++c) v[c] = optim_ref::e4m3_decode(static_cast<uint8_t>(c));
  }
  // Positive x only (the round trip is sign-symmetric): nearest code, ties to even, saturating.
  uint32_t encode(float x) const {
    if (std::isnan(x)) return 0x7F;
    if (x >= 448.0f) return 0x7E;
    int lo = 0, hi = 0x7E;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (v[mid] <= x) lo = mid;
      else hi = mid - 1;
    }
    if (lo == 0x7E) return 0x7E;
    const double dlo = double(x) - v[lo], dhi = double(v[lo + 1]) - x;
    return static_cast<uint32_t>(dlo < dhi ? lo : dhi < dlo ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1));
  }
};
inline const E4M3Table& e4m3_table() {
  static const E4M3Table t;
  return t;
}
inline float code_value(bool fp8, uint32_t code) {
  return fp8 ? e4m3_table().v[code & 0x7F] : optim_ref::fp16_to_f(static_cast<uint16_t>(code));
}
inline uint32_t encode_code(bool fp8, float x) { return fp8 ? e4m3_table().encode(x) : optim_ref::fp16_rne(x); }

inline RoundTrip roundtrip(float amax, bool fp8, const std::vector<uint32_t>& probe) {
  using optim::codec::make_scaling;
  const optim::codec::Scaling sc = make_scaling(amax, fp8, false);
  const uint32_t top = encode_code(fp8, amax * sc.mult);     // the amax element's code
  const float u_max = code_value(fp8, top) * sc.scale_inv;   // saved fp32 value of it
  const optim::codec::Scaling re = make_scaling(u_max, fp8, false);
  RoundTrip r;
  auto differs = [](float a, float b) { return std::memcmp(&a, &b, 4) != 0; };
  r.scale_changed = differs(sc.scale, re.scale);
  r.scale_inv_changed = differs(sc.scale_inv, re.scale_inv);
  if (encode_code(fp8, u_max * re.mult) != top) r.codes_changed = true;
  for (uint32_t c : probe) {
    if (r.codes_changed) break;
    const float u = code_value(fp8, c) * sc.scale_inv;
    if (encode_code(fp8, u * re.mult) != c) r.codes_changed = true;
  }
  return r;
}

// Probe codes: fp8 every positive finite E4M3 code but the top one (0x01..0x7D); fp16 every
// `fp16_stride`-th positive finite code below the top (0x77FF = 32752) plus the 64 just below it.
inline std::vector<uint32_t> probe_codes(bool fp8, uint32_t fp16_stride) {
  std::vector<uint32_t> out;
  if (fp8) {
    for (uint32_t c = 1; c < 0x7E; ++c) out.push_back(c);
  } else {
    for (uint32_t c = 1; c < 0x77FF - 64; c += fp16_stride) out.push_back(c);
    for (uint32_t c = 0x77FF - 64; c < 0x77FF; ++c) out.push_back(c);
  }
  return out;
}

}   // namespace rh::bench
