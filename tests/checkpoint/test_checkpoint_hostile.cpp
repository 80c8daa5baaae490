// Hostile input: each case is an input that crashed, hung, exhausted memory, read
// outside the checkpoint or slipped past a checksum before; now every one is refused with a
// CheckpointError naming the file and what was expected, and the target state is untouched.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <functional>
#include <sstream>

#include "checkpoint_fixture.h"
#include "harness/base/text.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/load_phases.h"
#include "harness/checkpoint/manifest.h"
#include "harness/checkpoint/manifest_reader.h"
#include "harness/checkpoint/safetensors.h"

using namespace ckfix;
using namespace rh::ckpt;

namespace {


// A test that used to hang (a FIFO opened for reading blocks until a writer comes): if it ever
// blocks again, the alarm ends the process instead of CTest's 10-minute timeout.
struct HangGuard {
  HangGuard() { ::alarm(20); }
  ~HangGuard() { ::alarm(0); }
};

std::string deep(size_t n) { return std::string(n, '[') + std::string(n, ']'); }

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// ------------------------------------------------------------------ JSON, bounded

TEST(JsonGuard, DepthIsCheckedBeforeParsingAndQuotesAreCapped) {
  EXPECT_EQ(json_depth_violation("[[1]]", 5, 2), std::string::npos);
  EXPECT_EQ(json_depth_violation("[[[1]]]", 7, 2), 2u);
  EXPECT_EQ(json_depth_violation("[\"[[[[\"]", 8, 1), std::string::npos);     // brackets in strings
  EXPECT_EQ(json_depth_violation("[\"\\\"[[\"]", 9, 1), std::string::npos);   // escaped quote
  const std::string deep_json = deep(100000);
  const std::string msg = error_of([&] { parse_json_bounded(deep_json, "x.json"); });
  EXPECT_NE(msg.find("x.json: nesting deeper than 64 levels"), std::string::npos) << msg;
  EXPECT_NE(error_of([] { parse_json_bounded(std::string("{}\0garbage", 10), "y.json"); }).find("NUL byte at offset 2"),
            std::string::npos);
  const std::string quoted = quote_text(std::string(1 << 20, 'A'));
  EXPECT_LT(quoted.size(), 260u);
  EXPECT_NE(quoted.find("(1048576 bytes)"), std::string::npos) << quoted;
  EXPECT_EQ(quote_text("a\nb"), "a\\x0ab");
  EXPECT_EQ(quote_json(nlohmann::json("\xff")), "\"\xef\xbf\xbd\"");   // invalid UTF-8 replaced, no throw
}

TEST(JsonGuard, CheckedAccessorNamesFilePathAndType) {
  const nlohmann::json document = nlohmann::json::parse(R"({"a":{"b":[1,"x",-3]},"big":4294967298})");
  const JsonField field(document, "m.json");
  EXPECT_EQ(field["a"]["b"][0].i64(), 1);
  EXPECT_EQ(error_of([&] { field["a"]["c"].str(); }), "m.json: field /a/c: missing");
  EXPECT_EQ(error_of([&] { field["a"]["b"][1].i64(); }),
            "m.json: field /a/b/1: expected an integer in [-9223372036854775808, 9223372036854775807], got \"x\"");
  EXPECT_EQ(error_of([&] { field["a"]["b"][2].u64(); }),
            "m.json: field /a/b/2: expected an integer in [0, 18446744073709551615], got -3");
  EXPECT_NE(error_of([&] { field["a"]["b"][7].i64(); }).find("/a/b: has 3 elements, element 7 is missing"),
            std::string::npos);
  EXPECT_NE(error_of([&] { field["big"].i64(0, 100); }).find("expected an integer in [0, 100], got 4294967298"),
            std::string::npos);
  EXPECT_NE(error_of([&] { field["a"].str(); }).find("expected a string, got {\"b\":[1,\"x\",-3]}"), std::string::npos);
}

// ------------------------------------------------------------------ safetensors headers

void write_st(const std::string& path, const std::string& header, const std::string& buffer) {
  std::string out(8, '\0');
  const uint64_t header_size = header.size();
  std::memcpy(out.data(), &header_size, 8);
  spit(path, out + header + buffer);
}

TEST(HostileSafetensors, DeeplyNestedShapeIsRefusedNotACrash) {
  TmpDir dir;
  const std::string path = (dir.p / "deep.safetensors").string();
  write_st(path, R"({"t":{"dtype":"F32","shape":)" + deep(100000) + R"(,"data_offsets":[0,0]}})", "");
  const std::string msg = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("nesting deeper than 64 levels"), std::string::npos) << msg;
  // A shape of one deep but huge value: quoted at most ~200 characters.
  write_st(path, R"({"t":{"dtype":"F32","shape":[")" + std::string(1 << 20, 'x') + R"("],"data_offsets":[0,0]}})", "");
  const std::string msg2 = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_NE(msg2.find("shape entries must be integers >= 0"), std::string::npos) << msg2.substr(0, 400);
  EXPECT_LT(msg2.size(), 600u);
}

