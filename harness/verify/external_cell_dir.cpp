// The external cell's own directory, never through a link; see external_cell_dir.h.
#include "harness/verify/external_cell_dir.h"

#include <sys/stat.h>

#include <stdexcept>

#include "harness/base/input.h"
#include "harness/base/no_follow.h"
#include "harness/verify/check.h"

namespace fs = std::filesystem;

namespace rh::external {

BeneathDir cell_dir(const fs::path& work_dir, const fs::path& rel, bool create) {
  return open_work_dir(fs::absolute(work_dir).string(), rel, create);
}

fs::path inside_cell(const fs::path& work_dir, const fs::path& p) {
  const fs::path cell = fs::absolute(work_dir).lexically_normal(), q = fs::absolute(p).lexically_normal();
  const fs::path rel = q.lexically_relative(cell);
  if (rel.empty() || *rel.begin() == "..") return {};
  return rel == "." ? fs::path() : rel;
}

void make_run_dir(const fs::path& work_dir, const std::string& label, const fs::path& seed_save_dir) {
  const BeneathDir cell = cell_dir(work_dir, {}, false);
  cell.sub(label, /*create=*/true);
  if (seed_save_dir.empty()) {
    cell.sub(fs::path(label) / "save", true);
    return;
  }
  const fs::path seed = inside_cell(work_dir, seed_save_dir);
  if (seed.empty()) throw std::logic_error("seed save directory " + seed_save_dir.string() + " is not in the cell");
  if (cell.mode_of(seed) == 0) cell.sub(fs::path(label) / "save", true);   // the run saved nothing
  else cell.copy_tree(seed, fs::path(label) / "save");
}

std::string read_cell_file(const fs::path& work_dir, const fs::path& p, uint64_t max_bytes) {
  const fs::path rel = inside_cell(work_dir, p);
  if (rel.empty()) return read_regular_file(p.string(), max_bytes);
  return cell_dir(work_dir, {}, false).read_file(rel, max_bytes);
}

void refuse_links_to(const fs::path& work_dir, const fs::path& p) {
  const fs::path rel = inside_cell(work_dir, p);
  if (!rel.empty()) cell_dir(work_dir, {}, false).mode_of(rel);   // throws at a link on the way
}

void refuse_checkpoint_outside(const fs::path& p, const fs::path& run_dir) {
  const fs::path dir = fs::absolute(run_dir).lexically_normal(), q = fs::absolute(p).lexically_normal();
  auto outside = [](const fs::path& inner, const fs::path& outer) {
    const fs::path rel = inner.lexically_relative(outer);
    return rel.empty() || rel == "." || *rel.begin() == "..";
  };
  std::error_code ec;
  // Lexically, and with every link resolved (a save/ that is a link out, say).
  const fs::path real_q = fs::weakly_canonical(q, ec), real_dir = fs::weakly_canonical(dir, ec);
  if (outside(q, dir) || (!ec && outside(real_q, real_dir)))
    throw std::invalid_argument("trainer.checkpoint.path names " + p.string() + ", outside the run's directory " +
                                dir.string() + " (use {save_dir}/... or {run_dir}/...: the checkpoint compared must be "
                                "one this run wrote)");
}

void clean_cell(const fs::path& work_dir) {
  const BeneathDir cell = cell_dir(work_dir, {}, false);
  for (const auto& [name, mode] : cell.entries()) {
    if (S_ISLNK(mode)) throw SymlinkRefused((cell.path() / name).string());
    if (S_ISDIR(mode) && name == "flat") cell.remove_tree(name);
    else if (S_ISDIR(mode)) cell.remove_tree(fs::path(name) / "save");
  }
}

}   // namespace rh::external
