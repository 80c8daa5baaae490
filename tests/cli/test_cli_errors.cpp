// The command line as a new user meets it: every bad input exits 2 with one line that
// starts with the tool's error prefix and names the file, flag or key; nothing is written before
// the flags are checked; --version and --help say what the tool and its options are.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>
#include <cstdio>
#include <sstream>
#include "harness/base/suggest.h"
#include "harness/process/process.h"
#include "harness/verify/scenario.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;

namespace {

using rh::testutil::slurp;
using rh::testutil::ToolRun;


ToolRun tool(const fs::path& dir, const std::vector<std::string>& args) {
  return rh::testutil::run_tool(dir, args, 120);
}

const std::string kPrefix = "resume-harness: error: ";

// Exit 2, exactly one line, the prefix, and `needle` in it.
void expect_bad_input(const ToolRun& tool_run, const std::string& needle) {
  EXPECT_EQ(tool_run.code, 2) << tool_run.log;
  EXPECT_EQ(tool_run.log.rfind(kPrefix, 0), 0u) << tool_run.log;
  EXPECT_EQ(std::count(tool_run.log.begin(), tool_run.log.end(), '\n'), 1) << tool_run.log;
  EXPECT_NE(tool_run.log.find(needle), std::string::npos) << "want '" << needle << "' in: " << tool_run.log;
}

TEST(CliErrors, MissingConfigFileIsBadInputNamingIt) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "config");
  expect_bad_input(tool(work_dir, {"train", "--config", (work_dir / "missing.json").string()}),
                   (work_dir / "missing.json").string());
}

TEST(CliErrors, ConfigWithAnUnknownKeyNamesTheFileAndKey) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "badkey");
  std::ofstream(work_dir / "c.json") << R"({"model": {"no_such_key": 1}})";
  const ToolRun tool_run = tool(work_dir, {"train", "--config", (work_dir / "c.json").string()});
  expect_bad_input(tool_run, (work_dir / "c.json").string());
  EXPECT_NE(tool_run.log.find("no_such_key"), std::string::npos) << tool_run.log;
}

TEST(CliErrors, UnknownSubcommandListsTheValidOnes) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "sub");
  const ToolRun tool_run = tool(work_dir, {"frobnicate"});
  expect_bad_input(tool_run, "unknown subcommand 'frobnicate'");
  for (const char* s : {"train", "inspect", "check", "matrix", "report"})
    EXPECT_NE(tool_run.log.find(s), std::string::npos) << s << " missing from: " << tool_run.log;
}

// "Did you mean": the closest subcommand, flag or scenario name when one is a likely typo, and
// nothing when none is close.
TEST(CliErrors, TyposGetTheClosestNameSuggested) {
  EXPECT_EQ(rh::edit_distance("matrx", "matrix"), 1u);
  EXPECT_EQ(rh::edit_distance("", "abc"), 3u);
  EXPECT_EQ(rh::edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(rh::closest_match("chek", {"train", "check", "matrix"}), "check");
  EXPECT_EQ(rh::closest_match("frobnicate", {"train", "check", "matrix"}), "");
  EXPECT_EQ(rh::closest_match("check", {"check"}), "");   // exact: nothing to suggest
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "typos");
  const std::string ci_toml = std::string(RH_SOURCE_DIR) + "/scenarios/ci.toml";
  struct Case {
    std::vector<std::string> args;
    std::string want;
  };
  for (const auto& c : std::vector<Case>{
           {{"matrx"}, "unknown subcommand 'matrx' (did you mean 'matrix'?)"},
           {{"matrix", ci_toml, "--jbos", "2"}, "matrix: unknown option '--jbos' (did you mean '--jobs'?)"},
           {{"check", "--jbos", "2", "states/*"}, "check: unknown option '--jbos' (did you mean '--jobs'?)"},
           {{"train", "--lr-decay-styl", "cosine"}, "(did you mean '--lr-decay-style'?)"},
           {{"check", "--file", ci_toml, "seed-protocl"},
            "no scenario matches 'seed-protocl' (did you mean 'seed-protocol'?)"},
       })
    expect_bad_input(tool(work_dir, c.args), c.want);
  const ToolRun far = tool(work_dir, {"frobnicate"});
  EXPECT_EQ(far.log.find("did you mean"), std::string::npos) << far.log;
}

