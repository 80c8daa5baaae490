// Internal to the checkpoint room: the on-disk layout's names, verifying a checkpoint directory as a whole (manifest version, file names, sizes,
// checksums, safetensors structure, manifest <-> file consistency), and disk accounting.
//
// Layout of root/:
//   latest_checkpointed_iteration.txt   "10\n": the newest published checkpoint, written last
//   iter_0000010/                       one published checkpoint
//     model.safetensors                 model parameters in their own dtype, keys = param names
//     optim_rank_00000.safetensors      optimizer state of data-parallel rank 0
//     manifest.json                     everything else (save.cpp writes it); a directory
//                                       without a valid manifest is not a checkpoint
//     manifest.json.xxh3                the manifest's own XXH3-64, checked before it is parsed
//     disk.csv                          bytes per tensor (a report; not checksummed)
//   .tmp.iter_0000010.<pid>/            a save in progress (or abandoned): ignored, cleaned
//   .old.iter_0000010.<pid>/            a replaced checkpoint being deleted: ignored, cleaned
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>

#include "harness/checkpoint/manifest_reader.h"
#include "harness/checkpoint/publish.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/checkpoint/train_state.h"

namespace rh::ckpt::detail {

inline constexpr const char* kPointerFile = "latest_checkpointed_iteration.txt";
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kDiskCsvFile = "disk.csv";
inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kFormatName = "resume-harness-checkpoint";

std::string iter_dir_name(int64_t iteration);   // iter_0000010
std::string shard_file_name(int dp_rank);       // optim_rank_00000.safetensors

// resolve_checkpoint_dir: publish.h, with the protocol whose directories it finds.

struct Verified {
  std::string dir;
  nlohmann::json manifest;
  ManifestState saved;                            // the manifest's train state, generators and counters,
                                                  // parsed with its schema check
  std::map<std::string, SafetensorsFile> files;   // by file name, every file the manifest lists
};

// Every check that needs no optimizer or model: manifest parses and has this format version;
// listed file names are plain names inside dir; each file exists with the listed size and
// XXH3-64; each is a valid safetensors file; the manifest's tensors and the files' tensors are
// the same set with the same dtype, shape and bytes. Throws CheckpointError naming the file.
// decode_budget > 0 caps what the compressed files may decode to, checked against the manifest
// before anything is decoded (a load passes what its state can hold; 0: this machine's memory).
Verified verify_checkpoint_dir(const std::string& dir, uint64_t decode_budget = 0);

// Where the optimizer state of each param lives: the shard files holding a part of it, by begin.
// Built from the manifest's "shards" param_ranges and checked to cover every element of every
// param exactly once (sizes from model.safetensors). Throws CheckpointError naming the manifest.
struct Piece {
  std::string file;
  int64_t begin = 0, end = 0;   // within the param, flat
};
struct ShardIndex {
  std::map<std::string, std::vector<Piece>> pieces;    // by param name
  std::map<std::string, std::vector<int64_t>> shape;   // the param's shape
};
ShardIndex shard_index(const Verified& v);

// Everything a reader checks after verify_checkpoint_dir that needs no model or optimizer: the
// counters (check_counters; run_config may be null), the train state and every generator state
// (train_state and rank_states, each of a length a generator accepts), the shard index, and the
// shard files against it (each named by one shard, the file of its dp_rank, every state tensor in
// a range of its shard with that range's length). load and inspect both call it, so inspect says
// OK only where load's model-free checks pass. Throws CheckpointError naming the field.
struct Consistent {
  ShardIndex ix;
  TrainState train_state;   // rank 0's generators
};
Consistent check_consistency(const Verified& v, const nlohmann::json& run_config);

// A generator state's bytes: a CPU generator's (what at::CPUGeneratorImpl::set_state accepts) or a
// CUDA Philox generator's (seed and offset, 16 bytes). Throws CheckpointError naming `what`.
void check_generator_state(const std::vector<uint8_t>& bytes, const std::string& what);

// Elements [begin, end) (flat, within the param) of the state tensor `key` of `param`, joined
// from the shards that hold them: a 1-D tensor aliasing the mapping when one shard holds them all.
torch::Tensor gather_state(const Verified& v, const ShardIndex& ix, const std::string& param, const std::string& key,
                           int64_t begin, int64_t end);
// The scale `key` ("<param>/exp_avg.scale") of a state split across shards, for reading without
// an optimizer: each shard's piece has its own (TE scales per shard upstream): the one value
// when every shard holding a part stores the same bits, else a 1-D tensor of the shards' values
// in the order of their pieces. Null tensor when no shard has the key.
torch::Tensor gather_scale(const Verified& v, const ShardIndex& ix, const std::string& param, const std::string& key);
// The scale `key` of each piece of `param`, in piece order (a null tensor for a piece whose shard
// lacks the key).
std::vector<std::pair<Piece, torch::Tensor>> piece_scales(const Verified& v, const ShardIndex& ix,
                                                          const std::string& param, const std::string& key);

// The manifest's "tensors" entry for one written tensor. kind: model | master_param | remainder
// | exp_avg | exp_avg_sq | scale. policy: native | fp32 | per_key | override. conversion: how
// the bytes were produced from the in-memory state (see policy.h). exact: the bytes
// decode back to the state's value bit for bit.
nlohmann::json tensor_entry(const std::string& file, const std::string& key, const std::string& param,
                            const std::string& kind, const TensorInfo& info, const std::string& policy,
                            const std::string& conversion, bool exact);

// Fills manifest["disk"]: total bytes (data files + manifest itself), bytes per file, per kind
// (incl. "metadata" = safetensors headers + manifest), per dtype, bytes per parameter. Settles
// the manifest's own size by iterating to a fixed point. Returns the final manifest text.
std::string finalize_disk_accounting(nlohmann::json& manifest, uint64_t num_model_params);

// disk.csv: file,key,kind,dtype,numel,bytes (one row per tensor, one per header, the manifest).
std::string disk_csv(const nlohmann::json& manifest);

}   // namespace rh::ckpt::detail
