// Lossless compression of checkpoint tensors: byte planes + zstd in independent fixed-size blocks
// (format in docs/checkpoints.md, "Compressed checkpoints"). LibTorch-free: pure bytes in, bytes out.
//
// A tensor's raw bytes (little-endian, row-major, itemsize k) are cut into blocks of
// kCompressBlockBytes raw bytes (the last one shorter). Each block is split into k byte planes:
// plane j holds byte j of every element of the block, in element order (for bf16: plane 0 the low
// bytes = 7 mantissa bits + 1 exponent bit, plane 1 the sign + 7 exponent bits). Each plane is
// stored either raw ('r') or as one zstd frame ('z'); a block's stored bytes are its planes'
// stored bytes in plane order, and a tensor's stored blob is its blocks in order. Every block has
// an XXH3-64 of its stored bytes (checked before decoding: names a damaged block) and of its raw
// bytes (checked after decoding: proves the exact bytes came back).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace rh::ckpt {

enum class Compression { none, zstd };
std::string to_string(Compression c);
Compression parse_compression(const std::string& s);   // "none" | "zstd"; throws std::invalid_argument

// Raw bytes per block: a multiple of every itemsize (1, 2, 4, 8).
constexpr uint64_t kCompressBlockBytes = 1ull << 20;
// The name written into a compressed file's __metadata__["rh_codec"].
inline constexpr const char* kCodecName = "byteplane-zstd/1";

struct CodecOptions {
  int level = 1;             // zstd level (negative: zstd's fast levels)
  bool byte_planes = true;   // false: zstd of the raw bytes (one "plane" of itemsize 1)
  // A plane whose order-0 entropy is at least this (bits/byte) is stored raw without trying zstd
  // (mantissa planes of trained values are near 8 bits: zstd would spend time to gain < 1 %).
  double raw_entropy_bits = 7.9;
  bool huffman_literals = false;   // force zstd's Huffman coding of literals (matters at levels < 0)
  int min_match = 0;               // > 0: zstd's minimum match length (7: nearly literals-only)
};

struct EncodedBlock {
  std::string modes;                   // one char per plane: 'z' zstd frame, 'r' raw
  std::vector<uint64_t> plane_bytes;   // stored bytes per plane
  uint64_t xxh3_stored = 0, xxh3_raw = 0;
  std::vector<uint8_t> bytes;   // the block's stored bytes (encode_block / encode_tensor)
  uint64_t stored_len = 0;      // encode_block_into: its stored bytes are dst[0, stored_len)
};

// Anonymous memory for whole files' worth of blocks, mapped with transparent huge pages where the
// kernel offers them, and given back to a small process-wide pool when destroyed so the next save
// or load reuses memory already touched (fresh pages are most of the cost on this VM: see
// compress.cpp). Contents are undefined (not zeroed when reused).
class Arena {
 public:
  explicit Arena(uint64_t bytes);   // throws std::bad_alloc
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  uint8_t* data() const { return p_; }
  static void release_pool();   // unmaps every pooled mapping (the next Arena starts cold)
  uint64_t size() const { return n_; }

 private:
  uint8_t* p_ = nullptr;
  uint8_t* base_ = nullptr;
  uint64_t n_ = 0, map_ = 0;
};

// Byte-plane split / join of n elements of itemsize k: dst[j * n + i] = src[i * k + j].
void split_planes(const uint8_t* src, uint64_t n, int k, uint8_t* dst);
void join_planes(const uint8_t* src, uint64_t n, int k, uint8_t* dst);

// Encodes one block of raw bytes (raw_len a multiple of itemsize, at most kCompressBlockBytes)
// into dst, which has room for raw_len bytes: a block never grows (a plane zstd cannot shrink is
// stored raw). Returns the table entry with stored_len set and `bytes` empty. Throws
// std::runtime_error on a zstd failure.
EncodedBlock encode_block_into(const uint8_t* raw, uint64_t raw_len, int itemsize, const CodecOptions& opt,
                               uint8_t* dst);
// The same into the block's own `bytes`.
EncodedBlock encode_block(const uint8_t* raw, uint64_t raw_len, int itemsize, const CodecOptions& opt);

// One tensor's blocks, encoded on `threads` threads (0: all cores).
std::vector<EncodedBlock> encode_tensor(const uint8_t* raw, uint64_t raw_len, int itemsize, const CodecOptions& opt,
                                        unsigned threads = 0);

// The header-table entry of one block: ["zr", [n0, n1], "<xxh3 stored>", "<xxh3 raw>"].
nlohmann::json block_json(const EncodedBlock& b);

// Decodes one block: checks its stored XXH3-64, decodes each plane (a zstd frame must declare and
// produce exactly the plane's size, with nothing after it), joins the planes and checks the raw
// XXH3-64. `what` names file, tensor and block for the message. Throws CheckpointError.
struct BlockRef {
  const uint8_t* stored = nullptr;
  uint64_t stored_len = 0;
  std::string modes;
  std::vector<uint64_t> plane_bytes;
  uint64_t xxh3_stored = 0, xxh3_raw = 0;
};
void decode_block(const BlockRef& block, uint8_t* raw, uint64_t raw_len, int itemsize, const std::string& what);

// Shannon entropy (bits per byte, order 0) of n bytes.
double byte_entropy(const uint8_t* p, uint64_t n);
// Bytes of an order-0 Huffman code of n bytes (code lengths from the byte histogram, plus a
// 256-byte table of code lengths): what a Huffman-only coder of a plane would store.
uint64_t huffman_bytes(const uint8_t* p, uint64_t n);

}   // namespace rh::ckpt
