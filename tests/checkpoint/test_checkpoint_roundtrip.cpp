// Round trip of every storage mode x save policy: train a few steps, save, load into a fresh
// optimizer, and compare each state bit for bit with a result predicted independently of the
// harness (tests/roundtrip_reference.py, numpy): native restores exactly; the fp32 formats
// re-store unscaled values (fp16/fp8 scales recomputed); per_key casts moments to their dtype
// without a scale (fp16 unscaled, fp8 by truncating value copy).
// Lossy outcomes must be refused without allow_lossy, leave the target untouched, and match the
// prediction with it. Also: master-mode conversions, overrides, skip_keys, disk accounting.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checkpoint_fixture.h"
#include "python_reference.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/policy.h"

using namespace ckfix;
using namespace rh::ckpt;

namespace {

// The stored codes as unsigned integers (fp32 / bf16 / fp16 / fp8 bit patterns).
nlohmann::json code_bits(const torch::Tensor& data) {
  torch::Tensor t = data.contiguous().view({-1});
  torch::Tensor u;
  switch (t.element_size()) {
    case 4: u = t.view(torch::kInt).to(torch::kLong).bitwise_and(static_cast<int64_t>(0xFFFFFFFFLL)); break;
    case 2: u = t.view(torch::kShort).to(torch::kLong).bitwise_and(static_cast<int64_t>(0xFFFF)); break;
    default: u = t.view(torch::kByte).to(torch::kLong); break;
  }
  nlohmann::json out = nlohmann::json::array();
  const int64_t* p = u.data_ptr<int64_t>();
  for (int64_t i = 0; i < u.numel(); ++i) out.push_back(static_cast<uint64_t>(p[i]));
  return out;
}

// The reference's prediction as a StoredState shaped like `like`.
StoredState from_reference(const nlohmann::json& j, const StoredState& like) {
  StoredState e = like;
  const auto& bits = j.at("bits");
  torch::Tensor u = torch::empty({static_cast<int64_t>(bits.size())}, torch::kLong);
  for (size_t i = 0; i < bits.size(); ++i) u[static_cast<int64_t>(i)] = bits[i].get<int64_t>();
  switch (like.data.element_size()) {
    case 4: u = u.to(torch::kInt); break;
    case 2: u = u.to(torch::kInt).to(torch::kShort); break;   // wraps 0x8000.. to negative: same bits
    default: u = u.to(torch::kByte); break;
  }
  e.data = u.view(like.data.scalar_type()).view(like.data.sizes()).clone();
  e.scale = j.at("scale").is_null() ? std::nullopt : std::optional<float>(j.at("scale").get<float>());
  e.scale_inv = j.at("scale_inv").is_null() ? std::nullopt : std::optional<float>(j.at("scale_inv").get<float>());
  return e;
}

// For a failure message: dtype, scales and the first codes.
std::string describe(const StoredState& s) {
  std::ostringstream o;
  o << rh::optim::to_string(s.dtype) << " scale " << (s.scale ? std::to_string(*s.scale) : "-") << " scale_inv "
    << (s.scale_inv ? std::to_string(*s.scale_inv) : "-") << " codes "
    << code_bits(s.data.view({-1}).narrow(0, 0, std::min<int64_t>(6, s.data.numel()))).dump();
  return o.str();
}

struct Case {
  Mode mode;
  SavePolicyKind policy;
};

class RoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(RoundTrip, RestoresExactlyOrWithThePredictedLoss) {
  torch::set_num_threads(1);
  TmpDir dir;
  const Mode& mode = GetParam().mode;
  const SavePolicyKind save_policy = GetParam().policy;
  Rig saved_rig = make_rig(mode, 1);
  train(saved_rig, 3);
  SaveResult saved = save_checkpoint(dir.str(), save_input(saved_rig, {save_policy, {}}));
  EXPECT_TRUE(fs::exists(fs::path(saved.dir) / "manifest.json"));
  std::ostringstream listing;
  EXPECT_EQ(inspect_checkpoint(dir.str(), listing), 0) << listing.str();

  Rig resumed_rig = make_rig(mode, 2);
  Rig fresh = make_rig(mode, 2);
  ASSERT_FALSE(same_state(saved_rig, resumed_rig)) << "negative control: a fresh optimizer must differ";

