// Data-parallel tests start their ranks as copies of the test binary itself: each child gets the
// caller's environment variables (which tell main() it is a worker and what to run) and the rank
// variables a launcher sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT on a free local port).
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "harness/process/process.h"
#include "harness/ranks/launcher.h"

namespace rh::testutil {

// Starts `world` ranks and waits for them; returns each rank's exit code (128 + signal when one
// was killed, -1 when it was still running after timeout_s and was killed then).
inline std::vector<int> spawn_rank_processes(int world, const std::vector<std::pair<std::string, std::string>>& env,
                                             int timeout_s = 120) {
  const int port = rh::dist::free_local_port();
  const std::string exe = rh::self_executable();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      execl(exe.c_str(), exe.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (pid_t pid : pids) {
    int status = 0;
    bool timed_out = false;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    codes.push_back(timed_out ? -1 : (WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)));
  }
  return codes;
}

}   // namespace rh::testutil
