// safetensors files, our own writer and a validating mmap reader (format:
// shared/docs/BACKGROUND.md). The writer is deterministic: the JSON header lists keys sorted,
// padded with spaces to a multiple of 8; tensor bytes follow in (itemsize descending, key) order
// so every tensor is aligned to its element size. The reader maps the file and checks every
// structural rule before handing out a tensor; tensors it returns alias the mapping (no copy) and
// keep it alive.
// Not here: what the tensors mean (policy.h), checksums of whole checkpoints (manifest.h).
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/checkpoint/compress.h"
#include "harness/checkpoint/safetensors_format.h"

namespace rh::ckpt {

torch::ScalarType st_scalar_type(StDtype d);   // F8_E4M3 -> kByte (raw E4M3 bytes)
// The natural safetensors dtype of a torch dtype (kByte -> U8; fp8 bytes must say F8_E4M3).
StDtype st_from_scalar_type(torch::ScalarType t, const std::string& what);

struct WriteTensor {
  std::string key;
  torch::Tensor data;   // any device/layout; written as contiguous CPU bytes
  StDtype dtype;        // must have data's element size and agree with its scalar type
  // Instead of data: a U8 tensor of these byte ranges, in order (compressed blocks, written
  // where they were encoded without joining them first).
  std::vector<std::pair<const uint8_t*, uint64_t>> pieces = {};
};

struct WriteStats {
  uint64_t file_bytes = 0;            // whole file
  uint64_t header_bytes = 0;          // 8 + N: length prefix plus JSON header (with padding)
  uint64_t xxh3 = 0;                  // XXH3-64 of the whole file, computed while writing
  uint64_t header_xxh3 = 0;           // XXH3-64 of the first header_bytes (trusted header: damage is located)
  std::vector<uint64_t> block_xxh3;   // XXH3-64 of each kHashBlock bytes of the file (the last
                                      // block shorter): verifiable in parallel on load
};
constexpr uint64_t kHashBlock = 32ull << 20;

// Writes path (created/truncated) and fsyncs it when do_fsync. Throws CheckpointError naming the
// file and key on duplicate/empty keys, dtype mismatches or I/O errors.
WriteStats write_safetensors(const std::string& path, const std::vector<WriteTensor>& tensors,
                             const std::map<std::string, std::string>& metadata, bool do_fsync);

// Compressed files (compress.h, docs/checkpoints.md "Compressed checkpoints"): a standard safetensors file in
// which every tensor is stored as a U8 blob of its compressed blocks under its own key, and
// __metadata__ holds "rh_codec" (kCodecName), "rh_block_bytes" and "rh_tensors": a JSON object
// per key {"dtype", "shape", "raw_bytes", "blocks": [[modes, [plane bytes], xxh3 stored, xxh3 raw],
// ...]}. Blocks are encoded on all cores.
struct CompressedKeyStats {
  uint64_t raw_bytes = 0, stored_bytes = 0, blocks = 0;
};
WriteStats write_safetensors_compressed(const std::string& path, const std::vector<WriteTensor>& tensors,
                                        const std::map<std::string, std::string>& metadata, bool do_fsync,
                                        const CodecOptions& opt, std::map<std::string, CompressedKeyStats>* per_key);

// A mapped, validated safetensors file. Cheap to copy (shares the mapping).
class SafetensorsFile {
 public:
  // Maps path (a regular file; a FIFO or device is refused without blocking) and validates it
  // with parse_safetensors() (safetensors_format.h). Throws CheckpointError naming path and tensor.
  // `check_bytes`, if given, sees the whole mapped file before any structural check (the
  // checkpoint loader verifies size and checksum there, so damage is reported as such).
  static SafetensorsFile open(const std::string& path,
                              const std::function<void(const uint8_t* data, uint64_t size)>& check_bytes = {});

