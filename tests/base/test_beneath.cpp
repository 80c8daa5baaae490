// BeneathDir (harness/base/beneath.h): every step below a root is taken without following a link,
// at the moment of the step, so a link swapped in between two calls is refused, never written or
// removed through; nothing outside the root is touched.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "harness/base/beneath.h"
#include "harness/base/fsutil.h"
#include "harness/base/no_follow.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;

namespace {

struct Beneath : ::testing::Test {
  fs::path base, root, outside;
  void SetUp() override {
    base = rh::testutil::fresh_dir("beneath", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    root = base / "run";
    outside = base / "outside";
    fs::create_directories(root);
    fs::create_directories(outside / "keep");
    std::ofstream(outside / "sentinel") << "outside";
    std::ofstream(outside / "keep" / "inner") << "inner";
  }
  void TearDown() override { fs::remove_all(base); }
  // What is outside, unchanged: both files with their text and nothing else.
  void expect_outside_untouched() {
    EXPECT_EQ(rh::testutil::slurp(outside / "sentinel"), "outside");
    EXPECT_EQ(rh::testutil::slurp(outside / "keep" / "inner"), "inner");
    size_t n = 0;
    for (auto it = fs::recursive_directory_iterator(outside); it != fs::recursive_directory_iterator(); ++it) ++n;
    EXPECT_EQ(n, 3u);
  }
  // Replaces root/rel (a directory) with a link to `outside`, as a trainer would.
  void swap_for_link(const fs::path& rel) {
    fs::rename(root / rel, base / ("moved_" + rel.filename().string()));
    fs::create_directory_symlink(outside, root / rel);
  }
};

TEST_F(Beneath, CreatesWritesAndRemovesBelowTheRoot) {
  const auto run = rh::BeneathDir::open(root);
  const auto cell = run.sub("scenarios/cell", /*create=*/true);
  EXPECT_EQ(cell.path(), root / "scenarios" / "cell");
  cell.write_file("result.json", "{}\n");
  run.write_file("scenarios/cell/result.json", "{\"a\": 1}\n");   // replaced atomically
  EXPECT_EQ(rh::testutil::slurp(root / "scenarios" / "cell" / "result.json"), "{\"a\": 1}\n");
  EXPECT_TRUE(S_ISREG(run.mode_of("scenarios/cell/result.json")));
  EXPECT_EQ(run.mode_of("scenarios/missing/x"), 0u);
  fs::create_directories(root / "scenarios" / "cell" / "save" / "deep");
  std::ofstream(root / "scenarios" / "cell" / "save" / "deep" / "f") << "x";
  run.remove_tree("scenarios/cell/save");
  EXPECT_FALSE(fs::exists(root / "scenarios" / "cell" / "save"));
  run.remove_tree("scenarios/cell/save");   // missing is fine
  EXPECT_TRUE(fs::exists(root / "scenarios" / "cell" / "result.json"));
  // No temp file is left beside what was written.
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(root / "scenarios" / "cell")) n += e.path().filename() != "result.json";
  EXPECT_EQ(n, 0u);
}

// The trainer's move: the cell directory replaced by a link between two of the tool's calls.
TEST_F(Beneath, ALinkSwappedInBetweenCallsIsRefusedAndNothingOutsideIsTouched) {
  const auto run = rh::BeneathDir::open(root);
  run.sub("scenarios/cell/interrupted", true).write_file("stdout.log", "x");
  swap_for_link("scenarios/cell");
  const std::string link = (root / "scenarios" / "cell").string();
  auto refuses = [&](auto&& step) {
    try {
      step();
      ADD_FAILURE() << "no refusal";
    } catch (const rh::SymlinkRefused& e) {
      EXPECT_EQ(e.path, link);
      EXPECT_NE(std::string(e.what()).find(link + " is a symbolic link"), std::string::npos) << e.what();
    }
  };
  refuses([&] { run.sub("scenarios/cell"); });
  refuses([&] { run.sub("scenarios/cell/flat", true); });
  refuses([&] { run.write_file("scenarios/cell/result.json", "{}"); });
  refuses([&] { run.remove_tree("scenarios/cell/keep"); });
  refuses([&] { run.remove_tree("scenarios/cell"); });
  refuses([&] { ::close(run.open_for_write("scenarios/cell/sentinel")); });
  refuses([&] { ::close(run.open_for_read("scenarios/cell/sentinel")); });
  refuses([&] { run.mode_of("scenarios/cell/sentinel"); });
  expect_outside_untouched();
  EXPECT_TRUE(fs::is_symlink(root / "scenarios" / "cell"));   // the link itself is left for the user to see
}

// A handle taken before the swap reaches the moved directory, not the link's target: writes
// through an old handle never land in `outside` either.
TEST_F(Beneath, AHandleFromBeforeTheSwapDoesNotFollowTheNewLink) {
  const auto cell = rh::BeneathDir::open(root).sub("cell", true);
  swap_for_link("cell");
  cell.write_file("result.json", "{}");
  expect_outside_untouched();
  EXPECT_TRUE(fs::exists(base / "moved_cell" / "result.json"));
}

TEST_F(Beneath, LinksInsideARemovedTreeAreRemovedNotFollowed) {
  fs::create_directories(root / "cell" / "save");
  fs::create_directory_symlink(outside, root / "cell" / "save" / "to_dir");
  fs::create_symlink(outside / "sentinel", root / "cell" / "save" / "to_file");
  rh::BeneathDir::open(root).remove_tree("cell");
  EXPECT_FALSE(fs::exists(fs::symlink_status(root / "cell")));
  expect_outside_untouched();
}

TEST_F(Beneath, AFileThatIsALinkIsNeitherWrittenNorReadThrough) {
  fs::create_directories(root / "cell");
  fs::create_symlink(outside / "sentinel", root / "cell" / "result.json");
  const auto run = rh::BeneathDir::open(root);
  EXPECT_THROW(run.write_file("cell/result.json", "{}"), rh::SymlinkRefused);
  EXPECT_THROW(::close(run.open_for_write("cell/result.json")), rh::SymlinkRefused);
  EXPECT_THROW(::close(run.open_for_read("cell/result.json")), rh::SymlinkRefused);
  EXPECT_TRUE(fs::is_symlink(root / "cell" / "result.json"));
  expect_outside_untouched();
}

TEST_F(Beneath, PathsThatLeaveTheRootAreALogicError) {
  const auto run = rh::BeneathDir::open(root);
  EXPECT_THROW(run.sub("../outside"), std::logic_error);
  EXPECT_THROW(run.write_file("a/../../outside/sentinel", "x"), std::logic_error);
  EXPECT_THROW(run.remove_tree("/tmp"), std::logic_error);
  expect_outside_untouched();
}

// The external check's seed copy of a save directory: holes kept (a 64 MiB file with two bytes
// of data takes no more than a few blocks), links copied as links (never followed: the copy of a
// link to `outside` is a link, outside untouched), a FIFO refused without blocking.
TEST_F(Beneath, CopyTreeKeepsHolesAndLinksAndRefusesAFifo) {
  constexpr off_t kSize = 64 << 20;
  fs::create_directories(root / "cell" / "interrupted" / "save" / "sub");
  {
    std::ofstream f(root / "cell" / "interrupted" / "save" / "sparse.bin", std::ios::binary);
    f << 'a';
    f.seekp(kSize - 1);
    f << 'z';
  }
  std::ofstream(root / "cell" / "interrupted" / "save" / "sub" / "small") << "small";
  fs::create_directory_symlink(outside, root / "cell" / "interrupted" / "save" / "latest");
  const auto cell = rh::BeneathDir::open(root, "cell");
  cell.sub("resumed", true);
  cell.copy_tree("interrupted/save", "resumed/save");
  const fs::path copy = root / "cell" / "resumed" / "save";
  struct stat st {};
  ASSERT_EQ(::stat((copy / "sparse.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, kSize);
  EXPECT_LT(st.st_blocks * 512, 1 << 20) << "the holes were written out";
  std::ifstream f(copy / "sparse.bin", std::ios::binary);
  char first = 0, last = 0;
  f.get(first);
  f.seekg(kSize - 1);
  f.get(last);
  EXPECT_EQ(std::string({first, last}), "az");
  EXPECT_EQ(rh::testutil::slurp(copy / "sub" / "small"), "small");
  EXPECT_TRUE(fs::is_symlink(copy / "latest"));
  EXPECT_EQ(fs::read_symlink(copy / "latest"), outside);
  EXPECT_EQ(cell.read_file("resumed/save/sub/small", 100), "small");
  EXPECT_THROW(cell.read_file("resumed/save/sub/small", 2), rh::FileError);
  ASSERT_EQ(::mkfifo((root / "cell" / "interrupted" / "save" / "fifo").c_str(), 0644), 0);
  try {
    cell.copy_tree("interrupted/save", "round_trip");
    ADD_FAILURE() << "copied a FIFO";
  } catch (const rh::FileError& e) {
    EXPECT_NE(std::string(e.what()).find("fifo: not a regular file"), std::string::npos) << e.what();
  }
  expect_outside_untouched();
}

TEST_F(Beneath, EntriesListWhatIsThereWithoutFollowingLinks) {
  fs::create_directories(root / "a");
  std::ofstream(root / "b") << "b";
  fs::create_directory_symlink(outside, root / "c");
  const auto entries = rh::BeneathDir::open(root).entries();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].first, "a");
  EXPECT_TRUE(S_ISDIR(entries[0].second));
  EXPECT_TRUE(S_ISREG(entries[1].second));
  EXPECT_TRUE(S_ISLNK(entries[2].second));
}

}   // namespace
