// One damaged checkpoint, one exit code: `inspect` and `train --load` both exit 1 for a checkpoint
// whose bytes are damaged (a flipped byte, a truncated or missing file, a bad manifest), each with
// one error line naming the file; a valid checkpoint the run refuses (another model) is bad input,
// exit 2, and so is a path that holds no checkpoint at all. `inspect --json` says the same as one
// JSON object, with the listing's values. Not for the rule-by-rule verdicts of
// the readers (tests/checkpoint/test_checkpoint_conformance.cpp) or what a refused load leaves untouched
// (tests/checkpoint/test_checkpoint_corruption.cpp).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/process/process.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;

namespace {

using rh::testutil::run_tool;
using rh::testutil::slurp;
using rh::testutil::ToolRun;

// stdout and stderr into two files; the exit code.
int run_split(const std::vector<std::string>& args, const fs::path& out, const fs::path& err) {
  return rh::testutil::run_tool_split(args, out, err).code;
}

const std::vector<std::string> kTinyModelFlags =
    {"--vocab-size",      "16", "--seq-length",          "4", "--hidden-size", "8",
     "--num-layers",      "1",  "--num-attention-heads", "2", "--num-experts", "2",
     "--moe-router-topk", "1",  "--moe-ffn-hidden-size", "8", "--quiet"};

std::vector<std::string> tiny(std::vector<std::string> args) {
  args.insert(args.end(), kTinyModelFlags.begin(), kTinyModelFlags.end());
  return args;
}

// One checkpoint (root with iter_0000001/) for the whole suite, copied per case.
const fs::path& pristine() {
  static const fs::path root = [] {
    const fs::path d = fs::temp_directory_path() / ("rh_cli_damage_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    const ToolRun r = run_tool(d, tiny({"train", "--train-iters", "2", "--stop-at", "1", "--save", (d / "ck").string(),
                                        "--out", (d / "out").string()}));
    EXPECT_EQ(r.code, 0) << r.log;
    return d / "ck";
  }();
  return root;
}

// Removes the suite's directory (the pristine checkpoint) after the last test.
struct RemoveSuiteDir : ::testing::Environment {
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(fs::temp_directory_path() / ("rh_cli_damage_" + std::to_string(::getpid())), ec);
  }
};
const auto* const kRemoveSuiteDir = ::testing::AddGlobalTestEnvironment(new RemoveSuiteDir);

struct Damage {
  const char* name;
  const char* file;   // in iter_0000001/, the file the damage is in and the message names
  std::function<void(const fs::path& iter)> apply;
};

void flip_byte(const fs::path& p, std::streamoff at_fraction_of_8) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const std::streamoff at = f.tellg() * at_fraction_of_8 / 8;
  f.seekg(at);
  char c = 0;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x5a));
}

const Damage kDamage[] = {
    {"FlippedByteInOptimizerShard", "optim_rank_00000.safetensors",
     [](const fs::path& it) { flip_byte(it / "optim_rank_00000.safetensors", 6); }},
    {"FlippedByteInModelFile", "model.safetensors", [](const fs::path& it) { flip_byte(it / "model.safetensors", 5); }},
    {"TruncatedOptimizerShard", "optim_rank_00000.safetensors",
     [](const fs::path& it) {
       const fs::path p = it / "optim_rank_00000.safetensors";
       fs::resize_file(p, fs::file_size(p) / 2);
     }},
    {"MissingModelFile", "model.safetensors", [](const fs::path& it) { fs::remove(it / "model.safetensors"); }},
    {"EditedManifest", "manifest.json",   // its sidecar no longer matches
     [](const fs::path& it) { std::ofstream(it / "manifest.json", std::ios::app) << " "; }},
    {"ManifestNotJson", "manifest.json",
     [](const fs::path& it) { std::ofstream(it / "manifest.json", std::ios::trunc) << "{\"format\": "; }},
    {"MissingManifestSidecar", "manifest.json.xxh3", [](const fs::path& it) { fs::remove(it / "manifest.json.xxh3"); }},
    {"MissingManifest", "manifest.json", [](const fs::path& it) { fs::remove(it / "manifest.json"); }},
};

class DamagedCheckpoint : public ::testing::TestWithParam<Damage> {};

