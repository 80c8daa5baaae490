// An external trainer's checkpoints, read key by key and compared (external_check.h).
// Safetensors files are read here; torch.save files (and directories of them) are turned into one
// flat safetensors file by python/rhckpt/torch_bridge.py (restricted unpickler; a long-lived
// `--serve` child shared by the tool process, harness/process/bridge_client.h, or a process of
// its own per read with trainer.checkpoint.trust_pickle) only when the two files compared are not
// byte-identical.
#pragma once
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "harness/checkpoint/safetensors.h"
#include "harness/verify/external.h"
#include "harness/verify/run_varied.h"
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
  // The cell directory (flat/'s parent): paths in it are resolved without following links.
  std::filesystem::path cell() const { return scratch_.parent_path(); }
  const ExternalTrainer& trainer() const { return t_; }

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

// Two checkpoints compared key by key. Non-tensor values are "value" (numbers, bools: state such as
// an iteration or a scheduler counter) or "metadata" (texts, paths, dtypes, None). A text that
// differs only by what the harness varied between the two runs (run_varied.h) is not a
// difference, nor is a key trainer.checkpoint.ignore names; both are listed.
struct Comparison {
  std::vector<TensorDiff> diffs;   // every key, sorted; kind "value" / "metadata" for non-tensors
  // The first differing key of each sort ("" when none), with what differs for a value.
  std::string first_tensor, first_value, first_metadata;
  std::vector<std::string> changed;                           // every differing key
  std::vector<std::pair<std::string, std::string>> varied;    // key -> what it was matched as
  std::vector<std::pair<std::string, std::string>> ignored;   // key -> the ignore rule's reason
  bool identical() const { return changed.empty(); }
  // The most telling difference: a tensor, else a value; "" when only metadata differs.
  std::string first_state() const { return !first_tensor.empty() ? first_tensor : first_value; }
};

// Compares checkpoint a (saved by run side_a) with b (by side_b); null sides match no varied value.
// A non-tensor key in `run_varying` (seen to differ between two uninterrupted runs) is metadata.
Comparison compare_checkpoints(CheckpointReader& reader, const std::filesystem::path& a,
                               const std::filesystem::path& b, const RunSide* side_a, const RunSide* side_b,
                               const std::string& label, const std::set<std::string>& run_varying = {});

// Optimizer state saved narrower than the parameters it belongs to: for each floating tensor
// named like a torch optimizer's per-parameter state (exp_avg, exp_avg_sq, max_exp_avg_sq,
// momentum_buffer, square_avg, acc_delta, sum) under a "state" key, when every tensor of the same
// shape outside optimizer state is of a wider float dtype. One line per key ("optimizer/state/0/
// exp_avg saved as F16, its parameter's shape held as F32").
std::vector<std::string> lossy_optimizer_state(const Flat& flat);

}   // namespace rh::external