TEST(HostileSafetensors, HeaderFollowedByNulAndGarbageIsRefused) {
  TmpDir dir;
  const std::string path = (dir.p / "nul.safetensors").string();
  write_st(path,
           std::string(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})") + std::string("\0\0garbage", 9),
           std::string(8, '\1'));
  const std::string msg = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_NE(msg.find("NUL byte"), std::string::npos) << msg;
}

TEST(HostileSafetensors, FifoAndDeviceAreRefusedWithoutBlocking) {
  HangGuard guard;
  TmpDir dir;
  const std::string fifo = (dir.p / "fifo.safetensors").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string msg = error_of([&] { SafetensorsFile::open(fifo); });
  EXPECT_NE(msg.find(fifo + ": is a FIFO, expected a regular file"), std::string::npos) << msg;
  msg = error_of([&] { SafetensorsFile::open("/dev/zero"); });
  EXPECT_NE(msg.find("/dev/zero: is a character device"), std::string::npos) << msg;
  msg = error_of([&] { SafetensorsFile::open(dir.str()); });
  EXPECT_NE(msg.find("is a directory"), std::string::npos) << msg;
}

// ------------------------------------------------------------------ pointer and manifest files

TEST(HostilePointer, GarbageFifoAndDevZeroAreRefusedBriefly) {
  HangGuard guard;
  TmpDir root;
  const fs::path ptr = root.p / "latest_checkpointed_iteration.txt";
  spit(ptr, std::string(10 << 20, 'g'));   // 10 MB of garbage: refused by size, not echoed
  std::string msg = error_of([&] { rh::ckpt::detail::resolve_checkpoint_dir(root.str()); });
  EXPECT_NE(msg.find(ptr.string()), std::string::npos) << msg.substr(0, 300);
  EXPECT_LT(msg.size(), 400u);
  spit(ptr, std::string(20, 'g'));
  msg = error_of([&] { rh::ckpt::detail::resolve_checkpoint_dir(root.str()); });
  EXPECT_NE(msg.find("expected an iteration number"), std::string::npos) << msg;
  for (const char* bad : {"-3\n", "4294967298999999\n", "+5\n", "0x10\n", ""})
    EXPECT_THROW(rh::ckpt::detail::parse_pointer_text(bad, "p"), CheckpointError) << bad;
  EXPECT_EQ(rh::ckpt::detail::parse_pointer_text("10\n", "p"), 10);
  fs::remove(ptr);
  fs::create_symlink("/dev/zero", ptr);
  msg = error_of([&] { rh::ckpt::detail::resolve_checkpoint_dir(root.str()); });
  EXPECT_NE(msg.find("is a character device"), std::string::npos) << msg;
  fs::remove(ptr);
  ASSERT_EQ(::mkfifo(ptr.c_str(), 0600), 0);
  msg = error_of([&] { rh::ckpt::detail::resolve_checkpoint_dir(root.str()); });
  EXPECT_NE(msg.find("is a FIFO"), std::string::npos) << msg;
}

// A pointer that cannot be written (ENOSPC, EIO; here its path is a non-empty directory, so the
// rename over it fails the same way) fails the save after iter_<new>/ was published: that
// directory, which nothing references, is removed again, no temp file of the pointer is left, and
// the previous checkpoint stays the one the root resolves to and loads.
TEST(HostilePointer, FailedPointerWriteLeavesNoOrphanAndKeepsThePreviousCheckpoint) {
  torch::set_num_threads(1);
  TmpDir root;
  const Mode mode = all_modes()[5];
  Rig saved_rig = make_rig(mode, 1);
  train(saved_rig, 1);
  const fs::path first = save_checkpoint(root.str(), save_input(saved_rig)).dir;
  const fs::path ptr = root.p / "latest_checkpointed_iteration.txt";
  const std::string ptr_text = slurp(ptr);
  fs::remove(ptr);
  fs::create_directories(ptr / "blocker");
  train(saved_rig, 1);
  const std::string msg = error_of([&] { save_checkpoint(root.str(), save_input(saved_rig)); });
  EXPECT_NE(msg.find("latest_checkpointed_iteration.txt"), std::string::npos) << msg;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(root.p)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{first.filename().string(), "latest_checkpointed_iteration.txt"}))
      << "only the first checkpoint and the (blocked) pointer may remain";
  fs::remove_all(ptr);
  spit(ptr, ptr_text);
  Rig resumed_rig = make_rig(mode, 2);
  EXPECT_EQ(rh::ckpt::detail::resolve_checkpoint_dir(root.str()), first.string());
  EXPECT_NO_THROW(load_checkpoint(root.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, {}, {}));
  EXPECT_EQ(resumed_rig.state.iteration, 1);
}

// One good checkpoint per test, damaged by `apply`, must be refused by load (naming `expect`) and
// by inspect (the same validation), with the target untouched.
struct Hostile {
  std::string name;
  std::function<void(const fs::path& dir)> apply;
  std::string expect;
};

void PrintTo(const Hostile& h, std::ostream* os) { *os << h.name; }

