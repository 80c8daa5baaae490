// The supervisor of a foreign command and the tool's termination handler; see supervise.h.
#include "harness/process/supervise.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace rh {
namespace {

// Everything below up to Supervised runs in the supervisor, a fork of a threaded process: only
// async-signal-safe calls, no allocation.

// The signals the supervisor waits for (blocked, taken with sigtimedwait).
sigset_t supervisor_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR2}) sigaddset(&set, s);
  return set;
}

void write_all_fd(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    c += w, n -= static_cast<size_t>(w);
  }
}

void sleep_ms(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// "/proc/self/task/<pid>/children" into buf.
void children_path(char* buf, size_t size) {
  const char head[] = "/proc/self/task/";
  size_t n = 0;
  for (const char* c = head; *c && n + 1 < size; ++c) buf[n++] = *c;
  char digits[16];
  int k = 0;
  for (unsigned long v = static_cast<unsigned long>(::getpid()); v > 0 && k < 16; v /= 10)
    digits[k++] = char('0' + v % 10);
  while (k > 0 && n + 1 < size) buf[n++] = digits[--k];
  for (const char* c = "/children"; *c && n + 1 < size; ++c) buf[n++] = *c;
  buf[n] = '\0';
}

// SIGKILL to every child of this process (orphaned descendants are its children: it is a
// subreaper). Returns how many it found.
int kill_children(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  int found = 0;
  char buf[4096];
  long pid = 0;
  bool in_number = false;
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] >= '0' && buf[i] <= '9') {
        pid = pid * 10 + (buf[i] - '0');
        in_number = true;
      } else if (in_number) {
        ::kill(static_cast<pid_t>(pid), SIGKILL);
        ++found, pid = 0, in_number = false;
      }
    }
  }
  if (in_number) ::kill(static_cast<pid_t>(pid), SIGKILL), ++found;
  ::close(fd);
  return found;
}

struct Prepared {
  const char* exe;
  char* const* argv;
  char* const* envp;
  const char* cwd;
  int fds[4];   // the command's stdin, stdout, stderr; the status pipe's write end
  sigset_t old_mask;
  pid_t tool;
};

// The command, in the supervisor's fork: its own process group, its parent's death kills it, the
// signal mask and dispositions of a fresh process, then exec.
[[noreturn]] void exec_command(const Prepared& p, pid_t supervisor) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != supervisor) _exit(127);
  ::setpgid(0, 0);
  for (int s : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR2, SIGCHLD}) ::signal(s, SIG_DFL);
  sigprocmask(SIG_SETMASK, &p.old_mask, nullptr);
  if (p.cwd && ::chdir(p.cwd) != 0) {
    const char msg[] = "cannot change to the trainer's cwd\n";
    (void)!::write(2, msg, sizeof msg - 1);
    _exit(127);
  }
  ::execve(p.exe, p.argv, p.envp);
  const char msg[] = "exec failed\n";
  (void)!::write(2, msg, sizeof msg - 1);
  _exit(127);
}

