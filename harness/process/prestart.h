// The pre-started worker: a clean process that has loaded the tool (LibTorch included) and
// nothing else, forked from the matrix command before any scenario is read or any training state
// or thread exists. A child marked `prestarted` (process.h) starts as a fork of it, running the
// tool's entry function with its argv, instead of a fork + exec of the executable: it skips loading
// and initialising LibTorch again (measured in docs/running.md, "Pre-started worker"). The isolation of an
// exec'ed child stays: the worker holds no state of the baselines trained after it started, and
// tests/dist/test_prestart.cpp checks that state set in the parent later does not reach a child.
// Children are started with a double fork and adopted by this process (PR_SET_CHILD_SUBREAPER), so
// the one wait loop of process.cpp waits for them like any other child. A child ends itself when
// the tool is gone, however it ended (PR_SET_PDEATHSIG SIGUSR2, checked against getppid()).
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

namespace rh {

// The tool's entry point (main without the numerics pinning): runs argv, returns the exit code.
using ToolEntry = int (*)(int argc, char** argv);

// In a forked child: runs entry(args) (args[0] names the tool), flushes every stream and ends
// the process with _exit, skipping static destructors (prestart.cpp says why).
[[noreturn]] void run_entry_and_exit(ToolEntry entry, std::vector<std::string> args);

// Forks the worker now. Call it before starting threads. Returns false (and children start by
// exec as before) when it cannot start; a second call while one runs returns true.
bool start_prestarted_worker(ToolEntry entry);
bool prestarted_worker_running();
// Ends the worker (it also ends when this process does).
void stop_prestarted_worker();

// Starts argv (argv[0] names the tool; the worker runs entry(argv)) with stdout and stderr
// appended to log_path (which must be set). Returns the child's pid, or -1 when no worker runs or it
// failed (errno-like text in *why). Thread-safe.
pid_t spawn_prestarted(const std::vector<std::string>& argv, const std::string& log_path, std::string* why);

}   // namespace rh
