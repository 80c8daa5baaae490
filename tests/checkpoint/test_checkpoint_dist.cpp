// The data-parallel save protocol, in one process: two threads are the two ranks of a save,
// agreeing through an in-memory optim::Collectives. A save publishes only after every rank wrote and
// verified its shard; a rank that fails (bad input, or a write that fails half way) fails the
// save on every rank, leaves no temp directory, and the previous checkpoint stays the newest.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "harness/checkpoint/checkpoint.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/manifest.h"
#include "harness/checkpoint/manifest_reader.h"

namespace fs = std::filesystem;
namespace ck = rh::ckpt;

namespace {

// All-gather of strings between threads; `after_round(r)` runs once when round r completes.
struct Hub {
  explicit Hub(int n) : n(n), slots(static_cast<size_t>(n)) {}
  int n;
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::string> slots, result;
  int arrived = 0;
  long round = 0;
  std::function<void(long)> after_round;

  std::vector<std::string> gather(int rank, const std::string& payload) {
    std::unique_lock<std::mutex> lock(m);
    const long mine = round;
    slots[static_cast<size_t>(rank)] = payload;
    if (++arrived == n) {
      result = slots;
      arrived = 0;
      if (after_round) after_round(round);
      ++round;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return round != mine; });
    }
    return result;
  }
};

struct ThreadRank final : rh::optim::Collectives {
  ThreadRank(Hub& h, int r) : hub(h), r(r) {}
  Hub& hub;
  int r;
  int rank() const override { return r; }
  int size() const override { return hub.n; }
  std::vector<std::string> all_gather_strings(const std::string& s) override { return hub.gather(r, s); }
  // The save protocol uses none of these; a call would be a bug in the test's premise.
  void all_reduce_sum(torch::Tensor&) override { throw std::logic_error("unused"); }
  void all_reduce_max(torch::Tensor&) override { throw std::logic_error("unused"); }
  void all_gather_bytes(const torch::Tensor&, torch::Tensor&) override { throw std::logic_error("unused"); }
};

struct Net : torch::nn::Module {
  Net() {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    register_parameter("w", torch::randn({33, 7}, gen).to(torch::kBFloat16));
    register_parameter("b", torch::randn({5}, gen).to(torch::kBFloat16));
  }
};

struct Rank {
  Rank(Hub& hub, int rank) : group(hub, rank) {
    std::vector<rh::optim::ParamGroup> groups{{"decay", {}, 0.1}};
    for (const auto& p : net.named_parameters()) groups[0].params.emplace_back(p.key(), p.value());
    rh::optim::OptimizerConfig cfg;
    cfg.use_precision_aware_optimizer = true;
    cfg.exp_avg_dtype = cfg.exp_avg_sq_dtype = rh::optim::Dtype::fp8;
    opt = std::make_unique<rh::optim::PrecisionAdam>(groups, cfg, &group);
    // A real CPU generator's state: load refuses a generator state of any other length.
    auto generator_state = at::detail::createCPUGenerator(static_cast<uint64_t>(rank)).get_state().contiguous();
    state.rng_states["dropout"].assign(generator_state.data_ptr<uint8_t>(),
                                       generator_state.data_ptr<uint8_t>() + generator_state.numel());
  }
  ThreadRank group;
  Net net;
  std::unique_ptr<rh::optim::PrecisionAdam> opt;
  ck::TrainState state;
};

// Both ranks save `iteration`; returns each rank's error ("" on success). `after_round` runs when
// an agreement round completes (round 0: rank 0 has prepared the temp directory).
std::vector<std::string> save_both(const fs::path& root, int64_t iteration, bool rank1_bad_input = false,
                                   std::function<void(long)> after_round = {}) {
  Hub hub(2);
  hub.after_round = std::move(after_round);
  Rank rank0(hub, 0), rank1(hub, 1);
  std::vector<std::string> errors(2);
  auto go = [&](Rank& rank, int rank_index) {
    rank.state.iteration = iteration;
    ck::SaveInput save_input{&rank.net,
                             rank.opt.get(),
                             (rank_index == 1 && rank1_bad_input) ? nullptr : &rank.state,
                             {},
                             {},
                             &rank.group};
    try {
      ck::save_checkpoint(root.string(), save_input);
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(rank_index)] = e.what();
    }
  };
  std::thread rank1_thread([&] { go(rank1, 1); });
  go(rank0, 0);
  rank1_thread.join();
  return errors;
}

