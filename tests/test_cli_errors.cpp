// The command line as a new user meets it (issue 14): every bad input exits 2 with one line that
// starts with the tool's error prefix and names the file, flag or key; nothing is written before
// the flags are checked; --version and --help say what the tool and its options are.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "harness/base/suggest.h"
#include "harness/dist/process.h"
#include "harness/verify/scenario.h"

namespace fs = std::filesystem;

namespace {

struct ToolRun {
  int code = -1;
  std::string log;   // stdout and stderr
};

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("rh_cli_errors_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

ToolRun tool(const fs::path& dir, std::vector<std::string> args) {
  std::vector<std::string> argv{RH_TOOL};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string log = (dir / "log").string();
  fs::remove(log);
  const auto r = rh::run_process(argv, log, 120);
  return {r.exit_code, rh::tail_of_file(log, 200000)};
}

const std::string kPrefix = "resume-harness: error: ";

// Exit 2, exactly one line, the prefix, and `needle` in it.
void expect_bad_input(const ToolRun& r, const std::string& needle) {
  EXPECT_EQ(r.code, 2) << r.log;
  EXPECT_EQ(r.log.rfind(kPrefix, 0), 0u) << r.log;
  EXPECT_EQ(std::count(r.log.begin(), r.log.end(), '\n'), 1) << r.log;
  EXPECT_NE(r.log.find(needle), std::string::npos) << "want '" << needle << "' in: " << r.log;
}

TEST(CliErrors, MissingConfigFileIsBadInputNamingIt) {
  const fs::path d = fresh_dir("config");
  expect_bad_input(tool(d, {"train", "--config", (d / "missing.json").string()}), (d / "missing.json").string());
}

TEST(CliErrors, ConfigWithAnUnknownKeyNamesTheFileAndKey) {
  const fs::path d = fresh_dir("badkey");
  std::ofstream(d / "c.json") << R"({"model": {"no_such_key": 1}})";
  const ToolRun r = tool(d, {"train", "--config", (d / "c.json").string()});
  expect_bad_input(r, (d / "c.json").string());
  EXPECT_NE(r.log.find("no_such_key"), std::string::npos) << r.log;
}

TEST(CliErrors, UnknownSubcommandListsTheValidOnes) {
  const fs::path d = fresh_dir("sub");
  const ToolRun r = tool(d, {"frobnicate"});
  expect_bad_input(r, "unknown subcommand 'frobnicate'");
  for (const char* s : {"train", "inspect", "check", "matrix", "report"})
    EXPECT_NE(r.log.find(s), std::string::npos) << s << " missing from: " << r.log;
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
  const fs::path d = fresh_dir("typos");
  const std::string ci = std::string(RH_SOURCE_DIR) + "/scenarios/ci.toml";
  struct Case {
    std::vector<std::string> args;
    std::string want;
  };
  for (const auto& c : std::vector<Case>{
           {{"matrx"}, "unknown subcommand 'matrx' (did you mean 'matrix'?)"},
           {{"matrix", ci, "--jbos", "2"}, "(did you mean '--jobs'?)"},
           {{"train", "--lr-decay-styl", "cosine"}, "(did you mean '--lr-decay-style'?)"},
           {{"check", "--file", ci, "seed-protocl"}, "no scenario matches 'seed-protocl' (did you mean 'seed-protocol'?)"},
       })
    expect_bad_input(tool(d, c.args), c.want);
  const ToolRun far = tool(d, {"frobnicate"});
  EXPECT_EQ(far.log.find("did you mean"), std::string::npos) << far.log;
}

// --list prints what a filter (and a shard) selects and runs nothing.
TEST(CliErrors, ListPrintsTheSelectionAndRunsNothing) {
  const fs::path d = fresh_dir("list");
  const std::string ci = std::string(RH_SOURCE_DIR) + "/scenarios/ci.toml";
  const ToolRun all = tool(d, {"matrix", ci, "--list", "--run-dir", (d / "run").string()});
  ASSERT_EQ(all.code, 0) << all.log;
  const auto want = static_cast<long>(rh::load_scenarios(ci).size());
  EXPECT_EQ(std::count(all.log.begin(), all.log.end(), '\n'), want) << all.log;
  EXPECT_FALSE(fs::exists(d / "run")) << "--list wrote a run directory";
  std::string halves;
  for (const char* s : {"1/2", "2/2"}) {
    const ToolRun h = tool(d, {"matrix", ci, "--list", "--shard", s});
    ASSERT_EQ(h.code, 0) << h.log;
    EXPECT_LT(std::count(h.log.begin(), h.log.end(), '\n'), want) << s;
    halves += h.log;
  }
  auto sorted_lines = [](const std::string& t) {
    std::vector<std::string> v;
    std::string line;
    for (char c : t) {
      if (c == '\n') v.push_back(line), line.clear();
      else line += c;
    }
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted_lines(halves), sorted_lines(all.log)) << "the two halves are not the whole";
  const ToolRun one = tool(d, {"check", "--file", ci, "seed-*", "--list"});
  EXPECT_EQ(one.code, 0);
  EXPECT_EQ(one.log, "seed-protocol\n");
}

TEST(CliErrors, Cli11ParseErrorsCarryTheSamePrefix) {
  const fs::path d = fresh_dir("cli11");
  expect_bad_input(tool(d, {"train", "--lr", "abc"}), "--lr");
  expect_bad_input(tool(d, {"train", "--no-such-flag"}), "--no-such-flag");
  // Values the optimizer would refuse are refused by the parser, with the valid ones.
  expect_bad_input(tool(d, {"train", "--main-params-dtype", "bf16"}), "--main-params-dtype");
  expect_bad_input(tool(d, {"train", "--fault", "frobnicate"}), "--fault");
}

// Token dropping and the router dtype (Megatron's choices): bad values are bad input naming the
// flag, or for a config file the field.
TEST(CliErrors, MoeTokenDropAndRouterDtypeRefuseBadValues) {
  const fs::path d = fresh_dir("tokendrop");
  expect_bad_input(tool(d, {"train", "--moe-token-drop-policy", "random"}), "--moe-token-drop-policy");
  expect_bad_input(tool(d, {"train", "--moe-router-dtype", "bf16"}), "--moe-router-dtype");
  expect_bad_input(tool(d, {"train", "--moe-expert-capacity-factor", "abc"}), "--moe-expert-capacity-factor");
  std::ofstream(d / "c.json") << R"({"model": {"token_drop_policy": "random"}})";
  expect_bad_input(tool(d, {"train", "--config", (d / "c.json").string()}), "token_drop_policy");
}

TEST(CliErrors, SaveAtWithoutSaveWritesNothing) {
  const fs::path d = fresh_dir("saveat");
  const fs::path out = d / "out";
  expect_bad_input(tool(d, {"train", "--out", out.string(), "--save-at", "2"}), "--save-at needs --save");
  EXPECT_FALSE(fs::exists(out)) << "config.json was written before the flags were checked";
  expect_bad_input(tool(d, {"train", "--out", out.string(), "--load", (d / "nothing").string()}),
                   (d / "nothing").string());
  EXPECT_FALSE(fs::exists(out));
  expect_bad_input(tool(d, {"train", "--out", out.string(), "--fault", "skip_rng_restore"}), "needs --load");
  EXPECT_FALSE(fs::exists(out));
}

TEST(CliErrors, InspectOfAMissingPathIsBadInputNotDamage) {
  const fs::path d = fresh_dir("inspect");
  ToolRun r = tool(d, {"inspect", (d / "nonexistent").string()});
  EXPECT_EQ(r.code, 2) << r.log;
  EXPECT_NE(r.log.find("no such file or directory"), std::string::npos) << r.log;
  r = tool(d, {"inspect", d.string()});   // a directory that is no checkpoint
  EXPECT_EQ(r.code, 2) << r.log;
  EXPECT_NE(r.log.find("neither a checkpoint directory"), std::string::npos) << r.log;
  fs::create_directories(d / "iter_0000007");   // an incomplete save: that is damage
  r = tool(d, {"inspect", (d / "iter_0000007").string()});
  EXPECT_EQ(r.code, 1) << r.log;
}

TEST(CliErrors, ScenarioFileThatCannotBeOpenedIsNamedWithoutALineNumber) {
  const fs::path d = fresh_dir("scen");
  const std::string f = (d / "none.toml").string();
  for (const auto& args : std::vector<std::vector<std::string>>{{"matrix", f}, {"matrix", "-f", f}, {"check", "x", "-f", f}}) {
    const ToolRun r = tool(d, args);
    expect_bad_input(r, f);
    EXPECT_EQ(r.log.find(f + ":0"), std::string::npos) << r.log;
  }
}

TEST(CliHelp, VersionNamesVersionCommitLibTorchAndBlasCore) {
  const fs::path d = fresh_dir("version");
  const ToolRun r = tool(d, {"--version"});
  EXPECT_EQ(r.code, 0) << r.log;
  for (const char* s : {"resume-harness 0.", "LibTorch 1.", "BLAS: ", " core "})
    EXPECT_NE(r.log.find(s), std::string::npos) << s << " missing from: " << r.log;
}

TEST(CliHelp, TrainHelpShowsDefaultsAndValidValues) {
  const fs::path d = fresh_dir("help");
  const ToolRun r = tool(d, {"train", "--help"});
  EXPECT_EQ(r.code, 0) << r.log;
  const auto line_of = [&](const std::string& flag) {
    const auto at = r.log.find("  " + flag + " ");
    if (at == std::string::npos) return std::string("(no line for " + flag + ")");
    return r.log.substr(at, r.log.find('\n', at) - at);
  };
  EXPECT_NE(line_of("--store-param-remainders").find("(default: true)"), std::string::npos) << r.log;
  EXPECT_EQ(r.log.find("{false}"), std::string::npos) << "a negated flag's {false} reads as its default";
  const std::string mp = line_of("--main-params-dtype");
  EXPECT_NE(mp.find("fp16"), std::string::npos) << mp;
  EXPECT_EQ(mp.find("fp8"), std::string::npos) << "fp8 is refused for the master: " << mp;
  EXPECT_NE(r.log.find("skip_rng_restore"), std::string::npos) << "--fault lists its values";
  EXPECT_NE(line_of("--lr").find("0.0"), std::string::npos) << "--lr shows its default: " << line_of("--lr");
}

TEST(CliHelp, DefaultRunPrintsNoRemaindersWarning) {
  const fs::path d = fresh_dir("warn");
  ToolRun r = tool(d, {"train", "--train-iters", "1", "--micro-batch-size", "4", "--out", (d / "o").string()});
  EXPECT_EQ(r.code, 0) << r.log;
  EXPECT_EQ(r.log.find("NOT in effect"), std::string::npos) << r.log;
  r = tool(d, {"train", "--train-iters", "1", "--micro-batch-size", "4", "--store-param-remainders", "--out",
               (d / "o").string()});
  EXPECT_EQ(r.code, 0) << r.log;
  EXPECT_NE(r.log.find("WARNING: --store-param-remainders: store_param_remainders=true NOT in effect"),
            std::string::npos) << r.log;
}

}  // namespace

// train --load without the flags the run was saved with resumes with the saved configuration
// (Megatron's --use-checkpoint-args), bit for bit as when every flag is given; a model flag that
// contradicts the checkpoint is refused naming both values; another given difference is listed.
TEST(TrainLoad, UsesTheSavedConfigAndRefusesAContradictingModelFlag) {
  const fs::path d = fresh_dir("load_saved_config");
  const std::vector<std::string> flags = {"--train-iters", "4", "--micro-batch-size", "4", "--hidden-size", "48",
                                          "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16",
                                          "--exp-avg-sq-dtype", "fp8", "--lr-decay-style", "cosine", "--quiet"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), flags.begin(), flags.end());
    return a;
  };
  ASSERT_EQ(tool(d, with({"train", "--out", (d / "saved").string(), "--save", (d / "ck").string(), "--stop-at", "2"})).code, 0);
  const ToolRun full = tool(d, with({"train", "--out", (d / "full").string(), "--load", (d / "ck").string()}));
  ASSERT_EQ(full.code, 0) << full.log;
  const ToolRun bare = tool(d, {"train", "--out", (d / "bare").string(), "--load", (d / "ck").string()});
  ASSERT_EQ(bare.code, 0) << bare.log;
  EXPECT_EQ(bare.log.find("differ"), std::string::npos) << bare.log;
  auto slurp = [](const fs::path& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_EQ(slurp(d / "bare" / "config.json"), slurp(d / "full" / "config.json"));
  EXPECT_NE(slurp(d / "bare" / "config.json").find("\"exp_avg_sq_dtype\": \"fp8\""), std::string::npos)
      << slurp(d / "bare" / "config.json");
  EXPECT_EQ(slurp(d / "bare" / "metrics.csv"), slurp(d / "full" / "metrics.csv"));
  EXPECT_FALSE(slurp(d / "bare" / "metrics.csv").empty());

  const ToolRun contra = tool(d, {"train", "--out", (d / "contra").string(), "--load", (d / "ck").string(),
                                  "--hidden-size", "32"});
  expect_bad_input(contra, "config mismatch: ");
  EXPECT_NE(contra.log.find("was saved with --hidden-size=48, this run has --hidden-size=32"), std::string::npos)
      << contra.log;

  const ToolRun clip = tool(d, {"train", "--out", (d / "clip").string(), "--load", (d / "ck").string(),
                                "--clip-grad", "0.5"});
  EXPECT_EQ(clip.code, 0) << clip.log;
  EXPECT_NE(clip.log.find("differ from the checkpoint's: --clip-grad=0.5 (saved 1.0)"), std::string::npos) << clip.log;
}