  // The loader's path ("verify while copying"): reads the whole file with pread() into
  // pooled anonymous memory (an Arena, reused from the previous load where one is free) and
  // hashes it while copying: each 256 KiB piece is fed to its block's XXH3-64 right after pread()
  // put it there, while it is still in cache, so the bytes are read once. Blocks of block_bytes
  // are spread over all cores. check_size(size) runs before anything is allocated or read;
  // check_blocks(data, size, hashes) sees every block's XXH3-64 before any structural check (so
  // damage is reported as damage); then the file is validated as open() does. Tensors alias the
  // buffer, which stays alive as long as any of them does and then goes back to the pool.
  static SafetensorsFile read_hashed(const std::string& path, uint64_t block_bytes,
                                     const std::function<void(uint64_t size)>& check_size,
                                     const std::function<void(const uint8_t* data, uint64_t size,
                                                              const std::vector<uint64_t>& block_xxh3)>& check_blocks);

  // A file someone else wrote and may still be changing (an external trainer's checkpoint): read
  // with pread() into owned memory, never mapped (a mapped file that shrinks kills the reader
  // with SIGBUS), and validated as open() does. A file that ends early, grows, or whose size or
  // modification time changed while it was read is a CheckpointError "<path> changed while it was
  // read (...)", one line. A symbolic link is refused, as are FIFOs and devices.
  static SafetensorsFile read_untrusted(const std::string& path);

  const std::string& path() const { return path_; }
  uint64_t file_bytes() const;
  uint64_t header_bytes() const { return 8 + header_len_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }   // sorted by key
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& key) const;
  const TensorInfo& info(const std::string& key) const;   // throws CheckpointError naming both
  // The tensor's bytes as a CPU tensor of st_scalar_type(dtype) aliasing the (copy-on-write)
  // mapping, which stays alive as long as the tensor does. Copied only if misaligned.
  torch::Tensor tensor(const std::string& key) const;
  // XXH3-64 of the whole mapped file.
  uint64_t xxh3() const;

  // True if __metadata__ names a codec (rh_codec): the tensors are compressed blobs.
  bool compressed() const { return metadata_.count("rh_codec") != 0; }
  // The decoded view of a compressed file: the logical tensors (dtype, shape from rh_tensors) in
  // one owned buffer, every block checked (stored XXH3-64, zstd frame sizes, raw XXH3-64) and
  // decoded on all cores. Validates the table first (dtypes, shapes, sizes, block counts, blobs
  // covered exactly, decoded size below physical memory). Throws CheckpointError naming file,
  // tensor and block.
  SafetensorsFile decoded() const;
  // Bytes a tensor takes in the file: its compressed blob's size in a decoded view, else its size.
  uint64_t stored_bytes(const std::string& key) const;
  // For a compressed file whose stored bytes fail a file-level checksum: the first block whose
  // stored XXH3-64 differs, as "tensor 'K' compressed block I of N (stored bytes [a, b) of the
  // file): ...", or "" if none does (or the table cannot be read).
  std::string locate_damaged_block() const;
  // Locating without a validated file: parses data (a whole file) itself; "" on any problem.
  static std::string locate_damaged_block(const std::string& path, const uint8_t* data, uint64_t size);

  struct Mapping;   // the mmap, shared by every tensor handed out (defined in the .cpp)

 private:
  std::string path_;
  std::shared_ptr<Mapping> map_;
  uint64_t header_len_ = 0;
  uint64_t data_offset_ = 0;   // where the data buffer starts in the mapping (8 + N; 0 decoded)
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, uint64_t> stored_bytes_;   // decoded view only
};

// XXH3-64 of a whole file, read through a mapping; throws CheckpointError naming the file.
uint64_t xxh3_file(const std::string& path, uint64_t* size_out);
// The same read with pread() in pieces, for a file another process may change meanwhile: a
// change (size, mtime, an early end) is the CheckpointError read_untrusted throws, never a SIGBUS.
uint64_t xxh3_file_untrusted(const std::string& path, uint64_t* size_out);
std::string hex64(uint64_t v);   // 16 lower-case hex digits

}   // namespace rh::ckpt
