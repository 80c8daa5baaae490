// Damaged and mismatched checkpoints: each case breaks one thing in a good checkpoint and
// asserts that load throws CheckpointError naming the damaged file (and what was expected), that
// the target model/optimizer/state are untouched, and that inspect returns 1 naming the file.
// Structural cases (header length, offsets, overlap, duplicate key) re-seal the manifest's size
// and checksum so the safetensors checks themselves are exercised, not the checksum.
#include <xxhash.h>

#include <fstream>
#include <functional>
#include <sstream>

#include "checkpoint_fixture.h"
#include "harness/checkpoint/safetensors.h"

using namespace ckfix;
using namespace rh::ckpt;

namespace {


// Rewrites `file` and updates the manifest's recorded size and checksum to match.
void reseal(const fs::path& dir, const std::string& file, const std::string& bytes) {
  spit(dir / file, bytes);
  nlohmann::json manifest = read_manifest(dir);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(bytes.data(), bytes.size()));
  nlohmann::json blocks = nlohmann::json::array();   // the per-block checksums load verifies
  for (size_t off = 0; off < bytes.size(); off += rh::ckpt::kHashBlock) {
    char block_hex[17];
    const size_t len = std::min<size_t>(rh::ckpt::kHashBlock, bytes.size() - off);
    std::snprintf(block_hex, sizeof block_hex, "%016llx", (unsigned long long)XXH3_64bits(bytes.data() + off, len));
    blocks.push_back(block_hex);
  }
  for (auto& f : manifest["files"])
    if (f["name"] == file) f["bytes"] = bytes.size(), f["xxh3"] = hex, f["block_xxh3"] = blocks;
  write_manifest(dir, manifest);
}

// Edits the JSON header text of a safetensors file (keeping its length by space padding when
// the edit is shorter) and reseals.
void edit_header(const fs::path& dir, const std::string& file, const std::function<void(std::string&)>& edit) {
  std::string file_bytes = slurp(dir / file);
  uint64_t header_len;
  std::memcpy(&header_len, file_bytes.data(), 8);
  std::string header = file_bytes.substr(8, header_len), rest = file_bytes.substr(8 + header_len);
  edit(header);
  if (header.size() < header_len) header.append(header_len - header.size(), ' ');
  uint64_t new_header_len = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &new_header_len, 8);
  reseal(dir, file, out + header + rest);
}

void replace_once(std::string& s, const std::string& from, const std::string& to) {
  size_t i = s.find(from);
  ASSERT_NE(i, std::string::npos) << from;
  s.replace(i, from.size(), to);
}

struct Damage {
  std::string name;
  std::function<void(const fs::path& dir)> apply;
  std::string file;     // the file the error must name
  std::string expect;   // and a fragment saying what is wrong
};

class Corruption : public ::testing::TestWithParam<Damage> {};

TEST_P(Corruption, LoadRefusesNamingTheFileAndTouchesNothing) {
  torch::set_num_threads(1);
  TmpDir root;
  const Mode mode = all_modes()[5];   // remainders + fp16 moments: I16, BF16, F16, F32 scales
  Rig saved_rig = make_rig(mode, 1);
  train(saved_rig, 2);
  SaveResult save_result = save_checkpoint(root.str(), save_input(saved_rig));
  const fs::path dir = save_result.dir;
  GetParam().apply(dir);

  Rig target_rig = make_rig(mode, 2), fresh = make_rig(mode, 2);
  nlohmann::json run_config = save_input(saved_rig).run_config;
  if (GetParam().name == "ModelConfigMismatch") run_config["model"]["width"] = 32;
  try {
    load_checkpoint(root.str(), *target_rig.model, *target_rig.opt, target_rig.state, run_config, {});
    FAIL() << "loaded a checkpoint with " << GetParam().name;
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(GetParam().file), std::string::npos) << msg;
    EXPECT_NE(msg.find(GetParam().expect), std::string::npos) << "want '" << GetParam().expect << "' in: " << msg;
  }
  EXPECT_TRUE(same_state(target_rig, fresh));
  EXPECT_EQ(target_rig.state.iteration, 0);
  if (GetParam().name != "ModelConfigMismatch") {
    std::ostringstream out;
    EXPECT_EQ(inspect_checkpoint(dir.string(), out), 1);
    EXPECT_NE(out.str().find("DAMAGED"), std::string::npos);
    EXPECT_NE(out.str().find(GetParam().file), std::string::npos) << out.str();
  }
}

