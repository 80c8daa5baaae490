"""The checkpoint format's rules that need no tensor data, as the tool checks them (the list is
docs/checkpoint-format.md; tests/conformance holds a case for each): the manifest's schema
(parse_manifest_text in harness/checkpoint/manifest_reader.cpp), its counters (check_counters),
the generator states, the shard index (shard_index in manifest.cpp) and the shard files
(check_shard_files in load.cpp). Each refusal is Damaged naming the manifest and the JSON field.
"""
import re

from .errors import Damaged
from .guard import Field, quote

FORMAT_NAME = "resume-harness-checkpoint"
FORMAT_VERSION = 3
MAX_COUNTER = 1 << 40                      # kMaxCounter
MIN_BLOCK_BYTES, MAX_BLOCK_BYTES = 4096, 1 << 40
STATE_KINDS = ("master_param", "remainder", "exp_avg", "exp_avg_sq")
_HEX = re.compile(r"^[0-9a-fA-F]*$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")


def hex_string(f, exact_len=0):
    s = f.str()
    if exact_len and len(s) != exact_len:
        f.fail("expected %d hex digits, got '%s'" % (exact_len, quote(s)))
    if len(s) % 2:
        f.fail("expected hex digits of even length, got '%s'" % quote(s))
    if not _HEX.match(s):
        f.fail("expected hex digits, got '%s'" % quote(s))
    return s