// --list prints what a filter (and a shard) selects and runs nothing.
TEST(CliErrors, ListPrintsTheSelectionAndRunsNothing) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "list");
  const std::string ci_toml = std::string(RH_SOURCE_DIR) + "/scenarios/ci.toml";
  const ToolRun all = tool(work_dir, {"matrix", ci_toml, "--list", "--run-dir", (work_dir / "run").string()});
  ASSERT_EQ(all.code, 0) << all.log;
  const auto want = static_cast<long>(rh::load_scenarios(ci_toml).size());
  EXPECT_EQ(std::count(all.log.begin(), all.log.end(), '\n'), want) << all.log;
  EXPECT_FALSE(fs::exists(work_dir / "run")) << "--list wrote a run directory";
  // check --list without a SCENARIO lists the whole file too; check without either names what is missing.
  const ToolRun check_all = tool(work_dir, {"check", "-f", ci_toml, "--list"});
  ASSERT_EQ(check_all.code, 0) << check_all.log;
  EXPECT_EQ(std::count(check_all.log.begin(), check_all.log.end(), '\n'), want) << check_all.log;
  expect_bad_input(tool(work_dir, {"check", "-f", ci_toml}), "check: give a SCENARIO");
  std::string halves;
  for (const char* shard : {"1/2", "2/2"}) {
    const ToolRun shard_run = tool(work_dir, {"matrix", ci_toml, "--list", "--shard", shard});
    ASSERT_EQ(shard_run.code, 0) << shard_run.log;
    EXPECT_LT(std::count(shard_run.log.begin(), shard_run.log.end(), '\n'), want) << shard;
    halves += shard_run.log;
  }
  auto sorted_lines = [](const std::string& text) {
    std::vector<std::string> lines;
    std::string line;
    for (char c : text) {
      if (c == '\n') lines.push_back(line), line.clear();
      else line += c;
    }
    std::sort(lines.begin(), lines.end());
    return lines;
  };
  EXPECT_EQ(sorted_lines(halves), sorted_lines(all.log)) << "the two halves are not the whole";
  const ToolRun one = tool(work_dir, {"check", "--file", ci_toml, "seed-*", "--list"});
  EXPECT_EQ(one.code, 0);
  EXPECT_EQ(one.log, "seed-protocol\n");
}

TEST(CliErrors, Cli11ParseErrorsCarryTheSamePrefix) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "cli11");
  expect_bad_input(tool(work_dir, {"train", "--lr", "abc"}), "--lr");
  expect_bad_input(tool(work_dir, {"train", "--no-such-flag"}), "--no-such-flag");
  // Values the optimizer would refuse are refused by the parser, with the valid ones.
  expect_bad_input(tool(work_dir, {"train", "--main-params-dtype", "bf16"}), "--main-params-dtype");
  expect_bad_input(tool(work_dir, {"train", "--fault", "frobnicate"}), "--fault");
}

// Token dropping and the router dtype (Megatron's choices): bad values are bad input naming the
// flag, or for a config file the field.
TEST(CliErrors, MoeTokenDropAndRouterDtypeRefuseBadValues) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "tokendrop");
  expect_bad_input(tool(work_dir, {"train", "--moe-token-drop-policy", "random"}), "--moe-token-drop-policy");
  expect_bad_input(tool(work_dir, {"train", "--moe-router-dtype", "bf16"}), "--moe-router-dtype");
  expect_bad_input(tool(work_dir, {"train", "--moe-expert-capacity-factor", "abc"}), "--moe-expert-capacity-factor");
  std::ofstream(work_dir / "c.json") << R"({"model": {"token_drop_policy": "random"}})";
  expect_bad_input(tool(work_dir, {"train", "--config", (work_dir / "c.json").string()}), "token_drop_policy");
}

TEST(CliErrors, SaveAtWithoutSaveWritesNothing) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "saveat");
  const fs::path out = work_dir / "out";
  expect_bad_input(tool(work_dir, {"train", "--out", out.string(), "--save-at", "2"}), "--save-at needs --save");
  EXPECT_FALSE(fs::exists(out)) << "config.json was written before the flags were checked";
  expect_bad_input(tool(work_dir, {"train", "--out", out.string(), "--load", (work_dir / "nothing").string()}),
                   (work_dir / "nothing").string());
  EXPECT_FALSE(fs::exists(out));
  expect_bad_input(tool(work_dir, {"train", "--out", out.string(), "--fault", "skip_rng_restore"}), "needs --load");
  EXPECT_FALSE(fs::exists(out));
}

TEST(CliErrors, InspectOfAMissingPathIsBadInputNotDamage) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "inspect");
  ToolRun tool_run = tool(work_dir, {"inspect", (work_dir / "nonexistent").string()});
  EXPECT_EQ(tool_run.code, 2) << tool_run.log;
  EXPECT_NE(tool_run.log.find("no such file or directory"), std::string::npos) << tool_run.log;
  tool_run = tool(work_dir, {"inspect", work_dir.string()});   // a directory that is no checkpoint
  EXPECT_EQ(tool_run.code, 2) << tool_run.log;
  EXPECT_NE(tool_run.log.find("neither a checkpoint directory"), std::string::npos) << tool_run.log;
  fs::create_directories(work_dir / "iter_0000007");   // an incomplete save: that is damage
  tool_run = tool(work_dir, {"inspect", (work_dir / "iter_0000007").string()});
  EXPECT_EQ(tool_run.code, 1) << tool_run.log;
}

