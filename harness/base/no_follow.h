// Refusing to write or delete through a symbolic link the tool did not create.
// A run directory, a `train --out` directory or a golden directory is named by the user and may
// itself be a link; everything the tool places below it (scenarios/, baselines/, a cell, the
// summaries, the report, plots/, the state dumps) must be a real file or directory, or absent.
// A planted link there would make a remove_all or a write land outside the directory.
// Not a defence against a link planted between the check and the write (a concurrent attacker):
// the writes themselves open with O_NOFOLLOW (write_text), which closes that gap for files.
#pragma once
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace rh {

// "<path> is a symbolic link; refusing to write or delete through it". An invalid_argument: the
// tool exits 2 (bad input) on it.
struct SymlinkRefused : std::invalid_argument {
  explicit SymlinkRefused(const std::string& path);
  std::string path;
};

// Throws SymlinkRefused naming the first component of root/below (below relative, e.g.
// "scenarios/ci__a") that exists and is a symbolic link; components after the first missing one
// are not looked at (they will be created). `root` itself is not checked.
void refuse_symlinks_below(const std::filesystem::path& root, const std::filesystem::path& below);
// The same for several paths below one root.
void refuse_symlinks_below(const std::filesystem::path& root, const std::vector<std::string>& below);

// Removes root/below recursively after refuse_symlinks_below (remove_all itself never follows a
// link inside the tree, only in the path that leads to it). Missing is fine.
void remove_tree_below(const std::filesystem::path& root, const std::filesystem::path& below);

}   // namespace rh
