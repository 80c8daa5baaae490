"""Hostile torch.save files (issue 41), written byte by byte without torch: each is a function
of a scratch path and returns the file's bytes. Shared by tests/test_torch_bridge.py (each attack
against the bridge, with what it must not do) and make_corpus.py (the conformance corpus's
torch_* cases, with every reader's verdict).

    zip_*     torch.save's zip format (archive/data.pkl + archive/data/<key>) with one lie each
    legacy_*  the pre-1.6 formats, whose only reader is torch's _legacy_load
"""
import io
import struct
import tarfile
import zipfile

PROTO = b"\x80\x02"


def s(text):
    b = text.encode("utf-8")
    return b"X" + struct.pack("<I", len(b)) + b


def i(n):
    if 0 <= n < 256:
        return b"K" + bytes([n])
    if -2 ** 31 <= n < 2 ** 31:
        return b"J" + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def glob(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def tup(items):
    return b"(" + b"".join(items) + b"t"


def tensor(key, numel, size, stride, offset=0, storage="FloatStorage"):
    """_rebuild_tensor_v2(storage ref, offset, size, stride, False, OrderedDict())."""
    ref = tup([s("storage"), glob("torch", storage), s(key), s("cpu"), i(numel)]) + b"Q"
    args = tup([ref, i(offset), tup([i(x) for x in size]), tup([i(x) for x in stride]), b"\x89",
                glob("collections", "OrderedDict") + b")R"])
    return glob("torch._utils", "_rebuild_tensor_v2") + args + b"R"


def state(value_pickle, key="w"):
    """data.pkl of {key: value}."""
    return PROTO + b"}" + s(key) + value_pickle + b"s."


def zip_bytes(pkl, records, deflate=()):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(zipfile.ZipInfo("archive/data.pkl"), pkl, compress_type=zipfile.ZIP_STORED)
        for name, data in records.items():
            z.writestr(zipfile.ZipInfo("archive/data/" + name), data,
                       compress_type=zipfile.ZIP_DEFLATED if name in deflate else zipfile.ZIP_STORED)
        z.writestr(zipfile.ZipInfo("archive/version"), b"3\n")
    return buf.getvalue()


def zip_valid():
    """A well-formed file: {"w": 2x2 float32 [1, 2, 3, 4]}, its transpose under "t"."""
    data = struct.pack("<4f", 1, 2, 3, 4)
    pkl = PROTO + b"}(" + s("w") + tensor("0", 4, (2, 2), (2, 1)) + s("t") + tensor("0", 4, (2, 2), (1, 2)) + b"u."
    return zip_bytes(pkl, {"0": data})


def zip_oversize_storage():
    """A storage declaring 4096 floats over a 4-byte record (the old bridge read its own heap)."""
    return zip_bytes(state(tensor("0", 4096, (4096,), (1,))), {"0": b"\0\0\x80\x3f"})


def zip_huge_storage():
    """2^30 floats declared over a 4-byte record (the old bridge segfaulted)."""
    return zip_bytes(state(tensor("0", 2 ** 30, (2 ** 30,), (1,))), {"0": b"\0\0\x80\x3f"})


def zip_tensor_past_storage():
    """A view reaching element 8 of a 4-element storage."""
    return zip_bytes(state(tensor("0", 4, (3,), (4,))), {"0": bytes(16)})


def zip_stride0():
    """One float viewed as 2^20 x 1024 with strides (0, 0): 4 GiB of output from 4 bytes."""
    return zip_bytes(state(tensor("0", 1, (2 ** 20, 1024), (0, 0))), {"0": bytes(4)})


def zip_deflate():
    """A deflate record (torch.save never compresses): 64 MiB of zeros in 64 KiB."""
    return zip_bytes(state(tensor("0", 2 ** 24, (2 ** 24,), (1,))), {"0": bytes(64 << 20)}, deflate={"0"})


def zip_deep_key(depth=1_000_000):
    """A tuple nested `depth` deep as a dict key (hashing it overflowed the C stack)."""
    return zip_bytes(PROTO + b"}" + b"N" + b"\x85" * depth + b"Ns.", {})


def zip_build_on_class():
    """BUILD with a slot state on the class argparse.Namespace: setattr(Namespace, ...)."""
    pkl = (PROTO + b"}" + s("x") + glob("argparse", "Namespace") + b"N}" +
           s("dump_patches") + b"\x88s\x86b" + b"s.")
    return zip_bytes(pkl, {})


def zip_dtype_mutation():
    """BUILD on the dtype torch.float32: a stand-in the reader shares between files."""
    pkl = PROTO + b"}" + s("x") + glob("torch", "float32") + b"N}" + s("name") + s("int8") + b"s\x86bs."
    return zip_bytes(pkl, {})


def zip_system():
    """REDUCE of os.system (refused by find_class)."""
    return zip_bytes(state(glob("posix", "system") + tup([s("true")]) + b"R"), {})


def legacy_dump_patches(target):
    """The legacy format: a BUILD gives argparse.Namespace dump_patches=True and __name__=target,
    then a ('module', Namespace, file, changed source) persistent id: torch 1.13's _legacy_load
    appends a diff to `<target>.patch`."""
    magic = PROTO + i(0x1950a86a20f9469cfc6c) + b"."
    version = PROTO + i(1001) + b"."
    sysinfo = PROTO + b"}(" + s("protocol_version") + i(1001) + s("little_endian") + b"\x88" + s("type_sizes") + \
        b"}(" + s("short") + i(2) + s("int") + i(4) + s("long") + i(4) + b"uu."
    body = (PROTO + glob("argparse", "Namespace") + b"q\x00" + b"N}(" + s("dump_patches") + b"\x88" + s("__name__") +
            s(target) + b"u\x86b0" + tup([s("module"), b"h\x00", s("x.py"), s("class Namespace:\n    changed = 1\n")]) +
            b"Q0}.")
    keys = PROTO + b"]."
    return magic + version + sysinfo + body + keys


def legacy_tar(member, linkname=None, fifo=False):
    """The legacy tar format: a first member named \\x80\\x02 (so the file starts with a pickle
    header), then `member`: a hard link to linkname (mode 0777, mtime 0), or a FIFO."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        first = tarfile.TarInfo("\udc80\x02")
        first.size = 1
        t.addfile(first, io.BytesIO(b"x"))
        m = tarfile.TarInfo(member)
        if fifo:
            m.type = tarfile.FIFOTYPE
        else:
            m.type, m.linkname = tarfile.LNKTYPE, linkname
        m.mode, m.mtime = 0o777, 0
        t.addfile(m)
    return buf.getvalue()


def legacy_plain():
    """An ordinary legacy (non-zip) file's first bytes: a pickle header and torch's magic number."""
    return PROTO + i(0x1950a86a20f9469cfc6c) + b"."


# --- torch.distributed.checkpoint directories ({file name: bytes}) -------------------------------
MD = "torch.distributed._shard.checkpoint.metadata"
STM = "torch.distributed._shard.sharded_tensor.metadata"
FS = "torch.distributed._shard.checkpoint.filesystem"


def obj(module, name, fields):
    """A dataclass as its pickle holds it: cls.__new__(cls) (NEWOBJ), then BUILD with a dict."""
    return glob(module, name) + b")\x81}(" + fields + b"ub"


def size(dims):
    return glob("torch", "Size") + tup([tup([i(d) for d in dims])]) + b"R"


def dcp_dir(chunks, lengths_extra=0, md=MD, stm=STM, fs=FS):
    """A DCP directory holding the float32 tensor "w" of 4 x 2 elements [0..8) in row chunks
    [(begin, end)] (one __0_<n>.distcp each, the blob after 8 bytes of padding) and the bytes item
    "step" = 7; lengths_extra is added to each chunk's recorded length."""
    files, chunk_meta, index = {}, b"", b""
    for n, (b, e) in enumerate(chunks):
        data = struct.pack("<%df" % (2 * (e - b)), *range(2 * b, 2 * e))
        blob = zip_bytes(PROTO + tensor("0", 2 * (e - b), (e - b, 2), (2, 1)) + b".", {"0": data})
        name = "__0_%d.distcp" % n
        files[name] = b"\0" * 8 + blob
        chunk_meta += obj(md, "ChunkStorageMetadata", s("offsets") + size((b, 0)) + s("sizes") + size((e - b, 2)))
        index += obj(md, "MetadataIndex", s("fqn") + s("w") + s("offset") + size((b, 0)) + s("index") + i(n))
        index += obj(fs, "_StorageInfo", s("relative_path") + s(name) + s("offset") + i(8) + s("length") +
                     i(len(blob) + lengths_extra))
    step = zip_bytes(PROTO + i(7) + b".", {})
    files["__1_0.distcp"] = step
    index += obj(md, "MetadataIndex", s("fqn") + s("step") + s("offset") + b"N" + s("index") + b"N")
    index += obj(fs, "_StorageInfo", s("relative_path") + s("__1_0.distcp") + s("offset") + i(0) + s("length") +
                 i(len(step)))
    props = obj(stm, "TensorProperties", s("dtype") + glob("torch", "float32"))
    tsm = obj(md, "TensorStorageMetadata", s("properties") + props + s("size") + size((4, 2)) + s("chunks") +
              b"](" + chunk_meta + b"e")
    meta = obj(md, "Metadata", s("state_dict_metadata") + b"}(" + s("w") + tsm + s("step") +
               obj(md, "BytesStorageMetadata", b"") + b"u" + s("planner_data") + b"N" + s("storage_data") +
               b"}(" + index + b"u")
    files[".metadata"] = PROTO + meta + b"."
    return files


def dcp_newer_paths():
    """The same directory with torch >= 2.0's class paths (torch.distributed.checkpoint.*)."""
    return dcp_dir([(0, 1), (1, 4)], md="torch.distributed.checkpoint.metadata",
                   stm="torch.distributed.checkpoint.metadata", fs="torch.distributed.checkpoint.filesystem")


def dcp_disallowed_class():
    files = dcp_dir([(0, 4)])
    files[".metadata"] = PROTO + glob("posix", "system") + tup([s("true")]) + b"R."
    return files


def dcp_many_chunks(n=4096):
    """A (n,) float32 tensor declared as n one-element chunks and no storage entries: refused at the
    first missing entry, after the overlap check (pairwise, it took over 20 s; tests/test_dcp_fuzz.py)."""
    chunk_meta = b"".join(obj(MD, "ChunkStorageMetadata", s("offsets") + size((k,)) + s("sizes") + size((1,)))
                          for k in range(n))
    props = obj(STM, "TensorProperties", s("dtype") + glob("torch", "float32"))
    tsm = obj(MD, "TensorStorageMetadata", s("properties") + props + s("size") + size((n,)) + s("chunks") +
              b"](" + chunk_meta + b"e")
    meta = obj(MD, "Metadata", s("state_dict_metadata") + b"}(" + s("w") + tsm + b"u" + s("planner_data") + b"N" +
               s("storage_data") + b"}")
    return {".metadata": PROTO + meta + b"."}


def dcp_empty_huge_dim():
    """"w" declared of size (0, 10**20) in one empty chunk whose blob is a 4 x 2 tensor: numpy cannot
    allocate that shape even empty (it was an internal error, ValueError)."""
    files = dcp_dir([(0, 4)])
    old = size((4, 2)) + s("chunks") + b"](" + obj(MD, "ChunkStorageMetadata", s("offsets") + size((0, 0)) +
                                                  s("sizes") + size((4, 2)))
    new = size((0, 10 ** 20)) + s("chunks") + b"](" + obj(MD, "ChunkStorageMetadata", s("offsets") + size((0, 0)) +
                                                         s("sizes") + size((0, 10 ** 20)))
    assert old in files[".metadata"]
    files[".metadata"] = files[".metadata"].replace(old, new)
    return files


def dcp_class_name_with_cr():
    """A class name holding a carriage return: its refusal must stay one line (it was two)."""
    files = dcp_dir([(0, 4)])
    files[".metadata"] = PROTO + glob("posix", "sys\rtem") + tup([s("true")]) + b"R."
    return files


def zip_class_name_with_newline():
    """STACK_GLOBAL of a module named "posix\\nfake": the refusal quotes it on one line."""
    return zip_bytes(state(b"X" + struct.pack("<I", 10) + b"posix\nfake" + s("system") + b"\x93" + tup([s("true")]) + b"R"),
                     {})


def bytearray8(n):
    """A protocol-5 BYTEARRAY8 opcode declaring n bytes (none follow): pickle allocates and zeroes
    n bytes before it reads them."""
    return b"\x96" + struct.pack("<Q", n)


def zip_bytearray8_huge(n=1 << 40):
    """data.pkl of {"w": bytearray of n bytes} in a 200-byte file."""
    return zip_bytes(b"\x80\x05}" + s("w") + bytearray8(n) + b"s.", {})


def dcp_bytearray8_huge(n=1 << 40):
    """A .metadata that is one BYTEARRAY8 of n bytes (found by tests/test_dcp_fuzz.py: a bit flip in
    a BINUNICODE opcode made it; under RLIMIT_AS a MemoryError, without it n bytes zeroed)."""
    files = dcp_dir([(0, 4)])
    files[".metadata"] = b"\x80\x05" + bytearray8(n) + b"."
    return files
