// Checkpoints: one directory per iteration (iter_0000010/) of safetensors files plus a JSON
// manifest, published atomically, with a top-level pointer latest_checkpointed_iteration.txt
// written last. Save policies decide the dtype each optimizer-state key is written in.
#pragma once
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "harness/checkpoint/compress.h"
#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/checkpoint/save_policy.h"
#include "harness/checkpoint/train_state.h"
#include "harness/optim/precision_adam.h"

namespace rh::ckpt {

constexpr int kFormatVersion = 3;   // 2: data-parallel shards (param_ranges within params, rank_states);
                                    // 3: train_state.opt_param_scheduler = Megatron's scheduler state_dict

// CheckpointError (errors.h) is raised for every problem; it names file, tensor and expectation.

// SavePolicyKind and SavePolicy, with their text forms: save_policy.h.

struct SaveInput {
  const torch::nn::Module* model = nullptr;   // weights written once, in their own dtype
  const optim::PrecisionAdam* optimizer = nullptr;
  const TrainState* state = nullptr;
  nlohmann::json run_config;   // full run config, stored in the manifest
  SavePolicy policy;
  // Data parallel (null: a single process): every rank calls save_checkpoint with the same root and
  // iteration; each writes and verifies its own optimizer shard, rank 0 also the model, and only
  // when every rank reports success (all_gather_strings) does rank 0 publish the manifest and the
  // pointer. harness/ranks/group.h implements it over c10d.
  optim::Collectives* group = nullptr;
};

struct SaveResult {
  std::string dir;   // the published iter_XXXXXXX directory
  uint64_t total_bytes = 0;
  std::map<std::string, uint64_t> bytes_per_key;   // master_param/remainder/exp_avg/.../model/metadata
  double bytes_per_param = 0.0;
};

// Writes root/iter_<iteration>/ atomically (temp dir, fsync, rename), then the pointer. Never
// touches an existing checkpoint until the new one is complete; throws CheckpointError.
SaveResult save_checkpoint(const std::string& root, const SaveInput& in);

struct LoadOptions {
  bool allow_lossy = false;   // accept conversions that are not exact (scenario says so)
  // Not upstream. Off (upstream): a load that would hand TransformerEngine's set_scaled_state a
  // master_param of the wrong dtype is refused, as TE's assertion fails upstream (fused_adam.py
  // FusedAdam.set_scaled_state @d0067d0: int16 for a remainder optimizer, fp32 otherwise): an int16
  // remainder into an fp32/fp16 master, an fp32/fp16 master into a remainder optimizer, a widened
  // fp32 remainder (dp_zero, fully_reshardable) into a remainder optimizer. On: those are converted
  // exactly (remainder + bf16 weight joined, a master split, the container narrowed to int16).
  bool exact_master_conversion = false;
  // Not upstream. Off (upstream): a dp_reshardable checkpoint saved with another bucket layout
  // (--ddp-bucket-size) is refused, as Megatron's load_parameter_state_from_dp_reshardable asserts
  // the per-bucket sizes equal (load_layout.cpp). On: its states are re-cut into this run's layout.
  bool exact_rebucket = false;
  std::set<std::string> skip_keys;   // state keys not restored (faults: "exp_avg", "remainder")
};

struct LoadReport {
  std::string dir;
  int64_t iteration = 0;
  std::vector<std::string> conversions;   // human-readable notes, e.g. master mode conversions
  nlohmann::json manifest;
  // Wall time of the two phases: every check (files mapped, sizes, checksums, structure, config,
  // planned conversions) before anything is touched, then restoring the state.
  double verify_seconds = 0, apply_seconds = 0;
};

// Resolves root (via the pointer) or an iter_ directory, verifies everything before touching any
// state (manifest version, config compatibility, sizes, checksums, safetensors structure, paths),
// then restores model weights, optimizer state and TrainState. Throws CheckpointError.
LoadReport load_checkpoint(const std::string& root_or_dir, torch::nn::Module& model, optim::PrecisionAdam& optimizer,
                           TrainState& state, const nlohmann::json& run_config, const LoadOptions& opts);

// Verifies structure and checksums of a checkpoint directory and prints every tensor (key,
// dtype, shape, bytes) with totals per key and per dtype. Returns 0 if intact; 1 (printing the
// damaged file) if damaged; 2 if `dir` does not exist or names no checkpoint at all. With json,
// prints the same as one JSON object instead (keys in docs/running.md, "inspect --json"). With
// verbose, the listing adds each file (bytes, XXH3-64, checksummed blocks) and the saved training
// state (iteration, samples, scheduler, generators, data-parallel shards).
int inspect_checkpoint(const std::string& dir, std::ostream& out, bool json = false, bool verbose = false);

// ---- Reading a checkpoint without a model or optimizer (the resume check, state comparison).

// "<param>/<field>.scale" or ".scale_inv": a stored fp16/fp8 state's scaling, one F32 value.
bool is_scale_key(const std::string& key);

// What a checkpoint takes on disk. Reads the model file (structure checked, a compressed one
// decoded) and the manifest (schema checked); file checksums are not verified.
struct CheckpointSize {
  std::string iter_dir;        // the iter_ directory root_or_iter_dir resolves to
  uint64_t stored_bytes = 0;   // its regular files' sizes, except disk.csv (a report, not data)
  uint64_t raw_bytes = 0;      // stored_bytes, each compressed file counted at its tensors' raw bytes
  int64_t num_params = 0;      // elements of every tensor in model.safetensors (buffers included)
};
// Throws CheckpointError (std::filesystem::filesystem_error if the directory cannot be listed).
CheckpointSize measure_checkpoint(const std::string& root_or_iter_dir);

// Every tensor of a checkpoint, verified as load verifies files (sizes, XXH3-64, structure,
// shards' coverage), with data-parallel shards joined into whole tensors, so that checkpoints
// written at different group sizes compare key by key.
struct JoinedTensors {
  // "model/<name>" for model.safetensors' tensors (parameters and buffers); "<param>/<state>"
  // for optimizer state in the param's shape, and "<param>/<state>.scale" / ".scale_inv" (one
  // value, the same in every shard). Each with its safetensors dtype (a compressed file's decoded).
  std::map<std::string, std::pair<StDtype, torch::Tensor>> tensors;
  std::vector<SafetensorsFile> files;   // keep the mappings the tensors alias alive
};
// Throws CheckpointError; std::runtime_error for a shard tensor whose param has no shard ranges.
JoinedTensors read_joined_tensors(const std::string& root_or_iter_dir);

}   // namespace rh::ckpt