TEST(CliErrors, ScenarioFileThatCannotBeOpenedIsNamedWithoutALineNumber) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "scen");
  const std::string missing_toml = (work_dir / "none.toml").string();
  for (const auto& args : std::vector<std::vector<std::string>>{{"matrix", missing_toml},
                                                                {"matrix", "-f", missing_toml},
                                                                {"check", "x", "-f", missing_toml}}) {
    const ToolRun tool_run = tool(work_dir, args);
    expect_bad_input(tool_run, missing_toml);
    EXPECT_EQ(tool_run.log.find(missing_toml + ":0"), std::string::npos) << tool_run.log;
  }
}

TEST(CliHelp, VersionNamesVersionCommitLibTorchAndBlasCore) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "version");
  const ToolRun tool_run = tool(work_dir, {"--version"});
  EXPECT_EQ(tool_run.code, 0) << tool_run.log;
  for (const char* s : {"resume-harness 0.", "LibTorch 1.", "BLAS: ", " core "})
    EXPECT_NE(tool_run.log.find(s), std::string::npos) << s << " missing from: " << tool_run.log;
}

TEST(CliHelp, TrainHelpShowsDefaultsAndValidValues) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "help");
  const ToolRun tool_run = tool(work_dir, {"train", "--help"});
  EXPECT_EQ(tool_run.code, 0) << tool_run.log;
  const auto line_of = [&](const std::string& flag) {
    const auto at = tool_run.log.find("  " + flag + " ");
    if (at == std::string::npos) return std::string("(no line for " + flag + ")");
    return tool_run.log.substr(at, tool_run.log.find('\n', at) - at);
  };
  EXPECT_NE(line_of("--store-param-remainders").find("(default: true)"), std::string::npos) << tool_run.log;
  EXPECT_EQ(tool_run.log.find("{false}"), std::string::npos) << "a negated flag's {false} reads as its default";
  const std::string main_params_line = line_of("--main-params-dtype");
  EXPECT_NE(main_params_line.find("fp16"), std::string::npos) << main_params_line;
  EXPECT_EQ(main_params_line.find("fp8"), std::string::npos) << "fp8 is refused for the master: " << main_params_line;
  EXPECT_NE(tool_run.log.find("skip_rng_restore"), std::string::npos) << "--fault lists its values";
  EXPECT_NE(line_of("--lr").find("0.0"), std::string::npos) << "--lr shows its default: " << line_of("--lr");
  // Defaults that differ from Megatron's (arguments.py @d98e8a6: --adam-beta2 0.999,
  // --weight-decay 0.01) say so beside the harness's own.
  for (const auto& [flag, ours, megatron] : {std::tuple<std::string, std::string, std::string>{
                                                 "--adam-beta2", "0.95", "Megatron's default is 0.999"},
                                             {"--weight-decay", "0.1", "Megatron's default is 0.01"}}) {
    const std::string line = line_of(flag);
    EXPECT_NE(line.find(megatron), std::string::npos) << line;
    EXPECT_NE(line.find("FLOAT=" + ours + " "), std::string::npos) << line;
  }
}

TEST(CliHelp, DefaultRunPrintsNoRemaindersWarning) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "warn");
  ToolRun tool_run =
      tool(work_dir, {"train", "--train-iters", "1", "--micro-batch-size", "4", "--out", (work_dir / "o").string()});
  EXPECT_EQ(tool_run.code, 0) << tool_run.log;
  EXPECT_EQ(tool_run.log.find("NOT in effect"), std::string::npos) << tool_run.log;
  tool_run = tool(work_dir, {"train", "--train-iters", "1", "--micro-batch-size", "4", "--store-param-remainders",
                             "--out", (work_dir / "o").string()});
  EXPECT_EQ(tool_run.code, 0) << tool_run.log;
  EXPECT_NE(tool_run.log.find("WARNING: --store-param-remainders: store_param_remainders=true NOT in effect"),
            std::string::npos)
      << tool_run.log;
}

}   // namespace

