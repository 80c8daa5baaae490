// The save policy as a value: its kinds (with the alias "fp32"), the per-key dtype overrides and
// the compression, and the one definition of its text forms. The command line, scenario files,
// save plans, the manifest and the matrix's grouping of baselines all parse and print it here.
#pragma once
#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "harness/checkpoint/compress.h"
#include "harness/optim/precision_adam.h"

namespace rh::ckpt {

// native: every state bit for bit as held (ours). per_key: Megatron PR 2790's text (open, not on
// main). The others are Megatron's own distributed-optimizer formats (--dist-ckpt-optim-fully-
// reshardable etc.; megatron/core/optimizer/distrib_optimizer.py @d98e8a6):
//  dp_reshardable     get_parameter_state_dp_reshardable: the dtypes get_unscaled_state returns,
//                     fp32 values and the int16 remainder as it is ("fp32" is accepted as an alias:
//                     the harness's earlier name)
//  fully_reshardable  sharded_param_state_fully_reshardable over get_parameter_state_dp_zero
//  dp_zero            get_parameter_state_dp_zero (also what the legacy torch format's
//                     save_parameter_state writes): world buffers of torch.float32 for every key,
//                     the int16 remainder copied into fp32 (widened) too
enum class SavePolicyKind { native, dp_reshardable, per_key, fully_reshardable, dp_zero };
std::string to_string(SavePolicyKind k);
SavePolicyKind parse_save_policy(const std::string& s);   // throws std::invalid_argument
// Every name parse_save_policy accepts, aliases included, in the order help texts list them.
const std::vector<std::string>& save_policy_names();
// "native | dp_reshardable (alias fp32) | fully_reshardable | dp_zero | per_key"
std::string save_policy_help();

struct SavePolicy {
  SavePolicyKind kind = SavePolicyKind::native;
  // Per-key dtype overrides ("master_param", "exp_avg", "exp_avg_sq" -> dtype), applied on top
  // of the policy; used for deliberate faults (e.g. fp32 moments written as bf16).
  std::map<std::string, optim::Dtype> overrides;
  // Orthogonal to the kind: every data file's tensors stored as byte planes + zstd blocks
  // (compress.h), lossless; the loader decodes and checks every block before anything else.
  Compression compress = Compression::none;
};

// An override's key: an optimizer state's name (optim::key_name), else std::invalid_argument
// "<what>: expected master_param, exp_avg or exp_avg_sq, got '<key>'".
optim::StateKey parse_override_key(const std::string& key, const std::string& what);
// Adds the override key = dtype (both checked); `what` names where it came from.
void set_override(SavePolicy& p, const std::string& key, const std::string& dtype, const std::string& what);
// The command line's form: --save-policy NAME and --save-override KEY=DTYPE (each repeatable).
SavePolicy parse_save_policy_args(const std::string& kind, const std::vector<std::string>& overrides);

// The JSON form, as the manifest's "save_policy" and each save plan entry hold it:
// {<kind_key>: "<kind>", "overrides": {"<key>": "<dtype>", ...}, "compress": "none" | "zstd"}.
// kind_key is "kind" in the manifest, "policy" in a save plan.
nlohmann::json to_json(const SavePolicy& p, const char* kind_key = "kind");
class JsonField;
// Parses that form through the checked accessor (a missing kind is native, missing overrides
// none, a missing compress none); throws CheckpointError naming the field.
SavePolicy parse_save_policy_json(const JsonField& j, const char* kind_key = "kind");

}   // namespace rh::ckpt
