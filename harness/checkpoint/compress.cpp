// Byte planes + zstd, block by block (see compress.h).
#define ZSTD_STATIC_LINKING_ONLY   // ZSTD_c_literalCompressionMode (a parameter of the stable setter)
#include "harness/checkpoint/compress.h"

#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <queue>
#include <stdexcept>
#include <thread>

#include "harness/checkpoint/errors.h"

namespace rh::ckpt {

std::string to_string(Compression c) { return c == Compression::zstd ? "zstd" : "none"; }

Compression parse_compression(const std::string& s) {
  if (s == "none") return Compression::none;
  if (s == "zstd") return Compression::zstd;
  throw std::invalid_argument("compression '" + s + "': expected none or zstd");
}

void split_planes(const uint8_t* src, uint64_t n, int k, uint8_t* dst) {
  switch (k) {
    case 1: std::memcpy(dst, src, n); return;
    case 2:
      for (uint64_t i = 0; i < n; ++i) {
        dst[i] = src[2 * i];
        dst[n + i] = src[2 * i + 1];
      }
      return;
    case 4:
      for (uint64_t i = 0; i < n; ++i) {
        dst[i] = src[4 * i];
        dst[n + i] = src[4 * i + 1];
        dst[2 * n + i] = src[4 * i + 2];
        dst[3 * n + i] = src[4 * i + 3];
      }
      return;
    default:
      for (uint64_t i = 0; i < n; ++i)
        for (int j = 0; j < k; ++j) dst[j * n + i] = src[i * k + j];
  }
}

void join_planes(const uint8_t* src, uint64_t n, int k, uint8_t* dst) {
  switch (k) {
    case 1: std::memcpy(dst, src, n); return;
    case 2:
      for (uint64_t i = 0; i < n; ++i) {
        dst[2 * i] = src[i];
        dst[2 * i + 1] = src[n + i];
      }
      return;
    case 4:
      for (uint64_t i = 0; i < n; ++i) {
        dst[4 * i] = src[i];
        dst[4 * i + 1] = src[n + i];
        dst[4 * i + 2] = src[2 * n + i];
        dst[4 * i + 3] = src[3 * n + i];
      }
      return;
    default:
      for (uint64_t i = 0; i < n; ++i)
        for (int j = 0; j < k; ++j) dst[i * k + j] = src[j * n + i];
  }
}

double byte_entropy(const uint8_t* p, uint64_t n) {
  if (n == 0) return 0;
  uint64_t h[4][256] = {};
  uint64_t i = 0;
  for (; i + 4 <= n; i += 4) {   // four histograms: no store-to-load stall on repeated bytes
    ++h[0][p[i]];
    ++h[1][p[i + 1]];
    ++h[2][p[i + 2]];
    ++h[3][p[i + 3]];
  }
  for (; i < n; ++i) ++h[0][p[i]];
  double e = 0;
  for (int s = 0; s < 256; ++s) {
    const uint64_t c = h[0][s] + h[1][s] + h[2][s] + h[3][s];
    if (c) {
      const double q = double(c) / double(n);
      e -= q * std::log2(q);
    }
  }
  return e;
}

namespace {
// The raw-or-zstd decision only needs the entropy to within a few hundredths of a bit: above 64 Ki
// bytes, every 16th byte is counted (>= 4 Ki samples: the estimate's bias for 256 equally likely
// values is 255 / (2 N ln 2) <= 0.045 bits, 0.006 at a 1 MiB block's 32 Ki samples). Measured on a
// bf16 block: 0.2 ms for the whole plane, a sixteenth of it sampled. A wrong guess costs size or
// time, never bytes: a plane zstd cannot shrink is stored raw anyway.
double plane_entropy_estimate(const uint8_t* p, uint64_t n) {
  constexpr uint64_t kStride = 16;
  if (n < (64u << 10)) return byte_entropy(p, n);
  uint64_t h[256] = {};
  uint64_t m = 0;
  for (uint64_t i = 0; i < n; i += kStride, ++m) ++h[p[i]];
  double e = 0;
  for (uint64_t c : h)
    if (c) {
      const double q = double(c) / double(m);
      e -= q * std::log2(q);
    }
  return e;
}
}   // namespace

uint64_t huffman_bytes(const uint8_t* p, uint64_t n) {
  if (n == 0) return 0;
  uint64_t h[256] = {};
  for (uint64_t i = 0; i < n; ++i) ++h[p[i]];
  // Huffman's algorithm on the histogram: the coded size is the sum of every merged weight.
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<>> q;
  for (uint64_t c : h)
    if (c) q.push(c);
  uint64_t bits = 0;
  if (q.size() == 1) bits = n;   // one symbol still needs one bit each
  while (q.size() > 1) {
    const uint64_t a = q.top();
    q.pop();
    const uint64_t b = q.top();
    q.pop();
    bits += a + b;
    q.push(a + b);
  }
  return (bits + 7) / 8 + 256;
}

namespace {

struct CCtx {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ~CCtx() { ZSTD_freeCCtx(c); }
};
struct DCtx {
  ZSTD_DCtx* d = ZSTD_createDCtx();
  ~DCtx() { ZSTD_freeDCtx(d); }
};

}   // namespace

namespace {

// Mappings given back by Arenas, kept for the next one: fresh anonymous memory is expensive here
// (touching 1 GiB of it took 2.8 s with huge pages, 5.3 s without, on this VM), memory a process
// has touched before is not. At most 4 mappings and a quarter of physical memory are kept.
struct Pool {
  std::mutex mu;
  std::vector<std::pair<uint8_t*, uint64_t>> free;   // base, mapped bytes
};
Pool& pool() {
  static Pool* p = new Pool;   // never destroyed: Arenas may be released during static teardown
  return *p;
}
uint64_t pool_cap() {
  static const uint64_t cap =
      static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) / 4;
  return cap;
}

}   // namespace

