// ShardLayout; see shard_layout.h.
#include "harness/optim/shard_layout.h"

#include <algorithm>
#include <stdexcept>

namespace rh::optim {

ShardLayout ShardLayout::make(const std::vector<int64_t>& numels, int rank, int size) {
  if (size < 1) throw std::invalid_argument("ShardLayout: data-parallel size " + std::to_string(size) + " < 1");
  if (rank < 0 || rank >= size)
    throw std::invalid_argument("ShardLayout: rank " + std::to_string(rank) + " outside [0, " +
                                std::to_string(size) + ")");
  ShardLayout L;
  L.rank = rank;
  L.size = size;
  L.numels = numels;
  for (int64_t n : numels) {
    if (n < 0) throw std::invalid_argument("ShardLayout: negative parameter size");
    L.offsets.push_back(L.total);
    L.total += n;
  }
  L.shard = (L.total + size - 1) / size;
  return L;
}

int64_t ShardLayout::lo(int r) const { return std::min(total, static_cast<int64_t>(r) * shard); }
int64_t ShardLayout::hi(int r) const { return std::min(total, static_cast<int64_t>(r + 1) * shard); }

std::pair<int64_t, int64_t> ShardLayout::piece(size_t i, int r) const {
  const int64_t a = offsets.at(i), b = a + numels.at(i);
  const int64_t s = std::max(a, lo(r)), e = std::min(b, hi(r));
  if (s >= e) return {0, 0};
  return {s - a, e - a};
}

int ShardLayout::owner(int64_t flat) const {
  if (flat < 0 || flat >= total) throw std::out_of_range("ShardLayout::owner: flat index out of range");
  return static_cast<int>(flat / shard);
}

bool ShardLayout::is_split(size_t i) const {
  if (numels.at(i) == 0) return false;
  return owner(offsets[i]) != owner(offsets[i] + numels[i] - 1);
}

std::vector<size_t> ShardLayout::split_params() const {
  std::vector<size_t> out;
  for (size_t i = 0; i < numels.size(); ++i)
    if (is_split(i)) out.push_back(i);
  return out;
}

std::string ShardLayout::describe() const {
  return "rank " + std::to_string(rank) + " of " + std::to_string(size) + ": flat [" + std::to_string(lo(rank)) +
         ", " + std::to_string(hi(rank)) + ") of " + std::to_string(total);
}

}  // namespace rh::optim