// train --load without the flags the run was saved with resumes with the saved configuration
// (Megatron's --use-checkpoint-args), bit for bit as when every flag is given; a model flag that
// contradicts the checkpoint is refused naming both values; another given difference is listed.
TEST(TrainLoad, UsesTheSavedConfigAndRefusesAContradictingModelFlag) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "load_saved_config");
  const std::vector<std::string> flags = {"--train-iters",
                                          "4",
                                          "--micro-batch-size",
                                          "4",
                                          "--hidden-size",
                                          "48",
                                          "--use-precision-aware-optimizer",
                                          "--exp-avg-dtype",
                                          "bf16",
                                          "--exp-avg-sq-dtype",
                                          "fp8",
                                          "--lr-decay-style",
                                          "cosine",
                                          "--quiet"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), flags.begin(), flags.end());
    return a;
  };
  ASSERT_EQ(tool(work_dir, with({"train", "--out", (work_dir / "saved").string(), "--save", (work_dir / "ck").string(),
                                 "--stop-at", "2"}))
                .code,
            0);
  const ToolRun full =
      tool(work_dir, with({"train", "--out", (work_dir / "full").string(), "--load", (work_dir / "ck").string()}));
  ASSERT_EQ(full.code, 0) << full.log;
  const ToolRun bare =
      tool(work_dir, {"train", "--out", (work_dir / "bare").string(), "--load", (work_dir / "ck").string()});
  ASSERT_EQ(bare.code, 0) << bare.log;
  EXPECT_EQ(bare.log.find("differ"), std::string::npos) << bare.log;
  auto slurp = [](const fs::path& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_EQ(slurp(work_dir / "bare" / "config.json"), slurp(work_dir / "full" / "config.json"));
  EXPECT_NE(slurp(work_dir / "bare" / "config.json").find("\"exp_avg_sq_dtype\": \"fp8\""), std::string::npos)
      << slurp(work_dir / "bare" / "config.json");
  EXPECT_EQ(slurp(work_dir / "bare" / "metrics.csv"), slurp(work_dir / "full" / "metrics.csv"));
  EXPECT_FALSE(slurp(work_dir / "bare" / "metrics.csv").empty());

  const ToolRun contra = tool(work_dir, {"train", "--out", (work_dir / "contra").string(), "--load",
                                         (work_dir / "ck").string(), "--hidden-size", "32"});
  expect_bad_input(contra, "config mismatch: ");
  EXPECT_NE(contra.log.find("was saved with --hidden-size=48, this run has --hidden-size=32"), std::string::npos)
      << contra.log;

  const ToolRun clip = tool(work_dir, {"train", "--out", (work_dir / "clip").string(), "--load",
                                       (work_dir / "ck").string(), "--clip-grad", "0.5"});
  EXPECT_EQ(clip.code, 0) << clip.log;
  EXPECT_NE(clip.log.find("differ from the checkpoint's: --clip-grad=0.5 (saved 1.0)"), std::string::npos) << clip.log;
}

// -q prints only what failed and the closing line, -v adds each scenario's directory; inspect -q
// prints nothing for a good checkpoint and the one DAMAGED line for a damaged one.
TEST(CliVerbosity, QuietPrintsOnlyFailuresVerboseTheDirectories) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "verbosity");
  std::ofstream(work_dir / "m.toml") << R"([defaults]
save_at = 2
model = { vocab_size = 32, seq_len = 16, d_model = 16, n_layers = 1, n_heads = 2, ffn_hidden = 16 }
train = { iterations = 4, global_batch = 4, micro_batch = 2, lr_decay_iters = 4 }
[[scenario]]
name = "good"
[[scenario]]
name = "bad"
fault = "reset_lr_schedule"
)";
  const ToolRun quiet_run = tool(work_dir, {"matrix", (work_dir / "m.toml").string(), "-q", "--no-report",
                                            "--keep-checkpoints", "--run-dir", (work_dir / "q").string()});
  EXPECT_EQ(quiet_run.code, 1) << quiet_run.log;
  EXPECT_NE(quiet_run.log.find("FAIL bad"), std::string::npos) << quiet_run.log;
  EXPECT_EQ(quiet_run.log.find("PASS good"), std::string::npos) << quiet_run.log;
  EXPECT_EQ(quiet_run.log.find("ETA"), std::string::npos) << quiet_run.log;
  EXPECT_NE(quiet_run.log.find("1 passed, 1 failed"), std::string::npos) << quiet_run.log;
  const ToolRun verbose_run = tool(work_dir, {"check", "-f", (work_dir / "m.toml").string(), "good", "-v", "--run-dir",
                                              (work_dir / "v").string()});
  EXPECT_EQ(verbose_run.code, 0) << verbose_run.log;
  EXPECT_NE(verbose_run.log.find("PASS good"), std::string::npos) << verbose_run.log;
  // Not a terminal: one line per finished cell with the progress count, no line per task started.
  EXPECT_NE(verbose_run.log.find("[1/1, elapsed "), std::string::npos) << verbose_run.log;
  EXPECT_EQ(verbose_run.log.find("training baseline"), std::string::npos) << verbose_run.log;
  EXPECT_EQ(verbose_run.log.find("checking good"), std::string::npos) << verbose_run.log;
  EXPECT_NE(verbose_run.log.find("directory: " + (work_dir / "v" / "scenarios" / "good").string()), std::string::npos)
      << verbose_run.log;
  EXPECT_EQ(tool(work_dir, {"check", "-f", (work_dir / "m.toml").string(), "good", "-q", "-v"}).code, 2)
      << "-q and -v exclude each other";

  fs::path ckpt;
  for (const auto& e : fs::recursive_directory_iterator(work_dir / "q" / "baselines"))
    if (e.path().filename() == "latest_checkpointed_iteration.txt") ckpt = e.path().parent_path();
  ASSERT_FALSE(ckpt.empty()) << "--keep-checkpoints keeps the baseline's checkpoint";
  const ToolRun ok = tool(work_dir, {"inspect", "-q", ckpt.string()});
  EXPECT_EQ(ok.code, 0) << ok.log;
  EXPECT_EQ(ok.log, "");
  fs::path victim;
  for (const auto& e : fs::recursive_directory_iterator(ckpt))
    if (e.path().extension() == ".safetensors") victim = e.path();
  ASSERT_FALSE(victim.empty());
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x5a');
  }
  const ToolRun bad = tool(work_dir, {"inspect", "-q", ckpt.string()});
  EXPECT_EQ(bad.code, 1) << bad.log;
  EXPECT_EQ(bad.log.rfind("DAMAGED", 0), 0u) << bad.log;
  EXPECT_EQ(std::count(bad.log.begin(), bad.log.end(), '\n'), 1) << bad.log;
}

