// The data-parallel layout of the optimizer state: Megatron's param/grad buffer as its
// distributed optimizer lays it out (ZeRO stage 1), and which part of it each rank owns.
// Plain integers only: no LibTorch here.
//
// Upstream (Megatron-LM main @d98e8a64ddf34856e74b24714e3bedb2f5a39553):
//  - megatron/core/optimizer/distrib_optimizer.py, DistributedOptimizer.
//    _compute_per_buffer_param_layout: params in *reverse* order (backprop order); each param's
//    start padded up to a multiple of 64 (param_layout.py pad_param_start); a bucket is closed
//    after the param that brings it to >= bucket_size elements, and its end is padded up to a
//    multiple of lcm(dp, 128) (lcm(dp, 128, 2^16) with --ddp-pad-buckets-for-high-nccl-busbw;
//    param_layout.py pad_bucket_end / bucket_end_divisor); the next bucket starts there. With no
//    bucket size the whole buffer is one bucket.
//  - distrib_optimizer.py _build_model_gbuf_range: every bucket is cut into dp equal contiguous
//    ranges; rank r owns [offset + r * size/dp, offset + (r + 1) * size/dp) of every bucket.
//    _build_model_gbuf_param_range_map: a param's part on a rank is its intersection with that
//    range (a param lies in one bucket, so it is one contiguous piece per rank).
//  - distributed_data_parallel.py DistributedDataParallel.__init__: --ddp-bucket-size defaults to
//    max(4e7, 1e6 * dp), but is set to None (one bucket) unless --overlap-grad-reduce.
//  - param_and_grad_buffer.py group_params_for_buffers: one buffer per (param dtype, grad dtype,
//    expert-parallel); the harness has one param dtype and no expert parallelism: one buffer.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rh::optim {

struct BufferOptions {
  int64_t bucket_size = 0;                // --ddp-bucket-size; <= 0: one bucket (upstream's
                                          // default without --overlap-grad-reduce)
  bool pad_for_high_nccl_busbw = false;   // --ddp-pad-buckets-for-high-nccl-busbw
};

struct ShardLayout {
  using Range = std::pair<int64_t, int64_t>;   // [begin, end)
  int rank = 0, size = 1;
  int64_t total = 0;              // elements of the padded buffer (every bucket's end padded)
  std::vector<int64_t> offsets;   // buffer offset of parameter i (i: the order given to make)
  std::vector<int64_t> numels;    // elements of parameter i
  std::vector<Range> buckets;     // buffer ranges of the buckets, in buffer order
  std::vector<int> bucket_of;     // bucket of parameter i
  // Megatron's per_bucket_numel_unpadded: each bucket's last param end minus the bucket's start
  // (the 64-element alignment gaps counted, the end padding not; so the same at every dp size).
  // load_parameter_state_from_dp_reshardable asserts it equals the checkpoint's.
  std::vector<int64_t> bucket_numel_unpadded;

  // `model_order`: the indices of `numels` in the model's parameter order (Megatron's buffer holds
  // them reversed); empty = 0, 1, ..., n-1. Throws std::invalid_argument if size < 1, rank is
  // outside [0, size), a size is negative or model_order is not a permutation.
  static ShardLayout make(const std::vector<int64_t>& numels, int rank, int size, const BufferOptions& opt = {},
                          std::vector<size_t> model_order = {});

  int64_t per_rank() const { return total / size; }   // elements a rank owns (padding included)
  std::vector<Range> ranges(int r) const;             // rank r's range of every bucket
  // The part of parameter i that rank r owns, as [begin, end) within the parameter (begin == end
  // when it owns none of it).
  Range piece(size_t i, int r) const;
  Range piece(size_t i) const { return piece(i, rank); }
  int owner(int64_t flat) const;   // the rank owning a buffer index (padding included)
  // Where buffer index `flat` (owned by rank r) sits in rank r's concatenated ranges.
  int64_t local_index(int r, int64_t flat) const;
  bool is_split(size_t i) const;              // parameter i has elements on more than one rank
  std::vector<size_t> split_params() const;   // in parameter order
  std::string describe() const;               // "rank 1 of 2: 1 bucket(s), 492352 of 984832 buffer elements"
};

}   // namespace rh::optim