const std::vector<Damage> kDamage = {
    {"FlippedDataByte",
     [](const fs::path& d) {
       std::string s = slurp(d / kShard);
       s[s.size() - 7] ^= 0x10;
       spit(d / kShard, s);
     },
     kShard, "checksum"},
    {"FlippedHeaderByte",
     [](const fs::path& d) {
       std::string s = slurp(d / kModel);
       s[20] ^= 0x01;
       spit(d / kModel, s);
     },
     kModel, "checksum"},
    {"TruncatedFile",
     [](const fs::path& d) {
       std::string s = slurp(d / kShard);
       spit(d / kShard, s.substr(0, s.size() / 2));
     },
     kShard, "(truncated)"},
    {"MissingFile", [](const fs::path& d) { fs::remove(d / kModel); }, kModel, "missing"},
    {"MissingManifest", [](const fs::path& d) { fs::remove(d / "manifest.json"); }, "manifest.json",
     "no manifest.json"},
    {"WrongHeaderLength",
     [](const fs::path& checkpoint_dir) {
       std::string shard_bytes = slurp(checkpoint_dir / kShard);
       uint64_t n = shard_bytes.size() + 100;
       std::memcpy(shard_bytes.data(), &n, 8);
       reseal(checkpoint_dir, kShard, shard_bytes);
     },
     kShard, "runs past the end"},
    {"OffsetsOutOfRange",
     [](const fs::path& d) {
       edit_header(d, kShard, [](std::string& h) {
         size_t i = h.rfind("\"data_offsets\":[");
         size_t comma = h.find(',', i), close = h.find(']', i);
         h.replace(comma + 1, close - comma - 1, "999999999");
       });
     },
     kShard, "out of range"},
    {"OverlappingTensors",
     [](const fs::path& checkpoint_dir) {
       edit_header(checkpoint_dir, kShard, [](std::string& header) {
         // Two tensors of the same size claim the same bytes: exp_avg_sq gets exp_avg's offsets.
         auto offsets_of = [&](const std::string& key) {
           size_t i = header.find("\"" + key + "\":{\"data_offsets\":[");
           EXPECT_NE(i, std::string::npos) << key;
           i = header.find('[', i);
           return std::make_pair(i, header.find(']', i) - i + 1);
         };
         auto [avg_at, avg_len] = offsets_of("embed/exp_avg");
         const std::string first = header.substr(avg_at, avg_len);
         auto [avg_sq_at, avg_sq_len] = offsets_of("embed/exp_avg_sq");
         header.replace(avg_sq_at, avg_sq_len, first);
       });
     },
     kShard, "overlaps"},
    {"DuplicateKey",
     [](const fs::path& d) {
       edit_header(d, kShard, [](std::string& h) { replace_once(h, "\"embed/exp_avg_sq\"", "\"embed/exp_avg\"   "); });
     },
     kShard, "duplicate key 'embed/exp_avg'"},
    {"PathEscapesDirectory",
     [](const fs::path& checkpoint_dir) {
       nlohmann::json manifest = read_manifest(checkpoint_dir);
       for (auto& f : manifest["files"])
         if (f["name"] == kModel) f["name"] = "../model.safetensors";
       write_manifest(checkpoint_dir, manifest);
     },
     "manifest.json", "'../model.safetensors' is not a plain file name"},
    {"AbsolutePath",
     [](const fs::path& d) {
       nlohmann::json m = read_manifest(d);
       m["files"][0]["name"] = "/etc/passwd";
       write_manifest(d, m);
     },
     "manifest.json", "not a plain file name"},
    {"FormatVersion",
     [](const fs::path& d) {
       nlohmann::json m = read_manifest(d);
       m["format_version"] = 99;
       write_manifest(d, m);
     },
     "manifest.json", "format version 99"},
    {"ManifestTensorMismatch",
     [](const fs::path& checkpoint_dir) {
       nlohmann::json manifest = read_manifest(checkpoint_dir);
       for (auto& t : manifest["tensors"])
         if (t["key"] == "norm/exp_avg") t["shape"] = {4};
       write_manifest(checkpoint_dir, manifest);
     },
     kShard, "tensor 'norm/exp_avg'"},
    {"ModelConfigMismatch", [](const fs::path&) {}, "manifest.json", "width=16 (now 32)"},
};

INSTANTIATE_TEST_SUITE_P(Cases, Corruption, ::testing::ValuesIn(kDamage), [](const auto& i) { return i.param.name; });