def block_count(nbytes, block_bytes):
    return -(-nbytes // block_bytes)


def check_schema(j, path):
    """Every field the readers use: present, of its type, in its range (parse_manifest_text)."""
    m = Field(j, path)
    if not isinstance(j, dict) or j.get("format") != FORMAT_NAME:
        raise Damaged(path, "not a %s manifest" % FORMAT_NAME)
    ver = m["format_version"].i64()
    if ver != FORMAT_VERSION:
        m["format_version"].fail("format version %d, this reader reads version %d" % (ver, FORMAT_VERSION))
    iteration = m["iteration"].i64(0, MAX_COUNTER)
    if m.has("dp_size"):
        m["dp_size"].i64(1, 4096)
    rc = m["run_config"]
    if rc.v is not None and not isinstance(rc.v, dict):
        rc.fail("expected an object or null, got " + quote(rc.v))
    m["save_policy"]["kind"].str()
    if m["save_policy"].has("compress") and m["save_policy"]["compress"].str() not in ("none", "zstd"):
        m["save_policy"]["compress"].fail("expected none or zstd, got " + quote(m["save_policy"]["compress"].v))
    for f in m["files"].each():
        f["name"].str()
        nbytes = f["bytes"].u64()
        hex_string(f["xxh3"], 16)
        f["header_bytes"].u64(nbytes)
        if f.has("block_xxh3") != f.has("block_bytes"):
            f.fail("block_xxh3 and block_bytes come together (one is missing)")
        if f.has("block_xxh3"):
            bb = f["block_bytes"].u64(MAX_BLOCK_BYTES)
            if bb < MIN_BLOCK_BYTES:
                f["block_bytes"].fail("expected at least %d, got %d" % (MIN_BLOCK_BYTES, bb))
            want = block_count(nbytes, bb)
            if f["block_xxh3"].size() != want:
                f["block_xxh3"].fail("%d block checksums, a file of %d bytes in blocks of %d needs %d"
                                     % (f["block_xxh3"].size(), nbytes, bb, want))
            for h in f["block_xxh3"].each():
                hex_string(h, 16)
            if want == 1 and f["xxh3"].v.lower() != f["block_xxh3"][0].v.lower():
                f["xxh3"].fail("%s, but the file is one block whose XXH3-64 (block_xxh3/0) is %s: they are the same "
                               "hash" % (f["xxh3"].v, f["block_xxh3"][0].v))
        if f.has("compress"):
            if f["compress"].v != "zstd":
                f["compress"].fail("expected \"zstd\", got " + quote(f["compress"].v))
            hex_string(f["header_xxh3"], 16)
            f["raw_bytes"].u64()
            f["stored_bytes"].u64(nbytes)
    for t in m["tensors"].each():
        for k in ("file", "key", "param", "kind", "dtype", "policy", "conversion"):
            t[k].str()
        for d in t["shape"].each():
            d.i64(0, 1 << 40)
        t["numel"].u64()
        t["bytes"].u64()
        if t.has("stored_bytes"):
            t["stored_bytes"].u64()
        t["exact"].boolean()
    for sh in m["shards"].each():
        sh["file"].str()
        for r in sh["param_ranges"].each():
            r["param"].str()
            b, e = r["begin"].i64(0, 1 << 50), r["end"].i64(0, 1 << 50)
            if e < b:
                r.fail("end %d < begin %d" % (e, b))
    o = m["optimizer"]
    for p in o["params"].each():
        p["name"].str()
    for g in o["groups"].each():
        g["name"].str()
        g["step"].i64(0, MAX_COUNTER)
    ts = m["train_state"]
    ts_iter = ts["iteration"].i64(0, MAX_COUNTER)
    if ts_iter != iteration:
        ts["iteration"].fail("%d differs from /iteration %d" % (ts_iter, iteration))
    ts["consumed_samples"].i64(0, MAX_COUNTER)
    sc = ts["opt_param_scheduler"]
    for k in ("max_lr", "min_lr", "start_wd", "end_wd"):
        sc[k].number()
    for k in ("lr_warmup_steps", "num_steps", "lr_decay_steps", "wd_incr_steps"):
        sc[k].i64(0, MAX_COUNTER)
    for k in ("lr_decay_style", "wd_incr_style"):
        sc[k].str()
    for _, v in ts["rng_states"].members():
        hex_string(v)
    if m.has("rank_states"):
        for r in m["rank_states"].each():
            r["dp_rank"].i64(0, 4095)
            for _, v in r["rng_states"].members():
                hex_string(v)
    d = m["disk"]
    d["total_bytes"].u64()
    for k in ("bytes_per_file", "bytes_per_key", "bytes_per_dtype"):
        for _, v in d[k].members():
            v.u64()
    d["num_params"].u64()
    d["bytes_per_param"].number()
    if d.has("raw_total_bytes"):
        d["raw_total_bytes"].u64()
        for _, v in d["raw_bytes_per_key"].members():
            v.u64()
        d["raw_bytes_per_param"].number()


def check_counters(j, path):
    """The counters against each other (check_counters without a resuming run's config)."""
    m = Field(j, path)
    ts = m["train_state"]
    it = ts["iteration"].i64(0, MAX_COUNTER)
    saved = m["run_config"]
    if saved.has("train") and saved["train"].has("global_batch"):
        gb = saved["train"]["global_batch"].i64(1, MAX_COUNTER)
        want = it * gb
        if want > MAX_COUNTER:
            ts["iteration"].fail("iteration %d * global_batch %d overflows" % (it, gb))
        got = ts["consumed_samples"].i64(0, MAX_COUNTER)
        if got != want:
            ts["consumed_samples"].fail("%d samples, but %d iterations of %d samples consume %d" % (got, it, gb, want))
        ns = ts["opt_param_scheduler"]["num_steps"].i64(0, MAX_COUNTER)
        if ns != want:
            ts["opt_param_scheduler"]["num_steps"].fail(
                "%d scheduler steps (samples) after %d iterations of %d samples, expected %d" % (ns, it, gb, want))
    ns = ts["opt_param_scheduler"]["num_steps"].i64(0, MAX_COUNTER)
    cs = ts["consumed_samples"].i64(0, MAX_COUNTER)
    if ns != cs:
        ts["opt_param_scheduler"]["num_steps"].fail("%d scheduler steps (samples), but consumed_samples is %d" % (ns, cs))
    first = None
    for g in m["optimizer"]["groups"].each():
        s = g["step"].i64(0, MAX_COUNTER)
        if s > it:
            g["step"].fail("step %d is more than the %d iterations run" % (s, it))
        if first is not None and s != first:
            g["step"].fail("step %d differs from group 0's step %d" % (s, first))
        if first is None:
            first = s


# A generator state is a CUDA Philox generator's (seed and offset, 16 bytes) or what
# at::CPUGeneratorImpl::set_state accepts: CPUGeneratorImplStateLegacy (5048 bytes) or
# CPUGeneratorImplState (5056), whose mt19937 part is valid: seeded, 0 < left <= 624, next <= 624
# (at::mt19937's is_valid). Layout: uint64 seed, int32 left, int32 seeded, uint64 next, state[624].
PHILOX_STATE_BYTES = 16
CPU_STATE_BYTES = (5048, 5056)
MT_N = 624


def check_generator_state(raw, field):
    n = len(raw)
    if n == PHILOX_STATE_BYTES:
        return
    ok = n in CPU_STATE_BYTES
    if ok:
        left = int.from_bytes(raw[8:12], "little", signed=True)
        seeded = int.from_bytes(raw[12:16], "little")
        nxt = int.from_bytes(raw[16:24], "little")
        ok = seeded != 0 and 0 < left <= MT_N and nxt <= MT_N
    if not ok:
        field.fail("%d bytes is not a generator state (a CPU generator's has %d, a CUDA generator's %d)"
                   % (n, CPU_STATE_BYTES[1], PHILOX_STATE_BYTES))


def check_generators(j, path):
    m = Field(j, path)
    for _, v in m["train_state"]["rng_states"].members():
        check_generator_state(bytes.fromhex(v.v), v)
    if not m.has("rank_states"):
        return
    dp_size = j.get("dp_size", 1)
    seen = set()
    for rs in m["rank_states"].each():
        r = rs["dp_rank"].i64(0, 4095)
        if r >= dp_size:
            rs["dp_rank"].fail("%d is not below dp_size %d" % (r, dp_size))
        if r in seen:
            rs["dp_rank"].fail("rank %d listed twice" % r)
        seen.add(r)
        for _, v in rs["rng_states"].members():
            check_generator_state(bytes.fromhex(v.v), v)


def shard_file_name(rank):
    return "optim_rank_%05d.safetensors" % rank


def shard_index(j, path, model_shapes, file_names):
    """{param: [(file, begin, end)]} sorted by begin, every element of every param (but the
    manifest's buffers) covered exactly once (shard_index in manifest.cpp)."""
    m = Field(j, path)
    buffers = set()
    if m["model"].has("buffers"):
        buffers = {b.str() for b in m["model"]["buffers"].each()}
    shapes = {k: s for k, s in model_shapes.items() if k not in buffers}
    pieces = {p: [] for p in shapes}
    for sh in m["shards"].each():
        file = sh["file"].str()
        if file not in file_names:
            sh["file"].fail("shard file '%s' is not listed in 'files'" % quote(file))
        for r in sh["param_ranges"].each():
            p = r["param"].str()
            if p not in shapes:
                r["param"].fail("shard %s holds state of '%s', which the model does not have" % (file, quote(p)))
            pieces[p].append((file, r["begin"].v, r["end"].v))
    for p, shape in sorted(shapes.items()):
        n = 1
        for d in shape:
            n *= d
        at = 0
        for file, b, e in sorted(pieces[p], key=lambda x: x[1]):
            if b != at or e <= b or e > n:
                raise Damaged(path, "the shards' ranges of '%s' do not cover [0, %d) exactly once (%s holds [%d, %d), "
                                    "expected a range starting at %d)" % (p, n, file, b, e, at))
            at = e
        if at != n:
            raise Damaged(path, "the shards hold elements [0, %d) of '%s', which has %d" % (at, p, n))
        pieces[p].sort(key=lambda x: x[1])
    return pieces


def check_shard_files(j, path, numel_of, model_numel):
    """Each shard file named once, the file of its dp_rank, one shard per rank below dp_size; every
    state tensor in a range of its shard with the range's length, every flat_begin the range's offset
    in the optimizer's flat buffer (check_shard_files in load.cpp). numel_of(file, key) gives a
    stored tensor's element count, model_numel {param: numel} model.safetensors' sizes."""
    m = Field(j, path)
    # A range's flat_begin is the param's buffer offset + begin. The buffer layout depends on the
    # run's options, so what is checked holds for any layout: every range of a param gives it the
    # same offset, and no two params' [offset, offset + numel) overlap.
    flat_offset = {}
    files, ranks, range_len = set(), set(), {}
    for sh in m["shards"].each():
        file = sh["file"].str()
        rank = sh["dp_rank"].i64(0, 4095)
        if file in files:
            sh["file"].fail("shard file '%s' is named by two shards" % quote(file))
        files.add(file)
        if rank in ranks:
            sh["dp_rank"].fail("dp_rank %d has two shards" % rank)
        ranks.add(rank)
        if file != shard_file_name(rank):
            sh["file"].fail("the shard of dp_rank %d is %s, not '%s' (shard files swapped or renamed)"
                            % (rank, shard_file_name(rank), quote(file)))
        for r in sh["param_ranges"].each():
            p = r["param"].str()
            if (file, p) in range_len:
                r["param"].fail("shard %s holds two ranges of '%s'" % (file, quote(p)))
            range_len[(file, p)] = r["end"].v - r["begin"].v
            if r.has("flat_begin"):
                fb = r["flat_begin"].i64(0, 1 << 50)
                offset = fb - r["begin"].v
                if p not in flat_offset:
                    flat_offset[p] = offset
                elif flat_offset[p] != offset:
                    r["flat_begin"].fail("%d, but another range of '%s' puts the param at flat offset %d and this range "
                                         "starts at its element %d: expected %d" % (fb, quote(p), flat_offset[p], r["begin"].v,
                                                                                   flat_offset[p] + r["begin"].v))
    spans = sorted((off, off + model_numel[p], p) for p, off in flat_offset.items() if p in model_numel)
    for prev, cur in zip(spans, spans[1:]):
        if cur[0] < prev[1]:
            m["shards"].fail("flat_begin puts '%s' at flat offset %d, inside '%s' [%d, %d)"
                             % (quote(cur[2]), cur[0], quote(prev[2]), prev[0], prev[1]))
    if m.has("dp_size"):
        n = m["dp_size"].v
        if len(ranks) != n or (ranks and max(ranks) != n - 1):
            m["shards"].fail("%d shards, but dp_size is %d (one shard per rank 0..%d)" % (len(ranks), n, n - 1))
    for t in m["tensors"].each():
        if t["kind"].str() not in STATE_KINDS:
            continue
        file, param, key = t["file"].v, t["param"].v, t["key"].v
        if (file, param) not in range_len:
            t["file"].fail("state '%s' is in %s, but no shard range of that file holds '%s'"
                           % (quote(key), quote(file), quote(param)))
        numel = numel_of(file, key)
        if numel != range_len[(file, param)]:
            raise Damaged(path, "tensor '%s' of %s has %d elements, but its shard's range of '%s' has %d"
                          % (key, file, numel, param, range_len[(file, param)]))
