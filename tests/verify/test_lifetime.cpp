// No process an external cell starts outlives the tool, however the tool ends (process/supervise.h,
// docs/hostile-input.md): `check` and `matrix` run tests/external/fake_trainer.py --mode daemons,
// a trainer that starts a setsid() worker and a double-forked daemon and sleeps; once both exist
// the tool is ended mid-cell by SIGKILL, SIGTERM or SIGINT, or its process group by SIGINT or
// SIGHUP (a terminal's Ctrl-C, or its closing). The torch bridge is ended the same way while it is
// blocked in open() of a FIFO (fake_trainer.py --mode fifo_torch). Every process of the cell
// carries a marker in its environment (inherited from the tool), so the test finds them however
// they were re-parented; none may be alive (zombies aside) a few seconds after the signal.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace fs = std::filesystem;

namespace {
namespace lifetime {   // unity batches share one anonymous namespace

using Clock = std::chrono::steady_clock;

// The state letter of /proc/<pid>/stat ('\0': no such process).
char process_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = s.rfind(')');
  return close == std::string::npos || close + 2 >= s.size() ? '\0' : s[close + 2];
}

// Running (not zombie) processes whose environment holds `marker`, with their command lines.
std::vector<std::string> marked_processes(const std::string& marker) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream env(e.path() / "environ", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    if (text.find(marker) == std::string::npos) continue;
    const char state = process_state(std::stoi(name));
    if (state == '\0' || state == 'Z' || state == 'X') continue;
    std::ifstream cmd(e.path() / "cmdline", std::ios::binary);
    std::string line((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    for (char& c : line) c = c == '\0' ? ' ' : c;
    out.push_back(name + " (" + line + ")");
  }
  return out;
}

size_t files_starting(const fs::path& dir, const std::string& prefix) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    n += e.path().filename().string().rfind(prefix, 0) == 0 && e.path().extension() == ".pid";
  return n;
}

std::string file_text(const fs::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// A marked torch bridge blocked in open() of a FIFO (the kernel waits in wait_for_partner;
// syscall 257 is openat on x86-64).
bool bridge_blocked_on_fifo(const std::string& marker) {
  for (const auto& p : marked_processes(marker)) {
    if (p.find("torch_bridge") == std::string::npos) continue;
    const std::string proc = "/proc/" + std::to_string(std::stoi(p));
    if (file_text(proc + "/wchan").find("wait_for_partner") != std::string::npos ||
        file_text(proc + "/syscall").rfind("257 ", 0) == 0)
      return true;
  }
  return false;
}

std::string trainer_toml(int cells, const std::string& mode) {
  const std::string trainer = std::string(RH_SOURCE_DIR) + "/tests/external/fake_trainer.py";
  std::string toml =
      "[defaults]\nsave_at = 10\n[defaults.trainer]\niterations = 20\ntimeout_s = 120\n"
      "command = [\"/usr/bin/python3\", \"" +
      trainer +
      "\", \"--iters\", \"{iterations}\", \"--save-every\", "
      "\"{save_at}\", \"--out\", \"{save_dir}\", \"--mode\", \"" +
      mode +
      "\"]\n"
      "resume_command = [\"/usr/bin/python3\", \"" +
      trainer +
      "\", \"--iters\", \"{iterations}\", \"--save-every\", "
      "\"{save_at}\", \"--out\", \"{save_dir}\", \"--load\", \"{load_dir}\", \"--mode\", \"" +
      mode +
      "\"]\n"
      "metrics = { stdout_regex = 'iter (?P<iteration>\\d+): loss (?P<loss>\\S+)' }\n";
  if (mode == "fifo_torch") toml += "checkpoint = { path = \"{save_dir}/iter_{iteration}.pt\" }\n";
  for (int i = 1; i <= cells; ++i) toml += "[[scenario]]\nname = \"cell" + std::to_string(i) + "\"\n";
  return toml;
}

struct KillCase {
  const char* name;
  const char* command;   // check | matrix
  int signal;
  bool to_group;                  // to the tool's process group (as a terminal sends it), else to the tool alone
  const char* mode = "daemons";   // fake_trainer.py --mode: daemons, or fifo_torch (the bridge blocks)
};

void PrintTo(const KillCase& kc, std::ostream* os) { *os << kc.name; }

class ToolKilledMidCell : public ::testing::TestWithParam<KillCase> {};

TEST_P(ToolKilledMidCell, LeavesNoProcessOfTheCellAlive) {
  const KillCase& kc = GetParam();
  const fs::path dir = rh::testutil::fresh_dir("lifetime", kc.name);
  const fs::path pids = dir / "pids";
  fs::create_directories(pids);
  const bool matrix = std::string(kc.command) == "matrix";
  const int cells = matrix ? 2 : 1;
  const bool bridge = std::string(kc.mode) == "fifo_torch";
  std::ofstream(dir / "cells.toml") << trainer_toml(cells, kc.mode);
  const std::string marker = "RH_LIFETIME_MARK=" + std::to_string(::getpid()) + "-" + kc.name;

  std::vector<std::string> args{RH_TOOL, kc.command};
  if (matrix) args.insert(args.end(), {(dir / "cells.toml").string(), "-j", "2", "--no-report"});
  else args.insert(args.end(), {"cell1", "-f", (dir / "cells.toml").string()});
  args.insert(args.end(), {"--run-dir", (dir / "run").string()});
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("TMPDIR=", 0) != 0) env_strings.push_back(*e);
  env_strings.push_back(marker);
  env_strings.push_back("RH_TEST_PIDS_DIR=" + pids.string());
  env_strings.push_back("TMPDIR=" + dir.string());   // where the bridge's tar extraction goes
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string log = (dir / "log").string();
  const pid_t tool = fork();
  ASSERT_GE(tool, 0);
  if (tool == 0) {
    ::setpgid(0, 0);   // a group of its own, as a shell's job: the group signals reach only it
    freopen(log.c_str(), "w", stdout);
    dup2(fileno(stdout), 2);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  ::setpgid(tool, tool);

  // Mid-cell: every trainer has started its setsid() worker and its daemon, or the bridge is blocked.
  const auto t0 = Clock::now();
  const auto ready = [&] {
    return bridge ? bridge_blocked_on_fifo(marker)
                  : files_starting(pids, "worker") >= size_t(cells) && files_starting(pids, "daemon") >= size_t(cells);
  };
  int status = 0;
  bool ended = false;
  while (!ready() && Clock::now() - t0 < std::chrono::seconds(120) && !ended) {
    ended = ::waitpid(tool, &status, WNOHANG) == tool;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (bridge && ended) {   // a bridge that refuses the file without blocking: nothing to end here
    fs::remove_all(dir);
    GTEST_SKIP() << "the torch bridge no longer blocks on a FIFO member; SupervisedCommand.* covers a blocked command";
  }
  ASSERT_FALSE(ended) << "the tool ended before the cell was under way: " << rh::testutil::slurp(log);
  EXPECT_TRUE(ready()) << "the cell did not get under way within 120 s: " << rh::testutil::slurp(log);
  EXPECT_FALSE(marked_processes(marker).empty());
  ::kill(kc.to_group ? -tool : tool, kc.signal);

  const auto t1 = Clock::now();
  while (::waitpid(tool, &status, WNOHANG) == 0) {
    if (Clock::now() - t1 > std::chrono::seconds(30)) {
      ::kill(tool, SIGKILL);
      ::waitpid(tool, &status, 0);
      ADD_FAILURE() << "the tool did not end within 30 s of signal " << kc.signal;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (kc.signal == SIGKILL) EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  else EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + kc.signal) << status << rh::testutil::slurp(log);

  // Within 5 s of the tool's end, nothing of the cell runs.
  std::vector<std::string> alive = marked_processes(marker);
  for (const auto t2 = Clock::now(); !alive.empty() && Clock::now() - t2 < std::chrono::seconds(5);) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    alive = marked_processes(marker);
  }
  std::string names;
  for (const auto& a : alive) {
    names += "\n  " + a;
    ::kill(std::stoi(a), SIGKILL);   // leave nothing behind when the test fails
  }
  EXPECT_TRUE(alive.empty()) << "still running after the tool ended:" << names;
  if (alive.empty()) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Signals, ToolKilledMidCell,
                         ::testing::Values(KillCase{"sigkill", "check", SIGKILL, false},
                                           KillCase{"sigterm", "check", SIGTERM, false},
                                           KillCase{"sigint", "check", SIGINT, false},
                                           KillCase{"sigint_group", "check", SIGINT, true},
                                           KillCase{"sighup_group", "check", SIGHUP, true},
                                           // two cells on the matrix's worker threads
                                           KillCase{"matrix_sigkill", "matrix", SIGKILL, false},
                                           // the bridge blocked on a FIFO survived SIGKILL of the tool
                                           KillCase{"bridge_sigkill", "check", SIGKILL, false, "fifo_torch"}),
                         [](const auto& info) { return std::string(info.param.name); });

}   // namespace lifetime
}   // namespace