fs::path fresh_root(const std::string& name) {
  const fs::path root = fs::temp_directory_path() / ("rh_ckpt_dist_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(root);
  return root;
}

bool has_temp_dirs(const fs::path& root) {
  for (const auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().rfind(".tmp.", 0) == 0) return true;
  return false;
}

TEST(DataParallelSave, PublishesOneShardPerRankWithRanges) {
  const fs::path root = fresh_root("ok");
  const auto errors = save_both(root, 3);
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  const auto verified = ck::detail::verify_checkpoint_dir(ck::detail::resolve_checkpoint_dir(root.string()));
  EXPECT_EQ(verified.manifest["dp_size"], 2);
  EXPECT_EQ(verified.manifest["rank_states"].size(), 2u);
  // Every rank's generators, parsed once by the manifest reader: the manifest's hex, decoded here.
  ASSERT_EQ(verified.saved.rank_states.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const nlohmann::json& rank_state = verified.manifest["rank_states"][i];
    EXPECT_EQ(verified.saved.rank_states[i].dp_rank, rank_state["dp_rank"].get<int64_t>());
    ASSERT_EQ(verified.saved.rank_states[i].rng_states.size(), rank_state["rng_states"].size());
    ASSERT_FALSE(rank_state["rng_states"].empty());
    for (const auto& [name, hex] : rank_state["rng_states"].items()) {
      const std::string hex_text = hex.get<std::string>();
      std::vector<uint8_t> bytes;
      for (size_t k = 0; k + 1 < hex_text.size(); k += 2)
        bytes.push_back(static_cast<uint8_t>(std::stoi(hex_text.substr(k, 2), nullptr, 16)));
      EXPECT_EQ(verified.saved.rank_states[i].rng_states.at(name), bytes) << name;
    }
  }
  EXPECT_TRUE(verified.files.count("optim_rank_00000.safetensors"));
  EXPECT_TRUE(verified.files.count("optim_rank_00001.safetensors"));
  // Megatron's buffer (reverse order, starts padded to 64, end to lcm(2, 128)): "b" at [0, 5),
  // "w" at [64, 295), 384 elements, 192 a rank: "w" is split at its element 128, "b" is rank 0's.
  const auto index = ck::detail::shard_index(verified);
  ASSERT_EQ(index.pieces.at("w").size(), 2u);
  EXPECT_EQ(index.pieces.at("w")[0].end, 128);
  EXPECT_EQ(index.pieces.at("b").size(), 1u);
  EXPECT_EQ(index.pieces.at("b")[0].file, "optim_rank_00000.safetensors");
  EXPECT_FALSE(has_temp_dirs(root));
  fs::remove_all(root);
}

TEST(DataParallelSave, AFailedShardWriteFailsEveryRankAndKeepsThePreviousCheckpoint) {
  const fs::path root = fresh_root("write_fails");
  ASSERT_EQ(save_both(root, 3), (std::vector<std::string>{"", ""}));
  // Make rank 1's shard file of the next save impossible to create: once rank 0 has prepared
  // the temp directory (round 0), put a directory where the file must go.
  const auto errors = save_both(root, 5, false, [&](long round) {
    if (round == 0)
      fs::create_directories(root / (".tmp.iter_0000005." + std::to_string(::getpid())) /
                             "optim_rank_00001.safetensors");
  });
  for (const auto& error : errors) {
    EXPECT_NE(error.find("failed on rank 1"), std::string::npos) << error;
    EXPECT_NE(error.find("optim_rank_00001.safetensors"), std::string::npos) << error;
    EXPECT_NE(error.find("the previous checkpoint stays the newest"), std::string::npos) << error;
  }
  EXPECT_EQ(ck::read_small_file((root / ck::detail::kPointerFile).string()), "3\n");
  EXPECT_FALSE(fs::exists(root / "iter_0000005"));
  EXPECT_FALSE(has_temp_dirs(root));
  EXPECT_NO_THROW(ck::detail::verify_checkpoint_dir(ck::detail::resolve_checkpoint_dir(root.string())));
  fs::remove_all(root);
}

TEST(DataParallelSave, OneRanksBadInputFailsEveryRankBeforeAnythingIsWritten) {
  const fs::path root = fresh_root("bad_input");
  const auto errors = save_both(root, 4, /*rank1_bad_input=*/true);
  for (const auto& error : errors)
    EXPECT_NE(error.find("failed on rank 1: save_checkpoint"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(root / ck::detail::kPointerFile));
  EXPECT_FALSE(has_temp_dirs(root));
  fs::remove_all(root);
}

// Inspect once said OK where load refused. One verification (check_consistency),
// two callers: for each damage (made behind a resealed manifest checksum, so it reaches the
// checks after it) load refuses and inspect prints the same refusal and exits 1.
struct ShardDamage {
  const char* name;
  std::function<void(nlohmann::json&)> edit;
  const char* expect;
};

class InspectAgreesWithLoad : public ::testing::TestWithParam<ShardDamage> {};

TEST_P(InspectAgreesWithLoad, BothRefuseWithTheSameMessage) {
  torch::set_num_threads(1);
  const fs::path root = fresh_root(std::string("agree_") + GetParam().name);
  ASSERT_EQ(save_both(root, 3), (std::vector<std::string>{"", ""}));
  const fs::path dir = ck::detail::resolve_checkpoint_dir(root.string());
  {   // intact: both accept
    std::ostringstream out;
    ASSERT_EQ(ck::inspect_checkpoint(root.string(), out), 0) << out.str();
  }
  auto read = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  nlohmann::json manifest = nlohmann::json::parse(read(dir / "manifest.json"));
  GetParam().edit(manifest);
  const std::string text = manifest.dump(1);
  std::ofstream(dir / "manifest.json", std::ios::binary | std::ios::trunc) << text;
  std::ofstream(dir / ck::detail::kManifestChecksumFile, std::ios::binary | std::ios::trunc)
      << ck::detail::manifest_checksum_text(text);
  // Load into one process (a resharded load, 2 -> 1 ranks, which is supported).
  Net net;
  std::vector<rh::optim::ParamGroup> groups{{"decay", {}, 0.1}};
  for (const auto& p : net.named_parameters()) groups[0].params.emplace_back(p.key(), p.value());
  rh::optim::OptimizerConfig cfg;
  cfg.use_precision_aware_optimizer = true;
  cfg.exp_avg_dtype = cfg.exp_avg_sq_dtype = rh::optim::Dtype::fp8;
  rh::optim::PrecisionAdam opt(groups, cfg);
  ck::TrainState train_state;
  std::string msg;
  try {
    ck::load_checkpoint(root.string(), net, opt, train_state, {}, {});
    ADD_FAILURE() << "load accepted " << GetParam().name;
  } catch (const ck::CheckpointError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(GetParam().expect), std::string::npos) << "want '" << GetParam().expect << "' in: " << msg;
  std::ostringstream out;
  EXPECT_EQ(ck::inspect_checkpoint(root.string(), out), 1) << out.str();
  EXPECT_NE(out.str().find("DAMAGED: " + msg), std::string::npos) << "load: " << msg << "\ninspect: " << out.str();
  fs::remove_all(root);
}

nlohmann::json& range_of(nlohmann::json& manifest, int shard, const std::string& param) {
  for (auto& r : manifest["shards"][shard]["param_ranges"])
    if (r["param"] == param) return r;
  throw std::logic_error("no range of " + param);
}

const std::vector<ShardDamage> kDamages = {
    // "w" (231 elements) is split at 128 between the ranks: move the boundary to 129 (flat_begin
    // follows, so the ranges still place "w" at one buffer offset and the lengths are what differ).
    {"ShardBoundaryMovedByOne",
     [](nlohmann::json& m) {
       range_of(m, 0, "w")["end"] = 129;
       range_of(m, 1, "w")["begin"] = 129;
       range_of(m, 1, "w")["flat_begin"] = range_of(m, 1, "w")["flat_begin"].get<int64_t>() + 1;
     },
     "elements, but its shard's range of 'w' has"},
    {"ShardFilesSwapped", [](nlohmann::json& m) { std::swap(m["shards"][0]["file"], m["shards"][1]["file"]); },
     "(shard files swapped or renamed)"},
    {"BothShardsNameOneFile", [](nlohmann::json& m) { m["shards"][1]["file"] = m["shards"][0]["file"]; },
     "is named by two shards"},
    {"EmptyRngStateInRankStates", [](nlohmann::json& m) { m["rank_states"][1]["rng_states"]["dropout"] = ""; },
     "field /rank_states/1/rng_states/dropout: 0 bytes is not a generator state"},
    {"OneByteRngStateInRankStates", [](nlohmann::json& m) { m["rank_states"][1]["rng_states"]["dropout"] = "ab"; },
     "field /rank_states/1/rng_states/dropout: 1 bytes is not a generator state"},
    {"EmptyRngStateInTrainState", [](nlohmann::json& m) { m["train_state"]["rng_states"]["dropout"] = ""; },
     "field /train_state/rng_states/dropout: 0 bytes is not a generator state"},
    {"OneByteRngStateInTrainState", [](nlohmann::json& m) { m["train_state"]["rng_states"]["dropout"] = "ab"; },
     "field /train_state/rng_states/dropout: 1 bytes is not a generator state"},
    {"RankStatesRankBeyondDpSize", [](nlohmann::json& m) { m["rank_states"][1]["dp_rank"] = 5; },
     "field /rank_states/1/dp_rank: 5 is not below dp_size 2"},
};

INSTANTIATE_TEST_SUITE_P(Damages, InspectAgreesWithLoad, ::testing::ValuesIn(kDamages),
                         [](const auto& i) { return std::string(i.param.name); });

}   // namespace
