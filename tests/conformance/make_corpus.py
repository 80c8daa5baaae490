#!/usr/bin/python3
"""The checkpoint conformance corpus: hostile checkpoints with the verdict each
must get from BOTH readers, `resume-harness inspect` (tests/checkpoint/test_checkpoint_conformance.cpp) and
`python3 -m rhckpt` (tests/test_rhckpt_conformance.py), so that the two can never drift apart.
The rules the cases exercise are listed in docs/checkpoint-format.md; each case names its rule.

    make_corpus.py OUT [CASE...]  writes OUT/<case>/ for every case (or those named) and
                                  OUT/expected.tsv: name, exit code, rule, a substring both
                                  readers' message must hold (tab-separated)
    make_corpus.py --list         prints that table for every case

The torch_* cases (issue 41) are hostile torch.save files (tests/conformance/hostile_torch.py), each
as OUT/<case>/checkpoint.pt, and the dcp_* cases torch.distributed.checkpoint directories
(OUT/<case>/.metadata, *.distcp; issue 43): the tool's own readers refuse the directory (R1, no
manifest.json, exit 2), and OUT/expected_bridge.tsv (name, exit code, a substring of the one-line
message, the input: checkpoint.pt or . for the directory) holds the verdict of the third reader,
python/rhckpt/torch_bridge.py (tests/test_torch_bridge.py), which must also write nothing into
the case's directory.

Every case starts from one of two tiny checkpoints the tool wrote (base/plain_dp2, base/zstd_dp2:
two data-parallel ranks, a 1-layer model of width 8; regenerate them as base/README.md says after a
format change), applies one change and, unless the case is about a checksum, RESEALS what it
changed (file sizes, whole-file, block and header XXH3-64 in the manifest, the manifest's sidecar),
so that the rule under test, not a checksum, is what must refuse it. Deterministic: the same
bytes every run. Needs no numpy: Python with Debian's python3-xxhash and python3-zstandard.
"""
import json
import os
import shutil
import struct
import sys

import xxhash
import zstandard

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hostile_torch as ht  # noqa: E402
BASES = ("plain_dp2", "zstd_dp2")
SHARD0, SHARD1, MODEL = "optim_rank_00000.safetensors", "optim_rank_00001.safetensors", "model.safetensors"
SPLIT = "layers.0.moe.experts.0.fc1.weight"   # the param whose optimizer state both ranks share
BLOCK = 1 << 20                               # the codec's raw bytes per block (compress.h)


def h64(b):
    return xxhash.xxh3_64_hexdigest(b)


