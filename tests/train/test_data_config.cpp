// Data addressing, the run-config forms (JSON, strict errors) and the metrics CSV round trip.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <limits>
#include <set>
#include <cstring>
#include <cmath>

#include "harness/train/config.h"
#include "harness/train/data.h"
#include "harness/train/metrics.h"

namespace {

TEST(Corpus, SampleIsTheSameWhetherReachedFromZeroOrDirectly) {
  rh::SyntheticCorpus c(42, 256, 64);
  std::vector<int64_t> tok(64 * 40), tgt(64 * 40);
  c.fill(0, 40, tok.data(), tgt.data());
  for (int64_t i : {0, 7, 39}) {
    std::vector<int64_t> t1(64), t2(64);
    c.fill(i, 1, t1.data(), t2.data());
    for (int64_t t = 0; t < 64; ++t) {
      ASSERT_EQ(t1[t], tok[i * 64 + t]) << "sample " << i << " token " << t;
      ASSERT_EQ(t2[t], tgt[i * 64 + t]);
    }
  }
  // A second corpus object with the same seed reproduces the samples; another seed does not.
  rh::SyntheticCorpus same(42, 256, 64), other(43, 256, 64);
  EXPECT_EQ(same.sample(1000), c.sample(1000));
  EXPECT_NE(other.sample(1000), c.sample(1000));
}

TEST(Corpus, TargetsAreInputsShiftedAndStructureIsLearnable) {
  rh::SyntheticCorpus c(1, 64, 32, /*branching=*/4, /*noise=*/0.1);
  auto s = c.sample(3);
  std::vector<int64_t> tok(32), tgt(32);
  c.fill(3, 1, tok.data(), tgt.data());
  for (int t = 0; t < 31; ++t) EXPECT_EQ(tgt[t], tok[t + 1]);
  // Count distinct successors per token over many samples: the structure limits them.
  std::vector<std::set<int64_t>> succ(64);
  for (int64_t i = 0; i < 200; ++i) {
    auto x = c.sample(i);
    for (size_t t = 1; t < x.size(); ++t) succ[x[t - 1]].insert(x[t]);
  }
  size_t total = 0;
  for (auto& s2 : succ) total += s2.size();
  EXPECT_LT(total, 64u * 20u) << "successor sets look uniform: no learnable structure";
  EXPECT_THROW(rh::SyntheticCorpus(1, 1, 32), std::invalid_argument);
  EXPECT_THROW(c.sample(-1), std::out_of_range);
}

TEST(RunConfig, JsonRoundTripsEveryField) {
  rh::RunConfig cfg;
  cfg.model.d_model = 96;
  cfg.model.param_dtype = "fp32";
  cfg.optim.use_precision_aware_optimizer = true;
  cfg.optim.exp_avg_dtype = rh::optim::Dtype::bf16;
  cfg.train.lr = 0.123456789012345;
  cfg.train.seed = 18446744073709551615ull;
  auto j = rh::to_json(cfg);
  auto back = rh::run_config_from_json(j, "test");
  EXPECT_EQ(rh::to_json(back), j);
  EXPECT_EQ(back.train.seed, cfg.train.seed);
  EXPECT_EQ(back.optim.exp_avg_dtype, rh::optim::Dtype::bf16);
}

TEST(RunConfig, StrictJsonNamesTheKey) {
  auto expect_error = [](const char* text, const char* needle) {
    try {
      rh::run_config_from_json(nlohmann::json::parse(text), "scenario.toml");
      FAIL() << "accepted " << text;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("scenario.toml"), std::string::npos) << e.what();
    }
  };
  expect_error(R"({"model": {"d_modle": 3}})", "model.d_modle");
  expect_error(R"({"modle": {}})", "modle");
  expect_error(R"({"model": {"d_model": "wide"}})", "model.d_model");
  expect_error(R"({"train": {"seed": -1}})", "train.seed");
  expect_error(R"({"optimizer": {"exp_avg_dtype": "fp64"}})", "exp_avg_dtype");
}

// Config and scenario files accept each setting's Megatron name (its flag, "--train-iters" ->
// train_iters) beside its key; the key is the name written back. Independent expectation: the
// same values given by key.
TEST(RunConfig, MegatronNamesAreAcceptedAndTheKeyIsWrittenBack) {
  const auto by_name =
      rh::run_config_from_json(nlohmann::json::parse(R"({"model": {"hidden_size": 48, "moe_aux_loss_coeff": 0.5},
                                "optimizer": {"adam_beta2": 0.9},
                                "train": {"train_iters": 7, "micro_batch_size": 2, "override_opt_param_scheduler": true}})"),
                               "names.json");
  const auto by_key =
      rh::run_config_from_json(nlohmann::json::parse(
                                   R"({"model": {"d_model": 48, "aux_loss_coeff": 0.5}, "optimizer": {"beta2": 0.9},
                                "train": {"iterations": 7, "micro_batch": 2, "override_opt_param_scheduler": true}})"),
                               "keys.json");
  EXPECT_EQ(rh::to_json(by_name), rh::to_json(by_key));
  EXPECT_EQ(by_name.train.iterations, 7);
  EXPECT_TRUE(rh::to_json(by_name)["train"].contains("iterations"));
  EXPECT_FALSE(rh::to_json(by_name)["train"].contains("train_iters"));
}