class HostileManifest : public ::testing::TestWithParam<Hostile> {};

TEST_P(HostileManifest, LoadAndInspectRefuseIt) {
  HangGuard guard;
  torch::set_num_threads(1);
  TmpDir root;
  const Mode mode = all_modes()[5];
  Rig saved_rig = make_rig(mode, 1);
  train(saved_rig, 2);
  const fs::path dir = save_checkpoint(root.str(), save_input(saved_rig)).dir;
  GetParam().apply(dir);
  Rig target_rig = make_rig(mode, 2), fresh = make_rig(mode, 2);
  const std::string msg =
      error_of([&] { load_checkpoint(root.str(), *target_rig.model, *target_rig.opt, target_rig.state, {}, {}); });
  EXPECT_NE(msg.find(GetParam().expect), std::string::npos)
      << "want '" << GetParam().expect << "' in: " << msg.substr(0, 600);
  EXPECT_LT(msg.size(), 1200u) << msg.substr(0, 600);
  EXPECT_TRUE(same_state(target_rig, fresh));
  std::ostringstream out;
  EXPECT_EQ(inspect_checkpoint(dir.string(), out), 1);
  EXPECT_NE(out.str().find(GetParam().expect), std::string::npos) << out.str().substr(0, 600);
}

std::function<void(const fs::path&)> edit(std::function<void(nlohmann::json&)> change) {
  return [change](const fs::path& checkpoint_dir) {
    nlohmann::json manifest = read_manifest(checkpoint_dir);
    change(manifest);
    write_manifest(checkpoint_dir, manifest);
  };
}

const std::vector<Hostile> kHostile = {
    {"FormatVersionDeeplyNested",
     [](const fs::path& checkpoint_dir) {
       std::string manifest_text = slurp(checkpoint_dir / "manifest.json");
       const size_t key_pos = manifest_text.find("\"format_version\":");
       const size_t value_end = manifest_text.find(',', key_pos);
       manifest_text.replace(key_pos, value_end - key_pos, "\"format_version\": " + deep(100000));
       write_manifest_text(checkpoint_dir, manifest_text);
     },
     "nesting deeper than 64 levels"},
    {"FormatVersionWraps", edit([](nlohmann::json& m) { m["format_version"] = 4294967298ull; }),
     "format version 4294967298"},
    {"MissingExact", edit([](nlohmann::json& m) { m["tensors"][0].erase("exact"); }),
     "field /tensors/0/exact: missing"},
    {"MissingGroupStep", edit([](nlohmann::json& m) { m["optimizer"]["groups"][0].erase("step"); }),
     "field /optimizer/groups/0/step: missing"},
    {"MissingDisk", edit([](nlohmann::json& m) { m.erase("disk"); }), "field /disk: missing"},
    {"TotalBytesWrongType", edit([](nlohmann::json& m) { m["disk"]["total_bytes"] = "many"; }),
     "field /disk/total_bytes: expected an integer in [0, 18446744073709551615], got \"many\""},
    {"MissingTrainState", edit([](nlohmann::json& m) { m.erase("train_state"); }), "field /train_state: missing"},
    {"BadGeneratorHex", edit([](nlohmann::json& m) { m["train_state"]["rng_states"]["dropout"] = "zz"; }),
     "field /train_state/rng_states/dropout: expected hex digits"},
    {"ConsumedSamplesNearInt64Max",
     edit([](nlohmann::json& m) { m["train_state"]["consumed_samples"] = INT64_MAX - 3; }),
     "field /train_state/consumed_samples: expected an integer in [0, 1099511627776]"},
    {"GroupStepNearInt64Max", edit([](nlohmann::json& m) { m["optimizer"]["groups"][0]["step"] = INT64_MAX; }),
     "field /optimizer/groups/0/step: expected an integer in [0, 1099511627776]"},
    {"NumStepsNearInt64Max",
     edit([](nlohmann::json& m) { m["train_state"]["opt_param_scheduler"]["num_steps"] = INT64_MAX; }),
     "field /train_state/opt_param_scheduler/num_steps"},
    {"BlockBytesWrapsToZeroBlocks",
     [](const fs::path& checkpoint_dir) {
       // A corrupted data byte, and block_bytes = 2^64-1 with an empty block list: the block
       // arithmetic wrapped to zero blocks and the whole-file checksum was skipped.
       std::string shard_bytes = slurp(checkpoint_dir / kShard);
       shard_bytes[shard_bytes.size() - 7] ^= 0x10;
       spit(checkpoint_dir / kShard, shard_bytes);
       nlohmann::json manifest = read_manifest(checkpoint_dir);
       for (auto& file_entry : manifest["files"])
         if (file_entry["name"] == kShard)
           file_entry["block_bytes"] = UINT64_MAX, file_entry["block_xxh3"] = nlohmann::json::array();
       write_manifest(checkpoint_dir, manifest);
     },
     "block_bytes: expected an integer in [0, 1099511627776]"},
    {"BlockListTooShort", edit([](nlohmann::json& m) {
       m["files"][0]["block_bytes"] = 4096;
       m["files"][0]["block_xxh3"] = nlohmann::json::array();
       for (int i = 0; i < 100000; ++i) m["files"][0]["block_xxh3"].push_back("0000000000000000");
     }),
     "block checksums, a file of"},
    {"BlockBytesWithoutList", edit([](nlohmann::json& m) { m["files"][0].erase("block_xxh3"); }),
     "block_xxh3 and block_bytes come together"},
    {"ManifestIsFifo",
     [](const fs::path& d) {
       fs::remove(d / "manifest.json");
       ASSERT_EQ(::mkfifo((d / "manifest.json").c_str(), 0600), 0);
     },
     "manifest.json: is a FIFO"},
    {"ManifestLinksToDevZero",
     [](const fs::path& d) {
       fs::remove(d / "manifest.json");
       fs::create_symlink("/dev/zero", d / "manifest.json");
     },
     "manifest.json: is a symbolic link; refused"},
    {"ManifestTooLarge",
     [](const fs::path& d) {
       std::ofstream f(d / "manifest.json", std::ios::app);
       f << std::string(rh::ckpt::detail::kMaxManifestBytes, ' ');
     },
     "-byte limit for this file"},
    {"DataFileIsFifo",
     [](const fs::path& d) {
       fs::remove(d / kModel);
       ASSERT_EQ(::mkfifo((d / kModel).c_str(), 0600), 0);
     },
     "model.safetensors: is a FIFO, expected a regular file"},
    {"DataFileLinksOutside",
     [](const fs::path& checkpoint_dir) {
       const fs::path outside =
           checkpoint_dir.parent_path().parent_path() / ("rh_outside_" + std::to_string(::getpid()));
       fs::copy_file(checkpoint_dir / kModel, outside, fs::copy_options::overwrite_existing);
       fs::remove(checkpoint_dir / kModel);
       fs::create_symlink(outside, checkpoint_dir / kModel);
     },
     "model.safetensors: is a symbolic link; refused"},
    {"IterationMismatch", edit([](nlohmann::json& m) { m["iteration"] = 7; }), "differs from /iteration 7"},
};