// The supervisor's life: start the command, wait for its end, a stop request or the tool's
// death, then end every descendant and report the command's status on fd 3.
[[noreturn]] void supervise(const Prepared& p) {
  prctl(PR_SET_PDEATHSIG, SIGUSR2);
  if (::getppid() != p.tool) _exit(0);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // The command's descriptors onto 0, 1, 2 and the status pipe onto 3 (through copies above 9,
  // since any source may be one of 0..3); everything else the tool had open is closed, so no
  // other cell's pipe or the bridge's socket is held open by this process or the command.
  int high[4];
  for (int i = 0; i < 4; ++i) high[i] = ::fcntl(p.fds[i], F_DUPFD, 10);
  for (int i = 0; i < 4; ++i)
    if (high[i] < 0 || ::dup2(high[i], i) < 0) _exit(126);
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, 4u, ~0u, 0u) != 0)
#endif
    for (int fd = 4; fd < 65536; ++fd) ::close(fd);
  ::fcntl(3, F_SETFD, FD_CLOEXEC);
  const pid_t self = ::getpid();
  const pid_t cmd = fork();
  if (cmd == 0) exec_command(p, self);
  if (cmd < 0) _exit(126);
  ::setpgid(cmd, cmd);
  const int32_t cmd32 = cmd;
  write_all_fd(3, &cmd32, sizeof cmd32);

  const sigset_t set = supervisor_signals();
  int cmd_status = 0;
  bool cmd_done = false, stop = false;
  while (!cmd_done && !stop) {
    for (;;) {
      int st = 0;
      const pid_t r = ::waitpid(-1, &st, WNOHANG);
      if (r <= 0) break;
      if (r == cmd) cmd_status = st, cmd_done = true;
    }
    if (cmd_done || ::getppid() != p.tool) break;   // the tool is gone (SIGUSR2 woke us, or the poll)
    timespec tick{0, 100 * 1000000L};
    const int s = sigtimedwait(&set, nullptr, &tick);
    stop = s == SIGTERM || s == SIGINT || s == SIGHUP || s == SIGQUIT;
  }
  // End every descendant: the command's group while the command is unreaped (its pid, hence the
  // group id, cannot be reused before), every child (re-parented orphans included) each round,
  // until none is left.
  char path[64];
  children_path(path, sizeof path);
  for (;;) {
    if (!cmd_done) ::kill(-cmd, SIGKILL);
    kill_children(path);
    int st = 0;
    const pid_t r = ::waitpid(-1, &st, WNOHANG);
    if (r == cmd) cmd_status = st, cmd_done = true;
    if (r < 0 && errno == ECHILD) break;
    if (r == 0) sleep_ms(1);
  }
  const int32_t st32 = cmd_status;
  write_all_fd(3, &st32, sizeof st32);
  _exit(0);
}

// ---- the registry of children and the termination handler ----

// An entry: the owning process's pid << 33 | supervisor << 32 | pid; 0 = free.
constexpr size_t kSlots = 512;
std::atomic<uint64_t> g_slots[kSlots];

uint64_t entry_of(pid_t owner, pid_t pid, bool supervisor) {
  return (static_cast<uint64_t>(owner) << 33) | (uint64_t{supervisor} << 32) | static_cast<uint32_t>(pid);
}

void on_terminate(int sig) {
  const uint64_t owner = static_cast<uint64_t>(::getpid());
  for (auto& slot : g_slots) {
    const uint64_t e = slot.load();
    if (e == 0 || (e >> 33) != owner) continue;
    ::kill(static_cast<pid_t>(e & 0xffffffffu), (e >> 32) & 1 ? SIGTERM : SIGKILL);
  }
  // The supervisors end their descendants and exit within milliseconds; wait up to 3 s, so that
  // nothing the tool started is left when its exit is seen.
  for (int round = 0; round < 300; ++round) {
    bool running = false;
    for (auto& slot : g_slots) {
      const uint64_t e = slot.load();
      if (e == 0 || (e >> 33) != owner || !((e >> 32) & 1)) continue;
      running = running || ::waitpid(static_cast<pid_t>(e & 0xffffffffu), nullptr, WNOHANG) == 0;
    }
    if (!running) break;
    sleep_ms(10);
  }
  _exit(128 + sig);
}

}   // namespace

void register_child(pid_t pid, bool supervisor) {
  const uint64_t e = entry_of(::getpid(), pid, supervisor);
  for (auto& slot : g_slots) {
    uint64_t expected = 0;
    if (slot.compare_exchange_strong(expected, e)) return;
  }   // full (512 children at once): the supervisors still see the tool's death
}

void unregister_child(pid_t pid) {
  const uint64_t owner = static_cast<uint64_t>(::getpid());
  for (auto& slot : g_slots) {
    uint64_t e = slot.load();
    if (e != 0 && (e >> 33) == owner && static_cast<pid_t>(e & 0xffffffffu) == pid) slot.compare_exchange_strong(e, 0);
  }
}

