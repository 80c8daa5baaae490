// ShardLayout: Megatron's distributed-optimizer buffer layout; see shard_layout.h for the
// upstream functions each rule follows.
#include "harness/optim/shard_layout.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace rh::optim {

namespace {

int64_t pad_to(int64_t v, int64_t d) { return (v + d - 1) / d * d; }

}   // namespace

ShardLayout ShardLayout::make(const std::vector<int64_t>& numels, int rank, int size, const BufferOptions& opt,
                              std::vector<size_t> model_order) {
  if (size < 1) throw std::invalid_argument("ShardLayout: data-parallel size " + std::to_string(size) + " < 1");
  if (rank < 0 || rank >= size)
    throw std::invalid_argument("ShardLayout: rank " + std::to_string(rank) + " outside [0, " + std::to_string(size) +
                                ")");
  for (int64_t n : numels)
    if (n < 0) throw std::invalid_argument("ShardLayout: negative parameter size");
  if (model_order.empty())
    for (size_t i = 0; i < numels.size(); ++i) model_order.push_back(i);
  std::vector<bool> seen(numels.size(), false);
  if (model_order.size() != numels.size()) throw std::invalid_argument("ShardLayout: model_order is not a permutation");
  for (size_t k : model_order) {
    if (k >= numels.size() || seen[k]) throw std::invalid_argument("ShardLayout: model_order is not a permutation");
    seen[k] = true;
  }
  ShardLayout layout;
  layout.rank = rank;
  layout.size = size;
  layout.numels = numels;
  layout.offsets.assign(numels.size(), 0);
  layout.bucket_of.assign(numels.size(), 0);
  // param_layout.py bucket_end_divisor: lcm(dp, 128), or lcm(dp, 128, 2^16).
  int64_t divisor = std::lcm(static_cast<int64_t>(size), int64_t{128});
  if (opt.pad_for_high_nccl_busbw) divisor = std::lcm(divisor, int64_t{1} << 16);
  const bool bucketed = opt.bucket_size > 0;
  int64_t param_start = 0, bucket_start = 0, param_end = 0;
  bool open = false;   // the current bucket holds a param
  auto finalize = [&](int64_t end) {
    layout.bucket_numel_unpadded.push_back(end - bucket_start);   // _finalize_bucket's first line
    const int64_t padded = pad_to(end, divisor);
    layout.buckets.emplace_back(bucket_start, padded);
    return padded;
  };
  // _compute_per_buffer_param_layout: `for param in params[::-1]`.
  for (size_t j = model_order.size(); j-- > 0;) {
    const size_t param_index = model_order[j];
    param_start = pad_to(param_start, 64);   // pad_param_start
    param_end = param_start + numels[param_index];
    layout.offsets[param_index] = param_start;
    layout.bucket_of[param_index] = static_cast<int>(layout.buckets.size());
    open = true;
    if (bucketed && param_end - bucket_start >= opt.bucket_size) {
      bucket_start = finalize(param_end);
      param_start = bucket_start;
      open = false;
    } else {
      param_start = param_end;
    }
  }
  if (open) finalize(param_end);
  layout.total = layout.buckets.empty() ? 0 : layout.buckets.back().second;
  return layout;
}

std::vector<ShardLayout::Range> ShardLayout::ranges(int r) const {
  std::vector<Range> out;
  for (const auto& [b, e] : buckets) {
    const int64_t n = (e - b) / size;   // divisible: the end is padded to a multiple of dp
    out.emplace_back(b + r * n, b + (r + 1) * n);
  }
  return out;
}

ShardLayout::Range ShardLayout::piece(size_t i, int r) const {
  const int64_t param_begin = offsets.at(i), param_end = param_begin + numels.at(i);
  if (param_begin == param_end) return {0, 0};
  const auto& [bucket_begin, bucket_end] = buckets.at(static_cast<size_t>(bucket_of.at(i)));
  const int64_t share = (bucket_end - bucket_begin) / size;
  const int64_t begin = std::max(param_begin, bucket_begin + r * share),
                end = std::min(param_end, bucket_begin + (r + 1) * share);
  if (begin >= end) return {0, 0};
  return {begin - param_begin, end - param_begin};
}

int ShardLayout::owner(int64_t flat) const {
  if (flat < 0 || flat >= total) throw std::out_of_range("ShardLayout::owner: buffer index out of range");
  auto it =
      std::upper_bound(buckets.begin(), buckets.end(), flat, [](int64_t f, const Range& b) { return f < b.second; });
  const int64_t n = (it->second - it->first) / size;
  return static_cast<int>((flat - it->first) / n);
}

int64_t ShardLayout::local_index(int r, int64_t flat) const {
  int64_t before = 0;
  for (const auto& [b, e] : buckets) {
    const int64_t n = (e - b) / size;
    if (flat < e) {
      const int64_t lo = b + r * n;
      if (flat < lo || flat >= lo + n) throw std::out_of_range("ShardLayout::local_index: not rank r's index");
      return before + flat - lo;
    }
    before += n;
  }
  throw std::out_of_range("ShardLayout::local_index: buffer index out of range");
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
  return "rank " + std::to_string(rank) + " of " + std::to_string(size) + ": " + std::to_string(buckets.size()) +
         " bucket(s), " + std::to_string(per_rank()) + " of " + std::to_string(total) + " buffer elements";
}

}   // namespace rh::optim
