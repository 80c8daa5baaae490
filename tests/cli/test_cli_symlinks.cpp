// Nothing the tool deletes or writes may be reached through a symbolic link it
// did not create. Each test plants a link at one place below a temporary run (or --out, or
// golden) directory, pointing at a directory or file outside it, runs the tool or the library
// function, and asserts the refusal (exit 2 naming the path) and that the outside target is byte
// for byte what it was. Not covered here: the checkpoint root (tests/checkpoint/test_checkpoint_hostile.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "harness/base/no_follow.h"
#include "harness/base/text.h"
#include "harness/verify/check.h"
#include "harness/verify/golden.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;

namespace {

// A fresh temporary directory holding `run/` and an `outside/` the links point to: a directory
// with files (`outside/dir/`) and a file (`outside/file.txt`).
struct Sandbox {
  fs::path root, run, outside_dir, outside_file;
  explicit Sandbox(const std::string& tag) {
    root = fs::temp_directory_path() / ("rh_symlink_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(root);
    run = root / "run";
    outside_dir = root / "outside" / "dir";
    outside_file = root / "outside" / "file.txt";
    fs::create_directories(run);
    fs::create_directories(outside_dir / "nested");
    std::ofstream(outside_dir / "victim.txt") << "precious results\n";
    std::ofstream(outside_dir / "nested" / "deep.csv") << "a,b\n1,2\n";
    std::ofstream(outside_file) << "precious file\n";
  }
  ~Sandbox() { fs::remove_all(root); }
  // Every file under outside/ with its bytes, and every directory: the "untouched" witness.
  std::map<std::string, std::string> outside() const {
    std::map<std::string, std::string> m;
    for (const auto& e : fs::recursive_directory_iterator(root / "outside")) {
      const std::string rel = fs::relative(e.path(), root / "outside").string();
      if (e.is_directory()) {
        m[rel + "/"] = "";
        continue;
      }
      std::ifstream f(e.path(), std::ios::binary);
      std::ostringstream s;
      s << f.rdbuf();
      m[rel] = s.str();
    }
    return m;
  }
  // Plants a link at `below` (relative to `base`, parents created) to the outside directory or file.
  void plant(const fs::path& base, const std::string& below, bool to_dir) const {
    const fs::path at = base / below;
    fs::create_directories(at.parent_path());
    fs::create_symlink(to_dir ? outside_dir : outside_file, at);
  }
};

// The tool with `args`, without the pre-started worker, its output in out_file.
rh::testutil::ToolRun tool_no_prestart(const std::vector<std::string>& args, const fs::path& out_file) {
  return rh::testutil::run_logged(rh::testutil::tool_argv(args), out_file, 600, {{"RH_NO_PRESTART", "1"}});
}

std::string refusal(const fs::path& p) {
  return p.string() + " is a symbolic link; refusing to write or delete through it";
}

// A place below a directory the tool writes into, and whether the planted link points at a
// directory (what the tool would remove or fill) or a file (what it would overwrite).
struct Place {
  std::string below;
  bool to_dir;
};

std::string place_name(const testing::TestParamInfo<Place>& i) {
  std::string n;
  for (char c : i.param.below) n += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return n;
}

// matrix and check: refused before anything is trained, removed or written.
class MatrixSymlink : public testing::TestWithParam<Place> {};

TEST_P(MatrixSymlink, RefusedWithExit2AndOutsideUntouched) {
  Sandbox sb("matrix_" + place_name(testing::TestParamInfo<Place>(GetParam(), 0)));
  std::ofstream(sb.root / "one.toml") << "[[scenario]]\nname = \"cell\"\n";
  sb.plant(sb.run, GetParam().below, GetParam().to_dir);
  const auto before = sb.outside();
  for (const std::vector<std::string>& sub :
       {std::vector<std::string>{"matrix", (sb.root / "one.toml").string()},
        std::vector<std::string>{"check", "--file", (sb.root / "one.toml").string(), "cell"}}) {
    std::vector<std::string> args = sub;
    args.insert(args.end(), {"--run-dir", sb.run.string()});
    const auto r = tool_no_prestart(args, sb.root / "out.txt");
    EXPECT_EQ(r.code, 2) << sub[0] << "\n" << r.log;
    EXPECT_NE(r.log.find(refusal(sb.run / GetParam().below)), std::string::npos) << sub[0] << "\n" << r.log;
    EXPECT_EQ(sb.outside(), before) << sub[0];
    EXPECT_TRUE(fs::is_symlink(sb.run / GetParam().below)) << "the planted link itself is left alone";
  }
}

INSTANTIATE_TEST_SUITE_P(PlantedLinks, MatrixSymlink,
                         testing::Values(Place{"scenarios", true}, Place{"baselines", true},
                                         Place{"scenarios/cell", true}, Place{"summary.csv", false},
                                         Place{"summary.json", false}, Place{"junit.xml", false},
                                         Place{"report.html", false}, Place{"report.md", false},
                                         Place{"projection.csv", false}, Place{"plots", true}),
                         place_name);

// report on its own: refused before the run directory is read.
class ReportSymlink : public testing::TestWithParam<Place> {};

TEST_P(ReportSymlink, RefusedWithExit2AndOutsideUntouched) {
  Sandbox sb("report_" + place_name(testing::TestParamInfo<Place>(GetParam(), 0)));
  sb.plant(sb.run, GetParam().below, GetParam().to_dir);
  const auto before = sb.outside();
  const auto r = tool_no_prestart({"report", sb.run.string()}, sb.root / "out.txt");
  EXPECT_EQ(r.code, 2) << r.log;
  EXPECT_NE(r.log.find(refusal(sb.run / GetParam().below)), std::string::npos) << r.log;
  EXPECT_EQ(sb.outside(), before);
}

INSTANTIATE_TEST_SUITE_P(PlantedLinks, ReportSymlink,
                         testing::Values(Place{"report.html", false}, Place{"report.md", false},
                                         Place{"projection.csv", false}, Place{"plots", true},
                                         Place{"plots/index.csv", false}, Place{"plots/storage.csv", false},
                                         Place{"plots/loss_curves.png", false}, Place{"plots/plots.log", false}),
                         place_name);

// train --out: refused before the model is built.
class TrainOutSymlink : public testing::TestWithParam<Place> {};

TEST_P(TrainOutSymlink, RefusedWithExit2AndOutsideUntouched) {
  Sandbox sb("train_" + place_name(testing::TestParamInfo<Place>(GetParam(), 0)));
  sb.plant(sb.run, GetParam().below, GetParam().to_dir);
  const auto before = sb.outside();
  const auto r = tool_no_prestart({"train", "--quiet", "--train-iters", "2", "--dump-states", "--out", sb.run.string()},
                                  sb.root / "out.txt");
  EXPECT_EQ(r.code, 2) << r.log;
  EXPECT_NE(r.log.find(refusal(sb.run / GetParam().below)), std::string::npos) << r.log;
  EXPECT_EQ(sb.outside(), before);
}

INSTANTIATE_TEST_SUITE_P(PlantedLinks, TrainOutSymlink,
                         testing::Values(Place{"config.json", false}, Place{"metrics.csv", false},
                                         Place{"timing.csv", false}, Place{"fingerprints.csv", false},
                                         Place{"load_result.json", false}, Place{"state_at_save", true},
                                         Place{"state_after_load", true}, Place{"state_final", true}),
                         place_name);

// The helpers every site uses.
TEST(NoFollow, WriteTextRefusesALinkAndLeavesItsTargetAlone) {
  Sandbox sb("write_text");
  fs::create_symlink(sb.outside_file, sb.run / "summary.csv");
  const auto before = sb.outside();
  try {
    rh::write_text((sb.run / "summary.csv").string(), "overwritten\n");
    FAIL() << "a write through a link was accepted";
  } catch (const rh::SymlinkRefused& e) {
    EXPECT_EQ(std::string(e.what()), refusal(sb.run / "summary.csv"));
  }
  EXPECT_EQ(sb.outside(), before);
}

TEST(NoFollow, RefuseBelowChecksEveryExistingComponentButNotTheRoot) {
  Sandbox sb("below");
  // The root may be a link: the user named it.
  fs::create_symlink(sb.run, sb.root / "run_link");
  EXPECT_NO_THROW(rh::refuse_symlinks_below(sb.root / "run_link", fs::path("scenarios/cell")));
  // Missing components are fine; a link anywhere below is not.
  fs::create_directories(sb.run / "a");
  fs::create_symlink(sb.outside_dir, sb.run / "a" / "b");
  EXPECT_NO_THROW(rh::refuse_symlinks_below(sb.run, fs::path("a/missing/b")));
  EXPECT_THROW(rh::refuse_symlinks_below(sb.run, fs::path("a/b")), rh::SymlinkRefused);
  EXPECT_THROW(rh::refuse_symlinks_below(sb.run, fs::path("a/b/victim.txt")), rh::SymlinkRefused);
  // A dangling link is refused too: writing through it would create its target.
  fs::create_symlink(sb.root / "outside" / "not_yet", sb.run / "dangling");
  EXPECT_THROW(rh::refuse_symlinks_below(sb.run, fs::path("dangling")), rh::SymlinkRefused);
  const auto before = sb.outside();
  EXPECT_THROW(rh::remove_tree_below(sb.run, fs::path("a/b/nested")), rh::SymlinkRefused);
  EXPECT_EQ(sb.outside(), before);
  EXPECT_FALSE(fs::exists(sb.root / "outside" / "not_yet"));
}

// A cell directory (or the scenarios directory above it) planted as a link after the matrix
// started: reset_work_dir refuses instead of emptying the link's target.
TEST(NoFollow, ResetWorkDirRefusesALinkedCellOrParent) {
  for (const std::string below : {"scenarios/cell", "scenarios"}) {
    Sandbox sb("reset_" + std::to_string(below.size()));
    sb.plant(sb.run, below, true);
    const auto before = sb.outside();
    EXPECT_THROW(rh::reset_work_dir((sb.run / "scenarios" / "cell").string()), rh::SymlinkRefused) << below;
    EXPECT_EQ(sb.outside(), before) << below;
  }
}

// --update-golden copied the metrics over whatever the golden CSV's link pointed to.
TEST(NoFollow, UpdateGoldenRefusesALinkedGoldenCsv) {
  Sandbox sb("golden");
  std::ofstream(sb.run / "metrics.csv") << "iteration\n1\n";
  fs::create_symlink(sb.outside_file, sb.run / "golden.csv");
  const auto before = sb.outside();
  const std::string failure =
      rh::golden_failure((sb.run / "golden.csv").string(), (sb.run / "metrics.csv").string(), /*update=*/true);
  EXPECT_NE(failure.find(refusal(sb.run / "golden.csv")), std::string::npos) << failure;
  EXPECT_EQ(sb.outside(), before);
}

}   // namespace
