// Links an external trainer plants while its cell runs (issue 41, item 3): the trainer runs between
// the tool's checks and its own writes, so a cell directory, the interrupted run's directory or the
// torch conversions' `flat` directory swapped for a link to somewhere else must be found at the
// moment the tool writes, removes or reads there. Run through `matrix` as a user meets it, with
// tests/external/fake_trainer.py --plant: the cell is an error naming the link, the tool exits
// non-zero, and a sentinel directory outside the run directory is left exactly as it was (before
// the fix: two of its files deleted, result.json and the compare CSVs written into it, and PASS).
// Also the LOW items of the external path: a checkpoint.path outside the run's directory, and a
// sparse file in a copied save directory.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/test_util.h"

namespace fs = std::filesystem;

namespace {

using rh::testutil::slurp;

// Every file below dir (relative path -> bytes), links listed as "-> target".
std::map<std::string, std::string> tree_of(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    const std::string rel = fs::relative(it->path(), dir).string();
    if (it->is_symlink()) files[rel] = "-> " + fs::read_symlink(it->path()).string();
    else if (it->is_regular_file()) files[rel] = slurp(it->path());
    else files[rel + "/"] = "";
  }
  return files;
}

// A scenario file of one external cell: the fake trainer with checkpoints and a round trip, `args`
// appended to both of its commands, `extra` lines in [defaults.trainer].
std::string planted_toml(const std::vector<std::string>& args, const std::string& extra = "") {
  const std::string trainer = std::string(RH_SOURCE_DIR) + "/tests/external/fake_trainer.py";
  std::string arg_list;
  for (const auto& a : args) arg_list += ", \"" + a + "\"";
  return "[defaults]\nsave_at = 10\n[defaults.trainer]\niterations = 20\ntimeout_s = 10\nround_trip = true\n"
         "command = [\"/usr/bin/python3\", \"" +
         trainer +
         "\", \"--iters\", \"{iterations}\", \"--save-every\", \"{save_at}\", \"--out\", \"{save_dir}\"]\n"
         "resume_command = [\"/usr/bin/python3\", \"" +
         trainer +
         "\", \"--iters\", \"{iterations}\", \"--save-every\", \"{save_at}\", \"--out\", \"{save_dir}\", "
         "\"--load\", \"{load_dir}\"]\n"
         "args = [" +
         (arg_list.empty() ? "" : arg_list.substr(2)) +
         "]\n"
         "metrics = { stdout_regex = 'iter (?P<iteration>\\d+): loss (?P<loss>\\S+)' }\n" +
         (extra.empty() ? "checkpoint = { path = \"{save_dir}/iter_{iteration}.safetensors\" }\n" : extra) +
         "[[scenario]]\nname = \"cell\"\nexpect = \"exact\"\n";
}

struct LinkedCell {
  fs::path base, run, outside;
  rh::testutil::ToolRun tool;
  nlohmann::json cell;   // its entry in summary.json
};

// Runs the cell through `matrix` with the trainer's extra args; the sentinel directory `outside`
// holds two files (one in a save/ directory, what the old cleanup removed).
LinkedCell run_linked(const std::string& name, const std::vector<std::string>& args, const std::string& extra = "") {
  LinkedCell c;
  c.base = rh::testutil::fresh_dir("extlinks", name);
  c.run = c.base / "run";
  c.outside = c.base / "outside";
  fs::create_directories(c.outside / "x" / "save");
  std::ofstream(c.outside / "sentinel") << "outside";
  std::ofstream(c.outside / "x" / "save" / "keep") << "keep";
  std::vector<std::string> trainer_args = args;
  for (auto& a : trainer_args)
    if (a == "OUTSIDE") a = c.outside.string();
  std::ofstream(c.base / "ext.toml") << planted_toml(trainer_args, extra);
  c.tool = rh::testutil::run_tool(
      c.base, {"matrix", (c.base / "ext.toml").string(), "--run-dir", c.run.string(), "-j", "1", "--no-report"}, 120);
  const auto summary = nlohmann::json::parse(slurp(c.run / "summary.json"), nullptr, false);
  if (summary.is_object() && summary.contains("scenarios") && !summary["scenarios"].empty())
    c.cell = summary["scenarios"][0];
  return c;
}

struct PlantCase {
  const char* name;
  const char* plant;   // fake_trainer.py --plant
  const char* link;    // the link the error must name, below the run directory
};

class PlantedLink : public ::testing::TestWithParam<PlantCase> {};

TEST_P(PlantedLink, IsAnErrorNamingItAndNothingOutsideIsTouched) {
  const auto& p = GetParam();
  const auto c = run_linked(p.name, {"--plant", p.plant, "--plant-to", "OUTSIDE"});
  const std::string link = (c.run / p.link).string();
  EXPECT_NE(c.tool.code, 0) << c.tool.log;
  ASSERT_TRUE(c.cell.is_object()) << "no summary.json: " << c.tool.log;
  EXPECT_FALSE(c.cell.value("passed", true)) << c.cell.dump();
  EXPECT_EQ(c.cell.value("outcome", ""), "error") << c.cell.dump();
  const std::string said = c.cell.value("first_divergence", "") + " | " + c.cell.value("verdict", "");
  EXPECT_NE(said.find(link + " is a symbolic link"), std::string::npos) << said;
  EXPECT_NE(c.tool.log.find(link + " is a symbolic link"), std::string::npos) << c.tool.log;
  const std::map<std::string, std::string> expected = {
      {"sentinel", "outside"}, {"x/", ""}, {"x/save/", ""}, {"x/save/keep", "keep"}};
  EXPECT_EQ(tree_of(c.outside), expected) << "the tool wrote or removed outside its run directory";
  fs::remove_all(c.base);
}

