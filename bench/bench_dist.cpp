// Benchmark: the data-parallel trainer at 1, 2 and 4 ranks on this machine. Each size
// runs as real processes (this binary re-executes itself as the ranks over c10d Gloo): the
// median step time of 6 iterations after 2 of warm-up, the median time of 3 sharded checkpoint
// saves, and the bytes each rank's optimizer shard takes. Prints ratios to one rank; never
// fails on time. The global batch is fixed (16 samples in 4 micro-batches), so more ranks split
// the same work: on a 2-core machine 4 ranks oversubscribe the cores.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "harness/checkpoint/checkpoint.h"
#include "harness/train/config.h"
#include "harness/ranks/group.h"
#include "harness/ranks/launcher.h"
#include "harness/train/env.h"
#include "harness/process/process.h"
#include "harness/train/trainer.h"

namespace fs = std::filesystem;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

rh::RunConfig bench_config() {
  rh::RunConfig cfg;
  cfg.train.micro_batch = 4;
  cfg.train.iterations = 100;
  cfg.train.lr_decay_iters = 100;
  cfg.optim.use_precision_aware_optimizer = true;
  cfg.optim.exp_avg_dtype = cfg.optim.exp_avg_sq_dtype = rh::optim::Dtype::bf16;
  return cfg;
}

// One rank: prints "step_s save_s shard_bytes" into out.<rank>.
int worker(const std::string& out) {
  rh::configure_determinism(1);
  const auto place = rh::dist::placement_from_environment();
  std::unique_ptr<rh::dist::Group> group;
  if (place.world_size > 1) group = std::make_unique<rh::dist::Group>(place, std::chrono::seconds(120));
  rh::Trainer tr(bench_config(), group.get());
  for (int i = 0; i < 2; ++i) tr.train_iteration();
  std::vector<double> steps, saves;
  for (int i = 0; i < 6; ++i) steps.push_back(tr.train_iteration().seconds);
  const fs::path root = out + ".ckpt";
  uint64_t shard_bytes = 0;
  for (int i = 0; i < 3; ++i) {
    rh::ckpt::SaveInput in;
    in.model = &tr.model();
    in.optimizer = &tr.optimizer();
    auto st = tr.state();
    st.iteration = 100 + i;
    in.state = &st;
    in.run_config = rh::to_json(tr.config());
    in.group = group.get();
    const auto t0 = std::chrono::steady_clock::now();
    const auto res = rh::ckpt::save_checkpoint(root.string(), in);
    saves.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    char name[64];
    std::snprintf(name, sizeof name, "optim_rank_%05d.safetensors", place.rank);
    shard_bytes = fs::file_size(fs::path(res.dir) / name);
  }
  std::ofstream(out + "." + std::to_string(place.rank))
      << median(steps) << " " << median(saves) << " " << shard_bytes << "\n";
  return 0;
}

struct Result {
  double step = 0, save = 0;
  std::vector<uint64_t> bytes;
  uint64_t model_bytes = 0;
};

Result run_size(int n, const fs::path& dir) {
  const std::string out = (dir / ("dp" + std::to_string(n))).string();
  const int port = rh::dist::free_local_port();
  const std::string exe = rh::self_executable();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("RH_BENCH_WORKER", out.c_str(), 1);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      execl(exe.c_str(), exe.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      throw std::runtime_error("a rank of the " + std::to_string(n) + "-rank run failed");
  }
  Result res;
  std::vector<double> step, save;
  for (int r = 0; r < n; ++r) {
    std::ifstream f(out + "." + std::to_string(r));
    double a, b;
    uint64_t c;
    f >> a >> b >> c;
    step.push_back(a);
    save.push_back(b);
    res.bytes.push_back(c);
  }
  res.step = *std::max_element(step.begin(), step.end());   // a step ends when the slowest rank's does
  res.save = *std::max_element(save.begin(), save.end());
  for (const auto& e : fs::recursive_directory_iterator(out + ".ckpt"))
    if (e.path().filename() == "model.safetensors") res.model_bytes = fs::file_size(e.path());
  return res;
}

}   // namespace

int main() {
  if (const char* out = std::getenv("RH_BENCH_WORKER")) return worker(out);
  std::printf("%s\n", rh::describe(rh::runtime_info()).c_str());
  const fs::path dir = fs::temp_directory_path() / ("rh_bench_dist_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<int> sizes{1, 2, 4};
  std::vector<Result> res;
  for (int n : sizes) res.push_back(run_size(n, dir));
  std::printf(
      "data-parallel ranks | step s (ratio to 1) | save s (ratio to 1) | model bytes (rank 0) | optimizer shard bytes "
      "per rank\n");
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::string b;
    for (uint64_t x : res[i].bytes) b += (b.empty() ? "" : ", ") + std::to_string(x);
    std::printf("%19d | %8.4f (%5.2fx)   | %7.4f (%5.2fx)   | %20llu | %s\n", sizes[i], res[i].step,
                res[i].step / res[0].step, res[i].save, res[i].save / res[0].save,
                static_cast<unsigned long long>(res[i].model_bytes), b.c_str());
  }
  std::printf("(%u cores here: at 4 ranks the processes share them)\n", std::thread::hardware_concurrency());
  fs::remove_all(dir);
  return 0;
}
