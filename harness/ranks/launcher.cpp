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
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t len = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &len) != 0) {
    ::close(fd);
    throw std::runtime_error(std::string("cannot find a free local port: ") + std::strerror(errno));
  }
  const int port = ntohs(address.sin_port);
  ::close(fd);
  return port;
}

int launch_local(int nproc, const std::vector<std::string>& args, double grace_s) {
  if (nproc < 1) throw std::invalid_argument("--nproc " + std::to_string(nproc) + ": expected >= 1");
  const std::string exe = self_executable();
  const std::string port = std::to_string(free_local_port());
  std::vector<ChildSpec> ranks(static_cast<size_t>(nproc));
  for (int rank = 0; rank < nproc; ++rank) {
    auto& child = ranks[static_cast<size_t>(rank)];
    child.argv = {exe};
    child.argv.insert(child.argv.end(), args.begin(), args.end());
    child.env = {{"RANK", std::to_string(rank)},
                 {"LOCAL_RANK", std::to_string(rank)},
                 {"WORLD_SIZE", std::to_string(nproc)},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", port}};
    child.die_with_parent = true;
    child.fork_entry = true;   // a fork of this process runs the tool's entry: no second LibTorch start
  }
  int first = -1;
  ChildExit first_exit;
  const auto exits = run_children(ranks, kNoLimit, [&](size_t rank, const ChildExit& child_exit) {
    if (child_exit.ok() || first >= 0) return kNoLimit;
    first = static_cast<int>(rank);
    first_exit = child_exit;
    std::cerr << "launcher: rank " << rank << " of " << nproc << " " << child_exit.describe()
              << "; stopping the other ranks\n";
    return grace_s;
  });
  for (size_t rank = 0; rank < exits.size(); ++rank)
    if (exits[rank].killed)
      std::cerr << "launcher: rank " << rank << " still running " << grace_s << " s after rank " << first
                << " failed; killing it\n";
  if (first < 0) return 0;
  // The first failing rank's own code (2 bad input, 3 a peer failed); a rank killed by a signal
  // is a peer failure for the launcher: 3, as documented in cli/main.cpp.
  return first_exit.signal ? 3 : first_exit.exit_code;
}

}   // namespace rh::dist