INSTANTIATE_TEST_SUITE_P(Cases, PlantedLink,
                         ::testing::Values(PlantCase{"cell", "cell", "scenarios/cell"},
                                           PlantCase{"interrupted", "interrupted", "scenarios/cell/interrupted"},
                                           PlantCase{"flat", "flat", "scenarios/cell/flat"}),
                         [](const auto& info) { return std::string(info.param.name); });

}   // namespace

namespace {

// Two runs into one run directory removed each other's baselines and both exited 0: a run takes an
// exclusive flock on <run dir>/.lock, and a second one exits 2 at once with one line naming the
// directory (here the lock is held by this test, as a first run would hold it).
TEST(RunDirLock, ASecondRunIntoTheSameDirectoryIsRefused) {
  const fs::path base = rh::testutil::fresh_dir("extlinks", "lock"), run = base / "run";
  fs::create_directories(run);
  std::ofstream(base / "ext.toml") << planted_toml({});
  const int fd = ::open((run / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const auto second = rh::testutil::run_tool_split(
      {"matrix", (base / "ext.toml").string(), "--run-dir", run.string(), "-j", "1", "--no-report"}, base / "out",
      base / "err", 120);
  EXPECT_EQ(second.code, 2) << second.err;
  EXPECT_NE(second.err.find(run.string() + " is in use by another run"), std::string::npos) << second.err;
  EXPECT_EQ(std::count(second.err.begin(), second.err.end(), '\n'), 1) << second.err;
  EXPECT_FALSE(fs::exists(run / "scenarios")) << "the second run wrote into the first one's directory";
  ::close(fd);
  // Released (as the kernel releases it when a run ends, however it ends): the next run proceeds.
  const auto third = rh::testutil::run_tool_split(
      {"matrix", (base / "ext.toml").string(), "--run-dir", run.string(), "-j", "1", "--no-report"}, base / "out",
      base / "err", 120);
  EXPECT_EQ(third.code, 0) << third.err << third.log;
  fs::remove_all(base);
}

// trainer.checkpoint.path must name a file of the run that wrote it: `/proc/self/environ` was
// compared with itself and found identical (PASS), another run's checkpoint likewise.
class CheckpointOutsideTheRun : public ::testing::TestWithParam<const char*> {};

TEST_P(CheckpointOutsideTheRun, IsAnErrorNamingTheKey) {
  const std::string name = std::string("ckpt_") + (GetParam()[0] == '/' ? "proc" : "other_run");
  const auto c = run_linked(name, {}, std::string("checkpoint = { path = \"") + GetParam() + "\" }\n");
  EXPECT_EQ(c.tool.code, 2) << c.tool.log;
  ASSERT_TRUE(c.cell.is_object()) << c.tool.log;
  EXPECT_EQ(c.cell.value("outcome", ""), "error") << c.cell.dump();
  const std::string said = c.cell.value("first_divergence", "");
  EXPECT_NE(said.find("trainer.checkpoint.path names "), std::string::npos) << said;
  EXPECT_NE(said.find("outside the run's directory"), std::string::npos) << said;
  EXPECT_EQ(said.find('\n'), std::string::npos) << said;
  fs::remove_all(c.base);
}

INSTANTIATE_TEST_SUITE_P(Cases, CheckpointOutsideTheRun,
                         ::testing::Values("/proc/self/environ",
                                           "{save_dir}/../../uninterrupted_1/save/iter_{iteration}.safetensors"));

// A sparse file in the interrupted run's save directory is copied into the resumed run's with its
// holes (it was written out whole: 2 GiB of zeros for a 2 GiB sparse file).
TEST(ExternalSaveCopy, KeepsHolesOfASparseFile) {
  constexpr uint64_t kMiB = 1 << 20, kSize = 512 * kMiB;
  const fs::path base = rh::testutil::fresh_dir("extlinks", "sparse"), run = base / "run";
  std::ofstream(base / "ext.toml") << planted_toml({"--sparse-mib", std::to_string(kSize / kMiB)});
  const auto tool = rh::testutil::run_tool(base, {"matrix", (base / "ext.toml").string(), "--run-dir", run.string(),
                                                  "-j", "1", "--no-report", "--keep-checkpoints"},
                                           120);
  EXPECT_EQ(tool.code, 0) << tool.log;
  for (const char* label : {"interrupted", "round_trip", "resumed"}) {
    const fs::path copy = run / "scenarios" / "cell" / label / "save" / "sparse.bin";
    struct stat st {};
    ASSERT_EQ(::stat(copy.c_str(), &st), 0) << copy;
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), kSize) << copy;
    EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, 4 * kMiB) << copy << " was written out whole";
    std::ifstream f(copy, std::ios::binary);
    char first = 0, last = 0;
    f.get(first);
    f.seekg(static_cast<std::streamoff>(kSize - 1));
    f.get(last);
    EXPECT_EQ(std::string({first, last}), "az") << copy;
  }
  fs::remove_all(base);
}

}   // namespace
