// safetensors writer and validating mmap reader (see safetensors.h for the rules enforced).
#include "harness/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <thread>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/checked_io.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors is little-endian; this code writes host byte order");

namespace rh::ckpt {

namespace {

// Runs fn(j) for every j in [0, n) on up to hardware_concurrency threads (each takes the next
// index), and returns each job's exception message ("" when it succeeded), so the caller reports
// the first failure in job order whatever order the threads met them in.
std::vector<std::string> run_blocks_on_all_cores(size_t n, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::vector<std::string> errs(n);
  auto work = [&] {
    for (size_t j; (j = next++) < n;) {
      try {
        fn(j);
      } catch (const std::exception& e) {
        errs[j] = e.what();
      }
    }
  };
  const unsigned nt = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), n));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < nt; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  return errs;
}

// The LibTorch type each safetensors dtype is held in (fp8 as raw bytes).
struct TorchDtypeRow {
  StDtype d;
  torch::ScalarType t;
};
const TorchDtypeRow kTorchDtypes[] = {
    {StDtype::F32, torch::kFloat},  {StDtype::F16, torch::kHalf}, {StDtype::BF16, torch::kBFloat16},
    {StDtype::F8_E4M3, torch::kByte}, {StDtype::I16, torch::kShort}, {StDtype::U8, torch::kByte},
    {StDtype::I32, torch::kInt},    {StDtype::I64, torch::kLong}, {StDtype::F64, torch::kDouble},
};
const TorchDtypeRow& torch_row(StDtype d) {
  for (const auto& r : kTorchDtypes)
    if (r.d == d) return r;
  throw std::logic_error("unknown StDtype");
}


// Hashes then writes in slices, so each slice is still in cache when write() copies it.
constexpr size_t kSlice = 8u << 20;

// Streams a durable file's dirty pages to the disk while the rest is still being written, so the
// final fsync() waits for the last window instead of the whole file: every kWindow bytes it starts
// write-back of the window just written and waits for the one two windows back (dirty memory
// stays bounded at ~3 windows). Measured on 1 GB (median of 10, this VM's disk): write()+fsync
// 0.46 s, with this 0.34 s. It is only a hint: durability still comes from fsync(), so a file
// system that refuses sync_file_range() just stops getting hints.
class WriteBack {
 public:
  static constexpr uint64_t kWindow = 32u << 20;
  explicit WriteBack(int fd) : fd_(fd) {}
  void wrote(uint64_t end) {
    if (!on_ || end - started_ < kWindow) return;
    int rc = ::sync_file_range(fd_, static_cast<off64_t>(started_), static_cast<off64_t>(end - started_),
                               SYNC_FILE_RANGE_WRITE);
    if (rc == 0 && started_ >= 2 * kWindow)
      rc = ::sync_file_range(fd_, static_cast<off64_t>(started_ - 2 * kWindow), kWindow,
                             SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    on_ = rc == 0;
    started_ = end;
  }

 private:
  int fd_;
  bool on_ = true;
  uint64_t started_ = 0;
};

}  // namespace

torch::ScalarType st_scalar_type(StDtype d) { return torch_row(d).t; }
StDtype st_from_scalar_type(torch::ScalarType t, const std::string& what) {
  for (const auto& r : kTorchDtypes)
    if (r.t == t && r.d != StDtype::F8_E4M3) return r.d;
  throw CheckpointError(what + ": torch dtype " + std::string(c10::toString(t)) +
                        " has no safetensors name here");
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

namespace {

// The tensors checked (key, definedness, dtype) and put in (itemsize descending, key) order,
// which keeps every tensor aligned to its element size.
std::vector<const WriteTensor*> write_order(const std::string& path, const std::vector<WriteTensor>& tensors) {
  std::vector<const WriteTensor*> order;
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    if (t.key.empty() || t.key == "__metadata__") bad_safetensors(path, "invalid tensor key '" + t.key + "'");
    if (!seen.insert(t.key).second) bad_safetensors(path, "duplicate tensor key '" + t.key + "'");
    if (!t.pieces.empty()) {
      if (t.dtype != StDtype::U8) bad_safetensors(path, "tensor '" + t.key + "' given as byte pieces must be U8");
      order.push_back(&t);
      continue;
    }
    if (!t.data.defined()) bad_safetensors(path, "tensor '" + t.key + "' is undefined");
    if (t.data.scalar_type() != st_scalar_type(t.dtype))
      bad_safetensors(path, "tensor '" + t.key + "' has torch dtype " +
                    std::string(c10::toString(t.data.scalar_type())) + ", expected " +
                    c10::toString(st_scalar_type(t.dtype)) + " for " + st_name(t.dtype));
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const WriteTensor* a, const WriteTensor* b) {
    int64_t sa = st_itemsize(a->dtype), sb = st_itemsize(b->dtype);
    return sa != sb ? sa > sb : a->key < b->key;
  });
  return order;
}

