// The fp32 policy's round trip of fp16/fp8 states over every fp32 amax in [1, 2) (2^23 values),
// on TE's scaling formulas (bench/scale_roundtrip.h): prints the fraction of amax values whose
// kept `scale`, whose decode `scale_inv` (fp8) and whose codes change when a state is saved as
// unscaled fp32 and re-stored on load. The README quotes these figures.
//
//   bench_scale_roundtrip [--fp16-stride S]   (fp16 probes every S-th code; default 64)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "bench/scale_roundtrip.h"

int main(int argc, char** argv) {
  uint32_t stride = 64;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--fp16-stride" && i + 1 < argc) stride = static_cast<uint32_t>(std::atoi(argv[++i]));
  for (bool fp8 : {false, true}) {
    const auto probe = rh::bench::probe_codes(fp8, stride);
    const uint32_t lo = 0x3F800000u, hi = 0x40000000u;   // [1, 2)
    const unsigned T = std::max(1u, std::thread::hardware_concurrency());
    std::vector<uint64_t> sc(T), si(T), co(T), any(T);
    std::vector<std::thread> th;
    for (unsigned t = 0; t < T; ++t)
      th.emplace_back([&, t] {
        for (uint32_t u = lo + t; u < hi; u += T) {
          float a;
          std::memcpy(&a, &u, 4);
          const auto r = rh::bench::roundtrip(a, fp8, probe);
          sc[t] += r.scale_changed;
          si[t] += r.scale_inv_changed;
          co[t] += r.codes_changed;
          any[t] += r.scale_changed || r.scale_inv_changed || r.codes_changed;
        }
      });
    for (auto& x : th) x.join();
    uint64_t S = 0, I = 0, C = 0, A = 0;
    for (unsigned t = 0; t < T; ++t) S += sc[t], I += si[t], C += co[t], A += any[t];
    const double n = double(hi - lo);
    std::printf("%s: %u amax values in [1,2), %zu probe codes each\n", fp8 ? "fp8 " : "fp16", hi - lo,
                probe.size() + 1);
    std::printf("  scale changed      %9llu  (%.4f %%)\n", (unsigned long long)S, 100.0 * S / n);
    if (fp8)
      std::printf("  scale_inv changed  %9llu  (%.4f %%)  <- what fp8 decodes with\n", (unsigned long long)I,
                  100.0 * I / n);
    std::printf("  codes changed      %9llu  (%.4f %%)\n", (unsigned long long)C, 100.0 * C / n);
    std::printf("  any of them changed %8llu  (%.4f %%)\n", (unsigned long long)A, 100.0 * A / n);
  }
  return 0;
}
