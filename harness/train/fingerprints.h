// fingerprints.csv: per iteration, the XXH3-64 of every piece of state (trainer.h, fingerprints),
// gathered over the data-parallel ranks.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rh {

class Trainer;
namespace dist {
class Group;
}

// The rows "iteration,key,xxh3" of one iteration's fingerprints.
std::string fingerprint_rows(int64_t iteration, const std::vector<std::pair<std::string, uint64_t>>& fingerprints);

// This rank's fingerprints; data parallel, rank 0 returns every rank's: the keys that differ by
// rank (optimizer parts, generators) of rank r > 0 get the suffix "@rank<r>".
std::vector<std::pair<std::string, uint64_t>> all_fingerprints(const Trainer& trainer, dist::Group* group);

}   // namespace rh