// The 8-byte length and the JSON header (padded to a multiple of 8); *data_bytes: the bytes after it.
std::string header_bytes(const std::string& path, const std::vector<const WriteTensor*>& order,
                         const std::map<std::string, std::string>& metadata, uint64_t* data_bytes) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const WriteTensor* t : order) {
    uint64_t bytes = 0;
    std::vector<int64_t> shape;
    if (!t->pieces.empty()) {
      for (const auto& pc : t->pieces) bytes += pc.second;
      shape = {static_cast<int64_t>(bytes)};
    } else {
      bytes = static_cast<uint64_t>(t->data.numel()) * st_itemsize(t->dtype);
      shape = t->data.sizes().vec();
    }
    header[t->key] = {{"dtype", st_name(t->dtype)},
                      {"shape", shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');   // 8 + N stays a multiple of 8
  if (json.size() > kMaxHeaderBytes) bad_safetensors(path, "header of " + std::to_string(json.size()) +
                                                   " bytes exceeds the 100 MB cap");
  std::string prefix(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(prefix.data(), &n, 8);
  *data_bytes = offset;
  return prefix + json;
}

// XXH3-64 of the whole file and of every kHashBlock block, fed in order as the bytes are written.
class FileHasher {
 public:
  FileHasher() : all_(XXH3_createState()), block_(XXH3_createState()) {
    XXH3_64bits_reset(all_);
    XXH3_64bits_reset(block_);
  }
  ~FileHasher() {
    XXH3_freeState(all_);
    XXH3_freeState(block_);
  }
  FileHasher(const FileHasher&) = delete;
  FileHasher& operator=(const FileHasher&) = delete;
  void update(const char* p, size_t k) {
    XXH3_64bits_update(all_, p, k);
    while (k > 0) {
      const size_t m = static_cast<size_t>(std::min<uint64_t>(k, kHashBlock - in_block_));
      XXH3_64bits_update(block_, p, m);
      p += m;
      k -= m;
      in_block_ += m;
      if (in_block_ == kHashBlock) {
        blocks_.push_back(XXH3_64bits_digest(block_));
        XXH3_64bits_reset(block_);
        in_block_ = 0;
      }
    }
  }
  // The whole file's hash; the block hashes (the last one partial) into out.
  uint64_t finish(std::vector<uint64_t>& blocks) {
    if (in_block_ > 0) blocks_.push_back(XXH3_64bits_digest(block_));
    blocks = std::move(blocks_);
    return XXH3_64bits_digest(all_);
  }

 private:
  XXH3_state_t* all_;
  XXH3_state_t* block_;
  uint64_t in_block_ = 0;
  std::vector<uint64_t> blocks_;
};

// Every tensor's bytes (or byte pieces), hashed and written in kSlice slices; with do_fsync the
// write-back starts behind the writer.
void write_data(int fd, const std::string& path, const std::vector<const WriteTensor*>& order, uint64_t written,
                bool do_fsync, FileHasher& hash) {
  WriteBack wb(fd);
  for (const WriteTensor* t : order) {
    std::vector<std::pair<const uint8_t*, uint64_t>> pieces = t->pieces;
    torch::Tensor c;
    if (pieces.empty()) {
      c = t->data.contiguous().cpu();   // no copy for contiguous CPU tensors
      pieces.push_back({static_cast<const uint8_t*>(c.data_ptr()), static_cast<uint64_t>(c.numel()) * st_itemsize(t->dtype)});
    }
    for (const auto& [piece, piece_len] : pieces) {
      const char* p = reinterpret_cast<const char*>(piece);
      size_t left = static_cast<size_t>(piece_len);
      while (left > 0) {
        const size_t k = std::min(left, kSlice);
        hash.update(p, k);
        write_all(fd, p, k, path);
        written += k;
        if (do_fsync) wb.wrote(written);
        p += k;
        left -= k;
      }
    }
  }
}

}  // namespace

WriteStats write_safetensors(const std::string& path, const std::vector<WriteTensor>& tensors,
                             const std::map<std::string, std::string>& metadata, bool do_fsync) {
  const auto order = write_order(path, tensors);
  uint64_t data_bytes = 0;
  const std::string head = header_bytes(path, order, metadata, &data_bytes);
  FileHasher hash;
  WriteStats out;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("cannot create", path);
  try {
    out.header_xxh3 = XXH3_64bits(head.data(), head.size());
    hash.update(head.data(), head.size());
    write_all(fd, head.data(), head.size(), path);
    write_data(fd, path, order, head.size(), do_fsync, hash);
    if (do_fsync) fsync_fd(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  out.xxh3 = hash.finish(out.block_xxh3);
  if (::close(fd) != 0) throw_errno("cannot close", path);
  out.header_bytes = head.size();
  out.file_bytes = head.size() + data_bytes;
  return out;
}

// ---------------------------------------------------------------- reader

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t len = 0;
  std::unique_ptr<Arena> owned;   // a decoded (compressed) file's buffer instead of a mapping
  bool borrowed = false;          // bytes someone else owns (locating damage in a check callback)
  ~Mapping() {
    if (addr && len && !owned && !borrowed) ::munmap(addr, len);
  }
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(addr); }
};

namespace {

// Pooled anonymous memory (an Arena) for `bytes` of a file read or decoded into it, refused
// naming the file when it exceeds this machine's memory (a hostile manifest and a sparse file, or
// a compressed table, must not make the loader allocate without bound) or cannot be had.
std::shared_ptr<SafetensorsFile::Mapping> owned_mapping(const std::string& path, uint64_t bytes, const char* why) {
  const uint64_t phys = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (bytes > phys)
    bad_safetensors(path, "needs " + std::to_string(bytes) + " bytes " + why + ", more than this machine's memory (" +
                              std::to_string(phys) + ")");
  auto m = std::make_shared<SafetensorsFile::Mapping>();
  try {
    m->owned = std::make_unique<Arena>(std::max<uint64_t>(bytes, 1));
  } catch (const std::bad_alloc&) {
    bad_safetensors(path, "cannot allocate " + std::to_string(bytes) + " bytes " + why);
  }
  m->addr = m->owned->data();
  m->len = static_cast<size_t>(bytes);
  return m;
}

// Maps the whole file copy-on-write: tensors that alias it may be written without touching the
// file. It is not populated up front: the loader's checksum threads fault the pages in, in
// parallel (read faults map page-cache pages in batches, "fault-around"), which measured faster
// than one MAP_POPULATE sweep per file (1 GB load: 0.102 s vs 0.128 s, median of 7). It is mapped
// read-only and then made writable, so a page is copied only if someone writes to it.
void map_file(const std::string& path, void** addr, size_t* len) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, &size);   // a FIFO or device is refused, never waited on
  *len = static_cast<size_t>(size);
  *addr = nullptr;
  if (*len > 0) {
    void* a = ::mmap(nullptr, *len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (a == MAP_FAILED) {
      ::close(fd);
      throw_errno("cannot mmap", path);
    }
    if (::mprotect(a, *len, PROT_READ | PROT_WRITE) != 0) {
      ::munmap(a, *len);
      ::close(fd);
      throw_errno("cannot mprotect", path);
    }
    *addr = a;
  }
  ::close(fd);
}

}  // namespace

SafetensorsFile SafetensorsFile::open(
    const std::string& path, const std::function<void(const uint8_t*, uint64_t)>& check_bytes) {
  SafetensorsFile f;
  f.path_ = path;
  f.map_ = std::make_shared<Mapping>();
  map_file(path, &f.map_->addr, &f.map_->len);
  const uint64_t size = f.map_->len;
  if (check_bytes) check_bytes(f.map_->bytes(), size);
  ParsedSafetensors ps = parse_safetensors(path, f.map_->bytes(), size);
  f.header_len_ = ps.header_len;
  f.data_offset_ = 8 + ps.header_len;
  f.tensors_ = std::move(ps.tensors);
  f.metadata_ = std::move(ps.metadata);
  return f;   // tensors_ is sorted by key: the JSON object iterates in key order
}

SafetensorsFile SafetensorsFile::read_hashed(
    const std::string& path, uint64_t block_bytes, const std::function<void(uint64_t)>& check_size,
    const std::function<void(const uint8_t*, uint64_t, const std::vector<uint64_t>&)>& check_blocks) {
  constexpr uint64_t kPiece = 256u << 10;   // fits L2 beside the hash state: hashed while hot
  if (block_bytes == 0) bad_safetensors(path, "block size 0");
  uint64_t size = 0;
  const int fd = open_regular_file(path, &size);   // a FIFO or device is refused, never waited on
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (check_size) check_size(size);
  SafetensorsFile f;
  f.path_ = path;
  f.map_ = owned_mapping(path, size, "to read it");
  uint8_t* base = static_cast<uint8_t*>(f.map_->addr);
  const size_t nb = static_cast<size_t>((size + block_bytes - 1) / block_bytes);
  std::vector<uint64_t> hashes(nb);
  const std::vector<std::string> errs = run_blocks_on_all_cores(nb, [&](size_t b) {
    std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> st(XXH3_createState(), XXH3_freeState);
    if (!st) throw std::bad_alloc();
    XXH3_64bits_reset(st.get());
    const uint64_t begin = b * block_bytes, end = std::min(size, begin + block_bytes);
    for (uint64_t off = begin; off < end;) {
      const uint64_t want = std::min(kPiece, end - off);
      uint64_t got = 0;
      while (got < want) {
        const ssize_t r = ::pread(fd, base + off + got, want - got, static_cast<off_t>(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) throw_errno("cannot read", path);
        if (r == 0)
          throw CheckpointError(path + ": ended at byte " + std::to_string(off + got) + " while reading it (its size was " +
                                std::to_string(size) + "; changed while loading?)");
        got += static_cast<uint64_t>(r);
      }
      XXH3_64bits_update(st.get(), base + off, want);
      off += want;
    }
    hashes[b] = XXH3_64bits_digest(st.get());
  });
  for (const std::string& e : errs)
    if (!e.empty()) throw CheckpointError(e);
  if (check_blocks) check_blocks(base, size, hashes);
  ParsedSafetensors ps = parse_safetensors(path, base, size);
  f.header_len_ = ps.header_len;
  f.data_offset_ = 8 + ps.header_len;
  f.tensors_ = std::move(ps.tensors);
  f.metadata_ = std::move(ps.metadata);
  return f;
}

uint64_t SafetensorsFile::file_bytes() const { return map_->len; }

uint64_t SafetensorsFile::stored_bytes(const std::string& key) const {
  auto it = stored_bytes_.find(key);
  if (it != stored_bytes_.end()) return it->second;
  const TensorInfo& t = info(key);
  return t.end - t.begin;
}

const TensorInfo* SafetensorsFile::find(const std::string& key) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), key,
                             [](const TensorInfo& t, const std::string& k) { return t.key < k; });
  return it != tensors_.end() && it->key == key ? &*it : nullptr;
}

