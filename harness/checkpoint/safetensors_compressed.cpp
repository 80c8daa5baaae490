// Compressed safetensors files (rh_codec, see compress.h): the writer that stores each tensor as
// blocks compressed in parallel behind a table in __metadata__, the decoder that checks and
// expands them, and the locator that names a damaged block.
#include "harness/checkpoint/safetensors.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>

#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/safetensors_internal.h"

namespace rh::ckpt {

WriteStats write_safetensors_compressed(const std::string& path, const std::vector<WriteTensor>& tensors,
                                        const std::map<std::string, std::string>& metadata, bool do_fsync,
                                        const CodecOptions& opt, std::map<std::string, CompressedKeyStats>* per_key) {
  // Every block of every tensor is one job, so small tensors do not leave cores idle.
  struct Job {
    size_t t;
    uint64_t off, len;
  };
  // Every block is encoded into one arena at its raw offset (a block never grows), and written
  // from there: no per-block buffers, no joined blob.
  std::vector<torch::Tensor> raw(tensors.size());
  std::vector<std::vector<EncodedBlock>> encoded(tensors.size());
  std::vector<uint64_t> base(tensors.size());
  std::vector<Job> jobs;
  uint64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const WriteTensor& tensor = tensors[i];
    if (!tensor.data.defined()) bad_safetensors(path, "tensor '" + tensor.key + "' is undefined");
    if (tensor.data.scalar_type() != st_scalar_type(tensor.dtype))
      bad_safetensors(path, "tensor '" + tensor.key + "' has torch dtype " +
                                std::string(c10::toString(tensor.data.scalar_type())) + ", expected " +
                                c10::toString(st_scalar_type(tensor.dtype)) + " for " + st_name(tensor.dtype));
    raw[i] = tensor.data.contiguous().cpu();
    const uint64_t bytes = static_cast<uint64_t>(raw[i].numel()) * st_itemsize(tensor.dtype);
    encoded[i].resize((bytes + kCompressBlockBytes - 1) / kCompressBlockBytes);
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
  const std::vector<std::string> errs = detail::run_blocks_on_all_cores(jobs.size(), [&](size_t j) {
    const Job& job = jobs[j];
    encoded[job.t][job.off / kCompressBlockBytes] =
        encode_block_into(static_cast<const uint8_t*>(raw[job.t].data_ptr()) + job.off, job.len,
                          static_cast<int>(st_itemsize(tensors[job.t].dtype)), opt,
                          arena->data() + base[job.t] + job.off);
  });
  for (size_t j = 0; j < jobs.size(); ++j)
    if (!errs[j].empty()) bad_safetensors(path, "tensor '" + tensors[jobs[j].t].key + "': " + errs[j]);

  nlohmann::json table = nlohmann::json::object();
  std::vector<WriteTensor> blobs;
  for (size_t i = 0; i < tensors.size(); ++i) {
    uint64_t stored = 0;
    nlohmann::json blocks = nlohmann::json::array();
    WriteTensor blob{tensors[i].key, torch::Tensor(), StDtype::U8};
    for (size_t b = 0; b < encoded[i].size(); ++b) {
      stored += encoded[i][b].stored_len;
      blocks.push_back(block_json(encoded[i][b]));
      blob.pieces.push_back({arena->data() + base[i] + b * kCompressBlockBytes, encoded[i][b].stored_len});
    }
    const uint64_t raw_bytes = static_cast<uint64_t>(raw[i].numel()) * st_itemsize(tensors[i].dtype);
    table[tensors[i].key] = {{"dtype", st_name(tensors[i].dtype)},
                             {"shape", raw[i].sizes().vec()},
                             {"raw_bytes", raw_bytes},
                             {"blocks", blocks}};
    if (per_key) (*per_key)[tensors[i].key] = {raw_bytes, stored, encoded[i].size()};
    if (blob.pieces.empty()) blob.data = torch::empty({0}, torch::kByte);   // an empty tensor: an empty blob
    blobs.push_back(std::move(blob));
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
  auto block_bytes = metadata.find("rh_block_bytes");
  if (block_bytes == metadata.end() || block_bytes->second != std::to_string(kCompressBlockBytes))
    bad_safetensors(path, "rh_block_bytes must be " + std::to_string(kCompressBlockBytes));
  auto table_text = metadata.find("rh_tensors");
  if (table_text == metadata.end()) bad_safetensors(path, "compressed, but __metadata__ has no rh_tensors");
  nlohmann::json table;
  try {
    table = parse_json_bounded(table_text->second, what);
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(e.what());
  }
  const JsonField root(table, what);
  if (root.object_size() != stored.size())
    bad_safetensors(path, "rh_tensors lists " + std::to_string(root.object_size()) + " tensors, the file stores " +
                              std::to_string(stored.size()));
  std::vector<TableEntry> entries;
  for (const TensorInfo& ti : stored) {
    if (ti.dtype != StDtype::U8 || ti.shape.size() != 1)
      bad_safetensors(path, "compressed tensor '" + ti.key + "' must be stored as a 1-D U8 blob");
    if (!root.has(ti.key)) bad_safetensors(path, "tensor '" + ti.key + "' has no entry in rh_tensors");
    const JsonField entry = root[ti.key];
    TableEntry te;
    te.blob = &ti;
    te.logical.key = ti.key;
    if (!st_parse(entry["dtype"].str(), &te.logical.dtype))
      entry["dtype"].fail("unknown dtype " + quote_json(entry["dtype"].raw()));
    const int64_t itemsize = st_itemsize(te.logical.dtype);
    uint64_t numel = 1;
    entry["shape"].each([&](const JsonField& dim) {
      const int64_t dim_size = dim.i64(0, int64_t(1) << 40);
      te.logical.shape.push_back(dim_size);
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dim_size), &numel))
        dim.fail("the shape's element count overflows");
    });
    uint64_t raw = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(itemsize), &raw))
      entry["shape"].fail("the tensor's byte count overflows");
    if (entry["raw_bytes"].u64() != raw)
      entry["raw_bytes"].fail(std::to_string(entry["raw_bytes"].u64()) + " raw bytes, the shape and dtype need " +
                              std::to_string(raw));
    te.logical.end = raw;
    const uint64_t num_blocks = (raw + kCompressBlockBytes - 1) / kCompressBlockBytes;
    if (entry["blocks"].size() != num_blocks)
      entry["blocks"].fail(std::to_string(entry["blocks"].size()) + " blocks, " + std::to_string(raw) +
                           " raw bytes need " + std::to_string(num_blocks));
    const uint64_t blob_len = ti.end - ti.begin;
    uint64_t at = 0;
    entry["blocks"].each([&](const JsonField& block) {
      BlockRef ref;
      ref.modes = block[size_t(0)].str();
      if (ref.modes.size() != 1 && ref.modes.size() != static_cast<size_t>(itemsize))
        block[size_t(0)].fail("expected 1 or " + std::to_string(itemsize) + " plane modes, got " +
                              quote_text(ref.modes));
      if (block[size_t(1)].size() != ref.modes.size()) block[size_t(1)].fail("one stored size per plane expected");
      uint64_t len = 0;
      block[size_t(1)].each([&](const JsonField& stored_size) {
        const uint64_t plane_len = stored_size.u64(blob_len);
        ref.plane_bytes.push_back(plane_len);
        len += plane_len;   // each <= blob_len and at most 8 planes: no overflow
      });
      if (len > blob_len - at)
        block[size_t(1)].fail("the blocks run past the tensor's " + std::to_string(blob_len) + " stored bytes");
      for (size_t h = 2; h <= 3; ++h) {
        const std::string digits = block[h].str();
        char* endp = nullptr;
        if (digits.size() != 16 || digits.find_first_not_of("0123456789abcdef") != std::string::npos)
          block[h].fail("expected 16 lower-case hex digits, got " + quote_text(digits));
        (h == 2 ? ref.xxh3_stored : ref.xxh3_raw) = std::strtoull(digits.c_str(), &endp, 16);
      }
      ref.stored = data_start + ti.begin + at;
      ref.stored_len = len;
      at += len;
      te.blocks.push_back(std::move(ref));
    });
    if (at != blob_len)
      bad_safetensors(path, "tensor '" + ti.key + "': its blocks cover " + std::to_string(at) + " of its " +
                                std::to_string(blob_len) + " stored bytes");
    entries.push_back(std::move(te));
  }
  return entries;
}