INSTANTIATE_TEST_SUITE_P(Cases, HostileManifest, ::testing::ValuesIn(kHostile),
                         [](const auto& i) { return i.param.name; });

// Counters are checked against the run being resumed (its config's train section).
TEST(HostileCounters, CountersMustMatchTheRunConfig) {
  torch::set_num_threads(1);
  TmpDir root;
  const Mode mode = all_modes()[5];
  Rig saved_rig = make_rig(mode, 1);
  train(saved_rig, 2);   // the fixture: 2 iterations of 8 samples, 2 scheduler steps
  SaveInput saved_input = save_input(saved_rig);
  saved_input.run_config["train"] = {{"iterations", 6}, {"global_batch", 8}};
  saved_rig.state.iteration = 2;
  const fs::path dir = save_checkpoint(root.str(), saved_input).dir;
  nlohmann::json run_config = saved_input.run_config;
  {
    Rig resumed_rig = make_rig(mode, 2);
    load_checkpoint(root.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, run_config,
                    {});   // consistent: loads
    EXPECT_EQ(resumed_rig.state.iteration, 2);
  }
  auto refused = [&](const std::string& want, const nlohmann::json& run_cfg) {
    Rig target_rig = make_rig(mode, 2), fresh = make_rig(mode, 2);
    const std::string msg = error_of(
        [&] { load_checkpoint(root.str(), *target_rig.model, *target_rig.opt, target_rig.state, run_cfg, {}); });
    EXPECT_NE(msg.find(want), std::string::npos) << "want '" << want << "' in: " << msg;
    EXPECT_TRUE(same_state(target_rig, fresh));
  };
  nlohmann::json shorter = run_config;
  shorter["train"]["iterations"] = 1;
  refused("iteration 2 is beyond the run's length (train.iterations = 1)", shorter);
  const nlohmann::json good = read_manifest(dir);
  nlohmann::json manifest = good;
  manifest["train_state"]["consumed_samples"] = 17;
  write_manifest(dir, manifest);
  refused("field /train_state/consumed_samples: 17 samples, but 2 iterations of 8 samples consume 16", run_config);
  manifest = good;
  manifest["train_state"]["opt_param_scheduler"]["num_steps"] = 5;
  write_manifest(dir, manifest);
  refused(
      "field /train_state/opt_param_scheduler/num_steps: 5 scheduler steps (samples) after 2 iterations of 8 "
      "samples, expected 16",
      run_config);
  manifest = good;
  manifest["optimizer"]["groups"][0]["step"] = 3;
  write_manifest(dir, manifest);
  refused("field /optimizer/groups/0/step: step 3 is more than the 2 iterations run", run_config);
  // A run config without train settings skips only the length check: the manifest's counters are
  // still checked against each other and against the run config saved with them.
  const nlohmann::json no_train = nlohmann::json::object();
  refused("field /optimizer/groups/0/step: step 3 is more than the 2 iterations run", no_train);
  manifest = good;
  manifest["train_state"]["consumed_samples"] = 17;
  write_manifest(dir, manifest);
  refused("field /train_state/consumed_samples: 17 samples, but 2 iterations of 8 samples consume 16", no_train);
  // The batch the counters were counted in is the saved run config's, read with the manifest's
  // schema: a batch of 0 would make every count "consistent" with iteration 0 only.
  manifest = good;
  manifest["run_config"]["train"]["global_batch"] = 0;
  write_manifest(dir, manifest);
  refused("field /run_config/train/global_batch: expected an integer in [1, 1099511627776], got 0", run_config);
}

