// Compressed checkpoints (byte planes + zstd blocks, compress.h): the fast byte-plane split beside
// an element-by-element reference, block round trips bit for bit per dtype (fp32, bf16, fp16,
// int16, fp8/uint8) at block boundaries, whole checkpoints saved compressed in every storage mode
// loading bit for bit, and a damaged compressed block refused naming file, tensor and block while
// the live state stays untouched.
#include <xxhash.h>
#include <zstd.h>

#include <fstream>
#include <sstream>

#include "checkpoint_fixture.h"
#include "harness/checkpoint/compress.h"
#include "harness/checkpoint/safetensors.h"

using namespace ckfix;
using namespace rh::ckpt;

namespace {

const char* kShard = "optim_rank_00000.safetensors";


// The obvious reference: element i's byte j, read as ((value >> 8j) & 0xff) from the element as
// an unsigned integer of itemsize bytes (little-endian memory), written to plane j at index i.
std::vector<uint8_t> reference_split(const uint8_t* src, uint64_t n, int k) {
  std::vector<uint8_t> out(n * k);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t v = 0;
    for (int j = 0; j < k; ++j) v |= uint64_t(src[i * k + j]) << (8 * j);
    for (int j = 0; j < k; ++j) out[j * n + i] = static_cast<uint8_t>((v >> (8 * j)) & 0xff);
  }
  return out;
}

struct DtypeCase {
  std::string name;
  torch::ScalarType t;
  int itemsize;
};

// Values like a trained state's: small normals of varying scale (clustered exponents), some
// exact zeros, and for int16 the uniform low halves a remainder holds.
torch::Tensor trained_like(const DtypeCase& dtype_case, int64_t n, uint64_t seed) {
  auto g = at::detail::createCPUGenerator(seed);
  torch::Tensor v = torch::randn({n}, g) * 1e-3 * torch::exp(torch::randn({n}, g));
  v.masked_fill_(torch::rand({n}, g) < 0.05, 0.0);
  if (dtype_case.t == torch::kShort) return torch::randint(-32768, 32768, {n}, g).to(torch::kShort);
  if (dtype_case.t == torch::kByte)
    return torch::randint(0, 256, {n}, g).to(torch::kByte).bitwise_and(0x7f);   // fp8-ish codes
  return v.to(dtype_case.t);
}

class Planes : public ::testing::TestWithParam<DtypeCase> {};

TEST_P(Planes, FastSplitMatchesTheReferenceAndJoinInvertsIt) {
  const DtypeCase dtype_case = GetParam();
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(4096), int64_t(100003)}) {
    torch::Tensor t = trained_like(dtype_case, n, 3 + n);
    const uint8_t* src = static_cast<const uint8_t*>(t.data_ptr());
    std::vector<uint8_t> fast(n * dtype_case.itemsize), back(n * dtype_case.itemsize);
    split_planes(src, n, dtype_case.itemsize, fast.data());
    EXPECT_EQ(fast, reference_split(src, n, dtype_case.itemsize)) << dtype_case.name << " n=" << n;
    join_planes(fast.data(), n, dtype_case.itemsize, back.data());
    EXPECT_EQ(0, std::memcmp(back.data(), src, back.size())) << dtype_case.name << " n=" << n;
  }
}

