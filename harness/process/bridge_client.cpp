// The long-lived helper child; see bridge_client.h.
#include "harness/process/bridge_client.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "harness/process/process.h"

namespace rh {

BridgeClient::BridgeClient(std::string name, std::function<BridgeCommand()> command)
    : name_(std::move(name)), command_(std::move(command)) {}

BridgeClient::~BridgeClient() { stop(); }

std::string BridgeClient::request(const std::string& request_line, double timeout_s) {
  std::lock_guard<std::mutex> lk(mu_);
  if (pid_ <= 0) start();
  const std::string line = request_line + "\n";
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::send(fd_, line.data() + done, line.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return fail(name_ + " stopped accepting requests");
    done += static_cast<size_t>(n);
  }
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s));
  std::string reply;
  char buf[4096];
  while (reply.find('\n') == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return fail(name_ + " did not answer within " + std::to_string(static_cast<int>(timeout_s)) + " s");
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return fail(name_ + " ended (killed, or out of memory?)");
    reply.append(buf, static_cast<size_t>(n));
    if (reply.size() > (1u << 20)) return fail(name_ + " answered more than 1 MiB");
  }
  try {
    const auto j = nlohmann::json::parse(reply.substr(0, reply.find('\n')));
    if (j.at("ok").get<bool>()) return "";
    return j.at("error").get<std::string>();
  } catch (const std::exception&) {
    return fail(name_ + " answered something that is not its reply");
  }
}

std::string BridgeClient::fail(const std::string& what) {
  stop();
  return what;
}

void BridgeClient::start() {
  BridgeCommand command = command_();
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw std::runtime_error(std::string("socketpair: ") + std::strerror(errno));
  std::vector<std::string> env_strings = child_environment(command.env);
  std::vector<char*> args, envp;
  for (auto& a : command.argv) args.push_back(a.data());
  args.push_back(nullptr);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(sv[0]), ::close(sv[1]);
    if (devnull >= 0) ::close(devnull);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    // No PR_SET_PDEATHSIG: it fires when the forking *thread* ends, and a matrix worker that
    // started the child may end while another still sends requests. The child ends at EOF on its
    // socket instead, which comes when this process exits or dies.
    ::dup2(sv[1], 0);
    ::dup2(sv[1], 1);
    if (devnull >= 0) ::dup2(devnull, 2);
    ::execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  ::close(sv[1]);
  if (devnull >= 0) ::close(devnull);
  fd_ = sv[0];
  pid_ = pid;
}

void BridgeClient::stop() {
  if (fd_ >= 0) ::close(fd_), fd_ = -1;
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
}

}   // namespace rh
