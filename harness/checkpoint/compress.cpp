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
  uint64_t histogram[4][256] = {};
  uint64_t i = 0;
  for (; i + 4 <= n; i += 4) {   // four histograms: no store-to-load stall on repeated bytes
    ++histogram[0][p[i]];
    ++histogram[1][p[i + 1]];
    ++histogram[2][p[i + 2]];
    ++histogram[3][p[i + 3]];
  }
  for (; i < n; ++i) ++histogram[0][p[i]];
  double entropy = 0;
  for (int s = 0; s < 256; ++s) {
    const uint64_t count = histogram[0][s] + histogram[1][s] + histogram[2][s] + histogram[3][s];
    if (count) {
      const double q = double(count) / double(n);
      entropy -= q * std::log2(q);
    }
  }
  return entropy;
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
  uint64_t histogram[256] = {};
  uint64_t samples = 0;
  for (uint64_t i = 0; i < n; i += kStride, ++samples) ++histogram[p[i]];
  double entropy = 0;
  for (uint64_t count : histogram)
    if (count) {
      const double q = double(count) / double(samples);
      entropy -= q * std::log2(q);
    }
  return entropy;
}
}   // namespace

uint64_t huffman_bytes(const uint8_t* p, uint64_t n) {
  if (n == 0) return 0;
  uint64_t histogram[256] = {};
  for (uint64_t i = 0; i < n; ++i) ++histogram[p[i]];
  // Huffman's algorithm on the histogram: the coded size is the sum of every merged weight.
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<>> weights;
  for (uint64_t count : histogram)
    if (count) weights.push(count);
  uint64_t bits = 0;
  if (weights.size() == 1) bits = n;   // one symbol still needs one bit each
  while (weights.size() > 1) {
    const uint64_t a = weights.top();
    weights.pop();
    const uint64_t b = weights.top();
    weights.pop();
    bits += a + b;
    weights.push(a + b);
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
    auto& pooled = pool().free;
    size_t best = pooled.size();
    for (size_t i = 0; i < pooled.size(); ++i)
      if (pooled[i].second >= want && (best == pooled.size() || pooled[i].second < pooled[best].second)) best = i;
    if (best < pooled.size()) {
      base_ = pooled[best].first;
      map_ = pooled[best].second;
      pooled.erase(pooled.begin() + static_cast<std::ptrdiff_t>(best));
    }
  }
  if (!base_) {
    void* mapped = ::mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapped == MAP_FAILED) throw std::bad_alloc();
    base_ = static_cast<uint8_t*>(mapped);
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
  auto& pooled = pool().free;
  pooled.push_back({base_, map_});
  uint64_t kept = 0;
  for (const auto& f : pooled) kept += f.second;
  while (!pooled.empty() && (pooled.size() > 4 || kept > pool_cap())) {   // drop the smallest first
    auto it = std::min_element(pooled.begin(), pooled.end(),
                               [](const auto& a, const auto& b) { return a.second < b.second; });
    kept -= it->second;
    ::munmap(it->first, it->second);
    pooled.erase(it);
  }
}

