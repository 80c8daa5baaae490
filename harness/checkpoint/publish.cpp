// The atomic publish protocol; see publish.h.
#include "harness/checkpoint/publish.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "harness/base/text.h"
#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/manifest.h"
#include "harness/checkpoint/manifest_reader.h"

namespace rh::ckpt::detail {

namespace fs = std::filesystem;

namespace {

// The pid a temp name of ours ends with ("....<pid>"), 0 when it does not end with digits.
long pid_suffix(const std::string& n) {
  const size_t dot = n.rfind('.');
  if (dot == std::string::npos || dot + 1 >= n.size()) return 0;
  for (size_t i = dot + 1; i < n.size(); ++i)
    if (n[i] < '0' || n[i] > '9') return 0;
  return std::strtol(n.c_str() + dot + 1, nullptr, 10);
}

// Whether another process of that pid runs (a saver still writing). Our own pid's entries are
// stale: this process saves one checkpoint of a root at a time.
bool live(long pid) {
  return pid != ::getpid() && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

}   // namespace

void clean_temps(const std::string& root_str) {
  const fs::path root(root_str);
  std::error_code ec;
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(root, ec)) entries.push_back(e.path());
  const std::string pointer_tmp = std::string(kPointerFile) + ".tmp.";
  for (const fs::path& p : entries) {
    const std::string n = p.filename().string();
    // Only names this room makes: make_temp_dir's .tmp.iter_<N>.<pid> and write_file_atomic's
    // <pointer>.tmp.<pid>, each of a process that no longer runs.
    const bool dir = n.rfind(".tmp.iter_", 0) == 0, pointer = n.rfind(pointer_tmp, 0) == 0;
    if (!dir && !pointer) continue;
    const long pid = pid_suffix(n);
    if (pid <= 0 || live(pid)) continue;
    if (pointer && n.size() != pointer_tmp.size() + std::to_string(pid).size()) continue;
    remove_tree(p.string());
  }
}

void clean_stale(const std::string& root_str) {
  clean_temps(root_str);
  const fs::path root(root_str);
  std::error_code ec;
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(root, ec)) entries.push_back(e.path());
  for (const fs::path& p : entries) {
    const std::string n = p.filename().string();
    if (n.rfind(".old.iter_", 0) != 0) continue;
    const size_t dot = n.rfind('.');
    const long pid = pid_suffix(n);
    if (pid > 0 && live(pid)) continue;   // live saver
    const fs::path published = root / n.substr(5, dot - 5);
    if (!path_exists(published.string()) && path_exists((p / kManifestFile).string())) {
      rename_path(p.string(), published.string());
      fsync_dir(root.string());
      continue;
    }
    remove_tree(p.string());
  }
}

void make_temp_dir(const std::string& root_str, const std::string& name, std::string& tmp_name) {
  const fs::path root(root_str);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw_if_disk_errno("cannot create checkpoint root", root_str, ec.value());
  if (ec) throw CheckpointError("cannot create checkpoint root " + root_str + ": " + ec.message());
  clean_stale(root_str);
  tmp_name = ".tmp." + name + "." + std::to_string(::getpid());
  remove_tree((root / tmp_name).string());
  fs::create_directory(root / tmp_name, ec);
  if (ec) throw_if_disk_errno("cannot create", (root / tmp_name).string(), ec.value());
  if (ec) throw CheckpointError("cannot create " + (root / tmp_name).string() + ": " + ec.message());
}

namespace {

// The complete, fsynced temp directory becomes the published one: a rename for a new iteration;
// for a re-save an exchange, or the old directory renamed aside first (publish.h). Returns
// whether the iteration is new.
bool rename_into_place(const fs::path& root_p, const std::string& tmp, const std::string& name) {
  const std::string root = root_p.string(), final_dir = (root_p / name).string();
  const bool fresh = !path_exists(final_dir);
  if (fresh) {
    rename_path(tmp, final_dir);
    fsync_dir(root);
    return true;
  }
  if (exchange_dirs(tmp, final_dir)) {
    fsync_dir(root);
  } else {
    const fs::path aside = root_p / (".old." + name + "." + std::to_string(::getpid()));
    remove_tree(aside.string());
    rename_path(final_dir, aside.string());
    fsync_dir(root);
    rename_path(tmp, final_dir);
    fsync_dir(root);
    remove_tree(aside.string());
  }
  remove_tree(tmp);   // after an exchange: the replaced checkpoint
  return false;
}

// Last: the pointer names the new iteration.
void write_pointer(const fs::path& root, const std::string& name, int64_t iteration, bool fresh) {
  try {
    write_file_atomic((root / kPointerFile).string(), std::to_string(iteration) + "\n");
  } catch (...) {
    // The pointer still names the previous checkpoint: a directory published just now for a
    // new iteration would be referenced by nothing, so it goes (a replaced one stays: it is
    // the only copy of that iteration now).
    if (fresh) {
      std::error_code ec;
      fs::remove_all(root / name, ec);
    }
    throw;
  }
}

}   // namespace

void publish_dir(const std::string& root, const std::string& tmp, const std::string& name, int64_t iteration,
                 const std::vector<std::pair<std::string, std::string>>& files) {
  // Within the temp directory order does not matter: the directory rename publishes.
  for (const auto& [file, text] : files) write_file_durable((fs::path(tmp) / file).string(), text);
  fsync_dir(tmp);
  const bool fresh = rename_into_place(fs::path(root), tmp, name);
  write_pointer(fs::path(root), name, iteration, fresh);
}

std::string resolve_checkpoint_dir(const std::string& root_or_dir) {
  const fs::path p(root_or_dir);
  if (path_exists((p / kManifestFile).string())) return p.string();
  const fs::path ptr = p / kPointerFile;
  if (!path_exists(ptr.string())) {
    if (path_exists(p.string()) && p.filename().string().rfind("iter_", 0) == 0) {
      CheckpointError e("checkpoint " + p.string() + ": no " + kManifestFile +
                            " (an incomplete save; not a checkpoint)",
                        (p / kManifestFile).string());
      e.damaged = true;   // as inspect says: an iter_ directory without its manifest is damage
      throw e;
    }
    throw CheckpointError(p.string() + ": neither a checkpoint directory (no " + kManifestFile +
                          ") nor a checkpoint root (no " + kPointerFile + ")");
  }
  int64_t it = 0;
  try {
    it = read_pointer_file(ptr.string());
  } catch (CheckpointError& e) {
    e.damaged = true;
    throw;
  }
  const std::string name = iter_dir_name(it);
  const fs::path dir = p / name;
  if (path_exists((dir / kManifestFile).string())) return dir.string();
  // Without RENAME_EXCHANGE a re-save of the same iteration moves the old directory aside
  // (.old.<name>.<pid>) before renaming the new one in; a crash between the two renames leaves
  // the complete old checkpoint there.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(p, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".old." + name + ".", 0) == 0 && path_exists((e.path() / kManifestFile).string()))
      return e.path().string();
  }
  CheckpointError e(ptr.string() + " names iteration " + std::to_string(it) + " but " + dir.string() + " has no " +
                        kManifestFile,
                    ptr.string());
  e.damaged = true;
  throw e;
}

}   // namespace rh::ckpt::detail