std::string block_name(const std::string& key, size_t i, size_t n) {
  return "tensor '" + key + "' compressed block " + std::to_string(i) + " of " + std::to_string(n) + " (raw bytes [" +
         std::to_string(i * kCompressBlockBytes) + ", ...))";
}

}   // namespace

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
  SafetensorsFile decoded_file;
  decoded_file.path_ = path_;
  decoded_file.metadata_ = metadata_;
  decoded_file.header_len_ = header_len_;
  decoded_file.data_offset_ = 0;
  decoded_file.map_ = detail::owned_mapping(path_, total, "to decode it");
  uint8_t* base = static_cast<uint8_t*>(decoded_file.map_->addr);
  struct Job {
    size_t t, b;
  };
  std::vector<Job> jobs;
  for (size_t t = 0; t < table.size(); ++t)
    for (size_t b = 0; b < table[t].blocks.size(); ++b) jobs.push_back({t, b});
  const std::vector<std::string> errs = detail::run_blocks_on_all_cores(jobs.size(), [&](size_t j) {
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
    decoded_file.tensors_.push_back(te.logical);
    decoded_file.stored_bytes_[te.logical.key] = te.blob->end - te.blob->begin;
  }
  return decoded_file;   // tensors_ stays sorted by key: table follows tensors_
}

std::string SafetensorsFile::locate_damaged_block() const {
  try {
    const uint8_t* data = map_->bytes() + data_offset_;
    const std::vector<TableEntry> table = read_table(path_, tensors_, metadata_, data);
    for (const TableEntry& te : table)
      for (size_t b = 0; b < te.blocks.size(); ++b) {
        const BlockRef& block = te.blocks[b];
        const uint64_t got = XXH3_64bits(block.stored, block.stored_len);
        if (got != block.xxh3_stored) {
          const uint64_t at = static_cast<uint64_t>(block.stored - map_->bytes());
          return block_name(te.logical.key, b, te.blocks.size()) + ", stored bytes [" + std::to_string(at) + ", " +
                 std::to_string(at + block.stored_len) + ") of the file: XXH3-64 " + hex64(got) +
                 " != " + hex64(block.xxh3_stored);
        }
      }
  } catch (const std::exception&) {
  }
  return "";
}

std::string SafetensorsFile::locate_damaged_block(const std::string& path, const uint8_t* data, uint64_t size) {
  try {
    ParsedSafetensors parsed = parse_safetensors(path, data, size);
    SafetensorsFile file;
    file.path_ = path;
    file.map_ = std::make_shared<Mapping>();
    file.map_->borrowed = true;   // not ours to unmap
    file.map_->addr = const_cast<uint8_t*>(data);
    file.map_->len = size;
    file.header_len_ = parsed.header_len;
    file.data_offset_ = 8 + parsed.header_len;
    file.tensors_ = std::move(parsed.tensors);
    file.metadata_ = std::move(parsed.metadata);
    if (!file.compressed()) return "";
    return file.locate_damaged_block();
  } catch (const std::exception&) {
    return "";
  }
}

}   // namespace rh::ckpt