// -v on train, inspect and report prints what their default output leaves out, each line checked
// against what the files on disk say: a save's bytes per key add up to its total, inspect lists
// every file of the manifest with its size and checksum and the saved training state, report names
// every file it wrote (each one exists).
TEST(CliVerbosity, VerboseTrainInspectReportPrintWhatTheFilesSay) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "verbose3");
  const std::vector<std::string> tiny = {"--vocab-size",          "32", "--seq-length",          "16",
                                         "--hidden-size",         "16", "--num-layers",          "1",
                                         "--num-attention-heads", "2",  "--moe-ffn-hidden-size", "16",
                                         "--train-iters",         "3",  "--global-batch-size",   "4",
                                         "--micro-batch-size",    "2"};
  std::vector<std::string> args = {"train",     "-v", "--out",  (work_dir / "out").string(),
                                   "--save-at", "2",  "--save", (work_dir / "ck").string()};
  args.insert(args.end(), tiny.begin(), tiny.end());
  const ToolRun train_run = tool(work_dir, args);
  ASSERT_EQ(train_run.code, 0) << train_run.log;
  uint64_t total = 0, sum = 0;
  int keys = 0;
  std::istringstream lines(train_run.log);
  for (std::string line; std::getline(lines, line);) {
    unsigned long long key_bytes = 0;
    char key[64];
    if (line.rfind("saved ", 0) == 0) total = std::stoull(line.substr(line.find(": ") + 2));
    else if (std::sscanf(line.c_str(), " %63s %llu bytes", key, &key_bytes) == 2 && line.rfind("  ", 0) == 0) {
      sum += key_bytes;
      ++keys;
    }
  }
  EXPECT_GT(total, 0u) << train_run.log;
  EXPECT_EQ(sum, total) << "the bytes per key add up to the save's total\n" << train_run.log;
  EXPECT_GE(keys, 4) << train_run.log;   // model, master_param, exp_avg, exp_avg_sq (and metadata)
  const nlohmann::json phases = nlohmann::json::parse(slurp(work_dir / "out" / "phases.json"));
  ASSERT_NE(train_run.log.find("seconds per phase (this process):"), std::string::npos) << train_run.log;
  for (auto it = phases["seconds"].begin(); it != phases["seconds"].end(); ++it)
    EXPECT_NE(train_run.log.find(" " + it.key() + " "), std::string::npos) << it.key() << "\n" << train_run.log;
  EXPECT_EQ(tool(work_dir, {"train", "-q", "-v", "--train-iters", "1"}).code, 2) << "-q and -v exclude each other";
  const ToolRun plain = tool(work_dir, {"inspect", (work_dir / "ck").string()});
  const ToolRun inspect_run = tool(work_dir, {"inspect", "-v", (work_dir / "ck").string()});
  ASSERT_EQ(inspect_run.code, 0) << inspect_run.log;
  EXPECT_EQ(plain.log.find("files ("), std::string::npos) << plain.log;
  const fs::path iter = work_dir / "ck" / "iter_0000002";
  const nlohmann::json manifest = nlohmann::json::parse(slurp(iter / "manifest.json"));
  ASSERT_FALSE(manifest["files"].empty());
  for (const auto& file_entry : manifest["files"]) {
    const std::string name = file_entry["name"].get<std::string>();
    const auto at = inspect_run.log.find("  " + name + " ", inspect_run.log.find("\nfiles ("));
    ASSERT_NE(at, std::string::npos) << name << "\n" << inspect_run.log;
    const std::string row = inspect_run.log.substr(at, inspect_run.log.find('\n', at) - at);
    EXPECT_NE(row.find(" " + std::to_string(fs::file_size(iter / name)) + "  "), std::string::npos) << row;
    EXPECT_NE(row.find(file_entry["xxh3"].get<std::string>()), std::string::npos) << row;
  }
  // 2 iterations of 4 samples; the scheduler counts samples too (Megatron's increment is the batch).
  EXPECT_NE(inspect_run.log.find("training state: iteration 2, consumed samples 8"), std::string::npos)
      << inspect_run.log;
  EXPECT_NE(inspect_run.log.find(" num_steps=8"), std::string::npos) << inspect_run.log;
  EXPECT_EQ(tool(work_dir, {"inspect", "-v", "--json", (work_dir / "ck").string()}).code, 2)
      << "--json and -v exclude each other";

  std::ofstream(work_dir / "m.toml") << R"([defaults]
