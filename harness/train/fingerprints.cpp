// Fingerprints gathered over the ranks; see fingerprints.h.
#include "harness/train/fingerprints.h"

#include <cstdio>
#include <sstream>

#include "harness/ranks/group.h"
#include "harness/train/trainer.h"

namespace rh {

std::string fingerprint_rows(int64_t iteration, const std::vector<std::pair<std::string, uint64_t>>& fingerprints) {
  std::string out;
  char buf[32];
  for (const auto& [key, hash] : fingerprints) {
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash));
    out += std::to_string(iteration) + "," + key + "," + buf + "\n";
  }
  return out;
}

std::vector<std::pair<std::string, uint64_t>> all_fingerprints(const Trainer& trainer, dist::Group* group) {
  auto fingerprints = trainer.fingerprints();
  if (!group) return fingerprints;
  std::string mine;
  for (const auto& [k, h] : fingerprints) mine += k + "," + std::to_string(h) + "\n";
  const auto all = group->all_gather_strings(mine);
  for (size_t rank = 1; rank < all.size(); ++rank) {
    std::istringstream in(all[rank]);
    std::string line;
    while (std::getline(in, line)) {
      const auto comma = line.rfind(',');
      const std::string key = line.substr(0, comma);
      if (key.rfind("model/", 0) == 0 || (key.rfind("state/", 0) == 0 && key.rfind("state/rng.", 0) != 0)) continue;
      fingerprints.emplace_back(key + "@rank" + std::to_string(rank), std::stoull(line.substr(comma + 1)));
    }
  }
  return fingerprints;
}

}   // namespace rh
