// The save plan: several checkpoints of the same state, written one after the other (train
// --save-plan), and the one checkpoint of --save.
#pragma once
#include <string>
#include <vector>

#include "harness/checkpoint/save_policy.h"

namespace rh {

// One checkpoint to write: where, and how (policy, per-key overrides, compression).
struct SaveTarget {
  std::string root;
  ckpt::SavePolicy policy;
};

// The save plan file (`train --save-plan FILE`): several checkpoints of the same state, written one
// after the other at the same iteration, so the matrix trains a baseline once for every cell that
// differs only in how it saves. {"schema_version": 1, "saves": [{"root": "...", "policy": "native",
// "overrides": {"exp_avg_sq": "bf16"}, "compress": "none"}, ...]}. Throws std::invalid_argument
// naming the file and the entry.
constexpr int kSavePlanSchema = 1;
std::vector<SaveTarget> read_save_plan(const std::string& path);
void write_save_plan(const std::string& path, const std::vector<SaveTarget>& saves);

}   // namespace rh