void terminate_children_on_signal() {
  struct sigaction sa {};
  sa.sa_handler = on_terminate;
  sigfillset(&sa.sa_mask);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaction(s, &sa, nullptr);
}

Supervised::Supervised(const SupervisedSpec& spec) {
  if (spec.argv.empty() || spec.exe.empty()) throw std::runtime_error("supervised command: empty argv");
  std::vector<char*> args, envp;
  for (const auto& a : spec.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : spec.envp) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  int status_pipe[2] = {-1, -1};
  if (devnull < 0 || ::pipe2(status_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    if (devnull >= 0) ::close(devnull);
    throw std::runtime_error(std::string("cannot start a supervisor: ") + std::strerror(err));
  }
  Prepared p{};
  p.exe = spec.exe.c_str();
  p.argv = args.data();
  p.envp = envp.data();
  p.cwd = spec.cwd.empty() ? nullptr : spec.cwd.c_str();
  p.fds[0] = spec.stdin_fd >= 0 ? spec.stdin_fd : devnull;
  p.fds[1] = spec.stdout_fd >= 0 ? spec.stdout_fd : devnull;
  p.fds[2] = spec.stderr_fd >= 0 ? spec.stderr_fd : devnull;
  p.fds[3] = status_pipe[1];
  p.tool = ::getpid();
  // Blocked from before the fork: a stop request cannot arrive before the supervisor waits for it.
  const sigset_t set = supervisor_signals();
  pthread_sigmask(SIG_BLOCK, &set, &p.old_mask);
  const pid_t pid = fork();
  if (pid == 0) supervise(p);
  const int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &p.old_mask, nullptr);
  ::close(devnull);
  ::close(status_pipe[1]);
  if (pid < 0) {
    ::close(status_pipe[0]);
    throw std::runtime_error(std::string("fork failed: ") + std::strerror(fork_errno));
  }
  register_child(pid, true);
  supervisor_ = pid;
  status_fd_ = status_pipe[0];
  int32_t cmd = -1;
  size_t got = 0;
  while (got < sizeof cmd) {
    const ssize_t n = ::read(status_fd_, reinterpret_cast<char*>(&cmd) + got, sizeof cmd - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got != sizeof cmd || cmd <= 0) {
    wait();
    ::close(status_fd_);
    status_fd_ = -1;
    throw std::runtime_error("the supervisor of " + spec.argv[0] + " could not start it");
  }
  command_ = cmd;
}

Supervised::~Supervised() {
  if (!done_) {
    stop();
    wait();
  }
  if (status_fd_ >= 0) ::close(status_fd_);
}

void Supervised::stop() {
  if (!done_ && supervisor_ > 0) ::kill(supervisor_, SIGTERM);
}

bool Supervised::finish(int supervisor_status, int* status) {
  unregister_child(supervisor_);
  done_ = true;
  int32_t st = 0;
  size_t got = 0;
  while (status_fd_ >= 0 && got < sizeof st) {
    const ssize_t n = ::read(status_fd_, reinterpret_cast<char*>(&st) + got, sizeof st - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  // A supervisor that died before reporting (killed itself): its own status stands for the command's.
  status_ = got == sizeof st ? st : supervisor_status;
  if (status) *status = status_;
  return true;
}

bool Supervised::poll(int* status) {
  if (done_) {
    if (status) *status = status_;
    return true;
  }
  int st = 0;
  const pid_t r = ::waitpid(supervisor_, &st, WNOHANG);
  if (r == supervisor_) return finish(st, status);
  if (r < 0 && errno != EINTR) return finish(W_EXITCODE(126, 0), status);
  return false;
}

int Supervised::wait() {
  if (done_) return status_;
  int st = 0;
  for (;;) {
    const pid_t r = ::waitpid(supervisor_, &st, 0);
    if (r == supervisor_) break;
    if (r < 0 && errno != EINTR) {
      st = W_EXITCODE(126, 0);
      break;
    }
  }
  int status = 0;
  finish(st, &status);
  return status;
}

}   // namespace rh
