// The pre-started worker (harness/process/prestart.h): a child started from it runs the entry it was
// given, in a process forked before the parent set any state, so nothing the parent trains or
// seeds later reaches it (the isolation an exec'ed child has); exit codes, signals and timeouts come
// back through the one wait loop (process.h) as for an exec'ed child.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "harness/process/prestart.h"
#include "harness/process/process.h"

namespace fs = std::filesystem;

namespace {

int g_marker = 0;   // set to 42 by the test after the worker started

// The worker's entry in this test: argv = {tool, what, out file}.
int entry(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string what = argv[1];
  if (what == "state") {
    // What a child sees of the parent's state: a global, LibTorch's default generator, and its
    // own process identity.
    std::ofstream(argv[2]) << g_marker << " " << at::detail::getDefaultCPUGenerator().current_seed() << " "
                           << torch::randn({4}).sum().item<float>() << " " << ::getppid() << "\n";
    return 0;
  }
  if (what == "exit3") return 3;
  if (what == "kill") raise(SIGKILL);
  if (what == "sleep") std::this_thread::sleep_for(std::chrono::seconds(30));
  return 0;
}

class Prestart : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("rh_prestart_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    ASSERT_TRUE(rh::start_prestarted_worker(&entry));
    // State set after the worker started: a child must not see any of it.
    g_marker = 42;
    torch::manual_seed(1234);
  }
  static void TearDownTestSuite() {
    rh::stop_prestarted_worker();
    fs::remove_all(dir_);
  }
  // argv[0] names no executable: only the worker can run the child (an exec would fail with 127).
  rh::ChildExit run(const std::string& what, double timeout_s = 60) {
    return rh::run_process({"/nonexistent/resume-harness", what, (dir_ / "out.txt").string()},
                           (dir_ / "log.txt").string(), timeout_s, /*prestarted=*/true);
  }
  static fs::path dir_;
};
fs::path Prestart::dir_;

TEST_F(Prestart, AChildSeesNoStateSetAfterTheWorkerStarted) {
  auto child_state = [&] {
    const auto e = run("state");
    EXPECT_TRUE(e.ok()) << e.describe();   // waited for by this process: it adopted the child
    std::ifstream f(dir_ / "out.txt");
    int marker = -1;
    uint64_t seed = 0;
    f >> marker >> seed;
    return std::pair{marker, seed};
  };
  const auto [marker1, seed1] = child_state();
  const auto [marker2, seed2] = child_state();
  EXPECT_EQ(marker1, 0) << "a global the parent set after the worker started reached the child";
  EXPECT_EQ(marker2, 0);
  // LibTorch seeds its default generator from the OS when a process first uses it: each child
  // gets its own seed, as a new process does, and never the parent's manual_seed.
  EXPECT_NE(seed1, 1234u) << "the parent's manual_seed reached the child";
  EXPECT_NE(seed2, 1234u);
  EXPECT_NE(seed1, seed2) << "two children share a generator state: the worker had used it before forking";
}

TEST_F(Prestart, ExitCodesSignalsAndTimeoutsComeBackAsForAnExecedChild) {
  auto e = run("exit3");
  EXPECT_EQ(e.exit_code, 3);
  EXPECT_EQ(e.signal, 0);
  e = run("kill");
  EXPECT_EQ(e.signal, SIGKILL);
  EXPECT_FALSE(e.ok());
  const auto t0 = std::chrono::steady_clock::now();
  e = run("sleep", 1.0);
  EXPECT_TRUE(e.timed_out);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

TEST_F(Prestart, WithoutAWorkerAChildIsExecedAsBefore) {
  rh::stop_prestarted_worker();
  const auto e = run("exit3");
  EXPECT_EQ(e.exit_code, 127) << "no worker: argv[0] is exec'ed, and it does not exist";
  ASSERT_TRUE(rh::start_prestarted_worker(&entry));
  EXPECT_EQ(run("exit3").exit_code, 3);
}

}   // namespace