EncodedBlock encode_block_into(const uint8_t* raw, uint64_t raw_len, int itemsize, const CodecOptions& opt,
                               uint8_t* dst) {
  thread_local CCtx cctx;
  thread_local std::vector<uint8_t> planes;
  const int num_planes = opt.byte_planes ? itemsize : 1;
  const uint64_t plane_len = raw_len / num_planes;
  planes.resize(raw_len);
  split_planes(raw, plane_len, num_planes, planes.data());
  EncodedBlock block;
  block.xxh3_raw = XXH3_64bits(raw, raw_len);
  ZSTD_CCtx_reset(cctx.c, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(cctx.c, ZSTD_c_compressionLevel, opt.level);
  ZSTD_CCtx_setParameter(cctx.c, ZSTD_c_contentSizeFlag, 1);
  if (opt.huffman_literals) ZSTD_CCtx_setParameter(cctx.c, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
  if (opt.min_match > 0) ZSTD_CCtx_setParameter(cctx.c, ZSTD_c_minMatch, opt.min_match);
  uint64_t at = 0;
  for (int j = 0; j < num_planes; ++j) {
    const uint8_t* plane = planes.data() + uint64_t(j) * plane_len;
    size_t got = 0;
    if (plane_len > 1 && plane_entropy_estimate(plane, plane_len) < opt.raw_entropy_bits) {
      // Room for one byte less than raw: a frame that does not fit is not worth storing.
      got = ZSTD_compress2(cctx.c, dst + at, plane_len - 1, plane, plane_len);
      if (ZSTD_isError(got)) {
        if (ZSTD_getErrorCode(got) != ZSTD_error_dstSize_tooSmall)
          throw std::runtime_error(std::string("zstd: ") + ZSTD_getErrorName(got));
        got = 0;
      }
    }
    if (got > 0) {
      block.modes += 'z';
    } else {
      block.modes += 'r';
      std::memcpy(dst + at, plane, plane_len);
      got = plane_len;
    }
    block.plane_bytes.push_back(got);
    at += got;
  }
  block.stored_len = at;
  block.xxh3_stored = XXH3_64bits(dst, at);
  return block;
}

EncodedBlock encode_block(const uint8_t* raw, uint64_t raw_len, int itemsize, const CodecOptions& opt) {
  std::vector<uint8_t> buf(raw_len);
  EncodedBlock block = encode_block_into(raw, raw_len, itemsize, opt, buf.data());
  buf.resize(block.stored_len);
  block.bytes = std::move(buf);
  return block;
}

std::vector<EncodedBlock> encode_tensor(const uint8_t* raw, uint64_t raw_len, int itemsize, const CodecOptions& opt,
                                        unsigned threads) {
  const uint64_t num_blocks = raw_len == 0 ? 0 : (raw_len + kCompressBlockBytes - 1) / kCompressBlockBytes;
  std::vector<EncodedBlock> blocks(num_blocks);
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<uint64_t>(threads, std::max<uint64_t>(num_blocks, 1)));
  std::atomic<uint64_t> next{0};
  std::exception_ptr err;
  std::mutex mu;
  auto work = [&] {
    try {
      for (uint64_t i; (i = next++) < num_blocks;) {
        const uint64_t off = i * kCompressBlockBytes, len = std::min(kCompressBlockBytes, raw_len - off);
        blocks[i] = encode_block(raw + off, len, itemsize, opt);
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
  return blocks;
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

void decode_block(const BlockRef& block, uint8_t* raw, uint64_t raw_len, int itemsize, const std::string& what) {
  thread_local DCtx dctx;
  thread_local std::vector<uint8_t> planes;
  const int num_planes = static_cast<int>(block.modes.size());
  if (num_planes != 1 && num_planes != itemsize)
    throw CheckpointError(what + ": " + std::to_string(num_planes) + " planes for an itemsize of " +
                          std::to_string(itemsize));
  if (block.plane_bytes.size() != block.modes.size())
    throw CheckpointError(what + ": plane sizes and modes differ in count");
  if (raw_len % num_planes != 0)
    throw CheckpointError(what + ": " + std::to_string(raw_len) + " raw bytes do not split into " +
                          std::to_string(num_planes) + " planes");
  const uint64_t got_stored = XXH3_64bits(block.stored, block.stored_len);
  if (got_stored != block.xxh3_stored)
    throw CheckpointError(what + ": XXH3-64 of its stored bytes " + hex(got_stored) + " != " + hex(block.xxh3_stored) +
                          " (the block is damaged)");
  const uint64_t plane_len = raw_len / num_planes;
  planes.resize(raw_len);
  uint64_t at = 0;
  for (int j = 0; j < num_planes; ++j) {
    const uint64_t len = block.plane_bytes[j];
    if (len > block.stored_len - at)
      throw CheckpointError(what + ": plane " + std::to_string(j) + " runs past the block's stored bytes");
    const uint8_t* src = block.stored + at;
    uint8_t* dst = planes.data() + uint64_t(j) * plane_len;
    if (block.modes[j] == 'r') {
      if (len != plane_len)
        throw CheckpointError(what + ": raw plane " + std::to_string(j) + " has " + std::to_string(len) +
                              " bytes, expected " + std::to_string(plane_len));
      std::memcpy(dst, src, plane_len);
    } else if (block.modes[j] == 'z') {
      const unsigned long long content_size = ZSTD_getFrameContentSize(src, len);
      const size_t frame_len = ZSTD_findFrameCompressedSize(src, len);
      if (content_size != plane_len || ZSTD_isError(frame_len) || frame_len != len)
        throw CheckpointError(what + ": plane " + std::to_string(j) + " is not one zstd frame of " +
                              std::to_string(plane_len) + " bytes");
      const size_t decoded_len = ZSTD_decompressDCtx(dctx.d, dst, plane_len, src, len);
      if (ZSTD_isError(decoded_len) || decoded_len != plane_len)
        throw CheckpointError(what + ": plane " + std::to_string(j) + " does not decode: " +
                              (ZSTD_isError(decoded_len) ? ZSTD_getErrorName(decoded_len) : "wrong size"));
    } else {
      throw CheckpointError(what + ": unknown plane mode '" + std::string(1, block.modes[j]) + "'");
    }
    at += len;
  }
  if (at != block.stored_len)
    throw CheckpointError(what + ": planes cover " + std::to_string(at) + " of its " +
                          std::to_string(block.stored_len) + " stored bytes");
  join_planes(planes.data(), plane_len, num_planes, raw);
  const uint64_t got_raw = XXH3_64bits(raw, raw_len);
  if (got_raw != block.xxh3_raw)
    throw CheckpointError(what + ": XXH3-64 of its decoded bytes " + hex(got_raw) + " != " + hex(block.xxh3_raw) +
                          " (does not decode to the saved bytes)");
}

}   // namespace rh::ckpt