save_at = 2
model = { vocab_size = 32, seq_len = 16, d_model = 16, n_layers = 1, n_heads = 2, ffn_hidden = 16 }
train = { iterations = 4, global_batch = 4, micro_batch = 2, lr_decay_iters = 4 }
[[scenario]]
name = "one"
)";
  ASSERT_EQ(tool(work_dir, {"matrix", (work_dir / "m.toml").string(), "-q", "--no-report", "--run-dir",
                            (work_dir / "run").string()})
                .code,
            0);
  const ToolRun report_run = tool(work_dir, {"report", "-v", (work_dir / "run").string()});
  ASSERT_EQ(report_run.code, 0) << report_run.log;
  EXPECT_NE(report_run.log.find("report: read 1 scenarios from " + (work_dir / "run" / "summary.csv").string()),
            std::string::npos)
      << report_run.log;
  int wrote = 0;
  std::istringstream report_lines(report_run.log);
  for (std::string line; std::getline(report_lines, line);)
    if (line.rfind("report: wrote ", 0) == 0 && line.find(" and ") == std::string::npos) {
      ++wrote;
      const std::string path = line.substr(std::string("report: wrote ").size());
      EXPECT_TRUE(fs::is_regular_file(path)) << path;
    }
  EXPECT_GE(wrote, 1) << report_run.log;   // projection.csv, and each plot matplotlib drew
  EXPECT_EQ(tool(work_dir, {"report", "-q", "-v", (work_dir / "run").string()}).code, 2)
      << "-q and -v exclude each other";
}

// ---- Hostile input: messages that name the file and field -------------

