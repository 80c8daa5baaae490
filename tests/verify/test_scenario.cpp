// Scenario files: matrix expansion, canonical names and selection, TOML errors with file:line:key,
// JUnit XML validity (parsed by Python's XML parser), and the golden metrics comparison.
#include <gtest/gtest.h>

#include <regex>
#include <algorithm>
#include <iterator>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <unistd.h>
#include <cmath>

#include "harness/base/text.h"
#include "harness/verify/golden.h"
#include "harness/verify/matrix.h"
#include "harness/verify/writers.h"
#include "harness/train/metrics.h"
#include "harness/train/config.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/verify/scenario.h"

#include <sys/stat.h>

namespace fs = std::filesystem;

namespace {

fs::path temp_file(const std::string& name, const std::string& body) {
  auto dir = fs::temp_directory_path() / ("rh_scenario_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto file_path = dir / name;
  std::ofstream(file_path) << body;
  return file_path;
}

const rh::Scenario& by_name(const std::vector<rh::Scenario>& scenarios, const std::string& name) {
  for (const auto& s : scenarios)
    if (s.name == name) return s;
  throw std::runtime_error("no scenario " + name);
}

TEST(Scenarios, CiMatrixExpandsWithCanonicalNamesExcludesAndExpectations) {
  auto all = rh::load_scenarios(std::string(RH_SOURCE_DIR) + "/scenarios/ci.toml");
  // states: 2 x 2 x 3 minus the excluded fp32+remainders row (3) = 9; scaled 6; faults 9; 2 named.
  // + dp (2 sizes x 2 moments), reshard (2), dp fault, dead-expert (2 guards x 3 policies),
  // schedule (2 LR decay styles), expert-bias (dp 1 x bf16/fp8, dp 2 x bf16, and its fault),
  // compressed (2 sizes x 2 moments), token-drop (2 drop policies), formats (2 policies x 2 masters),
  // buckets (resumed with the same bucket layout and with one bucket), dp3 (fp32 and bf16 main grads)
  EXPECT_EQ(all.size(), 9u + 6u + 9u + 2u + 4u + 2u + 1u + 6u + 2u + 4u + 4u + 2u + 4u + 2u + 2u);
  EXPECT_EQ(by_name(all, "buckets/resume=one-bucket").expect.kind, rh::Expectation::Kind::refused);
  const auto& dp3 = by_name(all, "dp3/grads=bf16");
  EXPECT_EQ(dp3.dp_size, 3);
  EXPECT_EQ(dp3.expect.kind, rh::Expectation::Kind::exact);
  EXPECT_EQ(dp3.cfg.optim.main_grads_dtype, rh::optim::Dtype::bf16);
  EXPECT_EQ(dp3.cfg.optim.ddp_bucket_size, 100000);
  EXPECT_EQ(dp3.cfg.train.global_batch / dp3.cfg.train.micro_batch, 3);   // one micro-batch per rank
  // Megatron's widened remainder (dp_zero) into a remainder optimizer: upstream TE refuses it.
  EXPECT_EQ(by_name(all, "formats/policy=dp_zero,master=remainders").expect.kind, rh::Expectation::Kind::refused);
  EXPECT_EQ(by_name(all, "formats/policy=dp_zero,master=fp32").expect.kind, rh::Expectation::Kind::exact);
  EXPECT_EQ(by_name(all, "formats/policy=dp_reshardable,master=remainders").policy.kind,
            rh::ckpt::SavePolicyKind::dp_reshardable);
  for (const char* policy : {"probs", "position"}) {
    const auto& token_drop = by_name(all, std::string("token-drop/drop=") + policy);
    EXPECT_EQ(token_drop.cfg.model.capacity_factor, 0.5);
    EXPECT_EQ(token_drop.cfg.model.token_drop_policy, policy);
    EXPECT_EQ(token_drop.expect.kind, rh::Expectation::Kind::exact);
  }
  const auto& expert_bias = by_name(all, "expert-bias/dp=2,moments=bf16");
  EXPECT_TRUE(expert_bias.cfg.model.enable_expert_bias);
  EXPECT_EQ(expert_bias.cfg.model.score_function, "sigmoid");
  EXPECT_EQ(expert_bias.dp_size, 2);
  EXPECT_EQ(by_name(all, "expert-bias/fault=skip_expert_bias_restore").fault, rh::Fault::skip_expert_bias_restore);
  const auto& wsd = by_name(all, "schedule/lr=WSD");
  EXPECT_EQ(wsd.cfg.train.lr_decay_style, "WSD");
  EXPECT_EQ(wsd.cfg.train.lr_wsd_decay_iters, 12);
  EXPECT_EQ(wsd.cfg.train.weight_decay_incr_style, "cosine");
  EXPECT_EQ(by_name(all, "faults/fault=reset_wd_schedule").cfg.train.weight_decay_incr_style, "linear");
  const auto& compressed = by_name(all, "compressed/dp=2,moments=fp8");
  EXPECT_EQ(compressed.policy.compress, rh::ckpt::Compression::zstd);
  EXPECT_EQ(compressed.policy.kind, rh::ckpt::SavePolicyKind::native);
  EXPECT_TRUE(compressed.cfg.optim.store_param_remainders);
  EXPECT_EQ(compressed.expect.kind, rh::Expectation::Kind::exact);
  EXPECT_EQ(by_name(all, "seed-protocol").policy.compress, rh::ckpt::Compression::none);
  const auto& states_cell = by_name(all, "states/moments=bf16,master=remainders,policy=per_key");
  EXPECT_EQ(states_cell.policy.kind, rh::ckpt::SavePolicyKind::per_key);
  EXPECT_EQ(states_cell.cfg.optim.exp_avg_dtype, rh::optim::Dtype::bf16);
  EXPECT_TRUE(states_cell.cfg.optim.store_param_remainders);
  EXPECT_EQ(states_cell.expect.kind, rh::Expectation::Kind::exact);
  EXPECT_THROW(by_name(all, "states/moments=fp32,master=remainders,policy=native"), std::runtime_error);
  const auto& lossy = by_name(all, "scaled/moments=fp8,policy=per_key");
  EXPECT_EQ(lossy.expect.kind, rh::Expectation::Kind::diverge);
  EXPECT_TRUE(lossy.allow_lossy);
  EXPECT_FALSE(lossy.expect.reason.empty());
  const auto& fault = by_name(all, "faults/fault=lossy_dtype_override");
  EXPECT_EQ(fault.fault, rh::Fault::none);   // a lossy save is a save setting (save_overrides), not a load fault
  EXPECT_EQ(fault.policy.overrides.at("exp_avg_sq"), rh::optim::Dtype::bf16);
  EXPECT_EQ(fault.cfg.optim.exp_avg_dtype, rh::optim::Dtype::fp32);
  EXPECT_EQ(by_name(all, "seed-protocol").save_at, 10);
  EXPECT_EQ(by_name(all, "seed-protocol").cfg.train.iterations, 20);
}

TEST(Scenarios, DefaultMatrixCoversEveryFaultAndPolicy) {
  auto all = rh::load_scenarios(std::string(RH_SOURCE_DIR) + "/scenarios/default.toml");
  std::set<std::string> faults, policies;
  for (const auto& s : all) {
    faults.insert(rh::to_string(s.fault));
    policies.insert(rh::ckpt::to_string(s.policy.kind));
  }
  EXPECT_EQ(faults.size(), rh::fault_names().size());
  EXPECT_EQ(policies.size(), 5u);   // native, per_key and Megatron's three formats
  // formats: 3 policies x 2 masters x 3 moments x 3 sizes
  EXPECT_EQ(rh::select_scenarios(all, "formats/").size(), 54u);
  EXPECT_EQ(rh::select_scenarios(all, "states/").size(), 24u);
  // compressed: every master mode (fp32, remainders, fp16) x every moment dtype, all exact.
  const auto compressed = rh::select_scenarios(all, "compressed/");
  EXPECT_EQ(compressed.size(), 12u);
  for (const auto& s : compressed) {
    EXPECT_EQ(s.policy.compress, rh::ckpt::Compression::zstd) << s.name;
    EXPECT_EQ(s.expect.kind, rh::Expectation::Kind::exact) << s.name;
  }
  // every LR decay style, WSD anneal style used, and weight-decay increment style at least once
  std::set<std::string> lr_styles, wd_styles;
  for (const auto& s : all) {
    lr_styles.insert(s.cfg.train.lr_decay_style);
    wd_styles.insert(s.cfg.train.weight_decay_incr_style);
  }
  EXPECT_EQ(lr_styles, (std::set<std::string>{"constant", "linear", "cosine", "inverse-square-root", "WSD"}));
  EXPECT_EQ(wd_styles, (std::set<std::string>{"constant", "linear", "cosine"}));
  EXPECT_EQ(rh::select_scenarios(all, "schedule/").size(), 15u);
  EXPECT_EQ(rh::select_scenarios(all, "expert-bias/").size(), 8u + 2u);
  EXPECT_TRUE(by_name(all, "expert-bias/reshard=2to1").resharded());
  // --moe-pad-expert-input-to-capacity: 2 exact cells (dp 1, 2) with capacity factor and bias
  const auto pad = rh::select_scenarios(all, "token-drop-pad/");
  ASSERT_EQ(pad.size(), 2u);
  for (const auto& s : pad) {
    EXPECT_TRUE(s.cfg.model.pad_to_capacity) << s.name;
    EXPECT_EQ(s.cfg.model.capacity_factor, 0.5) << s.name;
    EXPECT_TRUE(s.cfg.model.enable_expert_bias) << s.name;
    EXPECT_EQ(s.expect.kind, rh::Expectation::Kind::exact) << s.name;
  }
}

// Megatron's format names and the earlier "fp32" alias; the refused expectation and the
// exact_master_conversion key; a refused cell needs its reason.
TEST(Scenarios, FormatsRefusedExpectationAndMasterConversionKey) {
  const auto scenarios = rh::load_scenarios_text(
      "[[scenario]]\nname = \"a\"\nsave_policy = \"fp32\"\n"
      "[[scenario]]\nname = \"b\"\nsave_policy = \"fully_reshardable\"\nexpect = \"refused\"\nreason = \"TE asserts\"\n"
      "exact_master_conversion = true\n",
      "formats.toml");
  ASSERT_EQ(scenarios.size(), 2u);
  EXPECT_EQ(scenarios[0].policy.kind, rh::ckpt::SavePolicyKind::dp_reshardable);
  EXPECT_FALSE(scenarios[0].exact_master_conversion);
  EXPECT_EQ(scenarios[1].policy.kind, rh::ckpt::SavePolicyKind::fully_reshardable);
  EXPECT_EQ(scenarios[1].expect.kind, rh::Expectation::Kind::refused);
  EXPECT_TRUE(scenarios[1].exact_master_conversion);
  EXPECT_EQ(rh::ckpt::to_string(scenarios[0].policy.kind), "dp_reshardable");
  EXPECT_THROW(rh::load_scenarios_text("[[scenario]]\nname = \"c\"\nexpect = \"refused\"\n", "x.toml"),
               rh::ScenarioError);
  EXPECT_THROW(rh::load_scenarios_text("[[scenario]]\nname = \"d\"\nexact_master_conversion = 1\n", "x.toml"),
               rh::ScenarioError);
}

// The resumed run's bucket size and exact_rebucket (not upstream); a negative size is refused,
// and an external cell may not use them.
TEST(Scenarios, ResumeBucketSizeAndExactRebucketKeys) {
  const auto scenarios = rh::load_scenarios_text(
      "[[scenario]]\nname = \"a\"\n"
      "[[scenario]]\nname = \"b\"\nresume_ddp_bucket_size = 0\nexact_rebucket = true\n",
      "buckets.toml");
  ASSERT_EQ(scenarios.size(), 2u);
  EXPECT_EQ(scenarios[0].resume_ddp_bucket_size, -1);
  EXPECT_FALSE(scenarios[0].exact_rebucket);
  EXPECT_EQ(scenarios[1].resume_ddp_bucket_size, 0);
  EXPECT_TRUE(scenarios[1].exact_rebucket);
  try {
    rh::load_scenarios_text("[[scenario]]\nname = \"c\"\nresume_ddp_bucket_size = -5\n", "x.toml");
    ADD_FAILURE() << "a negative bucket size must be refused";
  } catch (const rh::ScenarioError& e) {
    EXPECT_NE(std::string(e.what()).find("resume_ddp_bucket_size"), std::string::npos) << e.what();
  }
  EXPECT_THROW(rh::load_scenarios_text("[[scenario]]\nname = \"d\"\nexact_rebucket = \"yes\"\n", "x.toml"),
               rh::ScenarioError);
}

// A scenario's model/optimizer/train tables and axis keys take a setting's Megatron name (its
// flag without dashes, '-' as '_') beside its key, as config.json does. Independent expectation:
// the values written out by hand, and the same file with the keys.
TEST(Scenarios, MegatronNamesInTablesPresetsAndAxisKeys) {
  const std::string by_name =
      "[defaults.train]\ntrain_iters = 12\nmicro_batch_size = 4\n"
      "[[scenario]]\nname = \"a\"\nsave_at = 5\nmodel = { hidden_size = 48, moe_router_topk = 1 }\n"
      "[scenario.optimizer]\nadam_beta2 = 0.9\nuse_precision_aware_optimizer = true\nexp_avg_dtype = \"bf16\"\n"
      "[[matrix]]\nname = \"m\"\nsave_at = 3\n"
      "[[matrix.axis]]\nname = \"lr\"\nkey = \"train.lr\"\nvalues = [0.5]\n"
      "[[matrix.axis]]\nname = \"decay\"\nkey = \"train.lr_decay_iters\"\nvalues = [9]\n"
      "[[matrix.axis]]\nname = \"width\"\nvalues = [\"w\"]\n"
      "[matrix.axis.presets]\nw = { model = { hidden_size = 64, num_attention_heads = 4 } }\n";
  std::string by_key = by_name;
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{{"train_iters", "iterations"},
                                                                                 {"micro_batch_size", "micro_batch"},
                                                                                 {"hidden_size", "d_model"},
                                                                                 {"moe_router_topk", "top_k"},
                                                                                 {"adam_beta2", "beta2"},
                                                                                 {"num_attention_heads", "n_heads"}})
    for (size_t at; (at = by_key.find(from)) != std::string::npos;) by_key.replace(at, from.size(), to);
  const auto named = rh::load_scenarios_text(by_name, "names.toml");
  const auto keyed = rh::load_scenarios_text(by_key, "keys.toml");
  ASSERT_EQ(named.size(), 2u);
  ASSERT_EQ(keyed.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(rh::to_json(named[i].cfg), rh::to_json(keyed[i].cfg)) << named[i].name;
  const auto& first_config = named[0].cfg;
  EXPECT_EQ(first_config.train.iterations, 12);
  EXPECT_EQ(first_config.train.micro_batch, 4);
  EXPECT_EQ(first_config.model.d_model, 48);
  EXPECT_EQ(first_config.model.top_k, 1);
  EXPECT_EQ(first_config.optim.beta2, 0.9);
  EXPECT_EQ(first_config.optim.exp_avg_dtype, rh::optim::Dtype::bf16);
  EXPECT_EQ(named[1].name, "m/lr=0.5,decay=9,width=w");
  const auto& matrix_config = named[1].cfg;
  EXPECT_EQ(matrix_config.train.lr, 0.5);
  EXPECT_EQ(matrix_config.train.lr_decay_iters, 9);
  EXPECT_EQ(matrix_config.model.d_model, 64);
  EXPECT_EQ(matrix_config.model.n_heads, 4);
  EXPECT_EQ(matrix_config.train.iterations, 12);   // from [defaults]
}

TEST(Scenarios, SelectionByNameSubstringAndGlob) {
  auto all = rh::load_scenarios(std::string(RH_SOURCE_DIR) + "/scenarios/ci.toml");
  EXPECT_EQ(rh::select_scenarios(all, "seed-protocol").size(), 1u);
  EXPECT_EQ(rh::select_scenarios(all, "faults/").size(), 9u);
  EXPECT_EQ(rh::select_scenarios(all, "states/*policy=per_key").size(), 3u);
  EXPECT_TRUE(rh::select_scenarios(all, "no-such").empty());
  EXPECT_EQ(rh::safe_name("states/a=b,c=d"), "states__a=b+c=d");
}

struct BadFile {
  const char* label;
  const char* body;
  const char* needle;   // must appear in the message, after "file:line"
  int line;
};

class ScenarioErrors : public ::testing::TestWithParam<BadFile> {};

TEST_P(ScenarioErrors, NameFileLineAndKey) {
  const auto& bad_file = GetParam();
  auto scenario_path = temp_file(std::string(bad_file.label) + ".toml", bad_file.body);
  try {
    rh::load_scenarios(scenario_path.string());
    FAIL() << "accepted " << bad_file.label;
  } catch (const rh::ScenarioError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(scenario_path.string() + ":" + std::to_string(bad_file.line)), std::string::npos) << msg;
    EXPECT_NE(msg.find(bad_file.needle), std::string::npos) << msg;
    static const std::regex doubled(R"((\b[A-Za-z_.]+): \1: )");   // "save_policy: save_policy: ..."
    EXPECT_FALSE(std::regex_search(msg, doubled)) << "a doubled prefix: " << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ScenarioErrors,
    ::testing::Values(
        BadFile{"syntax", "[[scenario]]\nname = \"a\"\nsave_at = = 3\n", "", 3},
        BadFile{"unknown_key", "[[scenario]]\nname = \"a\"\nsave_at = 3\nsav_policy = \"native\"\n", "sav_policy", 4},
        BadFile{"bad_type", "[[scenario]]\nname = \"a\"\n\nsave_at = \"ten\"\n", "save_at", 4},
        BadFile{"bad_policy", "[[scenario]]\nname = \"a\"\nsave_policy = \"fp64\"\n",
                "save_policy: unknown save policy 'fp64'", 3},
        BadFile{"bad_model_key", "[[scenario]]\nname = \"a\"\n[scenario.model]\nd_modle = 3\n", "model.d_modle", 4},
        BadFile{"bad_dtype", "[[scenario]]\nname = \"a\"\n[scenario.optimizer]\nexp_avg_dtype = \"fp64\"\n",
                "exp_avg_dtype", 4},
        BadFile{"no_reason", "[[scenario]]\nname = \"a\"\nexpect = \"diverge\"\n", "needs a reason", 1},
        BadFile{"save_at_range", "[[scenario]]\nname = \"a\"\nsave_at = 20\n", "save_at", 1},
        BadFile{"missing_preset",
                "[[matrix]]\nname = \"m\"\n[[matrix.axis]]\nname = \"x\"\nvalues = [\"a\"]\n[matrix.axis.presets]\nb = "
                "{}\n",
                "no preset", 3},
        BadFile{"bad_fault", "[[scenario]]\nname = \"a\"\nfault = \"skip_everything\"\n", "skip_everything", 3},
        BadFile{"megatron_rule",
                "[[scenario]]\nname = \"a\"\n[scenario.optimizer]\nuse_precision_aware_optimizer = "
                "false\nexp_avg_dtype = \"bf16\"\n",
                "precision", 1},
        BadFile{"dp_indivisible", "[[scenario]]\nname = \"a\"\ndp_size = 4\n", "do not divide the 2 micro-batches", 1},
        BadFile{"resume_dp_range", "[[scenario]]\nname = \"a\"\nresume_dp_size = -1\n", "resume_dp_size", 1},
        BadFile{"dp_type", "[[scenario]]\nname = \"a\"\ndp_size = \"two\"\n", "dp_size", 3},
        // Names that would make a scenario directory the run directory itself.
        BadFile{"name_dotdot", "[[scenario]]\nname = \"..\"\n", "scenario.name", 2},
        BadFile{"name_dot", "[[scenario]]\nname = \".\"\n", "scenario.name", 2},
        BadFile{"name_empty", "[[scenario]]\nname = \"\"\n", "is empty", 2},
        BadFile{"name_dotdot_segment", "[[scenario]]\nname = \"../../etc\"\n", "'..' path segment", 2},
        BadFile{"name_empty_segment", "[[scenario]]\nname = \"a//b\"\n", "path segment", 2},
        BadFile{"name_backslash", "[[scenario]]\nname = \"a\\\\b\"\n", "path separator", 2},
        BadFile{"name_control", "[[scenario]]\nname = \"a\\u0001b\"\n", "control character", 2},
        BadFile{"matrix_name_dotdot",
                "[[matrix]]\nname = \"..\"\n[[matrix.axis]]\nname = \"x\"\nkey = \"save_at\"\nvalues = [3]\n",
                "matrix.name", 2},
        BadFile{"axis_value_slash",
                "[[matrix]]\nname = \"m\"\n[[matrix.axis]]\nname = \"x\"\nkey = \"description\"\nvalues = [\"a/b\"]\n",
                "path separator", 6},
        // Tolerances that let anything pass, unmatched `when`s, model settings
        // that cannot work, and caps (item 4): bad input at parse time, not a failure at run time.
        BadFile{"tolerance_inf",
                "[[scenario]]\nname = \"a\"\nexpect = \"tolerance\"\nreason = \"r\"\ntolerance = { lm_loss = { atol = "
                "inf } }\n",
                "expected a finite number >= 0", 5},
        BadFile{"tolerance_nan",
                "[[scenario]]\nname = \"a\"\nexpect = \"tolerance\"\nreason = \"r\"\ntolerance = { lm_loss = { rtol = "
                "nan } }\n",
                "tolerance.lm_loss.rtol", 5},
        BadFile{"tolerance_negative",
                "[[scenario]]\nname = \"a\"\nexpect = \"tolerance\"\nreason = \"r\"\ntolerance = { lm_loss = { atol = "
                "-1.0 } }\n",
                "expected a finite number >= 0", 5},
        BadFile{"when_matches_nothing",
                "[[matrix]]\nname = \"m\"\n[[matrix.axis]]\nname = \"x\"\nkey = \"save_at\"\nvalues = [3, 4]\n"
                "[[matrix.expect]]\nwhen = { x = \"5\" }\nexpect = \"diverge\"\nreason = \"r\"\n",
                "'when' matches no cell", 7},
        BadFile{"exclude_matches_nothing",
                "[[matrix]]\nname = \"m\"\n[[matrix.axis]]\nname = \"x\"\nkey = \"save_at\"\nvalues = [3, 4]\n"
                "[[matrix.exclude]]\nx = \"5\"\n",
                "m.exclude: matches no cell", 7},
        BadFile{"matrix_too_many_cells",
                "[[matrix]]\nname = \"m\"\n"
                "[[matrix.axis]]\nname = \"a\"\nkey = \"description\"\nvalues = "
                "[\"0\",\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]\n"
                "[[matrix.axis]]\nname = \"b\"\nkey = \"description\"\nvalues = "
                "[\"0\",\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]\n"
                "[[matrix.axis]]\nname = \"c\"\nkey = \"description\"\nvalues = "
                "[\"0\",\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]\n"
                "[[matrix.axis]]\nname = \"d\"\nkey = \"description\"\nvalues = "
                "[\"0\",\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]\n",
                "expands to more than 4096 cells", 1},
        // toml++ 3.3.0 reaches __builtin_unreachable() on U+0403 at a token boundary (found by
        // scripts/fuzz.sh scenario): non-ASCII is refused before the parser sees it.
        BadFile{"non_ascii_after_value", "[[scenario]]\nname = \"a\"\xd0\x83\n", "column 11: byte 0xD0 is not ASCII",
                2},
        BadFile{"non_ascii_in_comment", "# ok\n[[scenario]] # caf\xc3\xa9\nname = \"a\"\n", "byte 0xC3", 2},
        BadFile{"dropout_2", "[[scenario]]\nname = \"a\"\n[scenario.model]\ndropout = 2.0\n", "dropout", 1},
        BadFile{"zero_layers", "[[scenario]]\nname = \"a\"\n[scenario.model]\nn_layers = 0\n",
                "key 'model.n_layers': expected an integer in [1, 256], got 0", 4},
        BadFile{"topk_over_experts", "[[scenario]]\nname = \"a\"\n[scenario.model]\ntop_k = 99\n", "top_k", 1},
        BadFile{"heads_not_dividing", "[[scenario]]\nname = \"a\"\n[scenario.model]\nn_heads = 7\n", "n_heads", 1},
        BadFile{"threads_100000", "[[scenario]]\nname = \"a\"\n[scenario.train]\nthreads = 100000\n",
                "key 'train.threads': expected an integer in [1, 256], got 100000", 4},
        BadFile{"iterations_huge", "[[scenario]]\nname = \"a\"\n[scenario.train]\niterations = 999999999999\n",
                "key 'train.iterations': expected an integer in [1, 10000000], got 999999999999", 4},
        // Run-config sections are read through the config's field table: a wrong type names the
        // key and the value's own line, a Megatron-name typo gets a suggestion, and one setting
        // given under its key and its Megatron name in one table is refused.
        BadFile{"config_wrong_type", "[[scenario]]\nname = \"a\"\n[scenario.model]\n\nd_model = \"wide\"\n",
                "key 'model.d_model': expected an integer in [1, 16384], got \"wide\"", 5},
        BadFile{"config_float_for_integer",
                "[[scenario]]\nname = \"a\"\n[scenario.train]\nseed = 1\nmicro_batch_size = 2.0\n",
                "key 'train.micro_batch': expected an integer in [1, 1048576], got 2.0", 5},
        BadFile{"config_megatron_typo", "[[scenario]]\nname = \"a\"\n[scenario.train]\ntrain_itres = 30\n",
                "unknown key 'train.train_itres' (did you mean 'train_iters'?)", 4},
        BadFile{"config_named_twice",
                "[[scenario]]\nname = \"a\"\n[scenario.train]\niterations = 30\ntrain_iters = 30\n",
                "'train.iterations' and 'train.train_iters' name one setting", 5},
        BadFile{"axis_config_wrong_type",
                "[[matrix]]\nname = \"m\"\n[[matrix.axis]]\nname = \"x\"\nkey = \"optimizer.adam_beta1\"\nvalues = "
                "[\"high\"]\n",
                "key 'optimizer.beta1': expected a number, got \"high\"", 6},
        BadFile{"scenario_key_typo", "[[scenario]]\nname = \"a\"\nsave_polcy = \"native\"\n",
                "save_polcy: unknown key (expected model, optimizer, train, description, save_at, save_policy", 3},
        BadFile{"trainer_key_typo", "[[scenario]]\nname = \"a\"\n[scenario.trainer]\ncomand = [\"x\"]\n",
                "trainer.comand: unknown key (expected command, resume_command, args, cwd, env, timeout_s, "
                "output_cap_mb, determinism_runs, round_trip, probe, noise, noise_factor, iterations, metrics, "
                "checkpoint, preset) (did you mean 'command'?)",
                4},
        BadFile{"trainer_checkpoint_key_typo",
                "[[scenario]]\nname = \"a\"\n[scenario.trainer]\ncheckpoint = { pth = \"x\" }\n",
                "(expected path, format, trust_pickle, ignore) (did you mean 'path'?)", 4},
        BadFile{"override_dtype_type", "[[scenario]]\nname = \"a\"\nsave_overrides = { exp_avg = 16 }\n",
                "save_overrides.exp_avg: expected a string", 3},
        BadFile{"model_too_large",
                "[[scenario]]\nname = \"a\"\n[scenario.model]\nd_model = 16384\nffn_hidden = 65536\nn_experts = 1024\n",
                "parameters", 1}),
    [](const auto& info) { return std::string(info.param.label); });

TEST(Scenarios, SafeNameRefusesNamesThatLeaveTheScenariosDirectory) {
  for (const char* bad : {"", ".", "..", "a\nb", "a\x7f"}) EXPECT_THROW(rh::safe_name(bad), rh::ScenarioError) << bad;
  EXPECT_THROW(rh::safe_name(std::string(300, 'a')), rh::ScenarioError);
  EXPECT_EQ(rh::safe_name("m/.."), "m__..");   // a child name, never the parent
  EXPECT_EQ(rh::safe_name("..."), "...");
  const fs::path run = "/tmp/run";
  EXPECT_EQ(rh::scenario_work_dir(run, "m/x=1"), "/tmp/run/scenarios/m__x=1");
  EXPECT_THROW(rh::scenario_work_dir(run, ".."), rh::ScenarioError);
}

TEST(Scenarios, NamesMappingToOneDirectoryAreRefused) {
  auto scenario_path = temp_file("collide.toml", "[[scenario]]\nname = \"a+b\"\n[[scenario]]\nname = \"a,b\"\n");
  try {
    rh::load_scenarios(scenario_path.string());
    FAIL() << "accepted two scenarios sharing a directory";
  } catch (const rh::ScenarioError& e) {
    EXPECT_NE(std::string(e.what()).find("would share the directory 'a+b'"), std::string::npos) << e.what();
  }
}

// A scenario named ".." made matrix remove the run directory itself.
TEST(Scenarios, MatrixWithADotDotScenarioRemovesNothing) {
  const fs::path run = fs::temp_directory_path() / ("rh_dotdot_run_" + std::to_string(::getpid()));
  fs::create_directories(run / "scenarios" / "other");
  std::ofstream(run / "keep.txt") << "unrelated\n";
  std::ofstream(run / "scenarios" / "other" / "result.json") << "{}\n";
  for (const char* name : {"..", ".", ""}) {
    auto scenario_path = temp_file("dotdot.toml", std::string("[[scenario]]\nname = \"") + name +
                                                      "\"\nsave_at = 3\n"
                                                      "[scenario.train]\niterations = 6\n");
    rh::MatrixOptions matrix_options;
    matrix_options.file = scenario_path.string();
    matrix_options.run_dir = run.string();
    matrix_options.tool = RH_TOOL;
    std::ostringstream log;
    EXPECT_THROW(rh::run_matrix(matrix_options, log), rh::ScenarioError) << name;
    EXPECT_TRUE(fs::exists(run / "keep.txt")) << name;
    EXPECT_TRUE(fs::exists(run / "scenarios" / "other" / "result.json")) << name;
  }
  rh::Scenario scenario;
  rh::CheckOptions check_options;
  check_options.work_dir = (run / "scenarios" / "..").string();
  EXPECT_THROW(rh::run_check(scenario, check_options), std::invalid_argument);
  EXPECT_TRUE(fs::exists(run / "keep.txt"));
  fs::remove_all(run);
}

#ifndef RH_WITH_CUDA
TEST(Scenarios, CudaWithoutACudaBuildIsBadInputAtParse) {
  auto scenario_path = temp_file("cuda.toml", "[[scenario]]\nname = \"a\"\n[scenario.train]\ndevice = \"cuda\"\n");
  try {
    rh::load_scenarios(scenario_path.string());
    FAIL() << "accepted device = cuda in a build without CUDA";
  } catch (const rh::ScenarioError& e) {
    EXPECT_NE(std::string(e.what()).find("this build has no CUDA"), std::string::npos) << e.what();
  }
}
#endif

// A FIFO (or device) in place of a scenario file or --config blocked forever.
TEST(HostileFiles, ScenarioAndConfigFifosAreRefusedWithoutBlocking) {
  ::alarm(20);   // if the open ever blocks again, fail fast instead of at CTest's timeout
  const fs::path dir = fs::temp_directory_path() / ("rh_fifo_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path fifo = dir / "s.toml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    rh::load_scenarios(fifo.string());
    ADD_FAILURE() << "read a FIFO";
  } catch (const rh::ScenarioError& e) {
    EXPECT_NE(std::string(e.what()).find(fifo.string() + ": is a FIFO"), std::string::npos) << e.what();
  }
  try {
    rh::load_run_config_file(fifo.string());
    ADD_FAILURE() << "read a FIFO";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("is a FIFO"), std::string::npos) << e.what();
  }
  EXPECT_THROW(rh::load_run_config_file("/dev/zero"), std::invalid_argument);
  ::alarm(0);
  fs::remove_all(dir);
}

// A --config of 100k nested '[' crashed (stack overflow) in parsing and dump().
TEST(HostileFiles, DeeplyNestedConfigIsRefusedNotACrash) {
  auto deep_path = temp_file("deep.json", "{\"train\": {\"iterations\": " + std::string(100000, '[') +
                                              std::string(100000, ']') + "}}");
  try {
    rh::load_run_config_file(deep_path.string());
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("nesting deeper than 64 levels"), std::string::npos) << e.what();
  }
  auto long_value_path =
      temp_file("longval.json", "{\"train\": {\"device\": [\"" + std::string(1 << 20, 'x') + "\"]}}");
  try {
    rh::load_run_config_file(long_value_path.string());
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_LT(std::string(e.what()).size(), 600u);   // the value is quoted, capped
    EXPECT_NE(std::string(e.what()).find("train.device"), std::string::npos) << std::string(e.what()).substr(0, 300);
  }
}

