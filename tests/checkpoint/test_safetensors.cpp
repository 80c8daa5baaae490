// Tests of the safetensors layer alone: bitwise round trip of every dtype (aligned and odd
// shapes, scalars, empty tensors), deterministic bytes, checksums, and one case per structural
// rule the reader enforces, each asserting the error names the file and the offending tensor.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <xxhash.h>

#include <fcntl.h>

#include <atomic>
#include <cstring>
#include <iostream>
#include <thread>
#include <filesystem>
#include <fstream>

#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/safetensors.h"
#include "tests/checkpoint_fixture.h"

namespace fs = std::filesystem;
using namespace rh::ckpt;

namespace {

using ckfix::TmpDir;

// Random bytes of the right size for any dtype (bit patterns include NaNs and infinities, which
// the round trip must carry untouched).
torch::Tensor random_tensor(StDtype d, std::vector<int64_t> shape, int64_t seed) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  int64_t numel = 1;
  for (auto s : shape) numel *= s;
  torch::Tensor bytes =
      torch::randint(0, 256, {numel * st_itemsize(d)}, gen, torch::TensorOptions().dtype(torch::kByte));
  torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(st_scalar_type(d)));
  if (numel) std::memcpy(t.data_ptr(), bytes.data_ptr(), bytes.numel());
  return t;
}

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         (a.numel() == 0 ||   // an empty tensor's data_ptr() may be null: memcmp(nullptr, ...) is UB
          std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.numel() * a.element_size()) == 0);
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_raw(const std::string& path, const std::string& header, const std::string& buffer,
               int64_t length_field = -1) {
  uint64_t n = length_field < 0 ? header.size() : static_cast<uint64_t>(length_field);
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  std::ofstream(path, std::ios::binary) << s << header << buffer;
}

}   // namespace

// ------------------------------------------------------------------ round trip per dtype

class SafetensorsDtype : public ::testing::TestWithParam<StDtype> {};

TEST_P(SafetensorsDtype, RoundTripIsBitwise) {
  torch::set_num_threads(1);
  TmpDir dir;
  const StDtype d = GetParam();
  // Odd and aligned shapes, a 0-dim scalar and an empty tensor, next to a 1-byte dtype that would
  // misalign anything written after it in naive order.
  std::vector<WriteTensor> in = {
      {"a/odd", random_tensor(d, {3, 5, 7}, 1), d},
      {"b/aligned", random_tensor(d, {64, 8}, 2), d},
      {"c/scalar", random_tensor(d, {}, 3), d},
      {"d/empty", random_tensor(d, {0, 4}, 4), d},
      {"e/bytes", random_tensor(StDtype::U8, {3}, 5), StDtype::U8},
  };
  const std::string path = dir.file("x.safetensors");
  WriteStats ws = write_safetensors(path, in, {{"format", "pt"}}, true);
  EXPECT_EQ(ws.header_bytes % 8, 0u);
  EXPECT_EQ(ws.file_bytes, fs::file_size(path));
  uint64_t size = 0;
  EXPECT_EQ(ws.xxh3, xxh3_file(path, &size));
  EXPECT_EQ(size, ws.file_bytes);

  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.xxh3(), ws.xxh3);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.tensors().size(), in.size());
  for (const auto& w : in) {
    torch::Tensor t = f.tensor(w.key);
    EXPECT_EQ(f.info(w.key).dtype, w.dtype) << w.key;
    EXPECT_TRUE(bitwise_equal(t, w.data)) << w.key;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % st_itemsize(w.dtype), 0u) << w.key;
  }
  // Tensors alias a copy-on-write mapping: writing one must not change the file.
  torch::Tensor t = f.tensor("b/aligned");
  const std::string before = read_bytes(path);
  std::memset(t.data_ptr(), 0xAB, 4);
  EXPECT_EQ(read_bytes(path), before);

  // Same input, same bytes.
  const std::string path2 = dir.file("y.safetensors");
  EXPECT_EQ(write_safetensors(path2, in, {{"format", "pt"}}, false).xxh3, ws.xxh3);
  EXPECT_EQ(read_bytes(path2), before);
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, SafetensorsDtype,
                         ::testing::Values(StDtype::F32, StDtype::F16, StDtype::BF16, StDtype::F8_E4M3, StDtype::I16,
                                           StDtype::U8, StDtype::I32, StDtype::I64, StDtype::F64),
                         [](const auto& info) { return st_name(info.param); });

TEST(Safetensors, TensorOutlivesTheFileObject) {
  TmpDir dir;
  const std::string path = dir.file("x.safetensors");
  torch::Tensor src = torch::arange(1000, torch::kFloat);
  write_safetensors(path, {{"w", src, StDtype::F32}}, {}, false);
  torch::Tensor t;
  { t = SafetensorsFile::open(path).tensor("w"); }   // the mapping must stay alive through t
  EXPECT_TRUE(torch::equal(t, src));
}