TEST(HostileSave, NegativeIterationAndEmptyRootAreRefusedNamingThem) {
  TmpDir root;
  Rig rig = make_rig(all_modes()[0], 1);
  rig.state.iteration = -4;
  std::string msg = error_of([&] { save_checkpoint(root.str(), save_input(rig)); });
  EXPECT_NE(msg.find("iteration -4 is outside [0, "), std::string::npos) << msg;
  rig.state.iteration = 1;
  msg = error_of([&] { save_checkpoint("", save_input(rig)); });
  EXPECT_NE(msg.find("the checkpoint root is an empty path"), std::string::npos) << msg;
}

}   // namespace

// ---- The manifest's own checksum, and what can be checked for consistency.

namespace manifest_checksum {

// One edit of the manifest's bytes that leaves it valid JSON with a valid schema, made without
// rewriting the checksum sidecar: load and inspect must refuse it before parsing.
struct Edit {
  const char* name;
  std::function<void(std::string&)> apply;
};

// The first number after `key` (e.g. "\"step\":"), decremented by one.
void decrement_after(std::string& manifest_text, const std::string& key) {
  size_t pos = manifest_text.find(key);
  ASSERT_NE(pos, std::string::npos) << key;
  pos = manifest_text.find_first_of("0123456789", pos + key.size());
  size_t digits_end = manifest_text.find_first_not_of("0123456789", pos);
  const long value = std::stol(manifest_text.substr(pos, digits_end - pos));
  ASSERT_GT(value, 0);
  manifest_text.replace(pos, digits_end - pos, std::to_string(value - 1));
}

const std::vector<Edit> kEdits = {
    {"GroupStepTwoToOne", [](std::string& s) { decrement_after(s, "\"step\":"); }},
    {"RngStateHexDigit",
     [](std::string& manifest_text) {
       const size_t key_pos = manifest_text.find("\"dropout\":");
       ASSERT_NE(key_pos, std::string::npos);
       const size_t digit_pos = manifest_text.find('"', key_pos + 10) + 1 + 40;   // a digit well inside the hex string
       manifest_text[digit_pos] = manifest_text[digit_pos] == '0' ? '1' : '0';
     }},
    {"ConsumedSamples", [](std::string& s) { decrement_after(s, "\"consumed_samples\":"); }},
    {"TrailingSpace", [](std::string& s) { s += ' '; }},
};

class EditedManifest : public ::testing::TestWithParam<Edit> {};

TEST_P(EditedManifest, IsRefusedByLoadAndInspectBeforeParsing) {
  torch::set_num_threads(1);
  TmpDir root;
  const Mode mode = all_modes()[5];
  Rig saved_rig = make_rig(mode, 1);
  train(saved_rig, 2);
  const fs::path dir = save_checkpoint(root.str(), save_input(saved_rig)).dir;
  ASSERT_TRUE(fs::is_regular_file(dir / "manifest.json.xxh3"));
  std::string text = slurp(dir / "manifest.json");
  GetParam().apply(text);
  ASSERT_TRUE(nlohmann::json::accept(text)) << "the edit must leave valid JSON";
  spit(dir / "manifest.json", text);   // not resealed
  Rig target_rig = make_rig(mode, 2), fresh = make_rig(mode, 2);
  const std::string msg =
      error_of([&] { load_checkpoint(root.str(), *target_rig.model, *target_rig.opt, target_rig.state, {}, {}); });
  EXPECT_NE(msg.find("manifest.json: XXH3-64 checksum"), std::string::npos) << msg;
  EXPECT_NE(msg.find("manifest.json.xxh3"), std::string::npos) << msg;
  EXPECT_TRUE(same_state(target_rig, fresh));
  std::ostringstream out;
  EXPECT_EQ(inspect_checkpoint(dir.string(), out), 1);
  EXPECT_NE(out.str().find(msg), std::string::npos) << out.str();
}

INSTANTIATE_TEST_SUITE_P(Edits, EditedManifest, ::testing::ValuesIn(kEdits),
                         [](const auto& i) { return i.param.name; });

// The sidecar itself: missing (a checkpoint written before it existed, or deleted to make an
// edited manifest pass), malformed, or a link. Each refused by load and inspect, naming it.
TEST(ManifestChecksumSidecar, MissingMalformedOrLinkedIsRefused) {
  torch::set_num_threads(1);
  const Mode mode = all_modes()[5];
  const std::vector<std::pair<std::function<void(const fs::path&)>, std::string>> cases = {
      {[](const fs::path& d) { fs::remove(d / "manifest.json.xxh3"); }, "manifest.json.xxh3: missing"},
      {[](const fs::path& d) { spit(d / "manifest.json.xxh3", "xyz\n"); }, "expected 16 lower-case hex digits"},
      {[](const fs::path& d) { spit(d / "manifest.json.xxh3", slurp(d / "manifest.json.xxh3") + "\n"); },
       "expected 16 lower-case hex digits"},
      {[](const fs::path& checkpoint_dir) {
         spit(checkpoint_dir.parent_path() / "elsewhere", slurp(checkpoint_dir / "manifest.json.xxh3"));
         fs::remove(checkpoint_dir / "manifest.json.xxh3");
         fs::create_symlink(checkpoint_dir.parent_path() / "elsewhere", checkpoint_dir / "manifest.json.xxh3");
       },
       "manifest.json.xxh3: is a symbolic link"},
  };
  for (const auto& [damage, want] : cases) {
    TmpDir root;
    Rig saved_rig = make_rig(mode, 1);
    train(saved_rig, 2);
    const fs::path dir = save_checkpoint(root.str(), save_input(saved_rig)).dir;
    damage(dir);
    Rig target_rig = make_rig(mode, 2);
    const std::string msg =
        error_of([&] { load_checkpoint(root.str(), *target_rig.model, *target_rig.opt, target_rig.state, {}, {}); });
    EXPECT_NE(msg.find(want), std::string::npos) << "want '" << want << "' in: " << msg;
    std::ostringstream out;
    EXPECT_EQ(inspect_checkpoint(dir.string(), out), 1);
    EXPECT_NE(out.str().find(want), std::string::npos) << out.str();
  }
}

// Behind the checksum (an attacker who rewrites both): the counters must agree with each other
// even without a run config, and every group has taken the same number of steps.
TEST(HostileCounters, StepsAndSchedulerAgreeWithoutARunConfig) {
  torch::set_num_threads(1);
  const Mode mode = all_modes()[5];
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& m) { m["optimizer"]["groups"][0]["step"] = 1; },
       "field /optimizer/groups/1/step: step 2 differs from group 0's step 1"},
      {[](nlohmann::json& m) { m["train_state"]["opt_param_scheduler"]["num_steps"] = 15; },
       "field /train_state/opt_param_scheduler/num_steps: 15 scheduler steps (samples), but consumed_samples is 16"},
  };
  for (const auto& [change, want] : cases) {
    TmpDir root;
    Rig saved_rig = make_rig(mode, 1);
    train(saved_rig, 2);
    const fs::path dir = save_checkpoint(root.str(), save_input(saved_rig)).dir;
    ASSERT_GE(read_manifest(dir)["optimizer"]["groups"].size(), 2u);
    nlohmann::json manifest = read_manifest(dir);
    change(manifest);
    write_manifest(dir, manifest);   // resealed
    Rig target_rig = make_rig(mode, 2), fresh = make_rig(mode, 2);
    const std::string msg =
        error_of([&] { load_checkpoint(root.str(), *target_rig.model, *target_rig.opt, target_rig.state, {}, {}); });
    EXPECT_NE(msg.find(want), std::string::npos) << "want '" << want << "' in: " << msg;
    EXPECT_TRUE(same_state(target_rig, fresh));
    std::ostringstream out;
    EXPECT_EQ(inspect_checkpoint(dir.string(), out), 1);
    EXPECT_NE(out.str().find(want), std::string::npos) << out.str();
  }
}

}   // namespace manifest_checksum