TEST(Scenarios, DataParallelKeysAndResharding) {
  auto all = rh::load_scenarios(std::string(RH_SOURCE_DIR) + "/scenarios/default.toml");
  const auto& same = by_name(all, "dp/dp=4,moments=fp8,master=remainders");
  EXPECT_EQ(same.dp_size, 4);
  EXPECT_EQ(same.resume_dp(), 4);
  EXPECT_FALSE(same.resharded());
  EXPECT_EQ(same.expect.kind, rh::Expectation::Kind::exact);
  const auto& reshard = by_name(all, "reshard/sizes=2to4,moments=bf16");
  EXPECT_EQ(reshard.dp_size, 2);
  EXPECT_EQ(reshard.resume_dp(), 4);
  EXPECT_TRUE(reshard.resharded());
  EXPECT_EQ(reshard.expect.kind, rh::Expectation::Kind::tolerance);
  EXPECT_EQ(reshard.expect.tolerances.at("lm_loss").atol, 2e-2);   // measured 3.7e-3 (scenario comment)
  std::set<std::pair<int64_t, int64_t>> sizes;
  for (const auto& s : all)
    if (s.resharded()) sizes.insert({s.dp_size, s.resume_dp()});
  EXPECT_EQ(sizes, (std::set<std::pair<int64_t, int64_t>>{{2, 1}, {1, 2}, {2, 4}, {4, 2}}));
}

