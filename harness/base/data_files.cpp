#include "harness/base/data_files.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace rh {

namespace fs = std::filesystem;

std::string data_dir() {
  if (const char* env = std::getenv("RH_DATA_DIR"); env && *env) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const fs::path dir = exe.parent_path();
  for (const fs::path& cand : {dir / "share" / "resume-harness", dir.parent_path() / "share" / "resume-harness"})
    if (fs::is_directory(cand, ec)) return cand.lexically_normal().string();
  return "";
}

std::string data_file(const std::string& rel) {
  const std::string d = data_dir();
  return d.empty() ? rel : (fs::path(d) / rel).string();
}

}   // namespace rh
