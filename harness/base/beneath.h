// Paths below a run directory resolved at the moment they are used, never through a link.
// no_follow.h checks a path before the tool writes; that leaves a window: an external trainer runs
// between the checks and the tool's own writes and may replace its cell directory (or `flat`, or
// `interrupted`) with a link to anywhere. A BeneathDir is a directory handle reached from a trusted
// root by one openat(O_NOFOLLOW | O_DIRECTORY) per component, and everything it does (make a
// directory, write a file, remove a tree, open for reading) goes through *at() calls relative to
// that handle with O_NOFOLLOW / AT_SYMLINK_NOFOLLOW, so no link is followed at any step.
// The root itself is named by the user and may be a link (it is opened as given); every component
// below it must be a real directory or file. A link met anywhere below is a SymlinkRefused naming
// the path up to it; ".." and absolute paths below a root are refused (std::logic_error: the tool
// builds these paths itself).
// Why a walk and not openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS): the walk needs no 5.6 kernel,
// is the same guarantee (each step is relative to the previous handle, ".." never occurs), and
// names the component that was a link, which a one-line error must say.
// Callers re-open from the root for every step they take after a foreign process ran (a handle
// kept from before would still reach a directory the trainer moved elsewhere).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace rh {

class BeneathDir {
 public:
  // root (followed: user-named) / below (walked without following links); with create, missing
  // directories are made (0755). Missing without create: FileError naming it (fsutil.h).
  static BeneathDir open(const std::filesystem::path& root, const std::filesystem::path& below = {},
                         bool create = false);

  BeneathDir(BeneathDir&& other) noexcept;
  BeneathDir& operator=(BeneathDir&& other) noexcept;
  BeneathDir(const BeneathDir&) = delete;
  BeneathDir& operator=(const BeneathDir&) = delete;
  ~BeneathDir();

  int fd() const { return fd_; }
  const std::filesystem::path& path() const { return path_; }   // for messages only, never opened

  // A directory below this one (rel: relative, no ".."), made when create.
  BeneathDir sub(const std::filesystem::path& rel, bool create = false) const;
  // What rel is, without following a link there: 0 missing, else the st_mode of its lstat. A link
  // on the way to rel's last component is a SymlinkRefused.
  unsigned mode_of(const std::filesystem::path& rel) const;
  bool exists(const std::filesystem::path& rel) const { return mode_of(rel) != 0; }

  // Writes rel atomically: a temp file beside it (O_CREAT | O_EXCL | O_NOFOLLOW), then renameat over
  // rel (which, when it exists, must not be a directory: rename replaces a link itself, never
  // its target). Throws WriteError / DiskError naming the path (base/text.h).
  void write_file(const std::filesystem::path& rel, const std::string& text) const;
  // Opens rel for writing (O_CREAT | O_TRUNC | O_NOFOLLOW, 0644); the caller closes the fd.
  int open_for_write(const std::filesystem::path& rel) const;
  // Opens rel for reading (O_RDONLY | O_NOFOLLOW; a FIFO does not block: O_NONBLOCK, cleared
  // after). A link is refused; the caller closes the fd.
  int open_for_read(const std::filesystem::path& rel) const;
  // Reads rel whole (a regular file, not a link; at most max_bytes, else FileError naming it).
  std::string read_file(const std::filesystem::path& rel, uint64_t max_bytes) const;
  // The entries of this directory: name and the st_mode of its lstat (a link is S_IFLNK), sorted.
  std::vector<std::pair<std::string, unsigned>> entries() const;
  // Copies the tree at `from` to `to` (which must not exist; its parent must), both below this
  // directory, never following a link: a link is copied as a link (its target text), a regular
  // file with its holes (SEEK_DATA / SEEK_HOLE: a sparse 2 GiB file stays sparse), directories
  // with 0755; anything else (a FIFO, a device, a socket) is refused naming it (FileError).
  void copy_tree(const std::filesystem::path& from, const std::filesystem::path& to) const;
  // Removes rel and, for a directory, everything in it. Inside the tree a link is removed itself
  // (unlinkat), never followed; rel itself being a link is a SymlinkRefused (nothing removed).
  // Missing is fine.
  void remove_tree(const std::filesystem::path& rel) const;

 private:
  BeneathDir(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  // The directory holding rel's last component, and that component.
  std::pair<BeneathDir, std::string> parent_of(const std::filesystem::path& rel) const;
  int fd_ = -1;
  std::filesystem::path path_;
};

}   // namespace rh
