// What an external trainer's cell (external_check.h) does to its own directory, every step through
// base/beneath.h: the trainer runs between the tool's steps and may replace the cell directory, a
// run's directory or `flat` with a link to anywhere, so each path is resolved from the run
// directory at the moment it is used, without following a link; a link there is a SymlinkRefused
// naming it ("PATH is a symbolic link; refusing to write or delete through it"), an invalid_argument:
// the cell is an error, the tool exits 2, nothing outside is read, written or removed.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include "harness/base/beneath.h"

namespace rh::external {

// <cell>/<rel> opened (made when create) from the run directory two levels above the cell.
BeneathDir cell_dir(const std::filesystem::path& work_dir, const std::filesystem::path& rel, bool create);

// p relative to the cell directory when p lies inside it (lexically), else "".
std::filesystem::path inside_cell(const std::filesystem::path& work_dir, const std::filesystem::path& p);

// A run's directory <cell>/<label> with its save/ made fresh: empty, or (seed, a directory of the
// cell) copied into it by BeneathDir::copy_tree (links as links, holes kept).
void make_run_dir(const std::filesystem::path& work_dir, const std::string& label,
                  const std::filesystem::path& seed_save_dir);

// Reads a file the trainer left inside the cell (a log, a probe file, a metrics file) without
// following a link on the way; at most max_bytes. A path outside the cell is read as named.
std::string read_cell_file(const std::filesystem::path& work_dir, const std::filesystem::path& p, uint64_t max_bytes);

// Throws SymlinkRefused when a link lies on the way to p inside the cell (a checkpoint about to be
// compared: the reads after this refuse a link in p's last component themselves).
void refuse_links_to(const std::filesystem::path& work_dir, const std::filesystem::path& p);

// trainer.checkpoint.path, expanded for a run, must name something inside that run's directory
// (its {save_dir} is inside it): a path that resolves elsewhere (`/proc/self/environ`, `../x`, a
// link out) is refused, std::invalid_argument naming the key, the expansion and the directory.
void refuse_checkpoint_outside(const std::filesystem::path& p, const std::filesystem::path& run_dir);

// After the cell: every run's save/ and the cell's flat/ removed (not followed). A link at the
// cell's level (a run directory or flat replaced by one) is a SymlinkRefused, nothing removed.
void clean_cell(const std::filesystem::path& work_dir);

}   // namespace rh::external
