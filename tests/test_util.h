// Helpers every test file may need: reading a file whole, a fresh scratch directory, running the
// tool (or another command) as a child process. One definition here, since test files of one executable are compiled
// together (tests/CMakeLists.txt: unity batches) and must not define the same names twice.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
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

// One run of a command: its exit code (128 + the signal if one ended it) and its output.
struct ToolRun {
  int code = -1;
  std::string log;   // stdout and stderr together (run_logged, run_tool); stdout alone (run_split)
  std::string err;   // stderr alone (run_split)
};

// Variables added to (or replacing in) this process's environment for one child.
using Env = std::vector<std::pair<std::string, std::string>>;

// Runs argv (no shell; argv[0] is a path) with `env` added, its stdout and stderr together in
// log_path, killed after timeout_s; returns both.
inline ToolRun run_logged(const std::vector<std::string>& argv, const std::filesystem::path& log_path,
                          double timeout_s = 600, const Env& env = {}) {
  std::filesystem::remove(log_path);
  rh::ChildSpec child;
  child.argv = argv;
  child.env = env;
  child.log_path = log_path.string();
  const auto r = rh::run_children({child}, timeout_s).front();
  return {r.exit_code, rh::tail_of_file(log_path.string(), 200000), ""};
}

// Runs argv (no shell; argv[0] without a '/' is looked up on PATH) with `env` added, stdout in
// out_path and stderr in err_path, killed after timeout_s; returns the code and both texts.
inline ToolRun run_split(const std::vector<std::string>& argv, const std::filesystem::path& out_path,
                         const std::filesystem::path& err_path, double timeout_s = 600, const Env& env = {}) {
  rh::CapturedSpec spec;
  spec.argv = argv;
  spec.env = env;
  spec.stdout_path = out_path.string();
  spec.stderr_path = err_path.string();
  spec.timeout_s = timeout_s;
  const auto r = rh::run_captured(spec);
  return {r.exit_code, slurp(out_path), slurp(err_path)};
}

#ifdef RH_TOOL
// The tool's argv: RH_TOOL, then `args`.
inline std::vector<std::string> tool_argv(const std::vector<std::string>& args) {
  std::vector<std::string> argv{RH_TOOL};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// The tool with `args` (and `env` added), its output in dir/log. Every test that runs the tool
// runs it through here or run_tool_split: no shell, no quoting.
inline ToolRun run_tool(const std::filesystem::path& dir, const std::vector<std::string>& args, double timeout_s = 600,
                        const Env& env = {}) {
  return run_logged(tool_argv(args), dir / "log", timeout_s, env);
}

// The tool with `args` (and `env` added), stdout in out_path and stderr in err_path.
inline ToolRun run_tool_split(const std::vector<std::string>& args, const std::filesystem::path& out_path,
                              const std::filesystem::path& err_path, double timeout_s = 600, const Env& env = {}) {
  return run_split(tool_argv(args), out_path, err_path, timeout_s, env);
}
#endif

}   // namespace rh::testutil
