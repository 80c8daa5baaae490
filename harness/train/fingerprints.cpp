// Fingerprints gathered over the ranks; see fingerprints.h.
#include "harness/train/fingerprints.h"

#include <cstdio>
#include <sstream>

#include "harness/ranks/group.h"
#include "harness/train/trainer.h"

namespace rh {

std::string fingerprint_rows(int64_t iteration, const std::vector<std::pair<std::string, uint64_t>>& fp) {
  std::string out;
  char buf[32];
  for (const auto& [key, h] : fp) {
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    out += std::to_string(iteration) + "," + key + "," + buf + "\n";
  }
  return out;
}

std::vector<std::pair<std::string, uint64_t>> all_fingerprints(const Trainer& tr, dist::Group* group) {
  auto fp = tr.fingerprints();
  if (!group) return fp;
  std::string mine;
  for (const auto& [k, h] : fp) mine += k + "," + std::to_string(h) + "\n";
  const auto all = group->all_gather_strings(mine);
  for (size_t r = 1; r < all.size(); ++r) {
    std::istringstream in(all[r]);
    std::string line;
    while (std::getline(in, line)) {
      const auto comma = line.rfind(',');
      const std::string key = line.substr(0, comma);
      if (key.rfind("model/", 0) == 0 || (key.rfind("state/", 0) == 0 && key.rfind("state/rng.", 0) != 0)) continue;
      fp.emplace_back(key + "@rank" + std::to_string(r), std::stoull(line.substr(comma + 1)));
    }
  }
  return fp;
}

}   // namespace rh
