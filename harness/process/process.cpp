// fork/exec with a log file and a timeout; see process.h.
#include "harness/process/process.h"

#include "harness/base/text.h"
#include "harness/process/prestart.h"
#include "harness/process/supervise.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <thread>

namespace rh {
namespace {

using Clock = std::chrono::steady_clock;

int (*g_tool_entry)(int, char**) = nullptr;

// One thread in this process: a fork may then run more than async-signal-safe code.
bool single_threaded() {
  std::error_code ec;
  size_t n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/task", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return !ec && n == 1;
}

// Forks and execs one child; returns its pid. Everything the child needs is prepared before the
// fork (argv, environment strings, the log descriptor), so between fork and exec it only calls
// async-signal-safe functions. A fork_entry child of a single-threaded process runs the tool's
// entry instead of exec: its environment set, then _exit once the streams are flushed (as a
// pre-started child, prestart.cpp, for the same reason).
pid_t start_child(const ChildSpec& spec) {
  if (spec.argv.empty()) throw std::runtime_error("run_children: empty argv");
  if (spec.prestarted && spec.env.empty() && !spec.die_with_parent && !spec.log_path.empty() &&
      prestarted_worker_running()) {
    const pid_t pid = spawn_prestarted(spec.argv, spec.log_path, nullptr);
    if (pid > 0) return pid;   // else: exec, as without a worker
  }
  std::vector<char*> args;
  for (const auto& a : spec.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings = child_environment(spec.env);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  int fd = -1;
  if (!spec.log_path.empty()) {
    fd = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot open log " + spec.log_path + ": " + std::strerror(errno));
  }
  const pid_t parent = ::getpid();
  const bool by_entry = spec.fork_entry && g_tool_entry != nullptr && single_threaded();
  if (by_entry) {   // the forked entry must not write this process's buffered output again
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
  }
  const pid_t pid = fork();
  if (pid < 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  }
  if (pid == 0) {
    // Every child dies with the thread that started it: that thread waits in run_children until
    // the child is reaped, so the signal fires only when the tool itself is gone.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(137);   // the parent died before prctl
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    if (by_entry) {
      if (fd >= 0) ::close(fd);
      for (const auto& [k, v] : spec.env) ::setenv(k.c_str(), v.c_str(), 1);
      run_entry_and_exit(g_tool_entry, spec.argv);
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
  ChildExit child_exit;
  child_exit.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (WIFEXITED(status)) {
    child_exit.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    child_exit.signal = WTERMSIG(status);
    child_exit.exit_code = 128 + child_exit.signal;
  }
  return child_exit;
}

}   // namespace

void set_tool_entry(int (*entry)(int, char**)) { g_tool_entry = entry; }

std::string ChildExit::describe() const {
  std::string text = signal ? "was killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")"
                            : "exited with code " + std::to_string(exit_code);
  return timed_out ? text + " after its time ran out" : text;
}

std::vector<ChildExit> run_children(const std::vector<ChildSpec>& children, double timeout_s,
                                    const OnChildExit& on_exit) {
  const auto t0 = Clock::now();
  std::vector<pid_t> pids;
  try {
    for (const auto& c : children) {
      pids.push_back(start_child(c));
      register_child(pids.back(), false);   // killed if the tool is ended by a signal (supervise.h)
    }
  } catch (...) {
    for (pid_t p : pids) kill(p, SIGKILL);
    for (pid_t p : pids) waitpid(p, nullptr, 0), unregister_child(p);
    throw;
  }
  std::vector<ChildExit> out(children.size());
  std::vector<bool> done(children.size(), false);
  size_t remaining = children.size();
  auto deadline =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(timeout_s, 1e9)));
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
      unregister_child(pids[i]);
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
        unregister_child(pids[i]);
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

namespace {

// The executable argv0 names: itself when it holds a '/', else the first executable regular file
// of that name on PATH.
std::string resolve_executable(const std::string& argv0, const std::string& path_var) {
  if (argv0.empty()) throw std::runtime_error("empty command");
  if (argv0.find('/') != std::string::npos) return argv0;
  size_t b = 0;
  while (b <= path_var.size()) {
    const size_t e = std::min(path_var.find(':', b), path_var.size());
    const std::string dir = e > b ? path_var.substr(b, e - b) : ".";
    const std::string cand = dir + "/" + argv0;
    struct stat st {};
    if (::stat(cand.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(cand.c_str(), X_OK) == 0) return cand;
    b = e + 1;
  }
  throw std::runtime_error("command '" + argv0 + "' not found on PATH");
}

}   // namespace

CapturedExit run_captured(const CapturedSpec& spec) {
  if (spec.argv.empty()) throw std::runtime_error("run_captured: empty argv");
  SupervisedSpec sup_spec;
  sup_spec.envp = child_environment(spec.env);
  std::string path_var = "/usr/local/bin:/usr/bin:/bin";   // the child's PATH decides where argv[0] is
  for (const auto& kv : sup_spec.envp)
    if (kv.rfind("PATH=", 0) == 0) path_var = kv.substr(5);
  // A relative executable is found from the command's own directory, as a shell in cwd would.
  sup_spec.exe = resolve_executable(spec.argv[0], path_var);
  if (sup_spec.exe[0] != '/' && !spec.cwd.empty()) sup_spec.exe = spec.cwd + "/" + sup_spec.exe;
  sup_spec.argv = spec.argv;
  sup_spec.argv[0] = sup_spec.exe;
  sup_spec.cwd = spec.cwd;

  auto open_out = [](const std::string& p) {
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
      const int err = errno;
      throw_if_disk_errno("cannot open the captured output", p, err);
      throw std::runtime_error("cannot open " + p + ": " + std::strerror(err));
    }
    return fd;
  };
  int out_fd[2] = {-1, -1};
  int pipes[2][2] = {{-1, -1}, {-1, -1}};
  auto close_all = [&] {
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 2; ++j)
        if (pipes[i][j] >= 0) ::close(pipes[i][j]), pipes[i][j] = -1;
      if (out_fd[i] >= 0) ::close(out_fd[i]), out_fd[i] = -1;
    }
  };
  try {
    out_fd[0] = open_out(spec.stdout_path);
    out_fd[1] = open_out(spec.stderr_path);
  } catch (...) {
    close_all();
    throw;
  }
  if (::pipe2(pipes[0], O_CLOEXEC) != 0 || ::pipe2(pipes[1], O_CLOEXEC) != 0) {
    close_all();
    throw std::runtime_error(std::string("run_captured: pipe: ") + std::strerror(errno));
  }
  sup_spec.stdout_fd = pipes[0][1];
  sup_spec.stderr_fd = pipes[1][1];
  const auto t0 = Clock::now();
  std::optional<Supervised> sup;   // its destructor ends the command and every descendant
  try {
    sup.emplace(sup_spec);
  } catch (...) {
    close_all();
    throw;
  }
  ::close(pipes[0][1]), pipes[0][1] = -1;
  ::close(pipes[1][1]), pipes[1][1] = -1;