// A model of another shape, or with other parameter names, is refused before anything changes.
TEST(CheckpointConfig, ShapeAndNameMismatchesAreRefused) {
  TmpDir root;
  const Mode mode = all_modes()[4];
  Rig saved_rig = make_rig(mode, 1);
  train(saved_rig, 1);
  save_checkpoint(root.str(), save_input(saved_rig));
  Rig wide = make_rig(mode, 2, /*width=*/24), untouched_wide = make_rig(mode, 2, 24);
  try {
    load_checkpoint(root.str(), *wide.model, *wide.opt, wide.state, {}, {});
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors tensor 'l0.w'"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(same_state(wide, untouched_wide));
  Rig fp32_rig = make_rig(all_modes()[0], 2);
  EXPECT_THROW(load_checkpoint(root.str(), *fp32_rig.model, *fp32_rig.opt, fp32_rig.state, {}, {}), CheckpointError);
}

TEST(CheckpointConfig, IncompleteDirectoryIsNotACheckpoint) {
  TmpDir root;
  fs::create_directories(root.p / "iter_0000005");
  spit(root.p / "latest_checkpointed_iteration.txt", "5\n");
  Rig target_rig = make_rig(all_modes()[0], 2);
  try {
    load_checkpoint(root.str(), *target_rig.model, *target_rig.opt, target_rig.state, {}, {});
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("has no manifest.json"), std::string::npos) << e.what();
  }
  spit(root.p / "latest_checkpointed_iteration.txt", "five\n");
  EXPECT_THROW(load_checkpoint(root.str(), *target_rig.model, *target_rig.opt, target_rig.state, {}, {}),
               CheckpointError);
}

// A file of several checksum blocks: a flipped byte in a middle block is refused naming the file
// and the byte range of that block, before anything is restored.
TEST(CheckpointChecksums, DamageInAMiddleBlockIsNamedByItsByteRange) {
  struct Big : torch::nn::Module {
    Big() { register_parameter("w", torch::arange(int64_t(3 * rh::ckpt::kHashBlock / 4 / 2), torch::kFloat)); }
  };
  Big model;
  std::vector<rh::optim::ParamGroup> groups{{"decay", {{"w", model.named_parameters()["w"]}}, 0.0}};
  rh::optim::PrecisionAdam opt(groups, rh::optim::OptimizerConfig{});
  rh::ckpt::TrainState train_state;
  train_state.iteration = 1;
  train_state.rng_states["dropout"] = generator_state(1);
  const fs::path root = fs::temp_directory_path() / ("rh_blocks_" + std::to_string(::getpid()));
  fs::remove_all(root);
  rh::ckpt::save_checkpoint(root.string(), {&model, &opt, &train_state, {}, {}, nullptr});
  const fs::path dir = root / "iter_0000001";
  const auto manifest = read_manifest(dir);
  for (const auto& f : manifest["files"]) EXPECT_GE(f["block_xxh3"].size(), 2u) << f["name"];
  std::string bytes = slurp(dir / "optim_rank_00000.safetensors");   // 3 x 48 MiB of states
  ASSERT_GT(bytes.size(), 2 * rh::ckpt::kHashBlock);
  const size_t at = rh::ckpt::kHashBlock + 100;   // inside block 1
  bytes[at] = static_cast<char>(bytes[at] ^ 0x01);
  spit(dir / "optim_rank_00000.safetensors", bytes);
  const auto before = opt.stored("w", rh::optim::StateKey::exp_avg).data.clone();
  try {
    rh::ckpt::load_checkpoint(root.string(), model, opt, train_state, {}, {});
    ADD_FAILURE() << "a damaged block was accepted";
  } catch (const rh::ckpt::CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("optim_rank_00000.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[" + std::to_string(rh::ckpt::kHashBlock) + ", " + std::to_string(2 * rh::ckpt::kHashBlock) +
                       ")"),
              std::string::npos)
        << msg;
  }
  EXPECT_TRUE(torch::equal(before, opt.stored("w", rh::optim::StateKey::exp_avg).data));
  fs::remove_all(root);
}

// Verify while copying: load reads every file into staging memory while hashing it
// and the state adopts the staging tensors only after every block of every file is verified.
// A damaged last byte of the file listed last is seen after everything else was read: the
// state is still bit-identical and still in the same tensors (nothing adopted, nothing copied).
// The repaired checkpoint then loads bit for bit, and the state is the staging (no copy into
// the tensors held before). Over uncompressed and compressed files.
class LateDamage : public ::testing::TestWithParam<Compression> {};

