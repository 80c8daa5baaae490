// Runs the Python package's checker (python/rhckpt: `python3 -m rhckpt --expect`, /usr/bin/python3) on
// checkpoints covering every dtype the harness writes (F32, BF16, F16, F8_E4M3, I16, U8 and F32
// scales) and checks that it decodes every tensor to the values the harness reports: model
// params and stored states from memory, per-policy values from the policy encoder, unscaled
// moments from get_unscaled_state. Negative controls: a wrong expected value and a damaged file
// must make the reader fail.
#include <cmath>
#include <fstream>

#include "checkpoint_fixture.h"
#include "harness/checkpoint/policy.h"
#include "harness/optim/storage_codecs.h"

using namespace ckfix;
using namespace rh::ckpt;

namespace {

nlohmann::json values_of(const torch::Tensor& t, bool fp8_codes) {
  torch::Tensor v =
      fp8_codes ? rh::optim::codec::fp8_decode(t.contiguous()).to(torch::kDouble) : t.to(torch::kDouble).contiguous();
  nlohmann::json out = nlohmann::json::array();
  const double* p = v.data_ptr<double>();
  for (int64_t i = 0; i < v.numel(); ++i) {
    if (std::isfinite(p[i])) out.push_back(p[i]);
    else out.push_back(std::isnan(p[i]) ? "nan" : p[i] > 0 ? "inf" : "-inf");
  }
  return out;
}

nlohmann::json entry(const std::string& file, const std::string& key, const torch::Tensor& t, StDtype d) {
  return {{"file", file},
          {"key", key},
          {"dtype", st_name(d)},
          {"shape", t.sizes().vec()},
          {"values", values_of(t, d == StDtype::F8_E4M3)}};
}

// What the harness holds and writes for this rig under this policy, independent of the files.
nlohmann::json expected_checkpoint(const Rig& r, const SavePolicy& pol, const std::string& dir) {
  nlohmann::json ts = nlohmann::json::array();
  for (const auto& p : r.model->named_parameters(true))
    ts.push_back(
        entry("model.safetensors", p.key(), p.value().detach(), st_from_scalar_type(p.value().scalar_type(), p.key())));
  for (const auto& p : r.opt->param_names())
    for (StateKey k : kKeys)
      for (const auto& e : rh::ckpt::detail::encode_state(*r.opt, p, k, pol)) {
        nlohmann::json j = entry("optim_rank_00000.safetensors", e.key, e.data, e.dtype);
        const auto& s = r.opt->stored(p, k);
        if (e.conversion == "stored" && e.kind != "scale" && s.scale)
          j["unscaled"] = values_of(r.opt->get_unscaled_state(p, k), false);
        ts.push_back(j);
      }
  return {{"dir", dir}, {"tensors", ts}};
}

int run_reader(const std::string& expected_path) {
  const std::string cmd = "PYTHONPATH=" + std::string(RH_SOURCE_DIR) + "/python /usr/bin/python3 -m rhckpt --expect " +
                          expected_path + " 2>&1";
  return std::system(cmd.c_str());
}

TEST(PythonReader, DecodesEveryTensorLikeTheHarness) {
  torch::set_num_threads(1);
  TmpDir root;
  struct Fixture {
    int mode;
    SavePolicy pol;
  };
  const auto modes = all_modes();
  const std::vector<Fixture> fixtures = {
      {6, {SavePolicyKind::native, {}}},    // I16 remainder, BF16 weights, F8_E4M3 + scales
      {5, {SavePolicyKind::native, {}}},    // F16 moments + scales
      {7, {SavePolicyKind::native, {}}},    // F16 master, F8 and F16 moments
      {6, {SavePolicyKind::per_key, {}}},   // U8 by value copy, F32 remainder container
      {5, {SavePolicyKind::per_key, {}}},   // F16 unscaled
      {0, {SavePolicyKind::dp_reshardable, {{"exp_avg", Dtype::bf16}}}},   // F32 params, BF16 override
  };
  nlohmann::json spec = {{"checkpoints", nlohmann::json::array()}};
  for (size_t i = 0; i < fixtures.size(); ++i) {
    Rig r = make_rig(modes[fixtures[i].mode], 10 + i);
    train(r, 3);
    SaveResult res = save_checkpoint((root.p / std::to_string(i)).string(), save_input(r, fixtures[i].pol));
    spec["checkpoints"].push_back(expected_checkpoint(r, fixtures[i].pol, res.dir));
  }
  const std::string good = (root.p / "expected.json").string();
  std::ofstream(good) << spec.dump();
  ASSERT_EQ(run_reader(good), 0) << "the Python reader disagrees with the harness";

  // Negative control 1: one expected value off by one ulp-ish step.
  nlohmann::json wrong = spec;
  auto& v = wrong["checkpoints"][0]["tensors"][0]["values"][0];
  v = v.get<double>() + 1.0 / 1024;
  const std::string bad = (root.p / "wrong.json").string();
  std::ofstream(bad) << wrong.dump();
  EXPECT_NE(run_reader(bad), 0);

  // Negative control 2: a flipped data byte in the last tensor of a shard (size unchanged).
  const fs::path shard = fs::path(spec["checkpoints"][0]["dir"].get<std::string>()) / "optim_rank_00000.safetensors";
  std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-1, std::ios::end);
  char c;
  f.get(c);
  f.seekp(-1, std::ios::end);
  f.put(static_cast<char>(c ^ 0x01));
  f.close();
  EXPECT_NE(run_reader(good), 0);
}

}   // namespace
