// Child processes: the one fork/exec/wait loop of the tool. The resume check runs its resumed
// (and data-parallel) runs as children of this same executable, so nothing in memory survives
// from one run to the other; the local launcher (launcher.h) starts its ranks through it too.
// LibTorch-free: the reports room runs the plot script through it.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace rh {

struct ChildSpec {
  std::vector<std::string> argv;                          // argv[0] is the executable's path
  std::vector<std::pair<std::string, std::string>> env;   // set in the child only
  std::string log_path;           // stdout + stderr appended here ("" = inherited from this process)
  // Not started pre-started when set. Every child of run_children gets PR_SET_PDEATHSIG SIGKILL
  // (killed if this process dies first) and is killed by the tool's SIGTERM/SIGINT/SIGHUP handler
  // (supervise.h); a pre-started one ends itself when it sees the tool gone (prestart.h).
  bool die_with_parent = false;
  // Start it from the pre-started worker (prestart.h) when one runs and argv[0] is this tool
  // (the worker runs the tool's entry in a fork of itself); else, or if that fails, fork + exec.
  // Needs a log_path; env and die_with_parent are not supported that way (exec is used).
  bool prestarted = false;
  // Run the tool's entry (set_tool_entry) in a fork of this process, with env set and argv[1..] as
  // its arguments, instead of exec'ing argv[0]: the launcher's ranks skip loading LibTorch again.
  // Used only while this process has a single thread (else, or without an entry, fork + exec).
  bool fork_entry = false;
};

// The tool's entry point (main without the numerics pinning), for ChildSpec::fork_entry.
void set_tool_entry(int (*entry)(int argc, char** argv));

struct ChildExit {
  int exit_code = -1;       // exit status, or 128 + signal
  int signal = 0;           // the signal that ended it (0: it exited)
  bool killed = false;      // killed by run_children (its deadline passed)
  bool timed_out = false;   // killed because timeout_s was up
  double seconds = 0;
  bool ok() const { return signal == 0 && exit_code == 0 && !killed; }
  std::string describe() const;   // "exited with code 2" / "was killed by signal 9 (Killed)"
};

constexpr double kNoLimit = std::numeric_limits<double>::infinity();

// Starts every child, then waits for all of them. A child still running `timeout_s` seconds after
// the start is killed (SIGKILL, timed_out). on_exit(i, e), when given, is called as child i ends
// and returns how many more seconds the others may run (kNoLimit: no change); the launcher uses it
// to stop the other ranks after one fails. Throws std::runtime_error if a child cannot be started
// (the ones already started are killed first).
using OnChildExit = std::function<double(size_t, const ChildExit&)>;
std::vector<ChildExit> run_children(const std::vector<ChildSpec>& children, double timeout_s = kNoLimit,
                                    const OnChildExit& on_exit = nullptr);

// One child, its output appended to log_path, killed after timeout_s.
ChildExit run_process(const std::vector<std::string>& argv, const std::string& log_path, double timeout_s,
                      bool prestarted = false);

// A foreign command (an external trainer): run as argv, never through a shell, under a supervisor
// (supervise.h) in its own process group, in `cwd`, stdin from /dev/null, stdout and stderr
// captured to two files through pipes. Output beyond output_cap_bytes (both streams together) is
// not written: the command is stopped and output_capped set. At timeout_s, or when the command
// itself has exited, every process it started is killed, also one that left its process group or
// session (setsid, a double fork), and when the tool dies, by any signal, so do they. argv[0]
// without a '/' is looked up on PATH (the child's PATH when env sets one). Throws
// std::runtime_error if it cannot be started, DiskError (base/text.h) when the disk holding the
// captured output fails (ENOSPC, EDQUOT, EIO, EROFS).
struct CapturedSpec {
  std::vector<std::string> argv;
  std::string cwd;                                        // "" = this process's
  std::vector<std::pair<std::string, std::string>> env;   // added to (or replacing in) this environment
  std::string stdout_path, stderr_path;
  uint64_t output_cap_bytes = 64ull << 20;
  double timeout_s = 600;
};
struct CapturedExit : ChildExit {
  bool output_capped = false;
  uint64_t output_bytes = 0;   // written to both files
};
CapturedExit run_captured(const CapturedSpec& spec);

// This process's environment with `env` added, each of its names replacing an inherited one:
// "NAME=value" strings for execve (every child the tool starts gets its environment this way).
std::vector<std::string> child_environment(const std::vector<std::pair<std::string, std::string>>& env);

// The path of the running executable (/proc/self/exe).
std::string self_executable();

// The last `max_bytes` of a text file (for error messages from a child's log).
std::string tail_of_file(const std::string& path, size_t max_bytes = 2000);

}   // namespace rh