namespace hostile4 {

const std::string kTinyModelArgs[] = {
    "--vocab-size",      "16", "--seq-length",          "4", "--hidden-size", "8",
    "--num-layers",      "1",  "--num-attention-heads", "2", "--num-experts", "2",
    "--moe-router-topk", "1",  "--moe-ffn-hidden-size", "8"};   // the conformance bases' model (tests/conformance/base)

std::vector<std::string> with_tiny(std::vector<std::string> args) {
  args.insert(args.end(), std::begin(kTinyModelArgs), std::end(kTinyModelArgs));
  return args;
}

// A corpus case (tests/conformance/make_corpus.py) written into dir/<name>.
fs::path corpus_case(const fs::path& dir, const std::string& name) {
  const std::string cmd = "/usr/bin/python3 " + std::string(RH_TESTS_DIR) + "/conformance/make_corpus.py " +
                          dir.string() + " " + name + " > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return dir / name;
}


bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

struct BadJson {
  const char* name;
  const char* flag;   // --save-plan or --config
  std::string text;
  std::string needle;
};
class TrainJsonInput : public ::testing::TestWithParam<BadJson> {};

// Each used to surface a bare library message or a wrapped value: nlohmann's type_error for a
// string schema_version, a root cut at its NUL, vocab_size 2^64-1 shown as -1, the last of two
// keys silently winning.
TEST_P(TrainJsonInput, IsBadInputNamingTheFileAndField) {
  const BadJson& bad_json = GetParam();
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", std::string("json_") + bad_json.name);
  std::ofstream(work_dir / "in.json", std::ios::binary) << bad_json.text;
  const ToolRun tool_run =
      tool(work_dir, {"train", bad_json.flag, (work_dir / "in.json").string(), "--out", (work_dir / "out").string()});
  expect_bad_input(tool_run, (work_dir / "in.json").string());
  EXPECT_NE(tool_run.log.find(bad_json.needle), std::string::npos)
      << "want '" << bad_json.needle << "' in: " << tool_run.log;
  EXPECT_EQ(tool_run.log.find("[json.exception"), std::string::npos) << tool_run.log;
  EXPECT_FALSE(fs::exists(work_dir / "out"));
  fs::remove_all(work_dir);
}

INSTANTIATE_TEST_SUITE_P(
    Hostile, TrainJsonInput,
    ::testing::Values(
        BadJson{"plan_schema_version_string", "--save-plan", R"({"schema_version": "1", "saves": []})",
                "field /schema_version: expected an integer"},
        BadJson{"plan_root_nul", "--save-plan", R"({"schema_version": 1, "saves": [{"root": "a\u0000b"}]})",
                "field /saves/0/root: NUL byte at character 1"},
        BadJson{"plan_root_number", "--save-plan", R"({"schema_version": 1, "saves": [{"root": 5}]})",
                "field /saves/0/root: expected a string"},
        BadJson{"plan_overrides_array", "--save-plan",
                R"({"schema_version": 1, "saves": [{"root": "x", "overrides": ["bf16"]}]})",
                "field /saves/0/overrides: expected an object"},
        BadJson{"plan_duplicate_key", "--save-plan", R"({"schema_version": 1, "saves": [], "saves": [{"root": "x"}]})",
                "duplicate key 'saves'"},
        BadJson{"config_vocab_size_2_64_minus_1", "--config", R"({"model": {"vocab_size": 18446744073709551615}})",
                "key 'model.vocab_size': expected an integer in [1, 1048576], got 18446744073709551615"},
        BadJson{"config_duplicate_key", "--config", R"({"model": {"vocab_size": 16, "vocab_size": 32}})",
                "duplicate key 'vocab_size'"}),
    [](const auto& info) { return std::string(info.param.name); });

// A value in int64 but outside the model's range says the range and the value (it said "must be
// positive" for -1 before, and nothing of the upper bound).
TEST(CliErrors, ModelSizeOutOfRangeShowsTheValueAndTheRange) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "vocab0");
  expect_bad_input(tool(work_dir, {"train", "--vocab-size", "0", "--out", (work_dir / "out").string()}),
                   "model.vocab_size (--vocab-size) must be in [1, 1048576], got 0");
  expect_bad_input(tool(work_dir, {"train", "--seq-length", "100000", "--out", (work_dir / "out").string()}),
                   "model.seq_len (--seq-length) must be in [1, 65536], got 100000");
}

// A bad generator state of rank 1 at --nproc 2: refused by every rank before anything is
// restored, load_result.json says "refused" naming the field, and the exit code is the same every
// time (1 where inspect calls the checkpoint damaged too, else 2). A 16-byte (CUDA) state on a CPU run said "loaded", then failed in set_state with a
// LibTorch backtrace, exit 3; a readers' check (inspect) accepts it, the load knows the device.
struct BadRankState {
  const char* name;
  const char* corpus_case;
  std::string needle;
  int code;   // 1 damaged (inspect refuses it too), 2 refused by this run
};
class HostileLoad : public ::testing::TestWithParam<BadRankState> {};
TEST_P(HostileLoad, BadRankStateAtTwoRanksIsRefusedBeforeTheLoadIsReported) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", std::string("rankrng_") + GetParam().name);
  const fs::path ckpt = corpus_case(work_dir / "corpus", GetParam().corpus_case);
  for (int run = 0; run < 2; ++run) {
    const fs::path out = work_dir / ("out" + std::to_string(run));
    const ToolRun tool_run = tool(work_dir, with_tiny({"train", "--quiet", "--nproc", "2", "--train-iters", "2",
                                                       "--load", ckpt.string(), "--out", out.string()}));
    EXPECT_EQ(tool_run.code, GetParam().code) << "the same code every time (run " << run << "): " << tool_run.log;
    EXPECT_NE(tool_run.log.find("field /rank_states/1/rng_states/dropout: " + GetParam().needle), std::string::npos)
        << tool_run.log;
    EXPECT_EQ(tool_run.log.find("Exception raised from"), std::string::npos) << tool_run.log;   // a LibTorch backtrace
    const std::string result = slurp(out / "load_result.json");
    EXPECT_NE(result.find("\"refused\""), std::string::npos) << result;
    EXPECT_EQ(result.find("\"loaded\""), std::string::npos) << result;
  }
  fs::remove_all(work_dir);
}
INSTANTIATE_TEST_SUITE_P(
    Hostile, HostileLoad,
    ::testing::Values(BadRankState{"OneByte", "rng_one_byte_rank_state", "1 bytes is not a generator state", 1},
                      BadRankState{"CudaStateOnACpuRun", "accept_cuda_rank_state",
                                   "16 bytes is a CUDA generator's state, but this run's generators are on the CPU",
                                   2}),
    [](const auto& i) { return std::string(i.param.name); });

