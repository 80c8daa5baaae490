// The validating safetensors reader (see safetensors.h for the rules enforced): a file mapped
// copy-on-write or read into pooled memory while its blocks are hashed, the tensors that alias it,
// and the dtype table both directions use.
#include "harness/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/safetensors_internal.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors is little-endian; this code reads host byte order");

namespace rh::ckpt {

namespace {

// The LibTorch type each safetensors dtype is held in (fp8 as raw bytes).
struct TorchDtypeRow {
  StDtype d;
  torch::ScalarType t;
};
const TorchDtypeRow kTorchDtypes[] = {
    {StDtype::F32, torch::kFloat},    {StDtype::F16, torch::kHalf},  {StDtype::BF16, torch::kBFloat16},
    {StDtype::F8_E4M3, torch::kByte}, {StDtype::I16, torch::kShort}, {StDtype::U8, torch::kByte},
    {StDtype::I32, torch::kInt},      {StDtype::I64, torch::kLong},  {StDtype::F64, torch::kDouble},
};
const TorchDtypeRow& torch_row(StDtype d) {
  for (const auto& r : kTorchDtypes)
    if (r.d == d) return r;
  throw std::logic_error("unknown StDtype");
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

// Reads fd (opened on path; `size` bytes by its fstat) with pread() piece by piece, each piece
// handed to `take` (offset, bytes, length); a change while reading is an error naming path.
// `into`, if given, is where the pieces are read (size bytes); else a bounce buffer.
void read_checking_change(int fd, const std::string& path, uint64_t size, uint8_t* into,
                          const std::function<void(const uint8_t*, uint64_t)>& take) {
  struct stat before {};
  if (::fstat(fd, &before) != 0) throw_errno("cannot stat", path);
  auto changed = [&](const std::string& how) {
    throw CheckpointError(path + " changed while it was read (" + how +
                          "): is the trainer still writing it? Compare checkpoints only after the run that "
                          "wrote them ended");
  };
  constexpr uint64_t kPiece = 1u << 20;
  std::vector<uint8_t> bounce(into ? 0 : static_cast<size_t>(std::min(size, kPiece)));
  for (uint64_t off = 0; off < size;) {
    const uint64_t want = std::min(kPiece, size - off);
    uint8_t* dst = into ? into + off : bounce.data();
    uint64_t got = 0;
    while (got < want) {
      const ssize_t r = ::pread(fd, dst + got, want - got, static_cast<off_t>(off + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw_errno("cannot read", path);
      if (r == 0) changed("it ended at byte " + std::to_string(off + got) + " of " + std::to_string(size));
      got += static_cast<uint64_t>(r);
    }
    if (take) take(dst, want);
    off += want;
  }
  uint8_t extra = 0;
  ssize_t more;
  while ((more = ::pread(fd, &extra, 1, static_cast<off_t>(size))) < 0 && errno == EINTR) {
  }
  if (more > 0) changed("it grew past its " + std::to_string(size) + " bytes");
  struct stat after {};
  if (::fstat(fd, &after) != 0) throw_errno("cannot stat", path);
  if (after.st_size != before.st_size)
    changed("its size went from " + std::to_string(before.st_size) + " to " + std::to_string(after.st_size) + " bytes");
  if (after.st_mtim.tv_sec != before.st_mtim.tv_sec || after.st_mtim.tv_nsec != before.st_mtim.tv_nsec ||
      after.st_ctim.tv_sec != before.st_ctim.tv_sec || after.st_ctim.tv_nsec != before.st_ctim.tv_nsec)
    changed("it was modified meanwhile");
}

struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

}   // namespace

torch::ScalarType st_scalar_type(StDtype d) { return torch_row(d).t; }
StDtype st_from_scalar_type(torch::ScalarType t, const std::string& what) {
  for (const auto& r : kTorchDtypes)
    if (r.t == t && r.d != StDtype::F8_E4M3) return r.d;
  throw CheckpointError(what + ": torch dtype " + std::string(c10::toString(t)) + " has no safetensors name here");
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

namespace detail {

std::shared_ptr<SafetensorsFile::Mapping> owned_mapping(const std::string& path, uint64_t bytes, const char* why) {
  const uint64_t phys =
      static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
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

}   // namespace detail

SafetensorsFile SafetensorsFile::open(const std::string& path,
                                      const std::function<void(const uint8_t*, uint64_t)>& check_bytes) {
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
  f.map_ = detail::owned_mapping(path, size, "to read it");
  uint8_t* base = static_cast<uint8_t*>(f.map_->addr);
  const size_t nb = static_cast<size_t>((size + block_bytes - 1) / block_bytes);
  std::vector<uint64_t> hashes(nb);
  const std::vector<std::string> errs = detail::run_blocks_on_all_cores(nb, [&](size_t b) {
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
          throw CheckpointError(path + ": ended at byte " + std::to_string(off + got) +
                                " while reading it (its size was " + std::to_string(size) +
                                "; changed while loading?)");
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

SafetensorsFile SafetensorsFile::read_untrusted(const std::string& path) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, &size, /*no_follow=*/true);   // FIFOs and devices refused
  const FdCloser closer{fd};
  SafetensorsFile f;
  f.path_ = path;
  f.map_ = detail::owned_mapping(path, size, "to read it");
  read_checking_change(fd, path, size, static_cast<uint8_t*>(f.map_->addr), {});
  ParsedSafetensors ps = parse_safetensors(path, f.map_->bytes(), size);
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
  return torch::from_blob(
      p, t.shape, [keep](void*) {}, opts);
}

uint64_t SafetensorsFile::xxh3() const { return XXH3_64bits(map_->addr, map_->len); }

uint64_t xxh3_file(const std::string& path, uint64_t* size_out) {
  SafetensorsFile::Mapping m;
  map_file(path, &m.addr, &m.len);
  if (size_out) *size_out = m.len;
  return XXH3_64bits(m.addr, m.len);
}

uint64_t xxh3_file_untrusted(const std::string& path, uint64_t* size_out) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, &size, /*no_follow=*/true);
  const FdCloser closer{fd};
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> st(XXH3_createState(), XXH3_freeState);
  if (!st) throw std::bad_alloc();
  XXH3_64bits_reset(st.get());
  read_checking_change(fd, path, size, nullptr,
                       [&](const uint8_t* p, uint64_t n) { XXH3_64bits_update(st.get(), p, n); });
  if (size_out) *size_out = size;
  return XXH3_64bits_digest(st.get());
}

}   // namespace rh::ckpt