const TensorInfo& SafetensorsFile::info(const std::string& key) const {
  const TensorInfo* t = find(key);
  if (!t) bad_safetensors(path_, "has no tensor '" + key + "'");
  return *t;
}

torch::Tensor SafetensorsFile::tensor(const std::string& key) const {
  const TensorInfo& t = info(key);
  uint8_t* p = static_cast<uint8_t*>(map_->addr) + data_offset_ + t.begin;
  auto opts = torch::TensorOptions().dtype(st_scalar_type(t.dtype)).device(torch::kCPU);
  if (reinterpret_cast<uintptr_t>(p) % st_itemsize(t.dtype) != 0) {   // foreign writer
    torch::Tensor c = torch::empty(t.shape, opts);
    std::memcpy(c.data_ptr(), p, t.end - t.begin);
    return c;
  }
  std::shared_ptr<Mapping> keep = map_;
  return torch::from_blob(p, t.shape, [keep](void*) {}, opts);
}

uint64_t SafetensorsFile::xxh3() const { return XXH3_64bits(map_->addr, map_->len); }

uint64_t xxh3_file(const std::string& path, uint64_t* size_out) {
  SafetensorsFile::Mapping m;
  map_file(path, &m.addr, &m.len);
  if (size_out) *size_out = m.len;
  return XXH3_64bits(m.addr, m.len);
}

}  // namespace rh::ckpt