// Run directories and checkpoint paths need not be UTF-8: a load from and into such
// paths works, load_result.json is valid UTF-8 JSON naming the path with \xNN escapes, and a
// refusal names it the same way instead of failing with nlohmann's type_error 316.
TEST(HostilePaths, NonUtf8PathsLoadAndAreNamedReadably) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "utf8");
  const std::string odd = "ckpt_\xff\xfe_\xc3";   // not UTF-8
  const fs::path ckpt = work_dir / odd;
  fs::copy(fs::path(RH_TESTS_DIR) / "conformance/base/plain_dp2", ckpt, fs::copy_options::recursive);
  const fs::path out = work_dir / ("out_\xff");
  ToolRun tool_run = tool(work_dir, with_tiny({"train", "--quiet", "--nproc", "2", "--train-iters", "2", "--load",
                                               ckpt.string(), "--out", out.string()}));
  EXPECT_EQ(tool_run.code, 0) << tool_run.log;
  std::string result = slurp(out / "load_result.json");
  EXPECT_TRUE(valid_utf8(result)) << result;
  EXPECT_NE(result.find("\"loaded\""), std::string::npos) << result;
  EXPECT_NE(result.find("ckpt_\\\\xff\\\\xfe_\\\\xc3"), std::string::npos) << result;   // JSON escapes the backslash
  // A refused load of such a path (its manifest's sidecar removed).
  fs::remove(ckpt / "manifest.json.xxh3");
  const fs::path out2 = work_dir / ("out2_\xff");
  tool_run = tool(work_dir, with_tiny({"train", "--quiet", "--nproc", "2", "--train-iters", "2", "--load",
                                       ckpt.string(), "--out", out2.string()}));
  EXPECT_NE(tool_run.code, 0) << tool_run.log;
  EXPECT_EQ(tool_run.log.find("json.exception"), std::string::npos) << tool_run.log;
  EXPECT_NE(tool_run.log.find("ckpt_\\xff\\xfe_\\xc3"), std::string::npos) << tool_run.log;
  EXPECT_TRUE(valid_utf8(tool_run.log)) << tool_run.log;
  result = slurp(out2 / "load_result.json");
  EXPECT_TRUE(valid_utf8(result)) << result;
  EXPECT_NE(result.find("\"refused\""), std::string::npos) << result;
  EXPECT_NE(result.find("manifest.json.xxh3"), std::string::npos) << result;
  // inspect prints the name escaped too.
  tool_run = tool(work_dir, {"inspect", ckpt.string()});
  EXPECT_EQ(tool_run.code, 1) << tool_run.log;
  EXPECT_TRUE(valid_utf8(tool_run.log)) << tool_run.log;
  EXPECT_NE(tool_run.log.find("ckpt_\\xff\\xfe_\\xc3"), std::string::npos) << tool_run.log;
  fs::remove_all(work_dir);
}

// A save that runs out of disk (a 256 KiB tmpfs, mounted in a private mount namespace with
// `unshare -rm`) exits 4, not 2 ("bad input"), and says it is the disk, naming the path. Skipped
// where unprivileged namespaces are not allowed; HostileDisk.* in test_checkpoint_hostile covers
// the same error with /dev/full.
TEST(HostileDisk, SaveOnAFullDiskExitsFourNamingThePathAndTheDisk) {
  const fs::path work_dir = rh::testutil::fresh_dir("cli_errors", "diskfull");
  fs::create_directories(work_dir / "mnt");
  if (rh::testutil::run_logged({"/usr/bin/unshare", "-rm", "true"}, work_dir / "probe.log").code != 0)
    GTEST_SKIP() << "unshare -rm is not allowed here";
  // In the new mount namespace: mount the tmpfs, then exec the tool with the arguments after $0.
  std::vector<std::string> argv{"/usr/bin/unshare",
                                "-rm",
                                "/bin/sh",
                                "-c",
                                "mount -t tmpfs -o size=16k tmpfs \"$0\" && exec \"$@\"",
                                (work_dir / "mnt").string(),
                                RH_TOOL};
  for (const auto& a : with_tiny({"train", "--quiet", "--train-iters", "2", "--save-at", "2", "--save",
                                  (work_dir / "mnt/ckpt").string(), "--out", (work_dir / "out").string()}))
    argv.push_back(a);
  const auto run = rh::testutil::run_logged(argv, work_dir / "log");
  const std::string& log = run.log;
  EXPECT_EQ(run.code, 4) << log;
  EXPECT_NE(log.find("No space left on device"), std::string::npos) << log;
  EXPECT_NE(log.find("(the disk failed, not the input)"), std::string::npos) << log;
  EXPECT_NE(log.find((work_dir / "mnt/ckpt").string()), std::string::npos) << log;
  fs::remove_all(work_dir);
}

}   // namespace hostile4