TEST_P(Planes, BlocksRoundTripBitForBitAtBlockBoundaries) {
  const DtypeCase dtype_case = GetParam();
  const int64_t per_block = static_cast<int64_t>(kCompressBlockBytes) / dtype_case.itemsize;
  for (int64_t n : {int64_t(1), per_block - 1, per_block, per_block + 1, 2 * per_block + 5}) {
    torch::Tensor t = trained_like(dtype_case, n, 11 + n);
    const uint8_t* src = static_cast<const uint8_t*>(t.data_ptr());
    const uint64_t bytes = static_cast<uint64_t>(n) * dtype_case.itemsize;
    for (bool planes : {true, false}) {
      CodecOptions opt;
      opt.byte_planes = planes;
      std::vector<EncodedBlock> enc = encode_tensor(src, bytes, dtype_case.itemsize, opt, 2);
      ASSERT_EQ(enc.size(), (bytes + kCompressBlockBytes - 1) / kCompressBlockBytes);
      std::vector<uint8_t> out(bytes);
      for (size_t b = 0; b < enc.size(); ++b) {
        BlockRef block_ref{enc[b].bytes.data(), enc[b].bytes.size(), enc[b].modes,
                           enc[b].plane_bytes,  enc[b].xxh3_stored,  enc[b].xxh3_raw};
        const uint64_t off = b * kCompressBlockBytes, len = std::min(kCompressBlockBytes, bytes - off);
        decode_block(block_ref, out.data() + off, len, dtype_case.itemsize, "block");
        // The slow path, independent of decode_block: each plane by plain ZSTD_decompress (or
        // copied when raw), then joined element by element.
        const int k = static_cast<int>(enc[b].modes.size());
        const uint64_t m = len / k;
        std::vector<uint8_t> plane_data(len), ref(len);
        uint64_t at = 0;
        for (int j = 0; j < k; ++j) {
          const uint64_t stored_len = enc[b].plane_bytes[j];
          if (enc[b].modes[j] == 'r') {
            ASSERT_EQ(stored_len, m);
            std::memcpy(plane_data.data() + j * m, enc[b].bytes.data() + at, m);
          } else {
            ASSERT_EQ(enc[b].modes[j], 'z');
            ASSERT_EQ(ZSTD_decompress(plane_data.data() + j * m, m, enc[b].bytes.data() + at, stored_len), m);
          }
          at += stored_len;
        }
        ASSERT_EQ(at, enc[b].bytes.size());
        for (uint64_t i = 0; i < m; ++i)
          for (int j = 0; j < k; ++j) ref[i * k + j] = plane_data[j * m + i];
        EXPECT_EQ(0, std::memcmp(ref.data(), src + off, len)) << dtype_case.name << " block " << b;
      }
      EXPECT_EQ(0, std::memcmp(out.data(), src, bytes)) << dtype_case.name << " n=" << n << " planes=" << planes;
    }
  }
}