// In the sanitizer step (base/input.cpp is compiled instrumented there): the TOML
// scan that runs before toml++ on inputs toml++ would recurse on 50,000 or 100,000 times.
TEST(TomlGuard, DeepKeysAndNestingAreRefusedBeforeParsing) {
  std::string key = "a";
  for (int i = 1; i < 50000; ++i) key += ".a";
  EXPECT_NE(rh::ckpt::toml_nesting_position(key + " = 1\n")
                .find("1: column 128: a key or table header of more than 64"),
            std::string::npos);
  EXPECT_NE(rh::ckpt::toml_nesting_position("[" + key + "]\n").find("more than 64 dotted parts"), std::string::npos);
  EXPECT_NE(rh::ckpt::toml_nesting_position("x = " + std::string(100000, '{')).find("nested deeper than 64"),
            std::string::npos);
  EXPECT_NE(rh::ckpt::toml_nesting_position("x = \"unterminated\n" + std::string(100000, '[')).find("nested deeper"),
            std::string::npos);
  EXPECT_EQ(rh::ckpt::toml_nesting_position("x = \"" + key + "\"\n[a.b]\ny = [[1.5, 2.5], {c.d = 1}]\n"), "");
  EXPECT_EQ(rh::ckpt::toml_nesting_position("s = \"\"\"\n" + key + "\\\"\"\"\"\n"), "");   // escaped quote inside
}

// ------------------------------------------------------------ names, counters, budgets, disks

