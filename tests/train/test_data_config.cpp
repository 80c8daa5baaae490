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
  rh::SyntheticCorpus corpus(42, 256, 64);
  std::vector<int64_t> tokens(64 * 40), targets(64 * 40);
  corpus.fill(0, 40, tokens.data(), targets.data());
  for (int64_t i : {0, 7, 39}) {
    std::vector<int64_t> sample_tokens(64), sample_targets(64);
    corpus.fill(i, 1, sample_tokens.data(), sample_targets.data());
    for (int64_t t = 0; t < 64; ++t) {
      ASSERT_EQ(sample_tokens[t], tokens[i * 64 + t]) << "sample " << i << " token " << t;
      ASSERT_EQ(sample_targets[t], targets[i * 64 + t]);
    }
  }
  // A second corpus object with the same seed reproduces the samples; another seed does not.
  rh::SyntheticCorpus same(42, 256, 64), other(43, 256, 64);
  EXPECT_EQ(same.sample(1000), corpus.sample(1000));
  EXPECT_NE(other.sample(1000), corpus.sample(1000));
}

TEST(Corpus, TargetsAreInputsShiftedAndStructureIsLearnable) {
  rh::SyntheticCorpus corpus(1, 64, 32, /*branching=*/4, /*noise=*/0.1);
  auto third_sample = corpus.sample(3);
  std::vector<int64_t> tokens(32), targets(32);
  corpus.fill(3, 1, tokens.data(), targets.data());
  for (int t = 0; t < 31; ++t) EXPECT_EQ(targets[t], tokens[t + 1]);
  // Count distinct successors per token over many samples: the structure limits them.
  std::vector<std::set<int64_t>> successors(64);
  for (int64_t i = 0; i < 200; ++i) {
    auto sample = corpus.sample(i);
    for (size_t t = 1; t < sample.size(); ++t) successors[sample[t - 1]].insert(sample[t]);
  }
  size_t total = 0;
  for (auto& s2 : successors) total += s2.size();
  EXPECT_LT(total, 64u * 20u) << "successor sets look uniform: no learnable structure";
  EXPECT_THROW(rh::SyntheticCorpus(1, 1, 32), std::invalid_argument);
  EXPECT_THROW(corpus.sample(-1), std::out_of_range);
}