Arena::Arena(uint64_t bytes) : n_(bytes) {
  constexpr uint64_t kHuge = 2u << 20;
  const uint64_t want = (bytes + kHuge - 1) / kHuge * kHuge + kHuge;   // room to align to a huge page
  {
    std::lock_guard<std::mutex> g(pool().mu);
    auto& fr = pool().free;
    size_t best = fr.size();
    for (size_t i = 0; i < fr.size(); ++i)
      if (fr[i].second >= want && (best == fr.size() || fr[i].second < fr[best].second)) best = i;
    if (best < fr.size()) {
      base_ = fr[best].first;
      map_ = fr[best].second;
      fr.erase(fr.begin() + static_cast<std::ptrdiff_t>(best));
    }
  }
  if (!base_) {
    void* a = ::mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (a == MAP_FAILED) throw std::bad_alloc();
    base_ = static_cast<uint8_t*>(a);
    map_ = want;
    const uint64_t skip = (kHuge - reinterpret_cast<uintptr_t>(base_) % kHuge) % kHuge;
    ::madvise(base_ + skip, map_ - skip, MADV_HUGEPAGE);   // a hint; ignored where unsupported
  }
  p_ = base_ + (kHuge - reinterpret_cast<uintptr_t>(base_) % kHuge) % kHuge;
}

void Arena::release_pool() {
  std::lock_guard<std::mutex> g(pool().mu);
  for (const auto& f : pool().free) ::munmap(f.first, f.second);
  pool().free.clear();
}