TEST(Junit, IsValidXmlWithOneTestcasePerScenario) {
  std::vector<rh::CheckResult> results(2);
  results[0].name = "states/a=1";
  results[0].passed = true;
  results[0].verdict = "PASS: bit-exact resume";
  results[1].name = "faults/x=<&>";
  results[1].passed = false;
  results[1].verdict = "FAIL: expected a difference \"quoted\" & <tagged>";
  auto path = fs::temp_directory_path() / ("rh_junit_" + std::to_string(::getpid()) + ".xml");
  rh::write_junit(path.string(), "ci", results);
  const std::string check_script_text =
      "import sys, xml.etree.ElementTree as E\n"
      "r = E.parse(sys.argv[1]).getroot()\n"
      "cases = r.findall('.//testcase')\n"
      "assert len(cases) == 2, len(cases)\n"
      "f = cases[1].find('failure')\n"
      "assert f is not None and f.get('message').startswith('FAIL: expected a difference \"quoted\" & <tagged>')\n"
      "assert cases[0].find('failure') is None\n"
      "assert r.find('testsuite').get('failures') == '1'\n";
  auto script = temp_file("junit_check.py", check_script_text);
  const std::string cmd = "/usr/bin/python3 " + script.string() + " " + path.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// An external cell's diagnosis reaches every place a result is read: the junit failure message,
// summary.csv's external/diagnosis/explanation columns; its built-in settings columns stay empty.
TEST(Summary, AnExternalCellCarriesItsDiagnosisAndNoBuiltInSettings) {
  rh::Scenario builtin_cell, external_cell;
  builtin_cell.name = "states/a";
  external_cell.name = "stranger/x";
  external_cell.trainer.emplace();
  std::vector<rh::CheckResult> results(2);
  results[0].name = builtin_cell.name;
  results[0].passed = true;
  results[0].verdict = "PASS: bit-exact resume";
  results[1].name = external_cell.name;
  results[1].verdict = "FAIL: expected bit-exact resume; first divergence: lossy save: k";
  results[1].diagnosis = "lossy-save";
  results[1].explanation = "iteration 12: metric loss (1 vs 2), the checkpoint holds k";
  const fs::path dir = fs::temp_directory_path() / ("rh_summary_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  rh::RunSummary run;
  run.run_dir = dir.string();
  rh::write_summary(run, {builtin_cell, external_cell}, results);
  rh::write_junit((dir / "junit.xml").string(), "ext", results);
  std::ifstream csv_in(dir / "summary.csv");
  const std::string csv((std::istreambuf_iterator<char>(csv_in)), std::istreambuf_iterator<char>());
  const auto records = rh::csv_parse(csv);
  ASSERT_EQ(records.size(), 3u);
  const auto& header = records[0].fields;
  auto column = [&](const std::string& name) {
    return static_cast<size_t>(std::find(header.begin(), header.end(), name) - header.begin());
  };
  ASSERT_LT(column("explanation"), header.size());
  EXPECT_EQ(records[1].fields[column("external")], "0");
  EXPECT_EQ(records[1].fields[column("save_policy")], "native");
  EXPECT_EQ(records[2].fields[column("external")], "1");
  EXPECT_EQ(records[2].fields[column("diagnosis")], "lossy-save");
  EXPECT_EQ(records[2].fields[column("explanation")], results[1].explanation);
  for (const char* builtin : {"save_policy", "fault", "exp_avg_dtype", "exp_avg_sq_dtype", "master_mode"})
    EXPECT_EQ(records[2].fields[column(builtin)], "") << builtin;
  std::ifstream junit_in(dir / "junit.xml");
  const std::string junit((std::istreambuf_iterator<char>(junit_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(junit.find("lossy save: k | diagnosis lossy-save: iteration 12: metric loss (1 vs 2)"), std::string::npos)
      << junit;
  fs::remove_all(dir);
}

TEST(Golden, ComparisonNamesIterationAndMetric) {
  std::vector<rh::IterMetrics> rows(3);
  for (int i = 0; i < 3; ++i) {
    rows[i].iteration = i + 1;
    rows[i].lm_loss = 5.0f - static_cast<float>(i);
    rows[i].lr = 1e-3;
  }
  auto golden_path = temp_file("golden_a.csv", ""), candidate_path = temp_file("golden_b.csv", "");
  rh::write_metrics_csv(golden_path.string(), rows);
  rh::write_metrics_csv(candidate_path.string(), rows);
  EXPECT_EQ(rh::compare_golden(golden_path.string(), candidate_path.string()), "");
  rows[1].lm_loss = std::nextafter(rows[1].lm_loss, 0.0f);
  rh::write_metrics_csv(candidate_path.string(), rows);
  const auto diff = rh::compare_golden(golden_path.string(), candidate_path.string());
  EXPECT_NE(diff.find("iteration 2: lm_loss"), std::string::npos) << diff;
  rows.pop_back();
  rh::write_metrics_csv(candidate_path.string(), rows);
  EXPECT_NE(rh::compare_golden(golden_path.string(), candidate_path.string()).find("rows"), std::string::npos);
}

// toml++ recurses per dotted part and per nested array / inline table; a key or
// header of 50,000 parts overflowed the stack. Refused before parsing, naming line and column.
struct DeepToml {
  const char* name;
  std::string text;
  const char* expect;
};

std::string parts(int n, const std::string& sep = ".") {
  std::string s = "a";
  for (int i = 1; i < n; ++i) s += sep + "a";
  return s;
}

class TomlNesting : public ::testing::TestWithParam<DeepToml> {};

TEST_P(TomlNesting, IsRefusedBeforeParsing) {
  try {
    rh::load_scenarios_text(GetParam().text, "deep.toml");
    FAIL() << "accepted";
  } catch (const rh::ScenarioError& e) {
    EXPECT_NE(std::string(e.what()).find(GetParam().expect), std::string::npos) << std::string(e.what()).substr(0, 400);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Depths, TomlNesting,
    ::testing::Values(
        DeepToml{"DottedKey50000Parts", parts(50000) + " = 1\n",
                 "deep.toml:1: column 128: a key or table header of more than 64 dotted parts"},
        DeepToml{"TableHeader50000Parts", "[" + parts(50000) + "]\n",
                 "deep.toml:1: column 129: a key or table header of more than 64"},
        DeepToml{"ArrayTableHeader50000Parts", "x = 1\n[[" + parts(50000) + "]]\n",
                 "deep.toml:2: column 130: a key or table header"},
        DeepToml{"QuotedParts", "[scenario]\n" + parts(70, ".\"q.q\".") + " = 1\n", "deep.toml:2:"},
        DeepToml{"InlineTables100000Deep", "x = " + std::string(100000, '{') + "\n", "nested deeper than 64 levels"},
        DeepToml{"Arrays100000Deep", "x = " + std::string(100000, '[') + "\n", "nested deeper than 64 levels"}),
    [](const auto& i) { return std::string(i.param.name); });

// Within the bounds the parser still decides: 64 parts, floats on one line, dots in strings and
// comments are not counted.
TEST(TomlNestingBounds, DotsInValuesStringsAndCommentsAreNotParts) {
  const std::string floats = "x = [" + parts(200, "1.5, ") + "]\n";
  for (const std::string& text : {parts(64) + " = 1\n", floats, "x = \"" + parts(500) + "\"\n",
                                  "# " + parts(500) + "\n", "x = '''\n" + parts(500) + "\n'''\n"})
    EXPECT_EQ(rh::ckpt::toml_nesting_position(text), "") << text.substr(0, 80);
}

}   // namespace
