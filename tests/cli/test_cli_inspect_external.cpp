// `inspect` on checkpoints the tool did not write: a torch.save file (written by /usr/bin/python3
// with torch), a torch.distributed.checkpoint directory (the conformance corpus's
// dcp_valid_two_chunks, written without torch) and a garbage .pt file, each through the tool
// binary: every tensor's key, dtype and shape and every value's text, one error line and exit 2
// for the garbage, nothing at all with -q, and no temporary directory left behind. Not for the
// bridge's own verdicts on hostile files (tests/test_torch_bridge.py, the corpus).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace fs = std::filesystem;

namespace {

using rh::testutil::ToolRun;

const std::string kInspectErrorPrefix = "resume-harness: error: ";

// The listing's row for `key` split on blanks ({} when no line starts with the key and a blank).
std::vector<std::string> listing_row(const std::string& log, const std::string& key) {
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    const size_t start = line.find_first_not_of(' ');
    if (start == std::string::npos || line.compare(start, key.size() + 1, key + " ") != 0) continue;
    std::istringstream words(line);
    std::vector<std::string> row;
    for (std::string w; words >> w;) row.push_back(w);
    return row;
  }
  return {};
}

// A torch.save file of a dict with a tensor, a nested dict, an int and a str; false (and the
// writer's output) when /usr/bin/python3 cannot write it.
bool write_torch_save(const fs::path& file, std::string* log) {
  const std::string code =
      "import sys, torch\n"
      "torch.save({'weight': torch.arange(6, dtype=torch.float32).reshape(2, 3),\n"
      "            'nested': {'bias': torch.tensor([1, 2], dtype=torch.int64), 'note': 'hi there'},\n"
      "            'step': 7, 'name': 'run-a'}, sys.argv[1])\n";
  const ToolRun r = rh::testutil::run_logged({"/usr/bin/python3", "-c", code, file.string()},
                                             file.parent_path() / "writer.log", 120);
  *log = r.log;
  return r.code == 0;
}

ToolRun inspect_tool(const fs::path& dir, const std::vector<std::string>& args, const fs::path& tmpdir) {
  return rh::testutil::run_tool(dir, args, 120, {{"TMPDIR", tmpdir.string()}});
}

// What the tool's temporary directory (TMPDIR) holds after a run: it must be empty again.
size_t entries_in(const fs::path& dir) {
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

TEST(InspectExternal, TorchSaveFileListsEveryTensorAndValue) {
  const fs::path d = rh::testutil::fresh_dir("cli_inspect", "torch_file");
  fs::create_directories(d / "tmp");
  std::string writer_log;
  if (!write_torch_save(d / "ck.pt", &writer_log)) GTEST_SKIP() << "/usr/bin/python3 with torch: " << writer_log;
  const ToolRun r = inspect_tool(d, {"inspect", (d / "ck.pt").string()}, d / "tmp");
  ASSERT_EQ(r.code, 0) << r.log;
  EXPECT_EQ(r.log.rfind((d / "ck.pt").string() + " (torch file", 0), 0u) << r.log;
  EXPECT_EQ(listing_row(r.log, "weight"), (std::vector<std::string>{"weight", "F32", "[2,3]", "24"})) << r.log;
  EXPECT_EQ(listing_row(r.log, "nested/bias"), (std::vector<std::string>{"nested/bias", "I64", "[2]", "16"}))
      << r.log;
  EXPECT_EQ(listing_row(r.log, "step"), (std::vector<std::string>{"step", "int:7"})) << r.log;
  EXPECT_EQ(listing_row(r.log, "name"), (std::vector<std::string>{"name", "str:run-a"})) << r.log;
  EXPECT_EQ(listing_row(r.log, "nested/note"), (std::vector<std::string>{"nested/note", "str:hi", "there"})) << r.log;
  EXPECT_NE(r.log.find("\ntotal 2 tensors, 8 elements, 40 bytes; 3 values\n"), std::string::npos) << r.log;
  EXPECT_LT(r.log.find("nested/bias"), r.log.find("weight")) << "tensors sorted by key: " << r.log;
  EXPECT_EQ(entries_in(d / "tmp"), 0u) << "the bridge's scratch directory is removed";

  const ToolRun quiet = inspect_tool(d, {"inspect", "-q", (d / "ck.pt").string()}, d / "tmp");
  EXPECT_EQ(quiet.code, 0) << quiet.log;
  EXPECT_EQ(quiet.log, "");
}

TEST(InspectExternal, DcpDirectoryListsItsReassembledTensorAndBytesItem) {
  const fs::path d = rh::testutil::fresh_dir("cli_inspect", "dcp");
  fs::create_directories(d / "tmp");
  const ToolRun gen = rh::testutil::run_logged(
      {"/usr/bin/python3", std::string(RH_TESTS_DIR) + "/conformance/make_corpus.py", d.string(), "dcp_valid_two_chunks"},
      d / "gen.log", 120);
  ASSERT_EQ(gen.code, 0) << gen.log;
  const fs::path dcp = d / "dcp_valid_two_chunks";   // .metadata, __0_0.distcp, __0_1.distcp, __1_0.distcp
  const ToolRun r = inspect_tool(d, {"inspect", dcp.string()}, d / "tmp");
  ASSERT_EQ(r.code, 0) << r.log;
  EXPECT_EQ(r.log.rfind(dcp.string() + " (DCP directory", 0), 0u) << r.log;
  EXPECT_EQ(listing_row(r.log, "w"), (std::vector<std::string>{"w", "F32", "[4,2]", "32"})) << r.log;
  EXPECT_EQ(listing_row(r.log, "step"), (std::vector<std::string>{"step", "int:7"})) << r.log;
  EXPECT_NE(r.log.find("\ntotal 1 tensor, 8 elements, 32 bytes; 1 value\n"), std::string::npos) << r.log;
  EXPECT_EQ(entries_in(d / "tmp"), 0u);
}

TEST(InspectExternal, GarbageTorchFileIsOneLineAndBadInput) {
  const fs::path d = rh::testutil::fresh_dir("cli_inspect", "garbage");
  fs::create_directories(d / "tmp");
  std::ofstream(d / "bad.pt") << "not a checkpoint at all";
  for (const bool quiet : {false, true}) {
    std::vector<std::string> args{"inspect", (d / "bad.pt").string()};
    if (quiet) args.insert(args.begin() + 1, "-q");
    const ToolRun r = inspect_tool(d, args, d / "tmp");
    EXPECT_EQ(r.code, 2) << r.log;
    EXPECT_EQ(r.log.rfind(kInspectErrorPrefix + (d / "bad.pt").string() + ": expected a torch.save file", 0), 0u)
        << r.log;
    EXPECT_NE(r.log.find("not a torch.save file (no zip or pickle magic)"), std::string::npos) << r.log;
    EXPECT_EQ(std::count(r.log.begin(), r.log.end(), '\n'), 1) << r.log;
    EXPECT_EQ(entries_in(d / "tmp"), 0u) << "removed on error too";
  }
}

}   // namespace
