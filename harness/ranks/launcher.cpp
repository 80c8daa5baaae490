// The local launcher; see launcher.h.
#include "harness/ranks/launcher.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <stdexcept>

#include "harness/process/process.h"

namespace rh::dist {

int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error(std::string("cannot find a free local port: ") + std::strerror(errno));
  }
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

int launch_local(int nproc, const std::vector<std::string>& args, double grace_s) {
  if (nproc < 1) throw std::invalid_argument("--nproc " + std::to_string(nproc) + ": expected >= 1");
  const std::string exe = self_executable();
  const std::string port = std::to_string(free_local_port());
  std::vector<ChildSpec> ranks(static_cast<size_t>(nproc));
  for (int r = 0; r < nproc; ++r) {
    auto& c = ranks[static_cast<size_t>(r)];
    c.argv = {exe};
    c.argv.insert(c.argv.end(), args.begin(), args.end());
    c.env = {{"RANK", std::to_string(r)},
             {"LOCAL_RANK", std::to_string(r)},
             {"WORLD_SIZE", std::to_string(nproc)},
             {"MASTER_ADDR", "127.0.0.1"},
             {"MASTER_PORT", port}};
    c.die_with_parent = true;
    c.fork_entry = true;   // a fork of this process runs the tool's entry: no second LibTorch start
  }
  int first = -1;
  ChildExit first_exit;
  const auto exits = run_children(ranks, kNoLimit, [&](size_t r, const ChildExit& e) {
    if (e.ok() || first >= 0) return kNoLimit;
    first = static_cast<int>(r);
    first_exit = e;
    std::cerr << "launcher: rank " << r << " of " << nproc << " " << e.describe() << "; stopping the other ranks\n";
    return grace_s;
  });
  for (size_t r = 0; r < exits.size(); ++r)
    if (exits[r].killed)
      std::cerr << "launcher: rank " << r << " still running " << grace_s << " s after rank " << first
                << " failed; killing it\n";
  if (first < 0) return 0;
  // The first failing rank's own code (2 bad input, 3 a peer failed); a rank killed by a signal
  // is a peer failure for the launcher: 3, as documented in cli/main.cpp.
  return first_exit.signal ? 3 : first_exit.exit_code;
}

}   // namespace rh::dist
