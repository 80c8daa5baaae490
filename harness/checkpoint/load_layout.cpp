// Phase 2 of load_checkpoint (load_phases.h), first check: the bucket layout a dp_reshardable
// checkpoint was saved with against this run's.
//
// Upstream (Megatron-LM megatron/core/optimizer/distrib_optimizer.py @d98e8a64ddf34856e74b24714e3bedb2f5a39553):
// sharded_param_state_dp_reshardable keys every bucket's tensors by its index
// (`...gbuf_idx_{g}.dtype_{dtype}.bucket_idx_{b}.{key}`, global shape the bucket's unpadded size)
// and saves `per_bucket_numel_unpadded` beside them; load_parameter_state_from_dp_reshardable
// (lines 2076-2082) asserts `self.per_bucket_numel_unpadded == per_bucket_numel_unpadded_in_checkpoint`
// ("Number of unpadded elements in each bucket need to be the same in current run ... and
// checkpoint"). Unpadded sizes do not depend on the dp size (the end padding is left out), so the
// format reshards across dp sizes but not across bucket layouts (--ddp-bucket-size,
// --ddp-pad-buckets-for-high-nccl-busbw only changes padding). Such a load is refused as upstream
// fails it, unless LoadOptions::exact_rebucket (not upstream): then the states are re-cut exactly.
#include <string>
#include <vector>

#include "harness/checkpoint/load_phases.h"

namespace rh::ckpt::detail {

namespace {

std::string list_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  const size_t shown = v.size() > 8 ? 6 : v.size();
  for (size_t i = 0; i < shown; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (shown < v.size()) s += ", ... " + std::to_string(v.back());
  return s + "] (" + std::to_string(v.size()) + " bucket" + (v.size() == 1 ? "" : "s") + ")";
}

}   // namespace

void check_bucket_layout(const VerifiedLoad& checkpoint, const optim::PrecisionAdam& opt, const LoadOptions& opts,
                         std::vector<std::string>& notes) {
  const nlohmann::json& manifest = checkpoint.v.manifest;
  const std::string policy = manifest["save_policy"]["kind"].get<std::string>();
  if (policy != "dp_reshardable" && policy != "fp32") return;
  const std::vector<int64_t>& running = opt.layout().bucket_numel_unpadded;
  if (!manifest.contains("per_bucket_numel_unpadded")) {
    notes.push_back("bucket layout: " + checkpoint.mpath +
                    " predates per_bucket_numel_unpadded; not compared with this run's " + list_text(running));
    return;
  }
  const nlohmann::json& field = manifest["per_bucket_numel_unpadded"];
  std::vector<int64_t> saved;
  bool ok = field.is_array() && !field.empty();
  for (const auto& n : field) {
    if (!n.is_number_integer() || n.get<int64_t>() < 0) ok = false;
    else saved.push_back(n.get<int64_t>());
  }
  if (!ok)
    throw CheckpointError(checkpoint.mpath + ": per_bucket_numel_unpadded: expected a non-empty array of element "
                          "counts >= 0, got " + field.dump().substr(0, 120));
  if (saved == running) return;
  const std::string what = "a dp_reshardable checkpoint whose buckets hold " + list_text(saved) +
                           " elements (per_bucket_numel_unpadded), this run's " + list_text(running) +
                           " (--ddp-bucket-size " + std::to_string(opt.config().ddp_bucket_size) + ")";
  if (!opts.exact_rebucket)
    throw CheckpointError(checkpoint.mpath + ": " + what +
                          "; upstream Megatron's load_parameter_state_from_dp_reshardable asserts they are equal and "
                          "keys each bucket's tensors by its index (distrib_optimizer.py @d98e8a6): refusing "
                          "(exact_rebucket, not upstream, re-cuts the states into this layout exactly)");
  notes.push_back("re-bucketed (exact_rebucket, not upstream): " + what);
}

}   // namespace rh::ckpt::detail