// ---------------------------------------------------------------- compressed files

namespace rh::ckpt {

WriteStats write_safetensors_compressed(const std::string& path, const std::vector<WriteTensor>& tensors,
                                        const std::map<std::string, std::string>& metadata, bool do_fsync,
                                        const CodecOptions& opt,
                                        std::map<std::string, CompressedKeyStats>* per_key) {
  // Every block of every tensor is one job, so small tensors do not leave cores idle.
  struct Job {
    size_t t;
    uint64_t off, len;
  };
  // Every block is encoded into one arena at its raw offset (a block never grows), and written
  // from there: no per-block buffers, no joined blob.
  std::vector<torch::Tensor> raw(tensors.size());
  std::vector<std::vector<EncodedBlock>> enc(tensors.size());
  std::vector<uint64_t> base(tensors.size());
  std::vector<Job> jobs;
  uint64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const WriteTensor& t = tensors[i];
    if (!t.data.defined()) bad_safetensors(path, "tensor '" + t.key + "' is undefined");
    if (t.data.scalar_type() != st_scalar_type(t.dtype))
      bad_safetensors(path, "tensor '" + t.key + "' has torch dtype " + std::string(c10::toString(t.data.scalar_type())) +
                    ", expected " + c10::toString(st_scalar_type(t.dtype)) + " for " + st_name(t.dtype));
    raw[i] = t.data.contiguous().cpu();
    const uint64_t bytes = static_cast<uint64_t>(raw[i].numel()) * st_itemsize(t.dtype);
    enc[i].resize((bytes + kCompressBlockBytes - 1) / kCompressBlockBytes);
    base[i] = total;
    total += bytes;
    for (uint64_t off = 0; off < bytes; off += kCompressBlockBytes)
      jobs.push_back({i, off, std::min(kCompressBlockBytes, bytes - off)});
  }
  std::unique_ptr<Arena> arena;
  try {
    arena = std::make_unique<Arena>(std::max<uint64_t>(total, 1));
  } catch (const std::bad_alloc&) {
    bad_safetensors(path, "cannot allocate " + std::to_string(total) + " bytes to compress into");
  }
  const std::vector<std::string> errs = run_blocks_on_all_cores(jobs.size(), [&](size_t j) {
    const Job& jb = jobs[j];
    enc[jb.t][jb.off / kCompressBlockBytes] =
        encode_block_into(static_cast<const uint8_t*>(raw[jb.t].data_ptr()) + jb.off, jb.len,
                          static_cast<int>(st_itemsize(tensors[jb.t].dtype)), opt, arena->data() + base[jb.t] + jb.off);
  });
  for (size_t j = 0; j < jobs.size(); ++j)
    if (!errs[j].empty()) bad_safetensors(path, "tensor '" + tensors[jobs[j].t].key + "': " + errs[j]);