// -q prints only what failed and the closing line, -v adds each scenario's directory; inspect -q
// prints nothing for a good checkpoint and the one DAMAGED line for a damaged one.
TEST(CliVerbosity, QuietPrintsOnlyFailuresVerboseTheDirectories) {
  const fs::path d = fresh_dir("verbosity");
  std::ofstream(d / "m.toml") << R"([defaults]
save_at = 2
model = { vocab_size = 32, seq_len = 16, d_model = 16, n_layers = 1, n_heads = 2, ffn_hidden = 16 }
train = { iterations = 4, global_batch = 4, micro_batch = 2, lr_decay_iters = 4 }
[[scenario]]
name = "good"
[[scenario]]
name = "bad"
fault = "reset_lr_schedule"
)";
  const ToolRun q = tool(d, {"matrix", (d / "m.toml").string(), "-q", "--no-report", "--keep-checkpoints",
                             "--run-dir", (d / "q").string()});
  EXPECT_EQ(q.code, 1) << q.log;
  EXPECT_NE(q.log.find("FAIL bad"), std::string::npos) << q.log;
  EXPECT_EQ(q.log.find("PASS good"), std::string::npos) << q.log;
  EXPECT_EQ(q.log.find("ETA"), std::string::npos) << q.log;
  EXPECT_NE(q.log.find("1 passed, 1 failed"), std::string::npos) << q.log;
  const ToolRun v = tool(d, {"check", "-f", (d / "m.toml").string(), "good", "-v", "--run-dir", (d / "v").string()});
  EXPECT_EQ(v.code, 0) << v.log;
  EXPECT_NE(v.log.find("PASS good"), std::string::npos) << v.log;
  EXPECT_NE(v.log.find("directory: " + (d / "v" / "scenarios" / "good").string()), std::string::npos) << v.log;
  EXPECT_EQ(tool(d, {"check", "-f", (d / "m.toml").string(), "good", "-q", "-v"}).code, 2) << "-q and -v exclude each other";

  fs::path ckpt;
  for (const auto& e : fs::recursive_directory_iterator(d / "q" / "baselines"))
    if (e.path().filename() == "latest_checkpointed_iteration.txt") ckpt = e.path().parent_path();
  ASSERT_FALSE(ckpt.empty()) << "--keep-checkpoints keeps the baseline's checkpoint";
  const ToolRun ok = tool(d, {"inspect", "-q", ckpt.string()});
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
  const ToolRun bad = tool(d, {"inspect", "-q", ckpt.string()});
  EXPECT_EQ(bad.code, 1) << bad.log;
  EXPECT_EQ(bad.log.rfind("DAMAGED", 0), 0u) << bad.log;
  EXPECT_EQ(std::count(bad.log.begin(), bad.log.end(), '\n'), 1) << bad.log;
}