// Every model param and stored state's data pointer, in a fixed order.
std::vector<const void*> state_pointers(const Rig& rig) {
  std::vector<const void*> out;
  for (const auto& p : rig.model->named_parameters(true)) out.push_back(p.value().data_ptr());
  for (const auto& p : rig.opt->param_names())
    for (StateKey k : kKeys) out.push_back(rig.opt->stored(p, k).data.data_ptr());
  return out;
}

TEST_P(LateDamage, IsNamedAndLeavesTheStateInItsOwnTensorsThenTheRepairLoadsWithoutACopy) {
  torch::set_num_threads(1);
  TmpDir root;
  const Mode mode = all_modes()[5];   // remainders + fp16 moments: I16, BF16, F16, F32 scales
  Rig saved_rig = make_rig(mode, 1);
  train(saved_rig, 3);
  SavePolicy save_policy;
  save_policy.compress = GetParam();
  const fs::path dir = save_checkpoint(root.str(), save_input(saved_rig, save_policy)).dir;
  const nlohmann::json manifest = read_manifest(dir);
  const std::string last = manifest["files"].back()["name"].get<std::string>();
  const std::string good = slurp(dir / last);
  std::string bad = good;
  bad.back() = static_cast<char>(bad.back() ^ 0x40);
  spit(dir / last, bad);

  Rig resumed_rig = make_rig(mode, 2), fresh = make_rig(mode, 2);
  train(resumed_rig, 1);
  train(fresh, 1);
  const std::vector<const void*> before = state_pointers(resumed_rig);
  try {
    load_checkpoint(root.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state,
                    save_input(saved_rig).run_config, {});
    ADD_FAILURE() << "a damaged last byte of " << last << " was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(last), std::string::npos) << e.what();
  }
  EXPECT_TRUE(same_state(resumed_rig, fresh));
  EXPECT_EQ(state_pointers(resumed_rig), before) << "a refused load replaced a state tensor";
  EXPECT_EQ(resumed_rig.state.iteration, 1);

  spit(dir / last, good);
  load_checkpoint(root.str(), *resumed_rig.model, *resumed_rig.opt, resumed_rig.state, save_input(saved_rig).run_config,
                  {});
  EXPECT_TRUE(same_state(resumed_rig, saved_rig));
  EXPECT_EQ(resumed_rig.state.iteration, saved_rig.state.iteration);
  const std::vector<const void*> after = state_pointers(resumed_rig);
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_NE(after[i], before[i]) << "tensor " << i << " was copied into instead of adopted";
  // The adopted state trains on like the original.
  train(saved_rig, 2);
  train(resumed_rig, 2);
  EXPECT_TRUE(same_state(resumed_rig, saved_rig));
}

INSTANTIATE_TEST_SUITE_P(Files, LateDamage, ::testing::Values(Compression::none, Compression::zstd),
                         [](const auto& i) { return to_string(i.param); });

// A refusal after some states were adopted (a conversion that is not exact, checked only once the
// optimizer re-stores it) puts back the very tensors the state held, with their values.
TEST(StagedLoad, ARefusedConversionPutsBackTheAdoptedStatesTensors) {
  torch::set_num_threads(1);
  TmpDir root;
  Mode saved = all_modes()[3];   // remainders, fp32 moments
  Rig saved_rig = make_rig(saved, 1);
  train(saved_rig, 3);
  save_checkpoint(root.str(), save_input(saved_rig));
  Mode target = saved;   // exp_avg into bf16 (inexact), the rest stored as saved
  target.cfg.exp_avg_dtype = Dtype::bf16;
  target.name = "remainders_bf16_m";
  Rig target_rig = make_rig(target, 2), fresh = make_rig(target, 2);
  const std::vector<const void*> before = state_pointers(target_rig);
  try {
    load_checkpoint(root.str(), *target_rig.model, *target_rig.opt, target_rig.state, save_input(saved_rig).run_config,
                    {});
    ADD_FAILURE() << "a lossy fp32 -> bf16 exp_avg conversion was accepted without allow_lossy";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("not exact"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(same_state(target_rig, fresh));
  EXPECT_EQ(state_pointers(target_rig), before);
  EXPECT_EQ(target_rig.state.iteration, 0);
}

}   // namespace
