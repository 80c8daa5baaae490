// Timing helpers shared by the benchmarks.
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace rh_bench {

inline double seconds(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}   // namespace rh_bench