  nlohmann::json table = nlohmann::json::object();
  std::vector<WriteTensor> blobs;
  for (size_t i = 0; i < tensors.size(); ++i) {
    uint64_t stored = 0;
    nlohmann::json blocks = nlohmann::json::array();
    WriteTensor w{tensors[i].key, torch::Tensor(), StDtype::U8};
    for (size_t b = 0; b < enc[i].size(); ++b) {
      stored += enc[i][b].stored_len;
      blocks.push_back(block_json(enc[i][b]));
      w.pieces.push_back({arena->data() + base[i] + b * kCompressBlockBytes, enc[i][b].stored_len});
    }
    const uint64_t rawb = static_cast<uint64_t>(raw[i].numel()) * st_itemsize(tensors[i].dtype);
    table[tensors[i].key] = {{"dtype", st_name(tensors[i].dtype)}, {"shape", raw[i].sizes().vec()},
                             {"raw_bytes", rawb}, {"blocks", blocks}};
    if (per_key) (*per_key)[tensors[i].key] = {rawb, stored, enc[i].size()};
    if (w.pieces.empty()) w.data = torch::empty({0}, torch::kByte);   // an empty tensor: an empty blob
    blobs.push_back(std::move(w));
  }
  std::map<std::string, std::string> meta = metadata;
  meta["rh_codec"] = kCodecName;
  meta["rh_block_bytes"] = std::to_string(kCompressBlockBytes);
  meta["rh_tensors"] = table.dump();
  return write_safetensors(path, blobs, meta, do_fsync);
}