// The per-block checksums the loader verifies in parallel: one per kHashBlock bytes of the file,
// the last one shorter, each the XXH3-64 of exactly those bytes (checked against the file).
TEST(Safetensors, BlockChecksumsCoverTheFileInOrder) {
  TmpDir dir;
  const std::string path = dir.file("big.safetensors");
  const int64_t n = static_cast<int64_t>(2 * kHashBlock / 4 + 12345);   // a bit over two blocks of fp32
  torch::Tensor a = torch::arange(n, torch::kFloat), b = torch::ones({77}, torch::kFloat);
  const WriteStats ws = write_safetensors(path, {{"a", a, StDtype::F32}, {"b", b, StDtype::F32}}, {}, false);
  ASSERT_EQ(ws.block_xxh3.size(), 3u);
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), ws.file_bytes);
  for (size_t i = 0; i < 3; ++i) {
    const size_t off = i * kHashBlock, len = std::min<size_t>(kHashBlock, bytes.size() - off);
    EXPECT_EQ(ws.block_xxh3[i], XXH3_64bits(bytes.data() + off, len)) << "block " << i;
  }
  EXPECT_EQ(ws.xxh3, XXH3_64bits(bytes.data(), bytes.size()));
}

TEST(Safetensors, WriterRejectsBadInput) {
  TmpDir dir;
  const std::string path = dir.file("x.safetensors");
  torch::Tensor f = torch::zeros({2});
  EXPECT_THROW(write_safetensors(path, {{"k", f, StDtype::F32}, {"k", f, StDtype::F32}}, {}, false), CheckpointError);
  EXPECT_THROW(write_safetensors(path, {{"k", f, StDtype::BF16}}, {}, false), CheckpointError);
  EXPECT_THROW(write_safetensors(path, {{"__metadata__", f, StDtype::F32}}, {}, false), CheckpointError);
}

// ------------------------------------------------------------------ structural corruption

struct Corruption {
  std::string name;
  std::string header;     // JSON header (written unpadded)
  size_t buffer_bytes;    // size of the data buffer written after it
  int64_t length_field;   // -1: the header's true length
  std::string expect;     // fragment the error message must contain
};

class SafetensorsCorruption : public ::testing::TestWithParam<Corruption> {};

TEST_P(SafetensorsCorruption, IsRejectedNamingFileAndCause) {
  TmpDir dir;
  const Corruption& c = GetParam();
  const std::string path = dir.file("bad.safetensors");
  write_raw(path, c.header, std::string(c.buffer_bytes, '\x01'), c.length_field);
  try {
    SafetensorsFile::open(path);
    FAIL() << "accepted a file with " << c.name;
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << msg;
  }
}

const std::string kT = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
INSTANTIATE_TEST_SUITE_P(
    Cases, SafetensorsCorruption,
    ::testing::Values(
        Corruption{"HeaderLengthBelow2", "{}", 0, 1, "header length 1 < 2"},
        Corruption{"HeaderLengthOverCap", "{" + kT + "}", 8, 200000000, "exceeds the 100 MB cap"},
        Corruption{"HeaderLengthPastEnd", "{" + kT + "}", 8, 5000, "runs past the end"},
        Corruption{"NotAnObjectStart", "[" + kT + "]", 8, -1, "does not start with '{'"},
        Corruption{"InvalidJson", "{" + kT + ",}", 8, -1, "not valid JSON"},
        Corruption{"DuplicateKey", "{" + kT + "," + kT + "}", 8, -1, "duplicate key 't'"},
        Corruption{"UnknownDtype", R"({"t":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", 8, -1,
                   "tensor 't': unknown dtype 'F7'"},
        Corruption{"NegativeShape", R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, -1,
                   "tensor 't': shape entries must be integers >= 0"},
        Corruption{"FloatShape", R"({"t":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8, -1,
                   "tensor 't': shape entries"},
        Corruption{"OffsetsOutOfRange", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 8, -1,
                   "tensor 't': data_offsets [8, 16] out of range"},
        Corruption{"BeginAfterEnd", R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8, -1,
                   "tensor 't': data_offsets begin 8 > end 0"},
        Corruption{"BytesNotNumelTimesItemsize", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, -1,
                   "expected numel 3"},
        Corruption{
            "OverlappingTensors",
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            12, -1, "tensor 'b' [4, 12) overlaps tensor 'a'"},
        Corruption{
            "HoleBetweenTensors",
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            12, -1, "hole of 4 bytes before tensor 'b'"},
        Corruption{"TruncatedBuffer", "{" + kT + "}", 4, -1, "tensor 't': data_offsets [0, 8] out of range"},
        Corruption{"TrailingBytes", "{" + kT + "}", 12, -1, "!= 8 + header"},
        Corruption{"MetadataNotString", R"({"__metadata__":{"a":1},)" + kT + "}", 8, -1,
                   "__metadata__ value of 'a' is not a string"},
        Corruption{"UnexpectedField", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8, -1,
                   "tensor 't': unexpected field 'x'"},
        Corruption{"NotAJsonObject", "{" + kT + "} 5", 8, -1, "not valid JSON"}),
    [](const auto& info) { return info.param.name; });

