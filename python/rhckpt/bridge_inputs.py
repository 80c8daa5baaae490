"""bridge_inputs: what the torch bridge reads (torch_bridge.py documents the formats): IN as a
file or a directory walked without following links (nofollow.py), each file kept open as an Input
(fd, size, first bytes) and loaded as a torch.save zip (torch_zip.py, never torch's loaders; plain
torch.load only with --trust-pickle), a safetensors file, or a torch.distributed.checkpoint
directory (DcpInput, dcp.py). Every refusal is a BridgeError naming the file.
"""
import os

from . import nofollow
from . import torch_zip
from .errors import BridgeError

PICKLE_PROTOCOLS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
ZIP_MAGIC = b"PK\x03\x04"


class Input:
    """One open input file: fd, size, first bytes, the path to name in messages."""

    def __init__(self, fd, st, shown):
        self.fd, self.size, self.shown = fd, st.st_size, shown
        self.head = os.pread(fd, 4, 0)

    def kind(self):
        """'torch', 'safetensors' or None by the file's first bytes (and name for safetensors)."""
        if self.head == ZIP_MAGIC or self.head[:2] in PICKLE_PROTOCOLS:
            return "torch"
        if self.shown.endswith(".safetensors"):
            return "safetensors"
        return None

    def fileobj(self):
        """A file object from offset 0 (a dup shares the offset: every reader starts over)."""
        f = os.fdopen(os.dup(self.fd), "rb")
        f.seek(0)
        return f

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def load_torch(inp, trust, budget):
    path = inp.shown
    if not inp.head:
        raise BridgeError("%s: empty file" % path)
    if inp.head != ZIP_MAGIC and inp.head[:2] not in PICKLE_PROTOCOLS:
        raise BridgeError("%s: not a torch.save file (no zip or pickle magic)" % path)
    if trust:
        return _trusted_load(inp)
    if inp.head != ZIP_MAGIC:
        tar = os.pread(inp.fd, 5, 257) == b"ustar"
        raise BridgeError("%s: a legacy (torch < 1.6, %s) torch.save file, refused: only torch's own loader reads it "
                          "and an untrusted file can steer that loader (set trust_pickle = true / --trust-pickle if "
                          "you trust this file, or re-save it with torch >= 1.6)"
                          % (path, "tar format" if tar else "non-zip pickle format"))
    budget[0] += torch_zip.OUTPUT_FACTOR * inp.size
    with inp.fileobj() as f:
        try:
            return torch_zip.load(f, inp.size, budget)
        except torch_zip.Refused as e:
            raise BridgeError("%s: %s" % (path, e)) from None


def _trusted_load(inp):
    """--trust-pickle: plain torch.load (a process of its own: the tool starts one per conversion)."""
    import torch
    import zipfile
    path = inp.shown
    if inp.head == ZIP_MAGIC:
        try:
            with inp.fileobj() as f, zipfile.ZipFile(f) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, ValueError, EOFError) as e:
            raise BridgeError("%s: not a readable zip archive (%s)" % (path, e)) from None
        if not any(n.endswith("data.pkl") for n in names):
            raise BridgeError("%s: a zip archive without data.pkl, not a torch.save file" % path)
    try:
        with inp.fileobj() as f:
            return torch.load(f, map_location="cpu")
    except RecursionError:
        raise BridgeError("%s: nested too deeply to load" % path) from None
    except Exception as e:   # torch raises RuntimeError, pickle UnpicklingError/EOFError/... on damage
        what = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BridgeError("%s: torch.load failed: %s: %s" % (path, type(e).__name__, what[:300])) from None


def load_safetensors(inp):
    from . import safetensors as st
    from .errors import Damaged
    with inp.fileobj() as f:
        blob = f.read()
    path = inp.shown
    try:
        meta, _ = st.parse(path, blob)
        tensors = st.tensors(path, blob)
    except Damaged as e:
        raise BridgeError(str(e)) from None
    except (ValueError, KeyError, TypeError) as e:
        raise BridgeError("%s: not a valid safetensors file: %s" % (path, e)) from None
    return meta, tensors


class DcpInput:
    """A torch.distributed.checkpoint directory's .metadata and *.distcp files (dcp.py)."""

    def __init__(self, fd, shown, size):
        self.fd, self.shown, self.size = fd, shown, size

    def kind(self):
        return "dcp"

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def list_inputs(walker, root):
    """[(relative path, Input)] of a directory, sorted; refuses symlinks. A directory with a
    top-level .metadata is a torch.distributed.checkpoint: its *.distcp files are read through it
    (one entry, relative path ""), other torch/safetensors files (Megatron's common.pt) as usual."""
    dfd = walker.open_dir(root)
    found = []
    try:
        rels = nofollow.scan(dfd, root)
        if ".metadata" in rels:
            distcp = [r for r in rels if r.endswith(".distcp") and "/" not in r]
            found.append(("", DcpInput(os.dup(dfd), root, sum(walker_size(dfd, r) for r in distcp))))
            rels = [r for r in rels if r != ".metadata" and r not in distcp]
        elif any(r.endswith(".distcp") for r in rels):
            raise BridgeError("%s: *.distcp files without a .metadata file (not a torch.distributed.checkpoint "
                              "directory)" % root)
        for rel in rels:
            fd, st_ = nofollow.open_rel(dfd, rel, root)
            inp = Input(fd, st_, os.path.join(root, rel))
            if inp.kind():
                found.append((rel, inp))
            else:
                inp.close()
    except BaseException:
        for _, inp in found:
            inp.close()
        raise
    finally:
        os.close(dfd)
    if not found:
        raise BridgeError("%s: no torch.save or safetensors file in the directory" % root)
    return found


def walker_size(dfd, name):
    return os.stat(name, dir_fd=dfd, follow_symlinks=False).st_size


def load_dcp(inp, budget):
    from . import dcp
    budget[0] += torch_zip.OUTPUT_FACTOR * inp.size
    try:
        return dcp.read(inp.fd, inp.shown, budget)
    except torch_zip.Refused as e:
        raise BridgeError("%s: torch.distributed.checkpoint: %s" % (inp.shown, e)) from None


def open_input(walker, src):
    """[(relative path, Input)]: src a file ("" as its path) or a directory."""
    import stat
    st_ = walker.lstat(src)
    if stat.S_ISLNK(st_.st_mode):
        raise BridgeError("%s: is a symlink (refused, never followed)" % src)
    if stat.S_ISDIR(st_.st_mode):
        return list_inputs(walker, src)
    if not stat.S_ISREG(st_.st_mode):
        raise BridgeError("%s: not a regular file or directory" % src)
    fd, name = walker.parent(src)
    try:
        ffd, fst = nofollow.open_file_at(fd, name, src)
    finally:
        os.close(fd)
    inp = Input(ffd, fst, src)
    if inp.kind() is None:
        inp.close()
        raise BridgeError("%s: %s" % (src, "empty file" if fst.st_size == 0 else "not a torch.save file (no zip or pickle magic)"))
    return [("", inp)]