  CapturedExit captured;
  bool exited = false, timed_out = false;
  int status = 0;
  const auto deadline =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(spec.timeout_s, 1e9)));
  auto exited_at = Clock::time_point::max();
  char buf[65536];
  while (pipes[0][0] >= 0 || pipes[1][0] >= 0 || !exited) {
    // The supervisor ends once the command and every process it left behind are gone.
    if (!exited && sup->poll(&status)) exited = true, exited_at = Clock::now();
    const auto now = Clock::now();
    if (!exited && now > deadline) {
      timed_out = true;
      sup->stop();
      status = sup->wait();
      exited = true;
      exited_at = now;
    }
    // Output still open a second after the command ended: something outside its tree holds it.
    if (exited && now - exited_at > std::chrono::seconds(1)) break;
    pollfd fds[2];
    nfds_t n = 0;
    int which[2];
    for (int i = 0; i < 2; ++i)
      if (pipes[i][0] >= 0) fds[n] = {pipes[i][0], POLLIN, 0}, which[n++] = i;
    if (n == 0) {
      if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    const int pr = ::poll(fds, n, 50);
    if (pr < 0 && errno != EINTR) break;
    for (nfds_t k = 0; pr > 0 && k < n; ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const int i = which[k];
      const ssize_t got = ::read(pipes[i][0], buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        ::close(pipes[i][0]);
        pipes[i][0] = -1;
        continue;
      }
      uint64_t keep = static_cast<uint64_t>(got);
      if (captured.output_bytes + keep > spec.output_cap_bytes) {
        keep = spec.output_cap_bytes - captured.output_bytes;
        if (!captured.output_capped) sup->stop();
        captured.output_capped = true;
      }
      for (uint64_t done = 0; done < keep;) {
        const ssize_t w = ::write(out_fd[i], buf + done, keep - done);
        if (w < 0 && errno == EINTR) continue;
        if (w > 0) {
          done += static_cast<uint64_t>(w);
          continue;
        }
        const int err = w < 0 ? errno : ENOSPC;
        sup->stop();
        close_all();
        sup.reset();
        const std::string path = i == 0 ? spec.stdout_path : spec.stderr_path;
        throw_if_disk_errno("cannot write the captured output of " + spec.argv[0] + " to", path, err);
        throw std::runtime_error("cannot write the captured output of " + spec.argv[0] + " to " + path + ": " +
                                 std::strerror(err));
      }
      captured.output_bytes += keep;
    }
  }
  if (!exited) status = sup->wait();
  close_all();
  static_cast<ChildExit&>(captured) = exit_of(status, t0);
  captured.timed_out = timed_out;
  captured.killed = timed_out || captured.output_capped;
  return captured;
}

std::vector<std::string> child_environment(const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    bool replaced = false;
    for (const auto& [k, v] : env) replaced = replaced || kv.compare(0, k.size() + 1, k + "=") == 0;
    if (!replaced) out.push_back(kv);
  }
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
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

}   // namespace rh
