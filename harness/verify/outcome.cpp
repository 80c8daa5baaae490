// The verdict type's names; see outcome.h.
#include "harness/verify/outcome.h"

#include <stdexcept>

namespace rh {

namespace {
constexpr const char* kNames[] = {"identical", "within-tolerance", "diverged", "load-refused",
                                  "error",     "nondeterministic"};
constexpr int kCount = sizeof kNames / sizeof kNames[0];
}   // namespace

const char* to_string(Outcome o) { return kNames[static_cast<int>(o)]; }

Outcome parse_outcome(const std::string& s) {
  for (int i = 0; i < kCount; ++i)
    if (s == kNames[i]) return static_cast<Outcome>(i);
  throw std::invalid_argument(
      "unknown outcome '" + s +
      "' (expected identical, within-tolerance, diverged, load-refused, error or nondeterministic)");
}

}   // namespace rh
