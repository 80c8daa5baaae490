// The data-parallel layout of the flat optimizer state (Megatron's distributed optimizer,
// ZeRO stage 1): all parameters, in optimizer order, concatenated into one flat index space of
// `total` elements; rank r owns the contiguous range [r * shard, min((r + 1) * shard, total)) with
// shard = ceil(total / size). A parameter that crosses a boundary is split between ranks.
// Plain integers only: no LibTorch here.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rh::optim {

struct ShardLayout {
  int rank = 0, size = 1;
  int64_t total = 0, shard = 0;      // shard: elements per rank (the last rank may own fewer)
  std::vector<int64_t> offsets;      // flat offset of parameter i
  std::vector<int64_t> numels;       // elements of parameter i

  // Throws std::invalid_argument if size < 1 or rank is outside [0, size).
  static ShardLayout make(const std::vector<int64_t>& numels, int rank, int size);

  int64_t lo(int r) const;           // rank r's flat range [lo, hi)
  int64_t hi(int r) const;
  // The part of parameter i that rank r owns, as [begin, end) within the parameter (begin == end
  // when it owns none of it).
  std::pair<int64_t, int64_t> piece(size_t i, int r) const;
  std::pair<int64_t, int64_t> piece(size_t i) const { return piece(i, rank); }
  int owner(int64_t flat) const;     // the rank owning a flat index
  bool is_split(size_t i) const;     // parameter i has elements on more than one rank
  std::vector<size_t> split_params() const;   // in parameter order
  std::string describe() const;      // "rank 1 of 2: flat [492352, 984704) of 984704"
};

}  // namespace rh::optim