namespace round4 {

// Every JSON file the tool reads back refuses a key named twice in one object (nlohmann keeps
// the last silently), at any depth, naming the key; distinct keys in sibling objects are fine.
struct Dup {
  const char* name;
  std::string text;
  std::string key;   // "" = accepted
};
class DuplicateKeys : public ::testing::TestWithParam<Dup> {};
TEST_P(DuplicateKeys, AreRefusedNamingTheKey) {
  const Dup& dup_case = GetParam();
  const std::string msg = error_of([&] { parse_json_unique(dup_case.text, "f.json"); });
  if (dup_case.key.empty()) {
    EXPECT_EQ(msg, "(no error)");
  } else {
    EXPECT_EQ(msg.rfind("f.json: duplicate key '" + dup_case.key + "' in one object", 0), 0u) << msg;
  }
}
INSTANTIATE_TEST_SUITE_P(
    Round4, DuplicateKeys,
    ::testing::Values(Dup{"TopLevel", R"({"a": 1, "b": 2, "a": 3})", "a"},
                      Dup{"Nested", R"({"saves": [{"root": "x", "root": "y"}]})", "root"},
                      Dup{"AfterADeepSibling", R"({"x": {"k": 1}, "y": {"k": 2}, "x": 0})", "x"},
                      Dup{"SameKeyInSiblingObjects", R"([{"k": 1}, {"k": 2}, {"a": {"k": 3}, "k": 4}])", ""},
                      Dup{"ControlCharacterKeyIsQuotedEscaped", "{\"\\u0001\": 1, \"\\u0001\": 2}", "\\x01"}),
    [](const auto& i) { return std::string(i.param.name); });

// Bytes that are not UTF-8 (a path) come out as \xNN, valid UTF-8 stays, and dump_text never
// throws where dump() threw nlohmann's type_error 316.
struct Printable {
  const char* name;
  std::string in, out;
};
class PrintableText : public ::testing::TestWithParam<Printable> {};
TEST_P(PrintableText, EscapesWhatIsNotUtf8) {
  const Printable& printable_case = GetParam();
  EXPECT_EQ(printable_text(printable_case.in), printable_case.out);
  const nlohmann::json document = {{"checkpoint", printable_case.in}};
  std::string dumped;
  EXPECT_NO_THROW(dumped = dump_text(document));
  EXPECT_TRUE(nlohmann::json::accept(dumped)) << dumped;
  EXPECT_TRUE(nlohmann::json::accept(dump_text(nlohmann::json{{"checkpoint", printable_text(printable_case.in)}})));
}
INSTANTIATE_TEST_SUITE_P(Round4, PrintableText,
                         ::testing::Values(Printable{"Ascii", "/tmp/run/ckpt", "/tmp/run/ckpt"},
                                           Printable{"ValidTwoAndThreeByte", "r\xc3\xa9sum\xc3\xa9/\xe6\x97\xa5",
                                                     "r\xc3\xa9sum\xc3\xa9/\xe6\x97\xa5"},
                                           Printable{"ValidFourByte", "\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80"},
                                           Printable{"Latin1Bytes", "ckpt_\xff\xfe", "ckpt_\\xff\\xfe"},
                                           Printable{"TruncatedSequence", "a\xc3", "a\\xc3"},
                                           Printable{"Overlong", "\xc0\xaf", "\\xc0\\xaf"},
                                           Printable{"Surrogate", "\xed\xa0\x80", "\\xed\\xa0\\x80"},
                                           Printable{"AboveU10FFFF", "\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80"},
                                           Printable{"ControlCharacters", std::string("a\rb\0c\x7f", 6),
                                                     "a\\x0db\\x00c\\x7f"},
                                           Printable{"NewlineAndTabKept", "a\nb\tc", "a\nb\tc"}),
                         [](const auto& i) { return std::string(i.param.name); });

// RFC 4180 both ways: csv_field's output read back by csv_parse gives every field unchanged, also
// with commas, quotes, line breaks (CRLF too) and leading spaces (a failure text with a newline
// made the matrix's own summary.csv unreadable).
class CsvRoundTrip : public ::testing::TestWithParam<std::vector<std::string>> {};
TEST_P(CsvRoundTrip, FieldsComeBackUnchanged) {
  const std::vector<std::string>& row = GetParam();
  std::string text = "a,b,c\n";
  for (size_t i = 0; i < row.size(); ++i) text += (i ? "," : "") + rh::csv_field(row[i]);
  text += "\nlast,1,2\n";
  const auto records = rh::csv_parse(text);
  ASSERT_EQ(records.size(), 3u) << text;
  EXPECT_EQ(records[1].fields, row) << text;
  EXPECT_EQ(records[1].line, 2u);
  EXPECT_EQ(records[2].fields, (std::vector<std::string>{"last", "1", "2"}));
  EXPECT_EQ(records[2].line,
            1u + static_cast<unsigned>(std::count(text.begin(), text.begin() + text.rfind("last"), '\n')));
}
INSTANTIATE_TEST_SUITE_P(Round4, CsvRoundTrip,
                         ::testing::Values(std::vector<std::string>{"plain", "1", "2"},
                                           std::vector<std::string>{"error: a\nb", "x,y", "say \"hi\""},
                                           std::vector<std::string>{"crlf\r\ninside", "", "\"\""},
                                           std::vector<std::string>{"trailing newline\n", "\n", ","}),
                         [](const auto& i) { return "Case" + std::to_string(i.index); });

TEST(CsvParse, MalformedTextIsRefusedWithItsLine) {
  EXPECT_NE(error_of([] { rh::csv_parse("a,b\n\"open,1\n2,3\n"); }).find("2: a quoted field is not closed"),
            std::string::npos);
  EXPECT_NE(error_of([] { rh::csv_parse("a,b\n\"x\"y,1\n"); }).find("2: text after a closing quote"),
            std::string::npos);
  const auto records = rh::csv_parse("a, b ,c\r\n\r\n1,2,3");   // spaces trimmed, CRLF, an empty line skipped
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].fields, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(records[1].line, 3u);
}

