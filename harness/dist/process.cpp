// fork/exec with a log file and a timeout; see process.h.
#include "harness/dist/process.h"

#include "harness/dist/prestart.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace rh {
namespace {

using Clock = std::chrono::steady_clock;

// Forks and execs one child; returns its pid. Everything the child needs is prepared before the
// fork (argv, environment strings, the log descriptor), so between fork and exec it only calls
// async-signal-safe functions.
pid_t start_child(const ChildSpec& c) {
  if (c.argv.empty()) throw std::runtime_error("run_children: empty argv");
  if (c.prestarted && c.env.empty() && !c.die_with_parent && !c.log_path.empty() && prestarted_worker_running()) {
    const pid_t pid = spawn_prestarted(c.argv, c.log_path, nullptr);
    if (pid > 0) return pid;   // else: exec, as without a worker
  }
  std::vector<char*> args;
  for (const auto& a : c.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    bool replaced = false;
    for (const auto& [k, v] : c.env) replaced = replaced || kv.compare(0, k.size() + 1, k + "=") == 0;
    if (!replaced) env_strings.push_back(kv);
  }
  for (const auto& [k, v] : c.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  int fd = -1;
  if (!c.log_path.empty()) {
    fd = ::open(c.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot open log " + c.log_path + ": " + std::strerror(errno));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  }
  if (pid == 0) {
    if (c.die_with_parent) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(137);   // the parent died before prctl
    }
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execve(args[0], args.data(), envp.data());
    const char msg[] = "exec failed\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(127);
  }
  if (fd >= 0) ::close(fd);
  return pid;
}

ChildExit exit_of(int status, Clock::time_point t0) {
  ChildExit e;
  e.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (WIFEXITED(status)) {
    e.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    e.signal = WTERMSIG(status);
    e.exit_code = 128 + e.signal;
  }
  return e;
}

}  // namespace

std::string ChildExit::describe() const {
  std::string s = signal ? "was killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")"
                         : "exited with code " + std::to_string(exit_code);
  return timed_out ? s + " after its time ran out" : s;
}

std::vector<ChildExit> run_children(const std::vector<ChildSpec>& children, double timeout_s,
                                    const OnChildExit& on_exit) {
  const auto t0 = Clock::now();
  std::vector<pid_t> pids;
  try {
    for (const auto& c : children) pids.push_back(start_child(c));
  } catch (...) {
    for (pid_t p : pids) kill(p, SIGKILL);
    for (pid_t p : pids) waitpid(p, nullptr, 0);
    throw;
  }
  std::vector<ChildExit> out(children.size());
  std::vector<bool> done(children.size(), false);
  size_t remaining = children.size();
  auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(std::min(timeout_s, 1e9)));
  bool limit_hit = timeout_s < kNoLimit;   // the deadline is timeout_s's (not an on_exit grace)
  while (remaining > 0) {
    bool reaped = false;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      const pid_t w = waitpid(pids[i], &status, WNOHANG);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
      if (w != pids[i]) continue;
      done[i] = true;
      --remaining;
      reaped = true;
      out[i] = exit_of(status, t0);
      if (!on_exit) continue;
      const double more = on_exit(i, out[i]);
      if (more < kNoLimit) {
        const auto d = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(more));
        if (d < deadline) deadline = d, limit_hit = false;
      }
    }
    if (remaining == 0) break;
    if (Clock::now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        kill(pids[i], SIGKILL);
        int status = 0;
        waitpid(pids[i], &status, 0);
        out[i] = exit_of(status, t0);
        out[i].killed = true;
        out[i].timed_out = limit_hit;
        done[i] = true;
      }
      break;
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return out;
}

ChildExit run_process(const std::vector<std::string>& argv, const std::string& log_path, double timeout_s,
                      bool prestarted) {
  ChildSpec c;
  c.argv = argv;
  c.log_path = log_path;
  c.prestarted = prestarted;
  return run_children({c}, timeout_s).front();
}

std::string self_executable() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("cannot resolve /proc/self/exe");
  buf[n] = '\0';
  return buf;
}

std::string tail_of_file(const std::string& path, size_t max_bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return "";
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return s.size() > max_bytes ? s.substr(s.size() - max_bytes) : s;
}

}  // namespace rh