Arena::~Arena() {
  if (!base_) return;
  std::lock_guard<std::mutex> g(pool().mu);
  auto& fr = pool().free;
  fr.push_back({base_, map_});
  uint64_t kept = 0;
  for (const auto& f : fr) kept += f.second;
  while (!fr.empty() && (fr.size() > 4 || kept > pool_cap())) {   // drop the smallest first
    auto it = std::min_element(fr.begin(), fr.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    kept -= it->second;
    ::munmap(it->first, it->second);
    fr.erase(it);
  }
}

EncodedBlock encode_block_into(const uint8_t* raw, uint64_t raw_len, int itemsize, const CodecOptions& opt,
                               uint8_t* dst) {
  thread_local CCtx cctx;
  thread_local std::vector<uint8_t> planes;
  const int k = opt.byte_planes ? itemsize : 1;
  const uint64_t n = raw_len / k;
  planes.resize(raw_len);
  split_planes(raw, n, k, planes.data());
  EncodedBlock b;
  b.xxh3_raw = XXH3_64bits(raw, raw_len);
  ZSTD_CCtx_reset(cctx.c, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(cctx.c, ZSTD_c_compressionLevel, opt.level);
  ZSTD_CCtx_setParameter(cctx.c, ZSTD_c_contentSizeFlag, 1);
  if (opt.huffman_literals) ZSTD_CCtx_setParameter(cctx.c, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
  if (opt.min_match > 0) ZSTD_CCtx_setParameter(cctx.c, ZSTD_c_minMatch, opt.min_match);
  uint64_t at = 0;
  for (int j = 0; j < k; ++j) {
    const uint8_t* pl = planes.data() + uint64_t(j) * n;
    size_t got = 0;
    if (n > 1 && plane_entropy_estimate(pl, n) < opt.raw_entropy_bits) {
      // Room for one byte less than raw: a frame that does not fit is not worth storing.
      got = ZSTD_compress2(cctx.c, dst + at, n - 1, pl, n);
      if (ZSTD_isError(got)) {
        if (ZSTD_getErrorCode(got) != ZSTD_error_dstSize_tooSmall)
          throw std::runtime_error(std::string("zstd: ") + ZSTD_getErrorName(got));
        got = 0;
      }
    }
    if (got > 0) {
      b.modes += 'z';
    } else {
      b.modes += 'r';
      std::memcpy(dst + at, pl, n);
      got = n;
    }
    b.plane_bytes.push_back(got);
    at += got;
  }
  b.stored_len = at;
  b.xxh3_stored = XXH3_64bits(dst, at);
  return b;
}

EncodedBlock encode_block(const uint8_t* raw, uint64_t raw_len, int itemsize, const CodecOptions& opt) {
  std::vector<uint8_t> buf(raw_len);
  EncodedBlock b = encode_block_into(raw, raw_len, itemsize, opt, buf.data());
  buf.resize(b.stored_len);
  b.bytes = std::move(buf);
  return b;
}

std::vector<EncodedBlock> encode_tensor(const uint8_t* raw, uint64_t raw_len, int itemsize, const CodecOptions& opt,
                                        unsigned threads) {
  const uint64_t nb = raw_len == 0 ? 0 : (raw_len + kCompressBlockBytes - 1) / kCompressBlockBytes;
  std::vector<EncodedBlock> out(nb);
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<uint64_t>(threads, std::max<uint64_t>(nb, 1)));
  std::atomic<uint64_t> next{0};
  std::exception_ptr err;
  std::mutex mu;
  auto work = [&] {
    try {
      for (uint64_t i; (i = next++) < nb;) {
        const uint64_t off = i * kCompressBlockBytes, len = std::min(kCompressBlockBytes, raw_len - off);
        out[i] = encode_block(raw + off, len, itemsize, opt);
      }
    } catch (...) {
      std::lock_guard<std::mutex> g(mu);
      if (!err) err = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (err) std::rethrow_exception(err);
  return out;
}

namespace {
std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}
}   // namespace

nlohmann::json block_json(const EncodedBlock& b) {
  return nlohmann::json::array({b.modes, b.plane_bytes, hex(b.xxh3_stored), hex(b.xxh3_raw)});
}

void decode_block(const BlockRef& b, uint8_t* raw, uint64_t raw_len, int itemsize, const std::string& what) {
  thread_local DCtx dctx;
  thread_local std::vector<uint8_t> planes;
  const int k = static_cast<int>(b.modes.size());
  if (k != 1 && k != itemsize)
    throw CheckpointError(what + ": " + std::to_string(k) + " planes for an itemsize of " + std::to_string(itemsize));
  if (b.plane_bytes.size() != b.modes.size()) throw CheckpointError(what + ": plane sizes and modes differ in count");
  if (raw_len % k != 0)
    throw CheckpointError(what + ": " + std::to_string(raw_len) + " raw bytes do not split into " + std::to_string(k) +
                          " planes");
  const uint64_t got_stored = XXH3_64bits(b.stored, b.stored_len);
  if (got_stored != b.xxh3_stored)
    throw CheckpointError(what + ": XXH3-64 of its stored bytes " + hex(got_stored) + " != " + hex(b.xxh3_stored) +
                          " (the block is damaged)");
  const uint64_t n = raw_len / k;
  planes.resize(raw_len);
  uint64_t at = 0;
  for (int j = 0; j < k; ++j) {
    const uint64_t len = b.plane_bytes[j];
    if (len > b.stored_len - at)
      throw CheckpointError(what + ": plane " + std::to_string(j) + " runs past the block's stored bytes");
    const uint8_t* src = b.stored + at;
    uint8_t* dst = planes.data() + uint64_t(j) * n;
    if (b.modes[j] == 'r') {
      if (len != n)
        throw CheckpointError(what + ": raw plane " + std::to_string(j) + " has " + std::to_string(len) +
                              " bytes, expected " + std::to_string(n));
      std::memcpy(dst, src, n);
    } else if (b.modes[j] == 'z') {
      const unsigned long long cs = ZSTD_getFrameContentSize(src, len);
      const size_t fl = ZSTD_findFrameCompressedSize(src, len);
      if (cs != n || ZSTD_isError(fl) || fl != len)
        throw CheckpointError(what + ": plane " + std::to_string(j) + " is not one zstd frame of " + std::to_string(n) +
                              " bytes");
      const size_t r = ZSTD_decompressDCtx(dctx.d, dst, n, src, len);
      if (ZSTD_isError(r) || r != n)
        throw CheckpointError(what + ": plane " + std::to_string(j) +
                              " does not decode: " + (ZSTD_isError(r) ? ZSTD_getErrorName(r) : "wrong size"));
    } else {
      throw CheckpointError(what + ": unknown plane mode '" + std::string(1, b.modes[j]) + "'");
    }
    at += len;
  }
  if (at != b.stored_len)
    throw CheckpointError(what + ": planes cover " + std::to_string(at) + " of its " + std::to_string(b.stored_len) +
                          " stored bytes");
  join_planes(planes.data(), n, k, raw);
  const uint64_t got_raw = XXH3_64bits(raw, raw_len);
  if (got_raw != b.xxh3_raw)
    throw CheckpointError(what + ": XXH3-64 of its decoded bytes " + hex(got_raw) + " != " + hex(b.xxh3_raw) +
                          " (does not decode to the saved bytes)");
}

}   // namespace rh::ckpt