TEST_P(Planes, ADamagedBlockIsRefusedBeforeDecoding) {
  const DtypeCase dtype_case = GetParam();
  torch::Tensor t = trained_like(dtype_case, 5000, 5);
  const uint8_t* src = static_cast<const uint8_t*>(t.data_ptr());
  std::vector<EncodedBlock> enc =
      encode_tensor(src, 5000 * dtype_case.itemsize, dtype_case.itemsize, CodecOptions{}, 1);
  ASSERT_EQ(enc.size(), 1u);
  enc[0].bytes[enc[0].bytes.size() / 2] ^= 0x04;
  BlockRef block_ref{enc[0].bytes.data(), enc[0].bytes.size(), enc[0].modes,
                     enc[0].plane_bytes,  enc[0].xxh3_stored,  enc[0].xxh3_raw};
  std::vector<uint8_t> out(5000 * dtype_case.itemsize);
  try {
    decode_block(block_ref, out.data(), out.size(), dtype_case.itemsize, "file F tensor 'K' compressed block 0 of 1");
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'K' compressed block 0 of 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("damaged"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Planes,
                         ::testing::Values(DtypeCase{"fp32", torch::kFloat, 4}, DtypeCase{"bf16", torch::kBFloat16, 2},
                                           DtypeCase{"fp16", torch::kHalf, 2}, DtypeCase{"int16", torch::kShort, 2},
                                           DtypeCase{"fp8_uint8", torch::kByte, 1}),
                         [](const auto& i) { return i.param.name; });

// Whole checkpoints, every storage mode: saved compressed, loaded into a fresh rig bit for bit.
class CompressedRoundTrip : public ::testing::TestWithParam<Mode> {};

TEST_P(CompressedRoundTrip, LoadsBitForBit) {
  torch::set_num_threads(1);
  TmpDir root;
  Rig saved_rig = make_rig(GetParam(), 1);
  train(saved_rig, 3);
  SavePolicy save_policy;
  save_policy.compress = Compression::zstd;
  SaveResult save_result = save_checkpoint(root.str(), save_input(saved_rig, save_policy));
  Rig resumed_rig = make_rig(GetParam(), 2);
  load_checkpoint(root.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, save_input(saved_rig).run_config,
                  {});
  EXPECT_TRUE(same_state(saved_rig, resumed_rig));
  EXPECT_EQ(resumed_rig.state.iteration, saved_rig.state.iteration);
  const nlohmann::json manifest = nlohmann::json::parse(slurp(fs::path(save_result.dir) / "manifest.json"));
  EXPECT_EQ(manifest["save_policy"]["compress"], "zstd");
  for (const auto& f : manifest["files"]) {
    EXPECT_EQ(f["compress"], "zstd");
    EXPECT_TRUE(f.contains("raw_bytes") && f.contains("stored_bytes"));
  }
  for (const auto& t : manifest["tensors"]) EXPECT_TRUE(t.contains("stored_bytes")) << t["key"];
  EXPECT_TRUE(manifest["disk"].contains("raw_bytes_per_param"));
  // disk.csv: bytes (on disk) add up to the directory's total, raw_bytes to the uncompressed one.
  std::ifstream csv(fs::path(save_result.dir) / "disk.csv");
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "file,key,kind,dtype,numel,bytes,raw_bytes");
  uint64_t on_disk = 0, raw = 0;
  while (std::getline(csv, line)) {
    const size_t last = line.rfind(','), prev = line.rfind(',', last - 1);
    on_disk += std::stoull(line.substr(prev + 1, last - prev - 1));
    raw += std::stoull(line.substr(last + 1));
  }
  EXPECT_EQ(on_disk, save_result.total_bytes);
  EXPECT_EQ(raw, manifest["disk"]["raw_total_bytes"].get<uint64_t>());
  EXPECT_LE(on_disk, raw);
  std::ostringstream out;
  EXPECT_EQ(inspect_checkpoint(save_result.dir, out), 0) << out.str();
  EXPECT_NE(out.str().find("compression per key"), std::string::npos) << out.str();
  // The stored files are standard safetensors: each tensor a U8 blob under its own key.
  SafetensorsFile shard_file = SafetensorsFile::open((fs::path(save_result.dir) / kShard).string());
  EXPECT_TRUE(shard_file.compressed());
  for (const auto& ti : shard_file.tensors()) EXPECT_EQ(ti.dtype, StDtype::U8) << ti.key;
}

INSTANTIATE_TEST_SUITE_P(Modes, CompressedRoundTrip, ::testing::ValuesIn(all_modes()),
                         [](const auto& i) { return i.param.name; });

// Where block `b` of tensor `key` lies in a compressed file: [begin, end) of the file.
std::pair<uint64_t, uint64_t> block_span(const std::string& file_bytes, const std::string& key, size_t b,
                                         size_t* n_blocks) {
  uint64_t header_len;
  std::memcpy(&header_len, file_bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(file_bytes.substr(8, header_len));
  const nlohmann::json table = nlohmann::json::parse(header["__metadata__"]["rh_tensors"].get<std::string>());
  uint64_t at = 8 + header_len + header[key]["data_offsets"][0].get<uint64_t>();
  const auto& blocks = table[key]["blocks"];
  *n_blocks = blocks.size();
  for (size_t i = 0;; ++i) {
    uint64_t len = 0;
    for (const auto& l : blocks[i][1]) len += l.get<uint64_t>();
    if (i == b) return {at, at + len};
    at += len;
  }
}

void reseal_checksums(const fs::path& dir, const std::string& file, const std::string& bytes) {
  spit(dir / file, bytes);
  nlohmann::json manifest = nlohmann::json::parse(slurp(dir / "manifest.json"));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(bytes.data(), bytes.size()));
  nlohmann::json blocks = nlohmann::json::array();
  for (size_t off = 0; off < bytes.size(); off += kHashBlock) {
    char block_hex[17];
    const size_t len = std::min<size_t>(kHashBlock, bytes.size() - off);
    std::snprintf(block_hex, sizeof block_hex, "%016llx", (unsigned long long)XXH3_64bits(bytes.data() + off, len));
    blocks.push_back(block_hex);
  }
  for (auto& f : manifest["files"])
    if (f["name"] == file) f["xxh3"] = hex, f["block_xxh3"] = blocks;
  write_manifest(dir, manifest);
}

// A late block of a multi-block tensor damaged: refused naming file, tensor and block; nothing
// restored. Once with the file's checksums as saved (the file-level check finds it, the block
// table names it), once with them resealed over the damage (the block's own XXH3-64 finds it).
class DamagedBlock : public ::testing::TestWithParam<bool> {};

TEST_P(DamagedBlock, IsNamedAndTheLiveStateIsUntouched) {
  torch::set_num_threads(1);
  TmpDir root;
  const Mode mode = all_modes()[4];   // remainders + bf16 moments
  const int64_t width = 700000;       // l0.w: 3.5 M elements, several 1 MiB blocks per state
  Rig saved_rig = make_rig(mode, 1, width);
  train(saved_rig, 1);
  SavePolicy save_policy;
  save_policy.compress = Compression::zstd;
  const fs::path dir = save_checkpoint(root.str(), save_input(saved_rig, save_policy)).dir;
  const std::string key = "l0.w/exp_avg_sq";
  std::string bytes = slurp(dir / kShard);
  size_t block_count = 0;
  block_span(bytes, key, 0, &block_count);
  ASSERT_GE(block_count, 3u);
  const auto [b0, b1] = block_span(bytes, key, block_count - 2, &block_count);
  bytes[(b0 + b1) / 2] ^= 0x20;
  if (GetParam()) reseal_checksums(dir, kShard, bytes);
  else spit(dir / kShard, bytes);

  Rig target_rig = make_rig(mode, 2, width), fresh = make_rig(mode, 2, width);
  const std::string want =
      "tensor '" + key + "' compressed block " + std::to_string(block_count - 2) + " of " + std::to_string(block_count);
  try {
    load_checkpoint(root.str(), *target_rig.model, *target_rig.opt, target_rig.state, save_input(saved_rig).run_config,
                    {});
    FAIL() << "loaded a damaged compressed block";
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(kShard), std::string::npos) << msg;
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
  }
  EXPECT_TRUE(same_state(target_rig, fresh));
  EXPECT_EQ(target_rig.state.iteration, 0);
  std::ostringstream out;
  EXPECT_EQ(inspect_checkpoint(dir.string(), out), 1);
  EXPECT_NE(out.str().find(want), std::string::npos) << out.str();
}

