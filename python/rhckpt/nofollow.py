"""nofollow: opening files and directories without following links, for torch_bridge.

A trainer runs between the tool's checks and the bridge's reads and writes, so it can plant a
link in place of any directory below the run directory. Paths below `root` (the directory the
tool names with --root / "root") are walked one component at a time from an fd of root: each
directory opened with O_DIRECTORY | O_NOFOLLOW beneath its parent's fd, the file itself with
O_NOFOLLOW | O_NONBLOCK (a FIFO never blocks) and fstat-checked as a regular file. A link met on
the way is an error naming it. Paths outside root (or with no root) are opened as the user gave
them up to their parent directory, and the last component without following a link, as before.
Outputs are written as NAME.tmp beneath the same parent fd and renamed over NAME (rename never
follows a link at NAME), missing directories beneath root made with mkdir at their parent's fd.
"""
import os
import stat

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class LinkError(OSError):
    """A path component is a link, or not what it must be: the message is the whole line."""

    def __init__(self, path, what):
        super().__init__(what)
        self.path, self.what = path, what

    def __str__(self):
        return "%s: %s" % (self.path, self.what)


def _refuse_component(parent_fd, name, shown, want_dir):
    """Raises the error for a component that did not open as wanted."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise LinkError(shown, "no such file or directory") from None
    except OSError as e:
        raise LinkError(shown, e.strerror or str(e)) from None
    if stat.S_ISLNK(st.st_mode):
        raise LinkError(shown, "is a symlink (refused, never followed)")
    if want_dir and not stat.S_ISDIR(st.st_mode):
        raise LinkError(shown, "is not a directory")
    raise LinkError(shown, "cannot be opened")


def open_dir_at(parent_fd, name, shown, create=False):
    """fd of directory `name` beneath parent_fd, never through a link."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            raise LinkError(shown, "no such file or directory") from None
        try:
            os.mkdir(name, 0o755, dir_fd=parent_fd)
        except FileExistsError:
            pass
        except OSError as e:
            raise LinkError(shown, "cannot create: %s" % (e.strerror or e)) from None
        try:
            return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
        except OSError:
            _refuse_component(parent_fd, name, shown, True)
    except (NotADirectoryError, OSError):   # ELOOP (a link), ENOTDIR, EACCES
        _refuse_component(parent_fd, name, shown, True)


class Walker:
    def __init__(self, root=None):
        self.root = os.path.abspath(root) if root else None

    def parent(self, path, create=False):
        """(fd of path's parent directory, last component). Walks beneath root when path is there."""
        path = os.path.abspath(path)
        name = os.path.basename(path)
        if not name or name in (".", ".."):
            raise LinkError(path, "not a file name")
        head = os.path.dirname(path)
        if self.root and (head == self.root or head.startswith(self.root.rstrip("/") + "/")):
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            shown = self.root
            try:
                for part in [p for p in head[len(self.root):].split("/") if p]:
                    if part == "..":
                        raise LinkError(path, "has a '..' component")
                    shown = os.path.join(shown, part)
                    nfd = open_dir_at(fd, part, shown, create)
                    os.close(fd)
                    fd = nfd
            except BaseException:
                os.close(fd)
                raise
            return fd, name
        try:
            return os.open(head, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), name
        except OSError as e:
            raise LinkError(head, e.strerror or str(e)) from None

    def beneath(self, path):
        return bool(self.root) and os.path.abspath(path).startswith(self.root.rstrip("/") + "/")

    def lstat(self, path):
        fd, name = self.parent(path)
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            raise LinkError(path, "no such file or directory") from None
        except OSError as e:
            raise LinkError(path, e.strerror or str(e)) from None
        finally:
            os.close(fd)

    def open_dir(self, path):
        fd, name = self.parent(path)
        try:
            return open_dir_at(fd, name, path)
        finally:
            os.close(fd)

    def write(self, path, parts):
        """Writes path.tmp beneath path's parent, renames it over path."""
        fd, name = self.parent(path, create=self.beneath(path))
        tmp = name + ".tmp"
        try:
            try:
                os.unlink(tmp, dir_fd=fd)   # a leftover (or a planted link) at NAME.tmp: never followed
            except FileNotFoundError:
                pass
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
            try:
                with os.fdopen(out, "wb") as f:
                    for p in parts:
                        f.write(p)
                os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=fd)
                except OSError:
                    pass
                raise
        finally:
            os.close(fd)


def open_file_at(dir_fd, name, shown):
    """(fd, stat) of a regular file, never through a link, never blocking on a FIFO."""
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as e:
            raise LinkError(shown, e.strerror or str(e)) from None
        if stat.S_ISLNK(st.st_mode):
            raise LinkError(shown, "is a symlink (refused, never followed)") from None
        raise LinkError(shown, "cannot be opened") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise LinkError(shown, "not a regular file (a FIFO, device or socket is refused, never read)")
    return fd, st


def scan(dir_fd, shown):
    """[(relative path, open-able (parent fd path), ...)]: every regular file below dir_fd, sorted,
    as (rel, shown path) pairs; a link anywhere is refused; FIFOs, devices, sockets are skipped.
    Directories are opened by fd, so a link planted mid-scan is met, not followed."""
    found, stack = [], [("", os.dup(dir_fd))]
    try:
        while stack:
            rel, fd = stack.pop()
            try:
                with os.scandir(fd) as it:
                    entries = sorted(it, key=lambda e: e.name)
                for e in entries:
                    child = e.name if not rel else rel + "/" + e.name
                    if e.is_symlink():
                        raise LinkError(os.path.join(shown, child), "is a symlink (refused, never followed)")
                    if e.is_dir(follow_symlinks=False):
                        stack.append((child, open_dir_at(fd, e.name, os.path.join(shown, child))))
                    elif e.is_file(follow_symlinks=False):
                        found.append(child)
            finally:
                os.close(fd)
    finally:
        for _, fd in stack:
            os.close(fd)
    return sorted(found)


def open_rel(dir_fd, rel, shown):
    """(fd, stat) of rel (a/b/c) beneath dir_fd, each component without following links."""
    parts = rel.split("/")
    fd = os.dup(dir_fd)
    try:
        at = shown
        for p in parts[:-1]:
            at = os.path.join(at, p)
            nfd = open_dir_at(fd, p, at)
            os.close(fd)
            fd = nfd
        return open_file_at(fd, parts[-1], os.path.join(shown, rel))
    finally:
        os.close(fd)