TEST(RunConfig, OneSettingNamedTwiceOrMisspelledIsRefused) {
  try {
    rh::run_config_from_json(nlohmann::json::parse(R"({"train": {"iterations": 7, "train_iters": 8}})"), "twice.json");
    FAIL() << "accepted a setting given under both names";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("twice.json"), std::string::npos) << m;
    EXPECT_NE(m.find("'train.iterations' and 'train.train_iters' name one setting"), std::string::npos) << m;
  }
  try {
    rh::run_config_from_json(nlohmann::json::parse(R"({"train": {"train_itres": 7}})"), "typo.json");
    FAIL() << "accepted a misspelled key";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'train_iters'"), std::string::npos) << e.what();
  }
}

// The field table reads a value whatever file it came from (SettingValue): an integer where a
// number is wanted, the full unsigned range of a seed, a negative seed refused naming the place
// the caller gave, an unknown section. Independent expectation: the values written by hand.
TEST(RunConfig, SectionSettingsReadValuesOfAnyFileForm) {
  rh::RunConfig cfg;
  rh::SectionSettings train(cfg, "train", "t.toml:3");
  train.set("train_iters", rh::SettingValue{int64_t{7}, "7"}, "t.toml:4");
  train.set("lr", rh::SettingValue{int64_t{1}, "1"}, "t.toml:5");
  train.set("seed", rh::SettingValue{uint64_t{18446744073709551615ull}, "18446744073709551615"}, "t.toml:6");
  EXPECT_EQ(cfg.train.iterations, 7);
  EXPECT_EQ(cfg.train.lr, 1.0);
  EXPECT_EQ(cfg.train.seed, 18446744073709551615ull);
  try {
    rh::SectionSettings(cfg, "train", "t.toml:7").set("seed", rh::SettingValue{int64_t{-1}, "-1"}, "t.toml:8");
    FAIL() << "accepted a negative seed";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "t.toml:8: key 'train.seed': expected a non-negative integer, got -1");
  }
  try {
    rh::SectionSettings(cfg, "trian", "t.toml:9");
    FAIL() << "accepted an unknown section";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "t.toml:9: unknown section 'trian' (expected model, optimizer or train)");
  }
  EXPECT_EQ(cfg.train.seed, 18446744073709551615ull);
}

TEST(RunConfig, ValidateNamesTheField) {
  rh::RunConfig cfg;
  cfg.train.global_batch = 10;
  cfg.train.micro_batch = 4;
  EXPECT_THROW(rh::validate(cfg), std::invalid_argument);
  cfg = rh::RunConfig{};
  cfg.train.device = "tpu";
  try {
    rh::validate(cfg);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--device"), std::string::npos);
  }
  EXPECT_NO_THROW(rh::validate(rh::RunConfig{}));
}

TEST(Metrics, CsvRoundTripsBitExactly) {
  std::vector<rh::IterMetrics> rows(3);
  for (int i = 0; i < 3; ++i) {
    rows[i].iteration = i + 1;
    rows[i].consumed_samples = 16 * (i + 1);
    rows[i].lm_loss = std::nextafter(5.5f + i, 10.f);
    rows[i].aux_loss = 1e-2f / 3.f;
    rows[i].total_loss = rows[i].lm_loss + rows[i].aux_loss;
    rows[i].grad_norm = 1.0 / 3.0 + i;
    rows[i].lr = std::numeric_limits<double>::denorm_min() * (i + 1);
    rows[i].num_zeros = 17 * i;
  }
  auto path = (std::filesystem::temp_directory_path() / "rh_metrics_test.csv").string();
  rh::write_metrics_csv(path, rows);
  auto back = rh::read_metrics_csv(path);
  ASSERT_EQ(back.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i)
    for (const auto& name : rh::metric_names()) {
      const double a = rh::metric_value(rows[i], name), b = rh::metric_value(back[i], name);
      EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << name << " row " << i;
    }
  // A malformed file names itself and the line.
  {
    std::FILE* f = std::fopen(path.c_str(), "a");
    std::fputs("4,64,1,zzz,1,0x1p+0,1,0x1p+0,1,0x1p+0,1,0x1p+0,0\n", f);
    std::fclose(f);
  }
  try {
    rh::read_metrics_csv(path);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("rh_metrics_test.csv:5"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

}   // namespace