INSTANTIATE_TEST_SUITE_P(Checksums, DamagedBlock, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? std::string("Resealed") : std::string("AsSaved"); });

// A hostile block table (sizes that do not add up) is refused with a message, never decoded.
TEST(CompressedHostile, ATableThatDoesNotCoverTheBlobIsRefused) {
  torch::set_num_threads(1);
  TmpDir root;
  Rig saved_rig = make_rig(all_modes()[4], 1);
  train(saved_rig, 1);
  SavePolicy save_policy;
  save_policy.compress = Compression::zstd;
  const fs::path dir = save_checkpoint(root.str(), save_input(saved_rig, save_policy)).dir;
  std::string bytes = slurp(dir / kShard);
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len));
  nlohmann::json table = nlohmann::json::parse(header["__metadata__"]["rh_tensors"].get<std::string>());
  table["embed/exp_avg"]["raw_bytes"] = 1ull << 50;
  header["__metadata__"]["rh_tensors"] = table.dump();
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  uint64_t new_header_len = header_text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &new_header_len, 8);
  reseal_checksums(dir, kShard, out + header_text + bytes.substr(8 + header_len));
  nlohmann::json manifest = nlohmann::json::parse(slurp(dir / "manifest.json"));
  for (auto& f : manifest["files"])   // keep header_bytes and header_xxh3 consistent with the new header
    if (f["name"] == kShard) {
      f["bytes"] = out.size() + header_text.size() + bytes.size() - 8 - header_len;
      f["header_bytes"] = 8 + new_header_len;
      char header_hex[17];
      const std::string head = out + header_text;
      std::snprintf(header_hex, sizeof header_hex, "%016llx",
                    (unsigned long long)XXH3_64bits(head.data(), head.size()));
      f["header_xxh3"] = header_hex;
    }
  write_manifest(dir, manifest);
  Rig target_rig = make_rig(all_modes()[4], 2), fresh = make_rig(all_modes()[4], 2);
  try {
    load_checkpoint(root.str(), *target_rig.model, *target_rig.opt, target_rig.state, save_input(saved_rig).run_config,
                    {});
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(kShard), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("raw_bytes"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(same_state(target_rig, fresh));
}

}   // namespace
