// The pre-started worker; see prestart.h.
#include "harness/process/prestart.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>

namespace rh {
namespace {

std::mutex g_mu;   // one request at a time on the socket
pid_t g_tool = -1;   // in a pre-started child: the tool that adopts it
int g_sock = -1;   // this process's end of the socketpair; -1: no worker
pid_t g_worker = -1;

// On the socket only: MSG_NOSIGNAL, so a worker that died makes a request fail, not this process.
bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w, n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r, n -= static_cast<size_t>(r);
  }
  return true;
}

// A request: the number of strings, then each as length + bytes: log path, then argv.
bool send_strings(int fd, const std::vector<std::string>& v) {
  std::string msg;
  auto put32 = [&](uint32_t x) { msg.append(reinterpret_cast<const char*>(&x), 4); };
  put32(static_cast<uint32_t>(v.size()));
  for (const auto& s : v) {
    put32(static_cast<uint32_t>(s.size()));
    msg += s;
  }
  return write_all(fd, msg.data(), msg.size());
}

bool recv_strings(int fd, std::vector<std::string>& v) {
  uint32_t n = 0;
  if (!read_all(fd, &n, 4) || n > 4096) return false;
  v.assign(n, "");
  for (auto& s : v) {
    uint32_t len = 0;
    if (!read_all(fd, &len, 4) || len > (1u << 20)) return false;
    s.resize(len);
    if (len && !read_all(fd, s.data(), len)) return false;
  }
  return true;
}

// In the grandchild: output to the log, then the tool itself, then _exit once the streams are
// flushed. Not std::exit: LibTorch's static destructors deregister every operator, writing to the
// dispatcher's tables, and after the fork those pages are shared copy-on-write with the worker,
// so each child spent about 0.46 s in page faults on its way out (perf: OperatorEntry::
// deregisterKernel_, do_wp_page), against 0.07 s for the same exit in an exec'ed process. Every
// file the tool writes is closed before the entry returns; nothing it needs runs at exit.
[[noreturn]] void run_child(ToolEntry entry, const std::vector<std::string>& req) {
  const int fd = ::open(req[0].c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) _exit(127);
  dup2(fd, 1);
  dup2(fd, 2);
  ::close(fd);
  run_entry_and_exit(entry, std::vector<std::string>(req.begin() + 1, req.end()));
}

// In a pre-started child: it ends itself when the tool is gone. PR_SET_PDEATHSIG fires when its
// parent *thread* ends (first the middle process, then whichever thread of the tool adopted it),
// so the handler checks that the tool is still its parent before doing anything.
void end_if_orphaned(int) {
  if (::getppid() != g_tool) _exit(137);
}

void die_with_tool(pid_t tool, pid_t middle) {
  g_tool = tool;
  struct sigaction sa {};
  sa.sa_handler = end_if_orphaned;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &sa, nullptr);
  prctl(PR_SET_PDEATHSIG, SIGUSR2);
  const pid_t parent = ::getppid();
  if (parent != tool && parent != middle) _exit(137);   // both gone before prctl
}

// The worker's loop: one request, one double fork. The middle process exits at once, so the
// grandchild is adopted by the subreaper (the process that started the worker); its pid goes back
// through a pipe once the middle process is reaped, i.e. once the adoption is done.
[[noreturn]] void worker_loop(int sock, ToolEntry entry, pid_t tool) {
  signal(SIGCHLD, SIG_DFL);
  std::vector<std::string> req;
  while (recv_strings(sock, req)) {
    int32_t reply = -1;
    int pfd[2];
    if (req.size() >= 2 && ::pipe(pfd) == 0) {
      const pid_t mid = fork();
      if (mid == 0) {
        ::close(pfd[0]);
        const pid_t middle = ::getpid();
        const pid_t g = fork();
        if (g == 0) {
          die_with_tool(tool, middle);
          ::close(pfd[1]);
          ::close(sock);
          run_child(entry, req);
        }
        const int32_t p = g;
        (void)!::write(pfd[1], &p, sizeof p);
        _exit(0);
      }
      ::close(pfd[1]);
      if (mid > 0) {
        int st = 0;
        while (waitpid(mid, &st, 0) < 0 && errno == EINTR) {
        }
        int32_t p = -1;
        if (read_all(pfd[0], &p, sizeof p)) reply = p;
      }
      ::close(pfd[0]);
    }
    if (!write_all(sock, &reply, sizeof reply)) break;
  }
  _exit(0);
}

}   // namespace

void run_entry_and_exit(ToolEntry entry, std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int rc = entry(static_cast<int>(args.size()), argv.data());
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  _exit(rc);
}

bool start_prestarted_worker(ToolEntry entry) {
  if (prestarted_worker_running()) return true;   // (the fork below must not hold g_mu)
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return false;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return false;
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    ::close(sv[0]);
    ::close(sv[1]);
    return false;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    ::close(sv[0]);
    worker_loop(sv[1], entry, parent);
  }
  ::close(sv[1]);
  std::lock_guard<std::mutex> lk(g_mu);
  g_sock = sv[0];
  g_worker = pid;
  return true;
}

bool prestarted_worker_running() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_sock >= 0;
}

void stop_prestarted_worker() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_sock < 0) return;
  ::close(g_sock);   // the worker reads EOF and exits
  g_sock = -1;
  int st = 0;
  waitpid(g_worker, &st, 0);
  g_worker = -1;
}

pid_t spawn_prestarted(const std::vector<std::string>& argv, const std::string& log_path, std::string* why) {
  std::lock_guard<std::mutex> lk(g_mu);
  auto fail = [&](const char* w) {
    if (why) *why = w;
    return pid_t{-1};
  };
  if (g_sock < 0) return fail("no pre-started worker runs");
  std::vector<std::string> req{log_path};
  req.insert(req.end(), argv.begin(), argv.end());
  int32_t pid = -1;
  if (!send_strings(g_sock, req) || !read_all(g_sock, &pid, sizeof pid)) return fail("the pre-started worker is gone");
  if (pid <= 0) return fail("the pre-started worker could not fork");
  return pid;
}

}   // namespace rh