TEST(Safetensors, TooShortFileIsRejected) {
  TmpDir dir;
  const std::string path = dir.file("short.safetensors");
  std::ofstream(path, std::ios::binary) << "abc";
  try {
    SafetensorsFile::open(path);
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than the 8-byte header length"), std::string::npos);
  }
  EXPECT_THROW(SafetensorsFile::open(dir.file("missing.safetensors")), CheckpointError);
}

// An external trainer's checkpoint may still be changing while the tool compares it: read with
// pread() into memory (read_untrusted, xxh3_file_untrusted), a file that shrinks under the reader
// is an error naming it, never a SIGBUS (the mapped reader died in 5 of 6 trials). A concurrent
// truncation loop against a bounded number of reads; each read either succeeds (the file was whole
// meanwhile) or throws one line naming the file.
TEST(SafetensorsUntrusted, AFileShrinkingWhileReadIsAnErrorNotACrash) {
  TmpDir dir;
  const std::string path = dir.file("ext.safetensors");
  const torch::Tensor src = torch::arange(4 << 20, torch::kFloat);   // 16 MiB
  write_safetensors(path, {{"w", src, StDtype::F32}}, {}, false);
  const uint64_t size = fs::file_size(path);
  {
    const SafetensorsFile whole = SafetensorsFile::read_untrusted(path);
    EXPECT_TRUE(torch::equal(whole.tensor("w"), src));
    uint64_t n = 0;
    EXPECT_EQ(xxh3_file_untrusted(path, &n), xxh3_file(path, nullptr));
    EXPECT_EQ(n, size);
  }
  std::atomic<bool> stop{false};
  std::atomic<int> flips{0};
  std::thread truncator([&] {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    while (!stop) {   // shrink to the header's page, grow back (zeros: a whole file again)
      if (::ftruncate(fd, 4096) != 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) break;
      ++flips;
    }
    ::close(fd);
  });
  int errors = 0;
  for (int trial = 0; trial < 60; ++trial) {
    for (int which = 0; which < 2; ++which) {
      try {
        if (which == 0) SafetensorsFile::read_untrusted(path).tensor("w").sum().item<float>();
        else xxh3_file_untrusted(path, nullptr);
      } catch (const CheckpointError& e) {
        ++errors;
        const std::string m = e.what();
        EXPECT_EQ(m.find('\n'), std::string::npos) << m;
        EXPECT_NE(m.find(path), std::string::npos) << m;
      }
    }
  }
  stop = true;
  truncator.join();
  std::cout << "[ shrink   ] " << errors << " of 120 reads refused a changing file (" << flips << " truncations)\n";
  EXPECT_GT(flips.load(), 0);
}

TEST(SafetensorsUntrusted, ALinkIsRefused) {
  TmpDir dir;
  const std::string path = dir.file("real.safetensors"), link = dir.file("link.safetensors");
  write_safetensors(path, {{"w", torch::ones({4}), StDtype::F32}}, {}, false);
  fs::create_symlink(path, link);
  EXPECT_THROW(SafetensorsFile::read_untrusted(link), CheckpointError);
  EXPECT_THROW(xxh3_file_untrusted(link, nullptr), CheckpointError);
}

TEST(FsUtil, PlainFileNamesAndHex) {
  for (const char* ok : {"model.safetensors", "optim_rank_00000.safetensors", "manifest.json"})
    EXPECT_TRUE(is_plain_file_name(ok)) << ok;
  for (const char* no : {"", ".", "..", "../x", "/etc/passwd", "a/b", ".hidden", "a\\b"})
    EXPECT_FALSE(is_plain_file_name(no)) << no;
  std::vector<uint8_t> b = {0, 1, 0xab, 0xff};
  EXPECT_EQ(hex_encode(b), "0001abff");
  EXPECT_EQ(hex_decode("0001ABff", "x"), b);
  EXPECT_THROW(hex_decode("abc", "x"), CheckpointError);
  EXPECT_THROW(hex_decode("zz", "x"), CheckpointError);
}