// Both commands on the root and on the iter_ directory: exit 1, one line naming the file.
TEST_P(DamagedCheckpoint, InspectAndTrainLoadGiveTheSameExitCode) {
  const Damage& dmg = GetParam();
  ASSERT_TRUE(fs::exists(pristine() / "iter_0000001" / "manifest.json"));
  const fs::path d = pristine().parent_path() / dmg.name;
  fs::remove_all(d);
  fs::create_directories(d);
  fs::copy(pristine(), d / "ck", fs::copy_options::recursive);
  dmg.apply(d / "ck" / "iter_0000001");
  for (const fs::path& ck : {d / "ck", d / "ck" / "iter_0000001"}) {
    const ToolRun ins = run_tool(d, {"inspect", ck.string()});
    const ToolRun load =
        run_tool(d, tiny({"train", "--train-iters", "2", "--load", ck.string(), "--out", (d / "out").string()}));
    EXPECT_EQ(ins.code, 1) << ck << "\n" << ins.log;
    EXPECT_EQ(load.code, ins.code) << ck << "\ninspect: " << ins.log << "train --load: " << load.log;
    EXPECT_NE(ins.log.find("DAMAGED: "), std::string::npos) << ins.log;
    EXPECT_EQ(load.log.rfind("resume-harness: error: ", 0), 0u) << load.log;
    EXPECT_EQ(std::count(load.log.begin(), load.log.end(), '\n'), 1) << load.log;
    EXPECT_NE(load.log.find(dmg.file), std::string::npos) << "want '" << dmg.file << "' in: " << load.log;
    EXPECT_EQ(load.log.find("Exception raised from"), std::string::npos) << load.log;
    const std::string result = slurp(d / "out" / "load_result.json");
    EXPECT_NE(result.find("\"damaged\": true"), std::string::npos) << result;
    EXPECT_NE(result.find("\"error_kind\": \"checkpoint\""), std::string::npos) << result;
    fs::remove_all(d / "out");
  }
  fs::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(Kinds, DamagedCheckpoint, ::testing::ValuesIn(kDamage),
                         [](const auto& i) { return std::string(i.param.name); });

// A pointer that names an iteration whose directory is gone is damage to both commands too.
TEST(DamagedCheckpointRoot, DanglingPointerIsDamageToBoth) {
  const fs::path d = pristine().parent_path() / "dangling";
  fs::remove_all(d);
  fs::create_directories(d);
  fs::copy(pristine(), d / "ck", fs::copy_options::recursive);
  std::ofstream(d / "ck" / "latest_checkpointed_iteration.txt", std::ios::trunc) << "7\n";
  const ToolRun ins = run_tool(d, {"inspect", (d / "ck").string()});
  const ToolRun load =
      run_tool(d, tiny({"train", "--train-iters", "2", "--load", (d / "ck").string(), "--out", (d / "out").string()}));
  EXPECT_EQ(ins.code, 1) << ins.log;
  EXPECT_EQ(load.code, 1) << load.log;
  EXPECT_NE(load.log.find("latest_checkpointed_iteration.txt"), std::string::npos) << load.log;
  fs::remove_all(d);
}

// The controls: a valid checkpoint of another model is refused by the load (2, not damage) and
// passes inspect (0); a path without a checkpoint is bad input (2) to both.
TEST(RefusedCheckpoint, AnIncompatibleOrAbsentCheckpointIsBadInputNotDamage) {
  const fs::path d = pristine().parent_path() / "refused";
  fs::remove_all(d);
  fs::create_directories(d);
  EXPECT_EQ(run_tool(d, {"inspect", pristine().string()}).code, 0);
  std::vector<std::string> other =
      tiny({"train", "--train-iters", "2", "--load", pristine().string(), "--out", (d / "out").string()});
  *std::find(other.begin(), other.end(), "8") = "16";   // --hidden-size 16: not the saved model
  const ToolRun load = run_tool(d, other);
  EXPECT_EQ(load.code, 2) << load.log;
  EXPECT_NE(load.log.find("config mismatch"), std::string::npos) << load.log;
  EXPECT_EQ(std::count(load.log.begin(), load.log.end(), '\n'), 1) << load.log;
  const ToolRun ins = run_tool(d, {"inspect", (d / "absent").string()});
  const ToolRun load2 = run_tool(d, tiny({"train", "--train-iters", "2", "--load", (d / "absent").string(), "--out",
                                          (d / "out2").string()}));
  EXPECT_EQ(ins.code, 2) << ins.log;
  EXPECT_EQ(load2.code, 2) << load2.log;
  fs::remove_all(d);
}

// The listing as values: the same iteration, policy, tensors and totals as the text listing;
// damage and bad input as a status with the same exit codes, the error also on stderr.
TEST(InspectJson, ListsTheCheckpointAsValuesAndRefusalsWithTheSameCodes) {
  const fs::path d = pristine().parent_path() / "json";
  fs::remove_all(d);
  fs::create_directories(d);
  ASSERT_EQ(run_split({"inspect", "--json", pristine().string()}, d / "out.json", d / "err"), 0)
      << slurp(d / "out.json") << slurp(d / "err");
  const nlohmann::json j = nlohmann::json::parse(slurp(d / "out.json"));
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_EQ(j["checkpoint"], (pristine() / "iter_0000001").string());
  EXPECT_EQ(j["iteration"], 1);
  EXPECT_EQ(j["save_policy"], "native");
  EXPECT_EQ(j["compress"], "none");
  EXPECT_EQ(j["files_verified"], 2);   // model.safetensors, optim_rank_00000.safetensors
  ASSERT_TRUE(j["tensors"].is_array());
  uint64_t sum = 0;
  bool seen_exp_avg = false;
  for (const auto& t : j["tensors"]) {
    for (const char* k : {"key", "kind", "dtype", "shape", "bytes", "stored_bytes", "file"})
      EXPECT_TRUE(t.contains(k)) << k << " in " << t.dump();
    EXPECT_EQ(t["bytes"], t["stored_bytes"]);
    sum += t["bytes"].get<uint64_t>();
    seen_exp_avg = seen_exp_avg || t["key"] == "embedding.weight/exp_avg";
  }
  EXPECT_TRUE(seen_exp_avg);
  uint64_t per_key = 0;
  for (const auto& [k, v] : j["bytes_per_key"].items()) per_key += v.get<uint64_t>();
  EXPECT_EQ(per_key, j["total_bytes"].get<uint64_t>());
  EXPECT_LE(sum, j["total_bytes"].get<uint64_t>());   // the total also counts headers and the manifest
  EXPECT_EQ(j["raw_total_bytes"], j["total_bytes"]);
  EXPECT_GT(j["num_params"].get<uint64_t>(), 0u);
  // The text listing says the same total.
  const ToolRun text = run_tool(d, {"inspect", pristine().string()});
  EXPECT_NE(text.log.find("total " + std::to_string(j["total_bytes"].get<uint64_t>()) + " bytes"), std::string::npos)
      << text.log;

  fs::copy(pristine(), d / "ck", fs::copy_options::recursive);
  flip_byte(d / "ck" / "iter_0000001" / "optim_rank_00000.safetensors", 6);
  EXPECT_EQ(run_split({"inspect", "--json", (d / "ck").string()}, d / "bad.json", d / "bad.err"), 1);
  const nlohmann::json b = nlohmann::json::parse(slurp(d / "bad.json"));
  EXPECT_EQ(b["status"], "damaged");
  EXPECT_EQ(b["exit_code"], 1);
  EXPECT_NE(b["file"].get<std::string>().find("optim_rank_00000.safetensors"), std::string::npos) << b.dump(2);
  EXPECT_NE(b["error"].get<std::string>().find("optim_rank_00000.safetensors"), std::string::npos) << b.dump(2);
  const std::string err = slurp(d / "bad.err");
  EXPECT_EQ(err.rfind("resume-harness: error: ", 0), 0u) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;

  EXPECT_EQ(run_split({"inspect", "--json", (d / "absent").string()}, d / "none.json", d / "none.err"), 2);
  const nlohmann::json n = nlohmann::json::parse(slurp(d / "none.json"));
  EXPECT_EQ(n["status"], "bad_input");
  EXPECT_NE(n["error"].get<std::string>().find("no such file or directory"), std::string::npos);
  fs::remove_all(d);
}

}   // namespace