  // The PR's remainder rule keys on the flag, not on what the optimizer holds, and only with the
  // precision-aware optimizer on (Megatron distrib_optimizer.py: no int16 branch without it).
  const bool pr_int16 =
      mode.cfg.use_precision_aware_optimizer && mode.cfg.store_param_remainders && mode.param_dtype == torch::kBFloat16;
  const bool has_rem = saved_rig.opt->master_mode() == rh::optim::MasterMode::remainders;
  if (save_policy == SavePolicyKind::per_key && pr_int16 &&
      saved_rig.opt->master_mode() == rh::optim::MasterMode::fp16) {
    // The PR hands an int16 tensor to set_scaled_state; TE (remainders off for an fp16 master)
    // asserts fp32 there. Refused, with or without allow_lossy, and the target is untouched.
    LoadOptions lossy;
    lossy.allow_lossy = true;
    for (const LoadOptions& load_options : {LoadOptions{}, lossy}) {
      try {
        load_checkpoint(dir.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, {}, load_options);
        ADD_FAILURE() << "per_key + fp16 master + store_param_remainders must be refused";
      } catch (const CheckpointError& e) {
        // Without allow_lossy the fp8 moments' lossy per_key save is refused first.
        if (load_options.allow_lossy) {
          EXPECT_NE(std::string(e.what()).find("upstream fails an assertion"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("/master_param'"), std::string::npos) << e.what();
        }
      }
      EXPECT_TRUE(same_state(resumed_rig, fresh)) << "a refused load must not touch the target";
    }
    return;
  }
  if (save_policy == SavePolicyKind::per_key && pr_int16 != has_rem) {
    EXPECT_THROW(load_checkpoint(dir.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, {}, {}),
                 CheckpointError);
    EXPECT_TRUE(same_state(resumed_rig, fresh)) << "a refused load must not touch the target";
    LoadOptions lossy;
    lossy.allow_lossy = true;
    load_checkpoint(dir.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, {}, lossy);
    const std::string param_name = saved_rig.opt->param_names()[0];
    EXPECT_FALSE(bytes_equal(resumed_rig.opt->stored(param_name, StateKey::master_param).data,
                             saved_rig.opt->stored(param_name, StateKey::master_param).data))
        << "the misfire (fp32 master read as int16) must show";
    return;
  }

  // Megatron's fp32 world-buffer formats widen the int16 remainder to fp32; TE's set_scaled_state
  // asserts int16 there, so upstream fails the load: refused, saying so, target untouched.
  // exact_master_conversion narrows the container back (exact), as for dp_reshardable below.
  const bool widened = save_policy == SavePolicyKind::dp_zero || save_policy == SavePolicyKind::fully_reshardable;
  LoadOptions opts;
  if (widened && has_rem) {
    LoadOptions lossy;
    lossy.allow_lossy = true;
    try {
      load_checkpoint(dir.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, {}, lossy);
      ADD_FAILURE() << "a widened fp32 remainder into a remainder optimizer must be refused";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("asserts unscaled_state.dtype == torch.int16"), std::string::npos)
          << e.what();
      // The fix is Megatron's (its load path hands TE the fp32 tensor), not TransformerEngine's.
      EXPECT_NE(std::string(e.what()).find("_set_main_param_and_optimizer_states @d98e8a6"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("Megatron-LM PR #4222, open, proposes casting it back to int16"),
                std::string::npos)
          << e.what();
      EXPECT_EQ(std::string(e.what()).find("TransformerEngine PR"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("/remainder'"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(same_state(resumed_rig, fresh)) << "a refused load must not touch the target";
    opts.exact_master_conversion = true;
  }

  // Predict each restored state independently: tests/roundtrip_reference.py (numpy, TE's
  // get_unscaled_state / _apply_scale rules written out) re-encodes every state a policy widens.
  nlohmann::json reference_input = {{"states", nlohmann::json::array()}};
  std::map<std::string, StoredState> expect;
  for (const auto& param_name : saved_rig.opt->param_names())
    for (StateKey k : kKeys) {
      const StoredState& orig = saved_rig.opt->stored(param_name, k);
      const std::string key = param_name + "/" + rh::optim::key_name(k);
      expect[key] = orig;
      const bool moment = k != StateKey::master_param;
      const bool scaled_master = !moment && orig.dtype == Dtype::fp16;   // re-scaled on load
      if ((moment || scaled_master) && save_policy != SavePolicyKind::native) {
        const Dtype cast_to = k == StateKey::exp_avg ? mode.cfg.exp_avg_dtype : mode.cfg.exp_avg_sq_dtype;
        reference_input["states"].push_back(
            {{"key", key},
             {"dtype", rh::optim::to_string(orig.dtype)},
             {"bits", code_bits(orig.data)},
             {"scale", orig.scale ? nlohmann::json(*orig.scale) : nlohmann::json()},
             {"scale_inv", orig.scale_inv ? nlohmann::json(*orig.scale_inv) : nlohmann::json()},
             {"cast", save_policy == SavePolicyKind::per_key && moment ? nlohmann::json(rh::optim::to_string(cast_to))
                                                                       : nlohmann::json()},
             {"guard", mode.cfg.scale_zero_guard}});
      }
    }
  const nlohmann::json predicted =
      rh::testing::python_reference_of("roundtrip_reference.py", reference_input, dir.p.string() + "_reference");
  bool lossy = false;
  for (auto& [key, e] : expect) {
    const StoredState orig = e;
    if (predicted.contains(key)) e = from_reference(predicted.at(key), orig);
    lossy |= !decodes_equal(e, orig);
  }
  // The weak spots must actually lose information in these runs.
  const bool low_moments = mode.cfg.exp_avg_dtype == Dtype::fp16 || mode.cfg.exp_avg_dtype == Dtype::fp8;
  if (save_policy == SavePolicyKind::per_key && low_moments) {
    EXPECT_TRUE(lossy) << "per_key fp16/fp8 must be lossy";
  }
  // fp16 through fp32 is exact for every amax (bench_scale_roundtrip); fp8 is not in general.
  if (save_policy == SavePolicyKind::native || !low_moments ||
      ((save_policy == SavePolicyKind::dp_reshardable || widened) && mode.cfg.exp_avg_dtype != Dtype::fp8 &&
       mode.cfg.exp_avg_sq_dtype != Dtype::fp8)) {
    EXPECT_FALSE(lossy);
  }

  if (lossy) {
    EXPECT_THROW(load_checkpoint(dir.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, {}, opts),
                 CheckpointError);
    EXPECT_TRUE(same_state(resumed_rig, fresh)) << "a refused load must not touch the target";
    opts.allow_lossy = true;
  }
  LoadReport load_report =
      load_checkpoint(dir.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, {}, opts);
  EXPECT_EQ(load_report.iteration, 3);
  EXPECT_EQ(load_report.dir, saved.dir);
  EXPECT_GT(load_report.verify_seconds, 0.0) << "both phases are timed";
  EXPECT_GT(load_report.apply_seconds, 0.0);
  for (const auto& param_name : saved_rig.opt->param_names())
    for (StateKey k : kKeys)
      EXPECT_TRUE(
          stored_equal(resumed_rig.opt->stored(param_name, k), expect[param_name + "/" + rh::optim::key_name(k)]))
          << param_name << "/" << rh::optim::key_name(k) << ": restored "
          << describe(resumed_rig.opt->stored(param_name, k)) << ", predicted "
          << describe(expect[param_name + "/" + rh::optim::key_name(k)]);
  auto saved_params = saved_rig.model->named_parameters(true),
       resumed_params = resumed_rig.model->named_parameters(true);
  for (size_t i = 0; i < saved_params.size(); ++i)
    EXPECT_TRUE(bytes_equal(saved_params[i].value(), resumed_params[i].value())) << saved_params[i].key();
  for (size_t g = 0; g < saved_rig.opt->num_groups(); ++g)
    EXPECT_EQ(resumed_rig.opt->step_count(g), saved_rig.opt->step_count(g));
  EXPECT_EQ(resumed_rig.state.iteration, saved_rig.state.iteration);
  EXPECT_EQ(resumed_rig.state.consumed_samples, saved_rig.state.consumed_samples);
  {   // the scheduler's state_dict, every key
    const auto &x = resumed_rig.state.opt_param_scheduler, &y = saved_rig.state.opt_param_scheduler;
    EXPECT_EQ(x.num_steps, y.num_steps);
    EXPECT_EQ(x.max_lr, y.max_lr);
    EXPECT_EQ(x.min_lr, y.min_lr);
    EXPECT_EQ(x.lr_warmup_steps, y.lr_warmup_steps);
    EXPECT_EQ(x.lr_decay_steps, y.lr_decay_steps);
    EXPECT_EQ(x.lr_decay_style, y.lr_decay_style);
    EXPECT_EQ(x.start_wd, y.start_wd);
    EXPECT_EQ(x.end_wd, y.end_wd);
    EXPECT_EQ(x.wd_incr_style, y.wd_incr_style);
    EXPECT_EQ(x.wd_incr_steps, y.wd_incr_steps);
  }
  EXPECT_EQ(resumed_rig.state.rng_states, saved_rig.state.rng_states);
  if (!lossy) {   // exact resume: the next step is identical too
    train(saved_rig, 1);
    train(resumed_rig, 1);
    EXPECT_TRUE(same_state(saved_rig, resumed_rig));
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> v;
  for (const Mode& m : all_modes())
    for (SavePolicyKind p : {SavePolicyKind::native, SavePolicyKind::dp_reshardable, SavePolicyKind::per_key,
                             SavePolicyKind::fully_reshardable, SavePolicyKind::dp_zero})
      v.push_back({m, p});
  return v;
}

INSTANTIATE_TEST_SUITE_P(ModesXPolicies, RoundTrip, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.mode.name + "_" + to_string(info.param.policy); });

Mode mode_named(const std::string& n) {
  for (const Mode& m : all_modes())
    if (m.name == n) return m;
  throw std::logic_error(n);
}

// Upstream: a master-mode change on load hands set_scaled_state a master_param of the other
// dtype and TE's assertion fails. Refused by default, saying so, for every policy but per_key
// (whose PR rules decide), with the target untouched.
TEST(Checkpoint, MasterModeConversionsAreRefusedAsUpstream) {
  torch::set_num_threads(1);
  TmpDir dir;
  Rig remainder_rig = make_rig(mode_named("remainders_bf16moments"), 1);
  train(remainder_rig, 3);
  Rig fp32_rig = make_rig(mode_named("fp32master_bf16moments"), 1);
  train(fp32_rig, 3);
  LoadOptions lossy;
  lossy.allow_lossy = true;
  for (SavePolicyKind save_policy : {SavePolicyKind::native, SavePolicyKind::dp_reshardable, SavePolicyKind::dp_zero}) {
    const std::string policy_dir = dir.str() + "/" + to_string(save_policy);
    save_checkpoint(policy_dir + "/rem", save_input(remainder_rig, {save_policy, {}}));
    save_checkpoint(policy_dir + "/fp32", save_input(fp32_rig, {save_policy, {}}));
    struct Try {
      std::string ckpt, target, want;
    };
    for (const Try& attempt : {Try{policy_dir + "/rem", "fp32master_bf16moments", "torch.float32"},
                               Try{policy_dir + "/fp32", "remainders_bf16moments", "torch.int16"}}) {
      Rig target_rig = make_rig(mode_named(attempt.target), 2), fresh = make_rig(mode_named(attempt.target), 2);
      try {
        load_checkpoint(attempt.ckpt, *target_rig.model, *target_rig.opt, target_rig.state, {}, lossy);
        ADD_FAILURE() << attempt.ckpt << " into " << attempt.target << " must be refused";
      } catch (const CheckpointError& e) {
        // dp_zero widens the remainder to fp32, which passes the float32 assertion: upstream
        // silently takes the integers as the master, and the refusal says that instead.
        const bool silent = save_policy == SavePolicyKind::dp_zero && attempt.want == "torch.float32";
        EXPECT_NE(std::string(e.what()).find(silent ? "accepts it (assert unscaled_state.dtype == torch.float32"
                                                    : "asserts unscaled_state.dtype == " + attempt.want),
                  std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find("exact_master_conversion"), std::string::npos) << e.what();
        // PR #4222 casts a widened remainder back; a master-mode change it does not fix.
        EXPECT_EQ(std::string(e.what()).find("4222"), std::string::npos) << e.what();
      }
      EXPECT_TRUE(same_state(target_rig, fresh)) << "a refused load must not touch the target";
    }
  }
}

TEST(Checkpoint, MasterModeConversionsAreExactAndReportedWhenAsked) {
  torch::set_num_threads(1);
  TmpDir dir;
  LoadOptions exact;
  exact.exact_master_conversion = true;
  // remainders -> fp32 master: join the bf16 weight with the remainder.
  Rig remainder_rig = make_rig(mode_named("remainders_bf16moments"), 1);
  train(remainder_rig, 3);
  save_checkpoint(dir.str() + "/rem", save_input(remainder_rig));
  Rig fp32_rig = make_rig(mode_named("fp32master_bf16moments"), 2);
  LoadReport load_report =
      load_checkpoint(dir.str() + "/rem", *fp32_rig.model, *fp32_rig.opt, fp32_rig.state, {}, exact);
  EXPECT_FALSE(load_report.conversions.empty());
  for (const auto& p : remainder_rig.opt->param_names())
    EXPECT_TRUE(bytes_equal(rh::ckpt::detail::unscaled(*fp32_rig.opt, p, StateKey::master_param),
                            rh::ckpt::detail::unscaled(*remainder_rig.opt, p, StateKey::master_param)))
        << p;
  // and back: the fp32 master splits into weight + remainder with the same joined value.
  save_checkpoint(dir.str() + "/fp32", save_input(fp32_rig));
  Rig remainder_again_rig = make_rig(mode_named("remainders_bf16moments"), 3);
  load_report = load_checkpoint(dir.str() + "/fp32", *remainder_again_rig.model, *remainder_again_rig.opt,
                                remainder_again_rig.state, {}, exact);
  EXPECT_FALSE(load_report.conversions.empty());
  for (const auto& p : remainder_rig.opt->param_names())
    EXPECT_TRUE(bytes_equal(rh::ckpt::detail::unscaled(*remainder_again_rig.opt, p, StateKey::master_param),
                            rh::ckpt::detail::unscaled(*remainder_rig.opt, p, StateKey::master_param)))
        << p;
  // remainder into an fp16 master cannot be exact: refused, target untouched.
  Rig fp16_rig = make_rig(mode_named("fp16master_fp8_fp16"), 4), fresh = make_rig(mode_named("fp16master_fp8_fp16"), 4);
  EXPECT_THROW(load_checkpoint(dir.str() + "/rem", *fp16_rig.model, *fp16_rig.opt, fp16_rig.state, {}, exact),
               CheckpointError);
  EXPECT_TRUE(same_state(fp16_rig, fresh));
}

TEST(Checkpoint, OverrideIsRecordedAsLossyAndRefused) {
  TmpDir dir;
  Rig saved_rig = make_rig(mode_named("remainders_fp32moments"), 1);
  train(saved_rig, 3);
  save_checkpoint(dir.str(), save_input(saved_rig, {SavePolicyKind::native, {{"exp_avg", Dtype::bf16}}}));
  Rig resumed_rig = make_rig(mode_named("remainders_fp32moments"), 2);
  try {
    load_checkpoint(dir.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, {}, {});
    FAIL() << "a bf16 override of fp32 moments must be refused";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("optim_rank_00000.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("/exp_avg'"), std::string::npos) << e.what();
  }
  LoadOptions lossy;
  lossy.allow_lossy = true;
  load_checkpoint(dir.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, {}, lossy);
  const std::string param_name = saved_rig.opt->param_names()[1];
  torch::Tensor want =
      saved_rig.opt->get_unscaled_state(param_name, StateKey::exp_avg).to(torch::kBFloat16).to(torch::kFloat);
  EXPECT_TRUE(bytes_equal(resumed_rig.opt->get_unscaled_state(param_name, StateKey::exp_avg), want));
  EXPECT_FALSE(bytes_equal(want, saved_rig.opt->get_unscaled_state(param_name, StateKey::exp_avg)));
}

TEST(Checkpoint, SkipKeysLeaveStatesAlone) {
  TmpDir dir;
  Rig saved_rig = make_rig(mode_named("remainders_bf16moments"), 1);
  train(saved_rig, 3);
  save_checkpoint(dir.str(), save_input(saved_rig));
  Rig resumed_rig = make_rig(mode_named("remainders_bf16moments"), 2);
  LoadOptions load_options;
  load_options.skip_keys = {"exp_avg", "remainder"};
  load_checkpoint(dir.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, {}, load_options);
  for (const auto& p : saved_rig.opt->param_names()) {
    EXPECT_EQ(resumed_rig.opt->stored(p, StateKey::exp_avg).data.abs().max().item<float>(), 0.0f) << p;
    EXPECT_EQ(resumed_rig.opt->stored(p, StateKey::master_param).data.abs().max().item<int>(), 0) << p;
    EXPECT_TRUE(
        stored_equal(resumed_rig.opt->stored(p, StateKey::exp_avg_sq), saved_rig.opt->stored(p, StateKey::exp_avg_sq)));
  }
  load_options.skip_keys = {"nonsense"};
  EXPECT_THROW(load_checkpoint(dir.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, {}, load_options),
               CheckpointError);
}

TEST(Checkpoint, DiskAccountingAddsUp) {
  TmpDir dir;
  Rig saved_rig = make_rig(mode_named("remainders_bf16moments"), 1);
  train(saved_rig, 1);
  SaveResult saved = save_checkpoint(dir.str(), save_input(saved_rig));
  int64_t num_params = 0;
  for (const auto& p : saved_rig.model->named_parameters(true)) num_params += p.value().numel();
  // bf16 weight 2 B + int16 remainder 2 B + bf16 moments 2 + 2 B: 8 B/param plus metadata.
  EXPECT_EQ(saved.bytes_per_key.at("model"), uint64_t(2 * num_params));
  EXPECT_EQ(saved.bytes_per_key.at("remainder"), uint64_t(2 * num_params));
  EXPECT_EQ(saved.bytes_per_key.at("exp_avg"), uint64_t(2 * num_params));
  EXPECT_EQ(saved.bytes_per_key.at("exp_avg_sq"), uint64_t(2 * num_params));
  uint64_t sum = 0;
  for (const auto& [k, b] : saved.bytes_per_key) sum += b;
  EXPECT_EQ(sum, saved.total_bytes);
  uint64_t on_disk = 0;
  for (const char* f : {"model.safetensors", "optim_rank_00000.safetensors", "manifest.json"})
    on_disk += fs::file_size(fs::path(saved.dir) / f);
  EXPECT_EQ(on_disk, saved.total_bytes);
  EXPECT_DOUBLE_EQ(saved.bytes_per_param, double(saved.total_bytes) / double(num_params));
  // disk.csv rows add up to the same total.
  std::ifstream csv(fs::path(saved.dir) / "disk.csv");
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "file,key,kind,dtype,numel,bytes,raw_bytes");
  uint64_t csv_sum = 0, raw_sum = 0;
  while (std::getline(csv, line)) {
    const size_t last = line.rfind(','), prev = line.rfind(',', last - 1);
    csv_sum += std::stoull(line.substr(prev + 1, last - prev - 1));
    raw_sum += std::stoull(line.substr(last + 1));
  }
  EXPECT_EQ(csv_sum, saved.total_bytes);
  EXPECT_EQ(raw_sum, saved.total_bytes);   // uncompressed: raw == on disk
}

TEST(Checkpoint, ResaveOfSameIterationReplacesAtomically) {
  TmpDir dir;
  Rig saved_rig = make_rig(mode_named("remainders_bf16moments"), 1);
  train(saved_rig, 2);
  save_checkpoint(dir.str(), save_input(saved_rig));
  // Same iteration, different content; the scheduler counts samples too, and load checks that
  // the two agree.
  saved_rig.state.consumed_samples = saved_rig.state.opt_param_scheduler.num_steps = 12345;
  save_checkpoint(dir.str(), save_input(saved_rig));
  Rig resumed_rig = make_rig(mode_named("remainders_bf16moments"), 2);
  load_checkpoint(dir.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, {}, {});
  EXPECT_EQ(resumed_rig.state.consumed_samples, 12345);
  for (const auto& e : fs::directory_iterator(dir.p))
    EXPECT_EQ(e.path().filename().string().rfind(".", 0), std::string::npos) << "leftover " << e.path();
}


// The model file is written on a second thread beside the optimizer shard: its failure still
// fails the save with its own message, leaves no temp directory and keeps the previous
// checkpoint the newest.
TEST(Checkpoint, FailingModelWriteKeepsThePreviousCheckpoint) {
  TmpDir dir;
  Rig saved_rig = make_rig(mode_named("remainders_bf16moments"), 1);
  train(saved_rig, 2);
  save_checkpoint(dir.str(), save_input(saved_rig));
  struct WithInt8 : torch::nn::Module {   // int8 has no safetensors name here: write_model throws
    explicit WithInt8(std::shared_ptr<Toy> t) {
      register_module("toy", std::move(t));
      register_parameter("codes", torch::zeros({4}, torch::kChar), /*requires_grad=*/false);
    }
  } bad(saved_rig.model);
  train(saved_rig, 1);
  rh::ckpt::SaveInput failing_input = save_input(saved_rig);
  failing_input.model = &bad;
  try {
    save_checkpoint(dir.str(), failing_input);
    ADD_FAILURE() << "a model the writer cannot store must fail the save";
  } catch (const rh::ckpt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("model parameter codes"), std::string::npos) << e.what();
  }
  for (const auto& e : fs::directory_iterator(dir.p))
    EXPECT_EQ(e.path().filename().string().rfind(".", 0), std::string::npos) << "leftover " << e.path();
  EXPECT_FALSE(fs::exists(dir.p / "iter_0000003"));
  Rig resumed_rig = make_rig(mode_named("remainders_bf16moments"), 2);
  EXPECT_EQ(load_checkpoint(dir.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, {}, {}).iteration, 2);
}

}   // namespace

namespace {

// Every kind name, aliases included, parses and prints back; the alias prints as its kind.
TEST(SavePolicyText, EveryNameRoundTripsAndTheAliasPrintsAsItsKind) {
  EXPECT_EQ(save_policy_names(),
            (std::vector<std::string>{"native", "dp_reshardable", "fp32", "fully_reshardable", "dp_zero", "per_key"}));
  EXPECT_EQ(save_policy_help(), "native | dp_reshardable (alias fp32) | fully_reshardable | dp_zero | per_key");
  for (const char* n : {"native", "dp_reshardable", "fully_reshardable", "dp_zero", "per_key"})
    EXPECT_EQ(to_string(parse_save_policy(n)), n);
  EXPECT_EQ(parse_save_policy("fp32"), SavePolicyKind::dp_reshardable);
  try {
    parse_save_policy("fp64");
    ADD_FAILURE() << "fp64 parsed";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "unknown save policy 'fp64' (expected native, dp_reshardable (alias fp32), "
                 "fully_reshardable, dp_zero or per_key)");
  }
}

TEST(SavePolicyText, OverrideKeysAreTheOptimizerStates) {
  EXPECT_EQ(parse_override_key("master_param", "x"), rh::optim::StateKey::master_param);
  EXPECT_EQ(parse_override_key("exp_avg", "x"), rh::optim::StateKey::exp_avg);
  EXPECT_EQ(parse_override_key("exp_avg_sq", "x"), rh::optim::StateKey::exp_avg_sq);
  for (const char* bad : {"remainder", "scale", "", "exp_avg "}) {
    try {
      parse_override_key(bad, "--save-override k");
      ADD_FAILURE() << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                "--save-override k: expected master_param, exp_avg or exp_avg_sq, got '" + std::string(bad) + "'");
    }
  }
}

TEST(SavePolicyText, CommandLineJsonAndBackAgree) {
  const SavePolicy p = parse_save_policy_args("fp32", {"exp_avg_sq=bf16", "master_param=fp16"});
  EXPECT_EQ(p.kind, SavePolicyKind::dp_reshardable);
  EXPECT_EQ(p.overrides.size(), 2u);
  EXPECT_EQ(p.overrides.at("exp_avg_sq"), rh::optim::Dtype::bf16);
  EXPECT_EQ(p.overrides.at("master_param"), rh::optim::Dtype::fp16);
  SavePolicy z = p;
  z.compress = Compression::zstd;
  // The manifest's form and the save plan's (kind under "policy").
  EXPECT_EQ(to_json(z).dump(),
            R"({"compress":"zstd","kind":"dp_reshardable","overrides":{"exp_avg_sq":"bf16","master_param":"fp16"}})");
  EXPECT_EQ(to_json(SavePolicy{}, "policy").dump(), R"({"compress":"none","overrides":{},"policy":"native"})");
  for (const char* kind_key : {"kind", "policy"}) {
    const nlohmann::json j = to_json(z, kind_key);
    const SavePolicy back = parse_save_policy_json(JsonField(j, "t"), kind_key);
    EXPECT_EQ(back.kind, z.kind);
    EXPECT_EQ(back.compress, z.compress);
    EXPECT_EQ(back.overrides, z.overrides);
  }
  // Absent fields are the defaults; a bad one is named by its JSON path.
  const SavePolicy d = parse_save_policy_json(JsonField(nlohmann::json::object(), "t"));
  EXPECT_EQ(d.kind, SavePolicyKind::native);
  EXPECT_EQ(d.compress, Compression::none);
  EXPECT_TRUE(d.overrides.empty());
  const nlohmann::json bad = {{"overrides", {{"remainder", "bf16"}}}};
  try {
    parse_save_policy_json(JsonField(bad, "plan"));
    ADD_FAILURE() << "remainder override parsed";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("/overrides/remainder"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_save_policy_args("native", {"exp_avg"}), std::invalid_argument);
  EXPECT_THROW(parse_save_policy_args("native", {"exp_avg=int8"}), std::invalid_argument);
}

// A scheduler state whose every value differs from the defaults and from each other.
OptParamSchedulerState distinct_scheduler() {
  OptParamSchedulerState s;
  s.max_lr = 3e-4;
  s.lr_warmup_steps = 11;
  s.num_steps = 12;
  s.lr_decay_style = "WSD";
  s.lr_decay_steps = 13;
  s.min_lr = 3e-5;
  s.start_wd = 0.01;
  s.end_wd = 0.02;
  s.wd_incr_style = "linear";
  s.wd_incr_steps = 14;
  return s;
}

TEST(TrainStateJson, EverySchedulerKeyIsWrittenReadBackAndCheckedAlone) {
  const std::vector<std::string> keys = {"end_wd",        "lr_decay_steps", "lr_decay_style", "lr_warmup_steps",
                                         "max_lr",        "min_lr",         "num_steps",      "start_wd",
                                         "wd_incr_steps", "wd_incr_style"};
  const OptParamSchedulerState s = distinct_scheduler();
  const nlohmann::json j = to_json(s);
  std::vector<std::string> got;
  for (auto it = j.begin(); it != j.end(); ++it) got.push_back(it.key());
  EXPECT_EQ(got, keys);
  EXPECT_EQ(j["max_lr"], 3e-4);
  EXPECT_EQ(j["lr_warmup_steps"], 11);
  EXPECT_EQ(j["num_steps"], 12);
  EXPECT_EQ(j["lr_decay_style"], "WSD");
  EXPECT_EQ(j["lr_decay_steps"], 13);
  EXPECT_EQ(j["min_lr"], 3e-5);
  EXPECT_EQ(j["start_wd"], 0.01);
  EXPECT_EQ(j["end_wd"], 0.02);
  EXPECT_EQ(j["wd_incr_style"], "linear");
  EXPECT_EQ(j["wd_incr_steps"], 14);
  EXPECT_EQ(to_json(parse_scheduler_state(JsonField(j, "m"), 1000)), j);
  for (const std::string& k : keys) {
    nlohmann::json missing = j;
    missing.erase(k);
    try {
      parse_scheduler_state(JsonField(missing, "m"), 1000);
      ADD_FAILURE() << "missing " << k << " parsed";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("/" + k), std::string::npos) << e.what();
    }
    nlohmann::json wrong = j;
    wrong[k] = nlohmann::json::array();
    EXPECT_THROW(parse_scheduler_state(JsonField(wrong, "m"), 1000), CheckpointError) << k;
  }
  nlohmann::json big = j;
  big["num_steps"] = 1001;   // a counter beyond the cap
  EXPECT_THROW(parse_scheduler_state(JsonField(big, "m"), 1000), CheckpointError);
}

TEST(TrainStateJson, TheTrainStateParsesOnceWithItsGenerators) {
  TrainState t;
  t.iteration = 4;
  t.consumed_samples = 12;
  t.opt_param_scheduler = distinct_scheduler();
  t.rng_states["dropout"] = {0x00, 0x01, 0xab, 0xff};
  const nlohmann::json j = to_json(t);
  EXPECT_EQ(j["rng_states"]["dropout"], "0001abff");
  const TrainState back = parse_train_state(JsonField(j, "m"), 4, 1000);
  EXPECT_EQ(back.iteration, 4);
  EXPECT_EQ(back.consumed_samples, 12);
  EXPECT_EQ(to_json(back.opt_param_scheduler), to_json(t.opt_param_scheduler));
  EXPECT_EQ(back.rng_states, t.rng_states);
  EXPECT_THROW(parse_train_state(JsonField(j, "m"), 5, 1000), CheckpointError);   // differs from /iteration
  nlohmann::json odd = j;
  odd["rng_states"]["dropout"] = "abc";
  EXPECT_THROW(parse_train_state(JsonField(odd, "m"), 4, 1000), CheckpointError);
  EXPECT_EQ(parse_hex(JsonField(nlohmann::json("0001ABff"), "h")), (std::vector<uint8_t>{0x00, 0x01, 0xab, 0xff}));
}

}   // namespace
