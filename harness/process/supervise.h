// Supervised foreign commands: every process a foreign command (an external trainer, the torch
// bridge) starts ends with it, and with the tool, however the tool ends.
//
// The command is started through a supervisor: a fork of the tool (no exec) that is a child
// subreaper (PR_SET_CHILD_SUBREAPER), so every descendant the command leaves behind, a setsid()'d
// or double-forked daemon included, is re-parented to it rather than to init. The supervisor ends
// every descendant it has (SIGKILL to the command's process group, then to each child listed in
// /proc/self/task/<tid>/children, repeated until none is left, each reaped) when the command exits,
// when the tool asks (stop()), when it gets SIGTERM, SIGINT, SIGHUP or SIGQUIT (a terminal's
// Ctrl-C or hang-up reaches the tool's process group, which the supervisor is in), and when the
// tool dies, even by SIGKILL: its PR_SET_PDEATHSIG signal (SIGUSR2) wakes it, and it checks
// getppid(), because that signal also fires when the *thread* that forked it ends (matrix cells run
// on worker threads; the bridge outlives the cell that started it) while the tool lives on. It
// also checks getppid() every 100 ms. The command runs in its own process group (a Ctrl-C of the
// terminal does not reach it: the supervisor ends it) with PR_SET_PDEATHSIG SIGKILL towards the
// supervisor. Between fork and exec only async-signal-safe calls are made (the tool has threads).
// What each way of ending the tool leaves behind is measured in docs/hostile-input.md.
//
// terminate_children_on_signal() makes SIGTERM, SIGINT and SIGHUP end the tool with 128 + signal
// after stopping every supervisor and killing every child process (process.h) it has running.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

namespace rh {

struct SupervisedSpec {
  std::string exe;                                     // the executable's path (no PATH lookup here)
  std::vector<std::string> argv;                       // argv[0] included
  std::vector<std::string> envp;                       // "NAME=value", the whole environment
  std::string cwd;                                     // "" = this process's
  int stdin_fd = -1, stdout_fd = -1, stderr_fd = -1;   // the command's 0, 1, 2 (-1: /dev/null)
};

class Supervised {
 public:
  // Starts the supervisor and, from it, the command. Throws std::runtime_error when it cannot.
  explicit Supervised(const SupervisedSpec& spec);
  ~Supervised();   // stop() and wait() when still running
  Supervised(const Supervised&) = delete;
  Supervised& operator=(const Supervised&) = delete;

  pid_t command_pid() const { return command_; }   // also its process group
  pid_t supervisor_pid() const { return supervisor_; }
  // Ends the command and every descendant (asynchronously: wait() reaps).
  void stop();
  // True once the supervisor has ended, i.e. the command and every descendant are gone; *status is
  // the command's waitpid status. Non-blocking.
  bool poll(int* status);
  int wait();   // blocks; the command's waitpid status

 private:
  bool finish(int supervisor_status, int* status);
  pid_t supervisor_ = -1;
  pid_t command_ = -1;
  int status_fd_ = -1;
  bool done_ = false;
  int status_ = 0;
};

// Installs the handlers (idempotent). The tool's main calls it.
void terminate_children_on_signal();

// The registry the handler reads (process.cpp registers the children of run_children). Entries
// belong to the process that added them, so a fork of the tool never kills its parent's children.
void register_child(pid_t pid, bool supervisor);
void unregister_child(pid_t pid);

}   // namespace rh