namespace {

struct TableEntry {
  const TensorInfo* blob = nullptr;   // the stored U8 tensor
  TensorInfo logical;
  std::vector<BlockRef> blocks;
};

// Reads and checks rh_tensors against the stored tensors (see SafetensorsFile::decoded).
std::vector<TableEntry> read_table(const std::string& path, const std::vector<TensorInfo>& stored,
                                   const std::map<std::string, std::string>& metadata, const uint8_t* data_start) {
  const std::string what = "safetensors file " + path + " __metadata__ rh_tensors";
  if (metadata.at("rh_codec") != kCodecName)
    bad_safetensors(path, "codec '" + quote_text(metadata.at("rh_codec")) + "' is not " + kCodecName);
  auto bb = metadata.find("rh_block_bytes");
  if (bb == metadata.end() || bb->second != std::to_string(kCompressBlockBytes))
    bad_safetensors(path, "rh_block_bytes must be " + std::to_string(kCompressBlockBytes));
  auto tt = metadata.find("rh_tensors");
  if (tt == metadata.end()) bad_safetensors(path, "compressed, but __metadata__ has no rh_tensors");
  nlohmann::json j;
  try {
    j = parse_json_bounded(tt->second, what);
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(e.what());
  }
  const JsonField root(j, what);
  if (root.object_size() != stored.size())
    bad_safetensors(path, "rh_tensors lists " + std::to_string(root.object_size()) + " tensors, the file stores " +
                  std::to_string(stored.size()));
  std::vector<TableEntry> out;
  for (const TensorInfo& ti : stored) {
    if (ti.dtype != StDtype::U8 || ti.shape.size() != 1)
      bad_safetensors(path, "compressed tensor '" + ti.key + "' must be stored as a 1-D U8 blob");
    if (!root.has(ti.key)) bad_safetensors(path, "tensor '" + ti.key + "' has no entry in rh_tensors");
    const JsonField e = root[ti.key];
    TableEntry te;
    te.blob = &ti;
    te.logical.key = ti.key;
    if (!st_parse(e["dtype"].str(), &te.logical.dtype)) e["dtype"].fail("unknown dtype " + quote_json(e["dtype"].raw()));
    const int64_t k = st_itemsize(te.logical.dtype);
    uint64_t n = 1;
    e["shape"].each([&](const JsonField& d) {
      const int64_t v = d.i64(0, int64_t(1) << 40);
      te.logical.shape.push_back(v);
      if (__builtin_mul_overflow(n, static_cast<uint64_t>(v), &n)) d.fail("the shape's element count overflows");
    });
    uint64_t raw = 0;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(k), &raw)) e["shape"].fail("the tensor's byte count overflows");
    if (e["raw_bytes"].u64() != raw)
      e["raw_bytes"].fail(std::to_string(e["raw_bytes"].u64()) + " raw bytes, the shape and dtype need " + std::to_string(raw));
    te.logical.end = raw;
    const uint64_t nb = (raw + kCompressBlockBytes - 1) / kCompressBlockBytes;
    if (e["blocks"].size() != nb)
      e["blocks"].fail(std::to_string(e["blocks"].size()) + " blocks, " + std::to_string(raw) + " raw bytes need " + std::to_string(nb));
    const uint64_t blob_len = ti.end - ti.begin;
    uint64_t at = 0;
    e["blocks"].each([&](const JsonField& b) {
      BlockRef r;
      r.modes = b[size_t(0)].str();
      if (r.modes.size() != 1 && r.modes.size() != static_cast<size_t>(k))
        b[size_t(0)].fail("expected 1 or " + std::to_string(k) + " plane modes, got " + quote_text(r.modes));
      if (b[size_t(1)].size() != r.modes.size()) b[size_t(1)].fail("one stored size per plane expected");
      uint64_t len = 0;
      b[size_t(1)].each([&](const JsonField& s) {
        const uint64_t v = s.u64(blob_len);
        r.plane_bytes.push_back(v);
        len += v;   // each <= blob_len and at most 8 planes: no overflow
      });
      if (len > blob_len - at) b[size_t(1)].fail("the blocks run past the tensor's " + std::to_string(blob_len) + " stored bytes");
      for (size_t h = 2; h <= 3; ++h) {
        const std::string s = b[h].str();
        char* endp = nullptr;
        if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
          b[h].fail("expected 16 lower-case hex digits, got " + quote_text(s));
        (h == 2 ? r.xxh3_stored : r.xxh3_raw) = std::strtoull(s.c_str(), &endp, 16);
      }
      r.stored = data_start + ti.begin + at;
      r.stored_len = len;
      at += len;
      te.blocks.push_back(std::move(r));
    });
    if (at != blob_len)
      bad_safetensors(path, "tensor '" + ti.key + "': its blocks cover " + std::to_string(at) + " of its " + std::to_string(blob_len) +
                    " stored bytes");
    out.push_back(std::move(te));
  }
  return out;
}

