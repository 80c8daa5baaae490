// Child processes for the resume check: the baseline and the resumed run are separate processes
// of this same tool, so nothing in memory survives from one to the other.
#pragma once
#include <string>
#include <vector>

namespace rh {

struct ProcessResult {
  int exit_code = -1;       // exit status, or 128 + signal
  bool timed_out = false;
  double seconds = 0;
};

// Runs argv[0] with argv, stdout and stderr appended to log_path; kills it (SIGKILL) after
// timeout_s seconds. Throws std::runtime_error if it cannot be started.
ProcessResult run_process(const std::vector<std::string>& argv, const std::string& log_path,
                          double timeout_s);

// The path of the running executable (/proc/self/exe).
std::string self_executable();

// The last `max_bytes` of a text file (for error messages from a child's log).
std::string tail_of_file(const std::string& path, size_t max_bytes = 2000);

}  // namespace rh
