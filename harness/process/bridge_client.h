// A long-lived helper child spoken to one line at a time: started on the first request, over a
// socketpair (its stdin and stdout; stderr to /dev/null), and shared by every thread. Each request
// is one line out and one JSON line back, {"ok": true} or {"ok": false, "error": "..."}. Requests
// are sent with MSG_NOSIGNAL (a child that died cannot kill us with SIGPIPE); a child that dies,
// hangs past the timeout or answers garbage is killed and restarted on the next request, and that
// request fails with a message naming the child. The torch bridge external checkpoints go through
// (harness/verify/external_checkpoints.cpp) is one. LibTorch-free.
#pragma once
#include <sys/types.h>

#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace rh {

// What starts the child: argv[0] is the executable's path; env is added to this environment.
struct BridgeCommand {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
};

class BridgeClient {
 public:
  // `name` names the child in errors ("the torch bridge"); `command` is called at each start and
  // may throw (the request then throws the same).
  BridgeClient(std::string name, std::function<BridgeCommand()> command);
  ~BridgeClient();
  BridgeClient(const BridgeClient&) = delete;
  BridgeClient& operator=(const BridgeClient&) = delete;

  // Sends `line` (one line, no newline) and waits up to timeout_s for the reply: "" on success,
  // else the child's error, or ours ("<name> did not answer within 600 s").
  std::string request(const std::string& line, double timeout_s);

 private:
  std::string fail(const std::string& what);
  void start();
  void stop();

  const std::string name_;
  const std::function<BridgeCommand()> command_;
  std::mutex mu_;
  pid_t pid_ = -1;
  int fd_ = -1;
};

}   // namespace rh
