// Typo suggestions; see suggest.h.
#include "harness/base/suggest.h"

#include <algorithm>

namespace rh {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = static_cast<size_t>(-1);
  for (const auto& candidate : candidates) {
    if (candidate.size() > 4 * word.size() + 8 || word.size() > 4 * candidate.size() + 8)
      continue;   // far too long to be a typo
    const size_t distance = edit_distance(word, candidate);
    if (distance < best_distance) best_distance = distance, best = candidate;
  }
  if (best.empty() || best_distance == 0) return "";
  const size_t limit = std::min<size_t>(3, std::max(word.size(), best.size()) / 3);
  return best_distance <= std::max<size_t>(1, limit) ? best : "";
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string match = closest_match(word, candidates);
  return match.empty() ? "" : " (did you mean '" + match + "'?)";
}

}   // namespace rh