# ---- reading and rewriting one checkpoint directory -------------------------------------------
class Ckpt:
    def __init__(self, d):
        self.d = d
        with open(os.path.join(d, "manifest.json"), "rb") as f:
            self.m = json.loads(f.read())

    def path(self, name):
        return os.path.join(self.d, name)

    def file_entry(self, name):
        return next(f for f in self.m["files"] if f["name"] == name)

    def read_st(self, name):
        """(header dict, data bytes) of a safetensors file."""
        with open(self.path(name), "rb") as f:
            b = f.read()
        (n,) = struct.unpack("<Q", b[:8])
        return json.loads(b[8:8 + n]), b[8 + n:]

    def write_st(self, name, header, blobs):
        """Writes header (data_offsets recomputed) and blobs {key: bytes} in the header's order."""
        out, at = [], 0
        for k, e in header.items():
            if k == "__metadata__":
                continue
            e["data_offsets"] = [at, at + len(blobs[k])]
            at += len(blobs[k])
            out.append(blobs[k])
        text = json.dumps(header, separators=(",", ":"))
        text += " " * ((8 - len(text) % 8) % 8)
        with open(self.path(name), "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text.encode() + b"".join(out))

    def blobs(self, header, data):
        return {k: data[e["data_offsets"][0]:e["data_offsets"][1]] for k, e in header.items() if k != "__metadata__"}

    def reseal_file(self, name):
        """The manifest's entry of a changed file: size, XXH3-64 whole and per block, header."""
        e = self.file_entry(name)
        with open(self.path(name), "rb") as f:
            b = f.read()
        e["bytes"], e["xxh3"] = len(b), h64(b)
        n = struct.unpack("<Q", b[:8])[0] if len(b) >= 8 else 0
        e["header_bytes"] = min(8 + n, len(b))   # the schema bounds it by bytes
        if "block_bytes" in e:
            bb = e["block_bytes"]
            e["block_xxh3"] = [h64(b[i:i + bb]) for i in range(0, max(len(b), 1), bb)]
        if "compress" in e:
            e["header_xxh3"] = h64(b[:e["header_bytes"]])
            e["stored_bytes"] = len(b) - e["header_bytes"]

    def save(self, reseal=True):
        text = json.dumps(self.m, indent=1).encode() + b"\n"
        with open(self.path("manifest.json"), "wb") as f:
            f.write(text)
        if reseal:
            with open(self.path("manifest.json.xxh3"), "w") as f:
                f.write(h64(text) + "\n")

    def ranges(self, rank):
        return next(s for s in self.m["shards"] if s["dp_rank"] == rank)["param_ranges"]

    def split_range(self, rank):
        return next(r for r in self.ranges(rank) if r["param"] == SPLIT)

    def rh_table(self, name):
        header, data = self.read_st(name)
        return header, data, json.loads(header["__metadata__"]["rh_tensors"])

    def write_table(self, name, header, blobs, table, **meta):
        header["__metadata__"]["rh_tensors"] = json.dumps(table, separators=(",", ":"))
        header["__metadata__"].update(meta)
        self.write_st(name, header, blobs)
        self.reseal_file(name)


# ---- the mutations ----------------------------------------------------------------------------
def shard_overlap(c):
    c.split_range(1)["begin"] -= 1


def shard_gap(c):
    c.split_range(1)["begin"] += 1


def shard_range_removed(c):
    c.ranges(1).remove(c.split_range(1))


def shard_removed(c):
    c.m["shards"] = [s for s in c.m["shards"] if s["dp_rank"] != 1]


def shard_boundary_moved(c):
    """Both ranges still tile the param (and flat_begin follows), but the tensors keep their sizes."""
    c.split_range(0)["end"] += 1
    c.split_range(1)["begin"] += 1
    c.split_range(1)["flat_begin"] += 1


def shard_files_swapped(c):
    a, b = c.m["shards"]
    a["file"], b["file"] = b["file"], a["file"]


def shards_one_file(c):
    c.m["shards"][1]["file"] = c.m["shards"][0]["file"]


def shard_unknown_param(c):
    c.split_range(1)["param"] = "no.such.param"


def shard_two_ranges_of_param(c):
    c.ranges(0).append(dict(c.split_range(0)))


def dp_size_three(c):
    c.m["dp_size"] = 3


def listed_compressed_but_plain(c):
    e = c.file_entry(SHARD0)
    e.update(compress="zstd", header_xxh3="0" * 16, raw_bytes=e["bytes"], stored_bytes=e["bytes"])
    c.reseal_file(SHARD0)


def compressed_but_listed_plain(c):
    e = c.file_entry(SHARD0)
    for k in ("compress", "header_xxh3", "raw_bytes", "stored_bytes"):
        del e[k]


def _replace_plane(c, name, make):
    """Rewrites the first tensor's first block with planes make(planes) -> (modes, [bytes])."""
    header, data, table = c.rh_table(name)
    blobs = c.blobs(header, data)
    key = sorted(table)[0]
    t = table[key]
    modes, sizes, _, h_raw = t["blocks"][0]
    blob, planes, at = blobs[key], [], 0
    for s in sizes:
        planes.append(blob[at:at + s])
        at += s
    new_modes, new_planes = make(modes, planes, t)
    stored = b"".join(new_planes)
    t["blocks"][0] = [new_modes, [len(p) for p in new_planes], h64(stored), h_raw]
    blobs[key] = stored + blob[at:]
    header[key]["shape"] = [len(blobs[key])]
    for e in c.m["tensors"]:
        if e["file"] == name and e["key"] == key:
            e["stored_bytes"] = len(blobs[key])
    c.write_table(name, header, blobs, table)


def _plane_values(modes, planes, t):
    n = t["raw_bytes"] // len(modes) if len(t["blocks"]) == 1 else BLOCK // len(modes)
    return [zstandard.ZstdDecompressor().decompress(p, max_output_size=n) if m == "z" else p
            for m, p in zip(modes, planes)]


def zstd_without_content_size(c):
    def make(modes, planes, t):
        raw = _plane_values(modes, planes, t)
        z = zstandard.ZstdCompressor(level=1, write_content_size=False)
        return "z" * len(raw), [z.compress(p) for p in raw]
    _replace_plane(c, SHARD0, make)


def zstd_corrupt_frame(c):
    def make(modes, planes, t):
        raw = _plane_values(modes, planes, t)
        frame = bytearray(zstandard.ZstdCompressor(level=1).compress(raw[-1]))
        frame[len(frame) // 2:] = b"\xff" * (len(frame) - len(frame) // 2)   # garbage after the frame header
        return modes[:-1] + "z", planes[:-1] + [bytes(frame)]
    _replace_plane(c, SHARD0, make)


def zstd_frame_too_long(c):
    def make(modes, planes, t):
        raw = _plane_values(modes, planes, t)
        return modes[:-1] + "z", planes[:-1] + [zstandard.ZstdCompressor(level=1).compress(raw[-1] + b"\0")]
    _replace_plane(c, SHARD0, make)


def zstd_unknown_plane_mode(c):
    _replace_plane(c, SHARD0, lambda modes, planes, t: (modes[:-1] + "x", planes))


def rh_block_bytes(value):
    def mutate(c):
        header, data, table = c.rh_table(SHARD0)
        c.write_table(SHARD0, header, c.blobs(header, data), table, rh_block_bytes=value)
    return mutate


def unknown_codec(c):
    header, data, table = c.rh_table(SHARD0)
    c.write_table(SHARD0, header, c.blobs(header, data), table, rh_codec="byteplane-zstd/2")


def rh_tensors_not_json(c):
    header, data = c.read_st(SHARD0)
    header["__metadata__"]["rh_tensors"] = "{not json"
    c.write_st(SHARD0, header, c.blobs(header, data))
    c.reseal_file(SHARD0)


def zstd_bomb(c):
    """A tensor the manifest says has 512 bytes, whose table says 256 MiB of zeros (1 MiB blocks of
    one zstd frame each, ~13 KB on disk): refused before anything is decoded."""
    header, data, table = c.rh_table(SHARD0)
    blobs = c.blobs(header, data)
    key = sorted(table)[0]
    raw_bytes = 256 << 20
    frame = zstandard.ZstdCompressor(level=19).compress(b"\0" * BLOCK)
    hz = h64(b"\0" * BLOCK)
    nblocks = raw_bytes // BLOCK
    table[key] = {"blocks": [["z", [len(frame)], h64(frame), hz]] * nblocks, "dtype": "U8",
                  "raw_bytes": raw_bytes, "shape": [raw_bytes]}
    blobs[key] = frame * nblocks
    header[key]["shape"] = [len(blobs[key])]
    for e in c.m["tensors"]:
        if e["file"] == SHARD0 and e["key"] == key:
            e["stored_bytes"] = len(blobs[key])
    c.write_table(SHARD0, header, blobs, table)


def zstd_bomb_manifest_agrees(c):
    """The 64 MiB zero bomb with the manifest resealed to AGREE with the table (dtype, shape, bytes,
    stored bytes): only the manifest's own layout (the shard range of that state's param, 128
    elements) tells that it cannot be; refused before anything is decoded."""
    header, data, table = c.rh_table(SHARD0)
    blobs = c.blobs(header, data)
    key = sorted(table)[0]
    raw_bytes = 64 << 20
    frame = zstandard.ZstdCompressor(level=19).compress(b"\0" * BLOCK)
    nblocks = raw_bytes // BLOCK
    entry = next(e for e in c.m["tensors"] if e["file"] == SHARD0 and e["key"] == key)
    table[key] = {"blocks": [["z", [len(frame)], h64(frame), h64(b"\0" * BLOCK)]] * nblocks, "dtype": entry["dtype"],
                  "raw_bytes": raw_bytes, "shape": [raw_bytes // 4]}
    blobs[key] = frame * nblocks
    header[key]["shape"] = [len(blobs[key])]
    entry.update(shape=[raw_bytes // 4], numel=raw_bytes // 4, bytes=raw_bytes, stored_bytes=len(blobs[key]))
    c.write_table(SHARD0, header, blobs, table)


def whole_file_hash_differs_from_its_one_block(c):
    """A one-block file whose whole-file XXH3-64 in the manifest is not its block's (resealed)."""
    e = c.file_entry(SHARD1)
    e["xxh3"] = "%016x" % (int(e["xxh3"], 16) ^ 1)


def table_disagrees_with_manifest(c):
    """rh_tensors says I32 where the manifest says F32 (same shape, bytes and blocks)."""
    header, data, table = c.rh_table(SHARD0)
    table[sorted(table)[0]]["dtype"] = "I32"
    c.write_table(SHARD0, header, c.blobs(header, data), table)


def link_outside(name):
    def mutate(c):
        outside = os.path.join(os.path.dirname(c.d), "outside." + os.path.basename(c.d))
        os.makedirs(outside, exist_ok=True)
        shutil.move(c.path(name), os.path.join(outside, name))
        os.symlink(os.path.join(outside, name), c.path(name))
    return mutate


def manifest_200mb(c):
    """200 MB (a sparse file: the cap refuses it by its size, before reading it)."""
    with open(c.path("manifest.json"), "r+b") as f:
        f.truncate(200 * 1000 * 1000)


def step_edited_unsealed(c):
    c.m["optimizer"]["groups"][0]["step"] -= 1


def rng_digit_edited_unsealed(c):
    s = c.m["train_state"]["rng_states"]["dropout"]
    c.m["train_state"]["rng_states"]["dropout"] = s[:40] + ("0" if s[40] != "0" else "1") + s[41:]


def sidecar_missing(c):
    os.remove(c.path("manifest.json.xxh3"))


def sidecar_upper_case(c):
    with open(c.path("manifest.json.xxh3")) as f:
        s = f.read()
    with open(c.path("manifest.json.xxh3"), "w") as f:
        f.write(s.upper())


def set_field(pathspec, value):
    """pathspec: keys and indices from the manifest's root, e.g. ("optimizer", "groups", 0, "step")."""
    def mutate(c):
        node = c.m
        for k in pathspec[:-1]:
            node = node[k]
        if value is DELETE:
            del node[pathspec[-1]]
        else:
            node[pathspec[-1]] = value
    return mutate


DELETE = object()


def rng_bytes(hexstr, where=("train_state",)):
    def mutate(c):
        node = c.m
        for k in where:
            node = node[k]
        node["rng_states"]["dropout"] = hexstr
    return mutate


def rng_unseeded(c):
    s = c.m["train_state"]["rng_states"]["dropout"]
    c.m["train_state"]["rng_states"]["dropout"] = s[:24] + "00000000" + s[32:]   # seeded = 0


def file_missing(c):
    os.remove(c.path(SHARD1))


def file_truncated(c):
    with open(c.path(SHARD1), "r+b") as f:
        f.truncate(os.path.getsize(c.path(SHARD1)) - 1)


def byte_flipped(c):
    with open(c.path(MODEL), "r+b") as f:
        f.seek(-1, 2)
        b = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([b[0] ^ 1]))


def tensor_dropped_from_manifest(c):
    c.m["tensors"] = [t for t in c.m["tensors"] if not (t["file"] == SHARD1 and t["key"] == SPLIT + "/exp_avg")]


def tensor_dtype_in_manifest(c):
    t = next(t for t in c.m["tensors"] if t["file"] == MODEL)
    t["dtype"] = "F16"


def extra_tensor_in_file(c):
    header, data = c.read_st(MODEL)
    blobs = c.blobs(header, data)
    header["zzz.extra"] = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    blobs["zzz.extra"] = b"\0\0\0\0"
    c.write_st(MODEL, header, blobs)
    c.reseal_file(MODEL)


def safetensors_overlap(c):
    """The second tensor's data_offsets moved onto the first's bytes (same length)."""
    header, data = c.read_st(MODEL)
    keys = [k for k in header if k != "__metadata__"]
    a, b = header[keys[0]]["data_offsets"], header[keys[1]]["data_offsets"]
    header[keys[1]]["data_offsets"] = [a[0], a[0] + b[1] - b[0]]
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    with open(c.path(MODEL), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text.encode() + data)
    c.reseal_file(MODEL)


def manifest_text(text):
    def mutate(c):
        with open(c.path("manifest.json"), "wb") as f:
            f.write(text)
        with open(c.path("manifest.json.xxh3"), "w") as f:
            f.write(h64(text) + "\n")
    return mutate


def duplicate_key(c):
    """group 0's step named twice, the second 1 (the last wins in a lenient parser), resealed."""
    text = json.dumps(c.m, indent=1)
    at = text.index('"step": ') + len('"step": ')
    end = text.index("\n", at)
    text = text[:end] + ',\n    "step": 1' + text[end:]
    manifest_text(text.encode() + b"\n")(c)


def pointer(text):
    """The case is a checkpoint ROOT: its pointer file holds text, the iteration dir is iter_0000002."""
    def mutate(c):
        root = c.d + ".root"
        os.rename(c.d, root)
        os.makedirs(c.d)
        os.rename(root, os.path.join(c.d, "iter_0000002"))
        with open(os.path.join(c.d, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(text)
    return mutate


def empty_dir(c):
    shutil.rmtree(c.d)
    os.makedirs(c.d)


def no_such_path(c):
    shutil.rmtree(c.d)


# name, base, mutation, reseal the manifest?, expected exit (0 accept, 1 damaged, 2 not a
# checkpoint), a substring both readers' message holds, the rule in docs/checkpoint-format.md.
P, Z = "plain_dp2", "zstd_dp2"
CASES = [
    ("accept_plain_dp2", P, None, True, 0, "", "R0"),
    ("accept_zstd_dp2", Z, None, True, 0, "", "R0"),
    ("accept_root_pointer", P, pointer("2\n"), True, 0, "", "R2"),
    # a CUDA generator's 16-byte state: a reader accepts it (R11); a CPU run's load refuses it
    # before reporting the load (test_cli_errors HostileLoad.*)
    ("accept_cuda_rank_state", P, rng_bytes("00" * 16, ("rank_states", 1)), True, 0, "", "R11"),
    # not a checkpoint at all
    ("no_such_path", P, no_such_path, False, 2, "no such file or directory", "R1"),
    ("empty_directory", P, empty_dir, False, 2, "neither a checkpoint directory", "R1"),
    # the pointer
    ("pointer_not_a_number", P, pointer("two\n"), True, 1, "expected an iteration number", "R2"),
    ("pointer_names_missing_iteration", P, pointer("7\n"), True, 1, "has no manifest.json", "R2"),
    # the manifest's own checksum, size, links
    ("manifest_step_edited_unsealed", P, step_edited_unsealed, False, 1, "the manifest is corrupted", "R3"),
    ("manifest_rng_digit_edited_unsealed", P, rng_digit_edited_unsealed, False, 1, "the manifest is corrupted", "R3"),
    ("manifest_sidecar_missing", P, sidecar_missing, False, 1, "manifest.json.xxh3: missing", "R3"),
    ("manifest_sidecar_upper_case", P, sidecar_upper_case, False, 1, "expected 16 lower-case hex digits", "R3"),
    ("manifest_200mb", P, manifest_200mb, False, 1, "more than the 67108864-byte limit", "R4"),
    ("manifest_symlink_outside", P, link_outside("manifest.json"), False, 1, "symbolic link", "R5"),
    ("manifest_not_json", P, manifest_text(b"{\"format\": "), False, 1, "manifest.json", "R4"),
    ("manifest_duplicate_key", P, duplicate_key, False, 1, "duplicate key 'step' in one object", "R4"),
    ("manifest_nested_100000", P, manifest_text(b"[" * 100000 + b"]" * 100000), False, 1, "nest", "R4"),
    # the schema
    ("schema_format_version_2", P, set_field(("format_version",), 2), True, 1, "field /format_version", "R6"),
    ("schema_files_not_a_list", P, set_field(("files",), {"name": MODEL}), True, 1, "field /files", "R6"),
    ("schema_file_bytes_string", P, set_field(("files", 0, "bytes"), "4556"), True, 1, "field /files/0/bytes", "R6"),
    ("schema_files_missing", P, set_field(("files",), DELETE), True, 1, "field /files", "R6"),
    ("schema_block_bytes_zero", P, set_field(("files", 0, "block_bytes"), 0), True, 1, "field /files/0/block_bytes", "R7"),
    ("schema_block_bytes_100", P, set_field(("files", 0, "block_bytes"), 100), True, 1, "field /files/0/block_bytes", "R7"),
    ("schema_block_count_wrong", P, set_field(("files", 0, "block_xxh3"), []), True, 1, "field /files/0/block_xxh3", "R7"),
    ("schema_rng_not_hex", P, rng_bytes("zz"), True, 1, "field /train_state/rng_states/dropout", "R6"),
    ("schema_iteration_differs", P, set_field(("train_state", "iteration"), 1), True, 1, "field /train_state/iteration", "R8"),
    # the listed files
    ("file_name_escapes", P, set_field(("files", 0, "name"), "../model.safetensors"), True, 1, "not a plain file name", "R5"),
    ("file_listed_twice", P, lambda c: c.m["files"].append(dict(c.m["files"][0])), True, 1, "listed twice", "R5"),
    ("file_missing", P, file_missing, True, 1, "missing", "R5"),
    ("file_symlink_outside", P, link_outside(MODEL), True, 1, "symbolic link", "R5"),
    ("file_hash_not_its_one_block", P, whole_file_hash_differs_from_its_one_block, True, 1,
     "they are the same hash", "R7"),
    ("file_truncated", P, file_truncated, False, 1, "(truncated)", "R7"),
    ("file_byte_flipped", P, byte_flipped, False, 1, "XXH3-64 checksum", "R7"),
    ("safetensors_overlap", P, safetensors_overlap, True, 1, MODEL, "R9"),
    ("tensor_not_in_manifest", P, tensor_dropped_from_manifest, True, 1, "is not in the manifest", "R10"),
    ("tensor_extra_in_file", P, extra_tensor_in_file, True, 1, "'zzz.extra' is not in the manifest", "R10"),
    ("tensor_dtype_differs", P, tensor_dtype_in_manifest, True, 1, "manifest says", "R10"),
    ("tensor_stored_bytes_differs", P, set_field(("tensors", 0, "stored_bytes"), 1 << 40), True, 1,
     "bytes in the file, manifest says 1099511627776", "R10"),
    # counters and generators
    ("counter_group_step_differs", P, set_field(("optimizer", "groups", 0, "step"), 1), True, 1, "field /optimizer/groups/1/step", "R8"),
    ("counter_group_step_beyond", P, lambda c: [g.update(step=3) for g in c.m["optimizer"]["groups"]], True, 1,
     "field /optimizer/groups/0/step", "R8"),
    ("counter_consumed_samples", P, set_field(("train_state", "consumed_samples"), 31), True, 1,
     "field /train_state/consumed_samples", "R8"),
    ("counter_scheduler_steps", P, set_field(("train_state", "opt_param_scheduler", "num_steps"), 16), True, 1,
     "field /train_state/opt_param_scheduler/num_steps", "R8"),
    ("rng_empty_train_state", P, rng_bytes(""), True, 1, "field /train_state/rng_states/dropout", "R11"),
    ("rng_one_byte_rank_state", P, rng_bytes("00", ("rank_states", 1)), True, 1, "field /rank_states/1/rng_states/dropout", "R11"),
    ("rng_unseeded", P, rng_unseeded, True, 1, "field /train_state/rng_states/dropout", "R11"),
    ("rank_state_rank_beyond_dp_size", P, set_field(("rank_states", 1, "dp_rank"), 2), True, 1, "field /rank_states/1/dp_rank", "R11"),
    ("rank_state_rank_twice", P, set_field(("rank_states", 1, "dp_rank"), 0), True, 1, "field /rank_states/1/dp_rank", "R11"),
    # the shards
    ("shard_ranges_overlap", P, shard_overlap, True, 1, "exactly once", "R12"),
    ("shard_ranges_gap", P, shard_gap, True, 1, "exactly once", "R12"),
    ("shard_range_missing", P, shard_range_removed, True, 1, "the shards hold elements [0, 68)", "R12"),
    ("shard_removed_from_manifest", P, shard_removed, True, 1, "the shards hold elements", "R12"),
    ("shard_boundary_moved_by_one", P, shard_boundary_moved, True, 1, "its shard's range", "R13"),
    ("shard_files_swapped", P, shard_files_swapped, True, 1, "shard files swapped or renamed", "R13"),
    ("shards_name_one_file", P, shards_one_file, True, 1, "is named by two shards", "R13"),
    ("shard_unknown_param", P, shard_unknown_param, True, 1, "which the model does not have", "R12"),
    ("shard_two_ranges_of_a_param", P, shard_two_ranges_of_param, True, 1, "exactly once", "R12"),
    ("shard_flat_begin_off_by_one", P, lambda c: c.split_range(1).update(flat_begin=c.split_range(1)["flat_begin"] + 1),
     True, 1, "field /shards/1/param_ranges/0/flat_begin", "R13"),
    ("shard_dp_size_three", P, dp_size_three, True, 1, "dp_size is 3", "R13"),
    ("shard_dp_size_one", P, set_field(("dp_size",), 1), True, 1, "is not below dp_size 1", "R11"),
    # compression
    ("zstd_listed_compressed_but_plain", P, listed_compressed_but_plain, True, 1, "the manifest says compressed", "R14"),
    ("zstd_compressed_but_listed_plain", Z, compressed_but_listed_plain, True, 1, "the manifest does not say so", "R14"),
    ("zstd_frame_without_content_size", Z, zstd_without_content_size, True, 1, "is not one zstd frame of", "R15"),
    ("zstd_frame_one_byte_long", Z, zstd_frame_too_long, True, 1, "is not one zstd frame of", "R15"),
    ("zstd_corrupt_frame", Z, zstd_corrupt_frame, True, 1, "compressed block 0 of 1", "R15"),
    ("zstd_unknown_plane_mode", Z, zstd_unknown_plane_mode, True, 1, "unknown plane mode 'x'", "R15"),
    ("zstd_block_bytes_4096", Z, rh_block_bytes("4096"), True, 1, "rh_block_bytes must be 1048576", "R15"),
    ("zstd_block_bytes_zero", Z, rh_block_bytes("0"), True, 1, "rh_block_bytes must be 1048576", "R15"),
    ("zstd_unknown_codec", Z, unknown_codec, True, 1, "is not byteplane-zstd/1", "R15"),
    ("zstd_table_not_json", Z, rh_tensors_not_json, True, 1, "rh_tensors", "R15"),
    ("zstd_table_disagrees_with_manifest", Z, table_disagrees_with_manifest, True, 1, "manifest says F32", "R16"),
    ("zstd_bomb_256mib", Z, zstd_bomb, True, 1, "manifest says", "R16"),
    ("zstd_bomb_manifest_agrees", Z, zstd_bomb_manifest_agrees, True, 1,
     "its shard's range; refused before decoding", "R16"),
]


# (name, maker(case dir) -> bytes, the bridge's exit code, a substring of its one-line message)
LEGACY = "a legacy (torch < 1.6"
TORCH_CASES = [
    ("torch_valid_zip", lambda d: ht.zip_valid(), 0, ""),
    ("torch_legacy_dump_patches", lambda d: ht.legacy_dump_patches(os.path.join(os.path.abspath(d), "pwned")), 2,
     LEGACY + ", non-zip pickle format)"),
    ("torch_legacy_tar_hard_link", lambda d: ht.legacy_tar("storages", os.path.join(os.path.abspath(d), "victim")), 2,
     LEGACY + ", tar format)"),
    ("torch_legacy_tar_fifo", lambda d: ht.legacy_tar("storages", fifo=True), 2, LEGACY + ", tar format)"),
    ("torch_legacy_plain", lambda d: ht.legacy_plain(), 2, LEGACY + ", non-zip pickle format)"),
    ("torch_storage_oversize", lambda d: ht.zip_oversize_storage(), 2, "declares 4096 float32 elements (16384 bytes)"),
    ("torch_storage_2e30", lambda d: ht.zip_huge_storage(), 2, "declares 1073741824 float32 elements"),
    ("torch_tensor_past_storage", lambda d: ht.zip_tensor_past_storage(), 2, "reaches element 8 of a 4-element storage"),
    ("torch_stride0_4gib", lambda d: ht.zip_stride0(), 2, "would expand to more than 4 x the input's bytes"),
    ("torch_deflate_record", lambda d: ht.zip_deflate(), 2, "is compressed (method 8)"),
    ("torch_deep_tuple_key", lambda d: ht.zip_deep_key(), 2, "nested deeper than 100 levels"),
    ("torch_build_on_class", lambda d: ht.zip_build_on_class(), 2, "sets the state of the class Namespace"),
    ("torch_build_on_dtype", lambda d: ht.zip_dtype_mutation(), 2, "sets the state of a DType"),
    ("torch_os_system", lambda d: ht.zip_system(), 2, "refused to unpickle posix.system"),
    ("dcp_valid_two_chunks", lambda d: ht.dcp_dir([(0, 1), (1, 4)]), 0, ""),
    ("dcp_newer_class_paths", lambda d: ht.dcp_newer_paths(), 0, ""),
    ("dcp_chunk_past_its_file", lambda d: ht.dcp_dir([(0, 2), (2, 4)], lengths_extra=1), 2, "past its end"),
    ("dcp_chunks_overlap", lambda d: ht.dcp_dir([(0, 3), (2, 4)]), 2, "overlap"),
    ("dcp_chunks_leave_a_gap", lambda d: ht.dcp_dir([(0, 1), (2, 4)]), 2, "cover 6 of its 8 elements"),
    ("dcp_disallowed_class", lambda d: ht.dcp_disallowed_class(), 2, ".metadata: refused to unpickle posix.system"),
    # found by tests/test_dcp_fuzz.py: a hang (> 20 s), an internal error, a refusal on two lines,
    # memory taken on a pickle's word (BYTEARRAY8)
    ("dcp_4096_one_element_chunks", lambda d: ht.dcp_many_chunks(), 2, "'w' chunk at (0,) has no storage entry"),
    ("dcp_empty_tensor_huge_dim", lambda d: ht.dcp_empty_huge_dim(), 2,
     "the chunk at (0, 0) is not a torch.float32 tensor of size (0, 100000000000000000000)"),
    ("dcp_class_name_with_cr", lambda d: ht.dcp_class_name_with_cr(), 2, "refused to unpickle posix.sys\\x0dtem"),
    ("torch_class_name_with_newline", lambda d: ht.zip_class_name_with_newline(), 2,
     "refused to unpickle posix\\x0afake.system"),
    ("dcp_bytearray8_1tib", lambda d: ht.dcp_bytearray8_huge(), 2, "a BYTEARRAY8 of 1099511627776 bytes in a 12-byte"),
    ("torch_bytearray8_1tib", lambda d: ht.zip_bytearray8_huge(), 2, "a BYTEARRAY8 of 1099511627776 bytes in a 20-byte"),
]


def build_torch(out, name, maker):
    d = os.path.join(out, name)
    os.makedirs(d)
    if name == "torch_legacy_tar_hard_link":
        with open(os.path.join(d, "victim"), "w") as f:
            f.write("the hard link's target; its mode must stay 0644\n")
        os.chmod(os.path.join(d, "victim"), 0o644)
    made = maker(d)
    for name, blob in (made.items() if isinstance(made, dict) else [("checkpoint.pt", made)]):
        with open(os.path.join(d, name), "wb") as f:
            f.write(blob)
    return "." if isinstance(made, dict) else "checkpoint.pt"


def build(out, name, base, mutate, reseal):
    """Copies the base, applies the mutation, and writes the manifest back (resealed unless the case
    is an edit the sidecar must catch) when the mutation changed it."""
    d = os.path.join(out, name)
    shutil.copytree(os.path.join(HERE, "base", base), d)
    c = Ckpt(d)
    before = json.dumps(c.m, sort_keys=True)
    if mutate is not None:
        mutate(c)
    if json.dumps(c.m, sort_keys=True) != before:
        c.save(reseal=reseal)


def main(argv):
    if argv == ["--list"]:
        for name, _, _, _, code, reason, rule in CASES:
            print("%s\t%d\t%s\t%s" % (name, code, rule, reason))
        for name, _, _, _ in TORCH_CASES:
            print("%s\t2\tR1\tno manifest.json" % name)
        return 0
    if not argv or argv[0].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out, only = argv[0], set(argv[1:])
    names = [c[0] for c in CASES] + [c[0] for c in TORCH_CASES]
    assert len(names) == len(set(names)), "case names must be unique"
    unknown = only - set(names)
    if unknown:
        print("make_corpus.py: no case named %s" % ", ".join(sorted(unknown)), file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "expected.tsv"), "w") as f:
        for name, base, mutate, reseal, code, reason, rule in CASES:
            if only and name not in only:
                continue
            build(out, name, base, mutate, reseal)
            f.write("%s\t%d\t%s\t%s\n" % (name, code, rule, reason))
        with open(os.path.join(out, "expected_bridge.tsv"), "w") as fb:
            for name, maker, code, reason in TORCH_CASES:
                if only and name not in only:
                    continue
                what = build_torch(out, name, maker)
                f.write("%s\t2\tR1\tno manifest.json\n" % name)   # the tool's readers: not a checkpoint directory
                fb.write("%s\t%d\t%s\t%s\n" % (name, code, reason, what))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
