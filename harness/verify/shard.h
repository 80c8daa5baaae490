// Splitting a matrix over CI runners: `matrix --shard I/N` runs the I-th of N parts, and
// `report --merge` (merge.h) puts the parts' run directories back together.
//
// The assignment is a pure function of the selected scenarios (the scenario file and --filter),
// so every runner computes the same one without talking to the others:
//  - cells that share a baseline (or a resharded cell's reference) form one group and always go
//    to the same shard, so no baseline is trained twice; an external-trainer cell is a group of
//    its own;
//  - a group's cost is the training it does, counted in iterations x ranks: each baseline's
//    N x dp_size, each cell's resumed (N - K) x resumed dp_size; an external cell's
//    N x determinism_runs + N (+ N - K for a round trip);
//  - groups are placed largest first (ties: first scenario first) on the shard with the least
//    cost so far (ties: the lowest index), the longest-processing-time rule.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "harness/verify/scenario.h"

namespace rh {

struct ShardSpec {
  int index = 0;   // 1-based; 0 = not sharded
  int count = 0;
  bool active() const { return count > 0; }
};

// "I/N" with 1 <= I <= N <= 1024; throws std::invalid_argument naming --shard otherwise.
ShardSpec parse_shard(const std::string& text);

struct ShardPlan {
  std::vector<int> shard_of;   // per selected scenario: its shard (1-based)
  std::vector<int64_t> cost;   // per shard (index 0 = shard 1): iterations x ranks
};

ShardPlan plan_shards(const std::vector<Scenario>& selected, int count);

}   // namespace rh