std::string block_name(const std::string& key, size_t i, size_t n) {
  return "tensor '" + key + "' compressed block " + std::to_string(i) + " of " + std::to_string(n) + " (raw bytes [" +
         std::to_string(i * kCompressBlockBytes) + ", ...))";
}

}  // namespace

SafetensorsFile SafetensorsFile::decoded() const {
  if (!compressed()) return *this;
  const uint8_t* data = map_->bytes() + data_offset_;
  std::vector<TableEntry> table = read_table(path_, tensors_, metadata_, data);
  // Logical tensors in one buffer, each at a 64-byte boundary.
  uint64_t total = 0;
  for (TableEntry& te : table) {
    const uint64_t raw = te.logical.end;
    te.logical.begin = total;
    te.logical.end = total + raw;
    total = (te.logical.end + 63) & ~uint64_t(63);
  }
  SafetensorsFile f;
  f.path_ = path_;
  f.metadata_ = metadata_;
  f.header_len_ = header_len_;
  f.data_offset_ = 0;
  f.map_ = owned_mapping(path_, total, "to decode it");
  uint8_t* base = static_cast<uint8_t*>(f.map_->addr);
  struct Job {
    size_t t, b;
  };
  std::vector<Job> jobs;
  for (size_t t = 0; t < table.size(); ++t)
    for (size_t b = 0; b < table[t].blocks.size(); ++b) jobs.push_back({t, b});
  const std::vector<std::string> errs = run_blocks_on_all_cores(jobs.size(), [&](size_t j) {
    const TableEntry& te = table[jobs[j].t];
    const size_t b = jobs[j].b;
    const uint64_t off = b * kCompressBlockBytes;
    const uint64_t len = std::min(kCompressBlockBytes, te.logical.end - te.logical.begin - off);
    decode_block(te.blocks[b], base + te.logical.begin + off, len, static_cast<int>(st_itemsize(te.logical.dtype)),
                 "safetensors file " + path_ + " " + block_name(te.logical.key, b, te.blocks.size()));
  });
  for (const std::string& e : errs)
    if (!e.empty()) throw CheckpointError(e);   // the first damaged block in file order
  for (TableEntry& te : table) {
    f.tensors_.push_back(te.logical);
    f.stored_bytes_[te.logical.key] = te.blob->end - te.blob->begin;
  }
  return f;   // tensors_ stays sorted by key: table follows tensors_
}

std::string SafetensorsFile::locate_damaged_block() const {
  try {
    const uint8_t* data = map_->bytes() + data_offset_;
    const std::vector<TableEntry> table = read_table(path_, tensors_, metadata_, data);
    for (const TableEntry& te : table)
      for (size_t b = 0; b < te.blocks.size(); ++b) {
        const BlockRef& r = te.blocks[b];
        const uint64_t got = XXH3_64bits(r.stored, r.stored_len);
        if (got != r.xxh3_stored) {
          const uint64_t at = static_cast<uint64_t>(r.stored - map_->bytes());
          return block_name(te.logical.key, b, te.blocks.size()) + ", stored bytes [" + std::to_string(at) + ", " +
                 std::to_string(at + r.stored_len) + ") of the file: XXH3-64 " + hex64(got) + " != " + hex64(r.xxh3_stored);
        }
      }
  } catch (const std::exception&) {
  }
  return "";
}

std::string SafetensorsFile::locate_damaged_block(const std::string& path, const uint8_t* data, uint64_t size) {
  try {
    ParsedSafetensors ps = parse_safetensors(path, data, size);
    SafetensorsFile f;
    f.path_ = path;
    f.map_ = std::make_shared<Mapping>();
    f.map_->borrowed = true;   // not ours to unmap
    f.map_->addr = const_cast<uint8_t*>(data);
    f.map_->len = size;
    f.header_len_ = ps.header_len;
    f.data_offset_ = 8 + ps.header_len;
    f.tensors_ = std::move(ps.tensors);
    f.metadata_ = std::move(ps.metadata);
    if (!f.compressed()) return "";
    return f.locate_damaged_block();
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace rh::ckpt