TEST(RunConfig, JsonRoundTripsEveryField) {
  rh::RunConfig cfg;
  cfg.model.d_model = 96;
  cfg.model.param_dtype = "fp32";
  cfg.optim.use_precision_aware_optimizer = true;
  cfg.optim.exp_avg_dtype = rh::optim::Dtype::bf16;
  cfg.train.lr = 0.123456789012345;
  cfg.train.seed = 18446744073709551615ull;
  auto config_json = rh::to_json(cfg);
  auto back = rh::run_config_from_json(config_json, "test");
  EXPECT_EQ(rh::to_json(back), config_json);
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
    const std::string message = e.what();
    EXPECT_NE(message.find("twice.json"), std::string::npos) << message;
    EXPECT_NE(message.find("'train.iterations' and 'train.train_iters' name one setting"), std::string::npos)
        << message;
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

// Every field with a range of its own: the range written here by hand (not read from the field
// table), how to set the field, and how to make the rest of a default config accept the field at
// either end of its range (a rule between fields that would fire too, e.g. min_lr <= lr).
struct BoundCase {
  const char* section;
  const char* key;
  const char* flag;
  bool integer;
  double lo, hi;   // hi = +inf: finite, no upper bound
  void (*set)(rh::RunConfig&, double);
  void (*isolate)(rh::RunConfig&);
  bool whole_config_at_ends;   // false: no valid config holds the field at lo or hi (d_model 1: odd head dim)
};

// A failing case prints as its key, not as the struct's bytes.
void PrintTo(const BoundCase& b, std::ostream* os) { *os << b.section << "." << b.key; }

constexpr double kInf = std::numeric_limits<double>::infinity();
void nothing(rh::RunConfig&) {}

std::string int_text(double v) { return std::to_string(static_cast<int64_t>(v)); }

// "train.iterations (--train-iters) must be in [1, 10000000], got 0" and the file's form
// "where: key 'train.iterations': expected an integer in [1, 10000000], got 0".
std::string range_words(const BoundCase& b) {
  if (b.hi == kInf) return ">= " + int_text(b.lo);
  return "in [" + int_text(b.lo) + ", " + int_text(b.hi) + "]";
}
std::string validate_message(const BoundCase& b, const std::string& got) {
  return std::string(b.section) + "." + b.key + " (" + b.flag + ") must be " + (b.integer ? "" : "finite and ") +
         range_words(b) + ", got " + got;
}
std::string file_message(const BoundCase& b, const std::string& where, const std::string& got) {
  return where + ": key '" + b.section + "." + b.key + "': expected " +
         (b.integer ? "an integer " : "a finite number ") + range_words(b) + ", got " + got;
}

std::string validate_error(const rh::RunConfig& cfg) {
  try {
    rh::validate(cfg);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

nlohmann::json one_setting(const BoundCase& b, const nlohmann::json& v) {
  nlohmann::json setting;
  setting[b.section][b.key] = v;
  return setting;
}

class FieldBounds : public ::testing::TestWithParam<BoundCase> {};

TEST_P(FieldBounds, ValidateAndFilesRefuseJustOutsideAndAcceptTheEnds) {
  const BoundCase& bound = GetParam();
  // Just outside: validate names the field, its flag, the range and the value.
  std::vector<std::pair<double, std::string>> outside;
  if (bound.integer) {
    outside = {{bound.lo - 1, int_text(bound.lo - 1)}, {bound.hi + 1, int_text(bound.hi + 1)}};
  } else {
    outside = {{bound.lo - 1, int_text(bound.lo - 1)}, {kInf, "inf"}, {std::nan(""), "nan"}};
  }
  for (const auto& [v, shown] : outside) {
    rh::RunConfig cfg;
    bound.set(cfg, v);
    EXPECT_EQ(validate_error(cfg), validate_message(bound, shown)) << shown;
  }
  if (!bound.integer) {   // the smallest step below lo
    rh::RunConfig cfg;
    bound.set(cfg, std::nextafter(bound.lo, -kInf));
    EXPECT_EQ(validate_error(cfg).rfind(validate_message(bound, ""), 0), 0u) << validate_error(cfg);
  }
  // The ends: accepted by the field's own check (the whole config too where one can be valid).
  const double hi = bound.hi == kInf ? std::numeric_limits<double>::max() : bound.hi;
  for (const double v : {bound.lo, hi}) {
    rh::RunConfig cfg;
    bound.isolate(cfg);
    bound.set(cfg, v);
    const std::string err = validate_error(cfg);
    EXPECT_EQ(err.find(validate_message(bound, "")), std::string::npos) << v << ": " << err;
    if (bound.whole_config_at_ends) {
      EXPECT_EQ(err, "") << v;
    }
    // From a file: the same value read back.
    const nlohmann::json value = bound.integer ? nlohmann::json(static_cast<int64_t>(v)) : nlohmann::json(v);
    const rh::RunConfig read = rh::run_config_from_json(one_setting(bound, value), "cfg.json");
    EXPECT_EQ(rh::to_json(read)[bound.section][bound.key], value);
  }
  // From a file, just outside: refused when read, naming the file, the key, the range and the value.
  const std::vector<std::pair<nlohmann::json, std::string>> file_outside =
      bound.integer
          ? std::vector<std::pair<nlohmann::json, std::string>>{{static_cast<int64_t>(bound.lo - 1),
                                                                 int_text(bound.lo - 1)},
                                                                {static_cast<int64_t>(bound.hi + 1),
                                                                 int_text(bound.hi + 1)}}
          : std::vector<std::pair<nlohmann::json, std::string>>{{bound.lo - 1, int_text(bound.lo - 1) + ".0"}};
  for (const auto& [v, shown] : file_outside) {
    try {
      rh::RunConfig cfg;
      rh::apply_json(cfg, one_setting(bound, v), "cfg.json");
      ADD_FAILURE() << "cfg.json accepted " << shown;
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), file_message(bound, "cfg.json", shown));
    }
  }
  // A TOML file can give inf and nan, which JSON cannot.
  if (!bound.integer) {
    for (const auto& [v, shown] : {std::pair{kInf, "inf"}, std::pair{std::nan(""), "nan"}}) {
      try {
        rh::RunConfig cfg;
        rh::SectionSettings(cfg, bound.section, "s.toml:3").set(bound.key, rh::SettingValue{v, shown}, "s.toml:4");
        ADD_FAILURE() << "s.toml accepted " << shown;
      } catch (const std::invalid_argument& e) {
        EXPECT_EQ(std::string(e.what()), file_message(bound, "s.toml:4", shown));
      }
    }
  }
}

constexpr double kMaxIters = 10'000'000, kMaxBatch = 1 << 20;

INSTANTIATE_TEST_SUITE_P(
    EveryBoundedField, FieldBounds,
    ::testing::Values(
        BoundCase{"model", "vocab_size", "--vocab-size", true, 1, 1 << 20,
                  [](rh::RunConfig& c, double v) { c.model.vocab_size = static_cast<int64_t>(v); }, nothing, true},
        BoundCase{"model", "seq_len", "--seq-length", true, 1, 1 << 16,
                  [](rh::RunConfig& c, double v) { c.model.seq_len = static_cast<int64_t>(v); }, nothing, true},
        BoundCase{"model", "d_model", "--hidden-size", true, 1, 1 << 14,
                  [](rh::RunConfig& c, double v) { c.model.d_model = static_cast<int64_t>(v); }, nothing, false},
        BoundCase{"model", "n_layers", "--num-layers", true, 1, 256,
                  [](rh::RunConfig& c, double v) { c.model.n_layers = static_cast<int64_t>(v); }, nothing, true},
        BoundCase{"model", "n_heads", "--num-attention-heads", true, 1, 1 << 10,
                  [](rh::RunConfig& c, double v) { c.model.n_heads = static_cast<int64_t>(v); },
                  [](rh::RunConfig& c) { c.model.d_model = 2048; },   // 1024 heads of an even size
                  true},
        BoundCase{"model", "n_experts", "--num-experts", true, 1, 1 << 10,
                  [](rh::RunConfig& c, double v) { c.model.n_experts = static_cast<int64_t>(v); },
                  [](rh::RunConfig& c) { c.model.top_k = 1; }, true},
        BoundCase{"model", "ffn_hidden", "--moe-ffn-hidden-size", true, 1, 1 << 16,
                  [](rh::RunConfig& c, double v) { c.model.ffn_hidden = static_cast<int64_t>(v); }, nothing, true},
        BoundCase{"train", "iterations", "--train-iters", true, 1, kMaxIters,
                  [](rh::RunConfig& c, double v) { c.train.iterations = static_cast<int64_t>(v); }, nothing, true},
        BoundCase{"train", "global_batch", "--global-batch-size", true, 1, kMaxBatch,
                  [](rh::RunConfig& c, double v) { c.train.global_batch = static_cast<int64_t>(v); },
                  [](rh::RunConfig& c) { c.train.micro_batch = 1; }, true},
        BoundCase{"train", "micro_batch", "--micro-batch-size", true, 1, kMaxBatch,
                  [](rh::RunConfig& c, double v) { c.train.micro_batch = static_cast<int64_t>(v); },
                  [](rh::RunConfig& c) { c.train.global_batch = 1 << 20; }, true},
        BoundCase{"train", "lr", "--lr", false, 0, kInf, [](rh::RunConfig& c, double v) { c.train.lr = v; },
                  [](rh::RunConfig& c) { c.train.min_lr = 0; }, true},
        BoundCase{"train", "min_lr", "--min-lr", false, 0, kInf, [](rh::RunConfig& c, double v) { c.train.min_lr = v; },
                  [](rh::RunConfig& c) { c.train.lr = std::numeric_limits<double>::max(); }, true},
        // No valid config holds 10^7 warmup iterations: the schedule must be longer, and is capped too.
        BoundCase{"train", "lr_warmup_iters", "--lr-warmup-iters", true, 0, kMaxIters,
                  [](rh::RunConfig& c, double v) { c.train.lr_warmup_iters = static_cast<int64_t>(v); }, nothing,
                  false},
        BoundCase{"train", "lr_decay_iters", "--lr-decay-iters", true, 1, kMaxIters,
                  [](rh::RunConfig& c, double v) { c.train.lr_decay_iters = static_cast<int64_t>(v); },
                  [](rh::RunConfig& c) { c.train.lr_warmup_iters = 0; }, true},
        BoundCase{"train", "lr_warmup_init", "--lr-warmup-init", false, 0, kInf,
                  [](rh::RunConfig& c, double v) { c.train.lr_warmup_init = v; },
                  [](rh::RunConfig& c) { c.train.lr = std::numeric_limits<double>::max(); }, true},
        BoundCase{"train", "lr_wsd_decay_iters", "--lr-wsd-decay-iters", true, -1, kMaxIters,
                  [](rh::RunConfig& c, double v) { c.train.lr_wsd_decay_iters = static_cast<int64_t>(v); },
                  [](rh::RunConfig& c) { c.train.lr_decay_iters = 10'000'000; }, true},
        BoundCase{"train", "clip_grad", "--clip-grad", false, 0, kInf,
                  [](rh::RunConfig& c, double v) { c.train.clip_grad = v; }, nothing, true},
        BoundCase{"train", "threads", "--threads", true, 1, 256,
                  [](rh::RunConfig& c, double v) { c.train.threads = static_cast<int64_t>(v); }, nothing, true}),
    [](const auto& info) { return std::string(info.param.section) + "_" + info.param.key; });

// String fields' choices come from their help text ("cpu | cuda"): a file's other value is refused
// when read, and validate names the field and the choices (model fields before train fields).
TEST(RunConfig, StringChoicesAreCheckedWhenReadAndByValidate) {
  try {
    rh::run_config_from_json(nlohmann::json::parse(R"({"train": {"device": "tpu"}})"), "c.json");
    ADD_FAILURE() << "accepted device tpu";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "c.json: key 'train.device': expected one of cpu, cuda, got \"tpu\"");
  }
  try {
    rh::run_config_from_json(nlohmann::json::parse(R"({"model": {"params_dtype": 16}})"), "c.json");
    ADD_FAILURE() << "accepted params_dtype 16";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "c.json: key 'model.param_dtype': expected one of bf16, fp32, got 16");
  }
  rh::RunConfig cfg;
  cfg.train.device = "tpu";
  cfg.model.param_dtype = "fp16";
  EXPECT_EQ(validate_error(cfg), "model.param_dtype (--params-dtype) must be one of bf16, fp32, got 'fp16'");
  cfg.model.param_dtype = "fp32";
  EXPECT_EQ(validate_error(cfg), "train.device (--device) must be one of cpu, cuda, got 'tpu'");
}

// Two bad values: validate reports the first in table order (model before train), a file the
// first it gives.
TEST(RunConfig, TheFirstBadValueIsReportedInTableOrderOrFileOrder) {
  rh::RunConfig cfg;
  cfg.train.iterations = 0;
  cfg.model.n_layers = 0;
  EXPECT_EQ(validate_error(cfg), "model.n_layers (--num-layers) must be in [1, 256], got 0");
  try {
    rh::RunConfig c;
    rh::apply_json(c, nlohmann::json::parse(R"({"train": {"iterations": 0}, "model": {"n_layers": 0}})"), "o.json");
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    // nlohmann's object keeps its keys sorted: model is read first.
    EXPECT_EQ(std::string(e.what()), "o.json: key 'model.n_layers': expected an integer in [1, 256], got 0");
  }
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
