// An external trainer's checkpoints, read key by key and compared (external_check.h).
// Safetensors files are read here; torch.save files (and directories of them) are turned into one
// flat safetensors file by python/rhckpt/torch_bridge.py (restricted unpickler; a long-lived
// `--serve` child shared by the tool process, harness/process/bridge_client.h, or a process of
// its own per read with trainer.checkpoint.trust_pickle) only when the two files compared are not
// byte-identical.
#pragma once
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "harness/checkpoint/safetensors.h"
#include "harness/verify/external.h"
#include "harness/verify/tensor_compare.h"

namespace rh::external {

// A checkpoint read key by key: tensors, and everything else as exact text (leaves).
struct Flat {
  TensorMap tensors;
  std::map<std::string, std::string> leaves;
  std::vector<ckpt::SafetensorsFile> files;   // keep the mappings the tensors alias alive
};

class CheckpointReader {
 public:
  // `scratch`: where the bridge's flat files go (created on the first torch checkpoint).
  CheckpointReader(const ExternalTrainer& t, std::filesystem::path scratch) : t_(t), scratch_(std::move(scratch)) {}

  // Reads checkpoints (files or directories) by their format; every torch one through one
  // request to the bridge (importing torch is most of its cost). Throws ckpt::CheckpointError
  // for an unreadable or hostile one.
  std::vector<Flat> read(const std::vector<std::filesystem::path>& paths, const std::string& label);

 private:
  std::string format_of(const std::filesystem::path& p, bool dir) const;
  void bridge(const std::vector<std::pair<std::filesystem::path, std::filesystem::path>>& io, const std::string& label);

  const ExternalTrainer& t_;
  std::filesystem::path scratch_;
};

// "" when identical, else the first differing key; diffs (when given) get every tensor's row.
std::string compare_checkpoints(CheckpointReader& reader, const std::filesystem::path& a,
                                const std::filesystem::path& b, const std::string& label,
                                std::vector<TensorDiff>* diffs);

}   // namespace rh::external
