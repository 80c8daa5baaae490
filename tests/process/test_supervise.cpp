// The supervisor of a foreign command (harness/process/supervise.h): the command survives the end
// of the thread that started it (PR_SET_PDEATHSIG fires then too), and the command, blocked in
// open() of a FIFO as the torch bridge was, and a setsid() worker it started end when the process
// that started them is killed with SIGKILL (tests/verify/test_lifetime.cpp does the same through
// the tool, for every way the tool can be ended).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "harness/base/text.h"
#include "harness/process/process.h"
#include "harness/process/supervise.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;

namespace {
namespace supervise_test {   // unity batches share one anonymous namespace

// Alive and not a zombie.
bool running(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = s.rfind(')');
  return close != std::string::npos && close + 2 < s.size() && s[close + 2] != 'Z' && s[close + 2] != 'X';
}

bool gone_within(pid_t pid, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (running(pid)) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::duration<double>(seconds)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

pid_t read_pid(const fs::path& file, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::duration<double>(seconds)) {
    std::ifstream f(file);
    pid_t pid = 0;
    if (f >> pid && pid > 0) return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

rh::SupervisedSpec shell(const std::string& script) {
  rh::SupervisedSpec spec;
  spec.exe = "/bin/sh";
  spec.argv = {"sh", "-c", script};
  spec.envp = rh::child_environment({});
  return spec;
}

TEST(SupervisedCommand, OutlivesTheThreadThatStartedIt) {
  std::unique_ptr<rh::Supervised> sup;
  std::thread([&] { sup = std::make_unique<rh::Supervised>(shell("exec sleep 30")); }).join();
  const pid_t cmd = sup->command_pid();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));   // the supervisor got SIGUSR2 and looked
  EXPECT_TRUE(running(cmd)) << "the command ended with the thread that started it";
  EXPECT_FALSE(sup->poll(nullptr));
  sup->stop();
  const int status = sup->wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_FALSE(running(cmd));
}

TEST(SupervisedCommand, EndsWithAStarterKilledBySigkill) {
  const fs::path dir = rh::testutil::fresh_dir("supervise", "sigkill");
  const std::string fifo = (dir / "fifo").string(), worker = (dir / "worker.pid").string(),
                    cmd_file = (dir / "cmd.pid").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const pid_t starter = fork();
  ASSERT_GE(starter, 0);
  if (starter == 0) {   // the "tool": starts the command from a thread that ends, then waits
    std::unique_ptr<rh::Supervised> sup;
    std::thread([&] {
      sup = std::make_unique<rh::Supervised>(
          shell("setsid sleep 300 & echo $! > '" + worker + "'; exec cat '" + fifo + "'"));
    }).join();
    std::ofstream(cmd_file) << sup->command_pid();
    pause();
    _exit(0);
  }
  const pid_t cmd = read_pid(cmd_file, 30), setsid_worker = read_pid(worker, 30);
  ASSERT_GT(cmd, 0);
  ASSERT_GT(setsid_worker, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));   // cat is in open(): nothing writes the FIFO
  EXPECT_TRUE(running(cmd) && running(setsid_worker));
  ::kill(starter, SIGKILL);
  ::waitpid(starter, nullptr, 0);
  EXPECT_TRUE(gone_within(cmd, 5)) << "the command blocked on a FIFO outlived its starter";
  EXPECT_TRUE(gone_within(setsid_worker, 5)) << "the setsid() worker outlived its starter";
  for (pid_t p : {cmd, setsid_worker})
    if (running(p)) ::kill(p, SIGKILL);
  fs::remove_all(dir);
}

TEST(SupervisedCommand, RunCapturedEndsASetsidWorkerWhenTheCommandExits) {
  const fs::path dir = rh::testutil::fresh_dir("supervise", "exit");
  rh::CapturedSpec spec;
  spec.argv = {"sh", "-c", "setsid sleep 300 & echo $! > worker.pid; exit 0"};
  spec.cwd = dir.string();
  spec.stdout_path = (dir / "out.log").string();
  spec.stderr_path = (dir / "err.log").string();
  spec.timeout_s = 30;
  const auto run = rh::run_captured(spec);
  EXPECT_TRUE(run.ok()) << run.describe();
  const pid_t worker = read_pid(dir / "worker.pid", 1);
  ASSERT_GT(worker, 0);
  EXPECT_FALSE(running(worker)) << "the setsid() worker outlived the command";
  if (running(worker)) ::kill(worker, SIGKILL);
  fs::remove_all(dir);
}

TEST(SupervisedCommand, CapturedOutputOnAFullDiskIsADiskError) {
  const fs::path dir = rh::testutil::fresh_dir("supervise", "full");
  rh::CapturedSpec spec;
  spec.argv = {"sh", "-c", "echo loss 1.0"};
  spec.stdout_path = "/dev/full";
  spec.stderr_path = (dir / "err.log").string();
  try {
    rh::run_captured(spec);
    ADD_FAILURE() << "no error writing the output to /dev/full";
  } catch (const rh::DiskError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("/dev/full: No space left on device"), std::string::npos) << msg;
    EXPECT_TRUE(rh::is_disk_error_message(msg)) << msg;
  }
  fs::remove_all(dir);
}

}   // namespace supervise_test
}   // namespace
