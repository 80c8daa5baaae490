// Refusing to write or delete through a symbolic link the tool did not create.
// A run directory, a `train --out` directory or a golden directory is named by the user and may
// itself be a link; everything the tool places below it (scenarios/, baselines/, a cell, the
// summaries, the report, plots/, the state dumps) must be a real file or directory, or absent.
// A planted link there would make a remove_all or a write land outside the directory.
// A check is not a defence against a link planted between the check and the write (an external
// trainer runs in between): what the tool writes or removes below a run directory after a foreign
// process ran goes through base/beneath.h, which resolves each path at the moment of use.
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

// Removes root/below recursively, every step without following a link (BeneathDir::remove_tree,
// base/beneath.h: a link on the way, or root/below itself a link, is a SymlinkRefused, checked as
// each directory is opened, not before). Missing is fine.
void remove_tree_below(const std::filesystem::path& root, const std::filesystem::path& below);

}   // namespace rh
