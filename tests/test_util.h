// Helpers every test file may need: reading a file whole, a fresh scratch directory, running the
// tool as a child process. One definition here, since test files of one executable are compiled
// together (tests/CMakeLists.txt: unity batches) and must not define the same names twice.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "harness/process/process.h"

namespace rh::testutil {

// The bytes of a file ("" if it cannot be opened).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// An empty directory under the temp directory, unique to this process: <tmp>/rh_<tag>_<pid>_<name>.
inline std::filesystem::path fresh_dir(const std::string& tag, const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("rh_" + tag + "_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// One run of a command: its exit code and its output (stdout and stderr).
struct ToolRun {
  int code = -1;
  std::string log;
};

// Runs argv (no shell) with its output in log_path, killed after timeout_s; returns both.
inline ToolRun run_logged(const std::vector<std::string>& argv, const std::filesystem::path& log_path,
                          double timeout_s = 600) {
  std::filesystem::remove(log_path);
  const auto r = rh::run_process(argv, log_path.string(), timeout_s);
  return {r.exit_code, rh::tail_of_file(log_path.string(), 200000)};
}

#ifdef RH_TOOL
// The tool with `args`, its output in dir/log.
inline ToolRun run_tool(const std::filesystem::path& dir, const std::vector<std::string>& args, double timeout_s = 600) {
  std::vector<std::string> argv{RH_TOOL};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_logged(argv, dir / "log", timeout_s);
}
#endif

}  // namespace rh::testutil