// I/O failures of the disk are not bad input: ENOSPC (here /dev/full) raises DiskError,
// whose message names the path and says it is the disk; the tool exits 4 on it
// (CliErrors' HostileDisk.SaveOnAFullDiskExitsFourNamingThePathAndTheDisk does it with a tmpfs).
TEST(HostileDisk, NoSpaceIsADiskErrorNamingThePath) {
  for (const auto& write :
       std::vector<std::function<void()>>{[] { rh::write_text("/dev/full", "x"); },
                                          [] { write_file_durable("/dev/full", std::string(1 << 16, 'x')); }}) {
    try {
      write();
      ADD_FAILURE() << "no error writing /dev/full";
    } catch (const rh::DiskError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("/dev/full: No space left on device"), std::string::npos) << msg;
      EXPECT_TRUE(rh::is_disk_error_message(msg)) << msg;
      EXPECT_NE(msg.find("free space"), std::string::npos) << msg;
    }
  }
  EXPECT_TRUE(rh::is_disk_errno(EIO) && rh::is_disk_errno(EDQUOT) && rh::is_disk_errno(EROFS));
  EXPECT_FALSE(rh::is_disk_errno(ENOENT) || rh::is_disk_errno(EACCES));
  // Not a disk error: a missing directory is the caller's input.
  EXPECT_FALSE(rh::is_disk_error_message(error_of([] { write_file_durable("/nonexistent-rh/x", "x"); })));
}

// A load may decode at most what its model and optimizer state can hold: the
// budget refuses a compressed checkpoint before any block is decoded, and a real checkpoint of the
// model is always within it.
TEST(DecodeBudget, CompressedTablesBeyondTheBudgetAreRefusedBeforeDecoding) {
  TmpDir root;
  const fs::path dir = root.p / "iter_0000002";
  fs::copy(fs::path(RH_TESTS_DIR) / "conformance/base/zstd_dp2", dir, fs::copy_options::recursive);
  EXPECT_NO_THROW(rh::ckpt::detail::verify_checkpoint_dir(dir.string()));
  EXPECT_NO_THROW(rh::ckpt::detail::verify_checkpoint_dir(dir.string(), 13104));   // the compressed tensors' raw bytes
  const std::string msg = error_of([&] { rh::ckpt::detail::verify_checkpoint_dir(dir.string(), 13103); });
  EXPECT_NE(msg.find(
                "need 13104 bytes decoded, more than the 13103 bytes this load's model and optimizer state can hold"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("refused before decoding"), std::string::npos) << msg;

  torch::set_num_threads(1);
  for (const int64_t width : {16, 64}) {
    const Mode mode = all_modes()[2];   // fp32 master, bf16 moments: dp_zero loads it exactly
    Rig saved_rig = make_rig(mode, 1, width);
    train(saved_rig, 1);
    SavePolicy save_policy;
    save_policy.kind = SavePolicyKind::dp_zero;   // fp32 containers for every state: the largest a policy writes
    save_policy.compress = Compression::zstd;
    const fs::path saved =
        save_checkpoint((root.p / ("w" + std::to_string(width))).string(), save_input(saved_rig, save_policy)).dir;
    uint64_t raw = 0;
    const nlohmann::json manifest =
        read_manifest(saved);   // kept: a range-for over manifest's member of a temporary dangles
    for (const auto& t : manifest["tensors"]) raw += t["bytes"].get<uint64_t>();
    ASSERT_GT(raw, 0u);
    EXPECT_LE(raw, rh::ckpt::detail::decode_budget(*saved_rig.model)) << "width " << width;
    // Beyond the fixed slack (1 MiB, 64 KiB of scales per parameter) the budget grows with the state.
    const uint64_t slack = (1u << 20) + (64u << 10) * saved_rig.model->named_parameters(true).size();
    EXPECT_GE(8 * raw, rh::ckpt::detail::decode_budget(*saved_rig.model) - slack)
        << "width " << width << ": a loose budget";
    Rig resumed_rig = make_rig(mode, 2, width);
    EXPECT_NO_THROW(load_checkpoint(saved.string(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, {}, {}));
  }
}

}   // namespace round4
