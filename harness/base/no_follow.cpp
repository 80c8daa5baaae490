// Symbolic-link refusal below a user-named directory; see no_follow.h.
#include "harness/base/no_follow.h"

#include <sys/stat.h>

#include "harness/base/beneath.h"

namespace fs = std::filesystem;

namespace rh {

SymlinkRefused::SymlinkRefused(const std::string& p)
    : std::invalid_argument(p + " is a symbolic link; refusing to write or delete through it"), path(p) {}

void refuse_symlinks_below(const fs::path& root, const fs::path& below) {
  fs::path at = root;
  for (const auto& part : below.relative_path()) {
    if (part.empty() || part == ".") continue;
    at /= part;
    struct stat st;
    // lstat, not stat: the link itself, never what it points to. Missing (or unreadable): the
    // rest does not exist either, and creating it cannot go through a link.
    if (::lstat(at.c_str(), &st) != 0) return;
    if (S_ISLNK(st.st_mode)) throw SymlinkRefused(at.string());
  }
}

void refuse_symlinks_below(const fs::path& root, const std::vector<std::string>& below) {
  for (const auto& b : below) refuse_symlinks_below(root, fs::path(b));
}

void remove_tree_below(const fs::path& root, const fs::path& below) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;   // nothing below a missing root
  BeneathDir::open(root).remove_tree(below);
}

}   // namespace rh
