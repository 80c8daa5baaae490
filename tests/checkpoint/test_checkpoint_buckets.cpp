// A dp_reshardable checkpoint and the bucket layout it was saved with. Upstream (Megatron-LM
// distrib_optimizer.py @d98e8a6, load_parameter_state_from_dp_reshardable, lines 2076-2082)
// asserts the saved per_bucket_numel_unpadded equals the running one, so a checkpoint saved with
// one bucket does not load into a run with several: refused, naming both layouts, the target
// untouched; exact_rebucket (not upstream) loads it exactly. Other policies do not compare.
#include <string>
#include <vector>

#include "checkpoint_fixture.h"

using namespace ckfix;
using namespace rh::ckpt;

namespace {

// remainders + bf16 moments, Toy's params (optimizer order: decay embed 35, l0.w 80, l1.w 48,
// then no_decay norm 3, l0.b 16, l1.b 3), optionally cut into buckets of >= `bucket_size` elements.
Rig bucketed_rig(int64_t bucket_size, uint64_t seed) {
  Mode mode = make_mode("remainders_bf16moments", true, torch::kBFloat16, Dtype::fp32, true, Dtype::bf16, Dtype::bf16);
  mode.cfg.ddp_bucket_size = bucket_size;
  return make_rig(mode, seed);
}

// Megatron's _compute_per_buffer_param_layout by hand, params reversed (l1.b, l0.b, norm, l1.w,
// l0.w, embed), each start padded to 64, a bucket closed once it reaches the bucket size, its
// unpadded size = last param end - bucket start, its end padded to lcm(dp, 128):
//   one bucket:       l1.b 0-3, l0.b 64-80, norm 128-131, l1.w 192-240, l0.w 256-336, embed 384-419
//                     -> [419]
//   bucket size 64:   [0: l1.b 0-3, l0.b 64-80] 80 | [128: norm 128-131, l1.w 192-240] 112 |
//                     [256: l0.w 256-336] 80 | [384: embed 384-419] 35  -> [80, 112, 80, 35]
// (tests/megatron_layout_reference.py compute_layout gives the same for both.)
const std::string kOneBucket = "[419] (1 bucket)", kFourBuckets = "[80, 112, 80, 35] (4 buckets)";

TEST(BucketLayout, ManifestRecordsMegatronsPerBucketNumelUnpadded) {
  torch::set_num_threads(1);
  TmpDir dir;
  Rig rig = bucketed_rig(64, 1);
  train(rig, 2);
  save_checkpoint(dir.str(), save_input(rig, {SavePolicyKind::dp_reshardable, {}}));
  const nlohmann::json manifest = read_manifest(fs::path(dir.str()) / "iter_0000002");
  EXPECT_EQ(manifest.at("per_bucket_numel_unpadded").get<std::vector<int64_t>>(), (std::vector<int64_t>{80, 112, 80, 35}));
}

TEST(BucketLayout, DpReshardableAcrossBucketLayoutsIsRefusedAsUpstream) {
  torch::set_num_threads(1);
  TmpDir dir;
  Rig saved_rig = bucketed_rig(0, 1);
  train(saved_rig, 3);
  save_checkpoint(dir.str() + "/one", save_input(saved_rig, {SavePolicyKind::dp_reshardable, {}}));
  Rig target_rig = bucketed_rig(64, 2), fresh = bucketed_rig(64, 2);
  LoadOptions lossy;
  lossy.allow_lossy = true;   // not a lossiness question: refused even so
  try {
    load_checkpoint(dir.str() + "/one", *target_rig.model, *target_rig.opt, target_rig.state, {}, lossy);
    ADD_FAILURE() << "a dp_reshardable checkpoint of one bucket must not load into four";
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    for (const std::string& want :
         {"manifest.json: a dp_reshardable checkpoint whose buckets hold " + kOneBucket,
          "this run's " + kFourBuckets + " (--ddp-bucket-size 64)",
          std::string("load_parameter_state_from_dp_reshardable asserts they are equal"),
          std::string("distrib_optimizer.py @d98e8a6"), std::string("exact_rebucket, not upstream")})
      EXPECT_NE(msg.find(want), std::string::npos) << want << " missing from: " << msg;
  }
  EXPECT_TRUE(same_state(target_rig, fresh)) << "a refused load must not touch the target";

  // exact_rebucket: every state restored bit for bit into the four-bucket layout, and said so.
  LoadOptions rebucket;
  rebucket.exact_rebucket = true;
  const LoadReport report =
      load_checkpoint(dir.str() + "/one", *target_rig.model, *target_rig.opt, target_rig.state, {}, rebucket);
  bool noted = false;
  for (const auto& note : report.conversions) noted = noted || note.find("re-bucketed (exact_rebucket") == 0;
  EXPECT_TRUE(noted) << "the load must say it re-bucketed";
  EXPECT_TRUE(same_state(target_rig, saved_rig));
}

// The same layout loads (dp_reshardable into the same buckets), and policies upstream does not
// key by bucket (native, dp_zero) load across bucket layouts as before.
TEST(BucketLayout, SameLayoutAndOtherPoliciesLoad) {
  torch::set_num_threads(1);
  TmpDir dir;
  Rig saved_rig = bucketed_rig(64, 1);
  train(saved_rig, 3);
  for (SavePolicyKind policy : {SavePolicyKind::dp_reshardable, SavePolicyKind::native, SavePolicyKind::dp_zero}) {
    const std::string path = dir.str() + "/" + to_string(policy);
    save_checkpoint(path, save_input(saved_rig, {policy, {}}));
    LoadOptions opts;
    opts.exact_master_conversion = policy == SavePolicyKind::dp_zero;   // its widened remainder
    Rig same = bucketed_rig(64, 2);
    load_checkpoint(path, *same.model, *same.opt, same.state, {}, opts);
    EXPECT_TRUE(same_state(same, saved_rig)) << to_string(policy);
    if (policy == SavePolicyKind::dp_reshardable) continue;
    Rig one = bucketed_rig(0, 2);
    load_checkpoint(path, *one.model, *one.opt, one.state, {}, opts);
    EXPECT_TRUE(same_state(one, saved_rig)) << to_string(policy);
  }
}

}   // namespace
