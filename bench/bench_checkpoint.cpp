// Checkpoint save/load throughput against two baselines, in one run, on ~1 GB of tensors:
//   plain:  write() the same bytes sequentially into one file + fsync / read() them back into
//           preallocated (already touched) tensors of the same sizes;
//   torch:  torch::save of the same tensors + fsync / torch::load, then copy_ into the same
//           preallocated tensors (restoring state with torch::load takes both; torch::load alone
//           is printed too).
// save = save_checkpoint (two safetensors files, XXH3 while writing, manifest, fsyncs, renames,
// pointer); load = load_checkpoint (mmap, checksums, structure, copy into model + optimizer),
// also split into its two phases: verify (everything checked, nothing touched) and restore.
// Every figure is the median of --reps runs. Files live in page cache for all sides alike, or with
// --cold every side's files are evicted from it (fdatasync + POSIX_FADV_DONTNEED) before each
// load or read, as after a restart on another node (the VM's disk makes cold figures noisy).
//   bench_checkpoint [--gb 1.0] [--reps 5] [--dir /tmp] [--cold]
// Targets: save >= 0.8x plain write, load >= 0.9x plain read, both >= 3x torch; and
// (verify while copying into staging, then adopt): load >= 0.85x plain read. The first load of a
// process allocates its staging fresh (later loads reuse the pool the previous state returns to),
// so it is printed on its own, with the peak memory a load adds over the state already held.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "bench/bench_util.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "harness/checkpoint/checkpoint.h"

namespace fs = std::filesystem;
using rh::optim::StateKey;

using rh_bench::median;
using rh_bench::seconds;

namespace {

struct Flat : torch::nn::Module {
  std::vector<torch::Tensor> ps;
  Flat(int64_t n_tensors, int64_t numel) {
    auto g = at::detail::createCPUGenerator(7);
    for (int64_t i = 0; i < n_tensors; ++i)
      ps.push_back(register_parameter("layer" + std::to_string(i) + "_weight", torch::randn({numel}, g)));
  }
};

std::string rh_iter_name(int64_t it) {
  char b[32];
  std::snprintf(b, sizeof b, "iter_%07lld", static_cast<long long>(it));
  return b;
}

// Drops a file's pages from the page cache (they are clean after fdatasync).
void evict(const std::string& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0 || ::fdatasync(fd) != 0 || ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0)
    throw std::runtime_error("evict " + p);
  ::close(fd);
}

void evict_tree(const fs::path& d) {
  for (const auto& e : fs::recursive_directory_iterator(d))
    if (e.is_regular_file()) evict(e.path().string());
}

// VmRSS / VmHWM of this process in MB (/proc/self/status); reset_peak() makes VmHWM = VmRSS.
double status_mb(const char* field) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  double kb = -1;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') kb = std::atof(line + n + 1);
  std::fclose(f);
  return kb / 1024.0;
}
void reset_peak() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f) std::fputs("5", f), std::fclose(f);
}

void fsync_path(const std::string& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) throw std::runtime_error("fsync " + p);
  ::close(fd);
}

}   // namespace

int main(int argc, char** argv) {
  double gb = 1.0;
  int reps = 5;
  std::string base = "/tmp";
  bool cold = false;
  for (int i = 1; i < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--cold") {
      cold = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", a.c_str());
      return 2;
    }
    if (a == "--gb") gb = std::stod(argv[i + 1]);
    else if (a == "--reps") reps = std::stoi(argv[i + 1]);
    else if (a == "--dir") base = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  torch::set_num_threads(1);
  const fs::path dir = fs::path(base) / ("rh_bench_ckpt_" + std::to_string(::getpid()));
  fs::create_directories(dir);

  // fp32 params, fp32 master and moments: 16 bytes per parameter on disk.
  const int64_t n_tensors = 16;
  const int64_t numel = static_cast<int64_t>(gb * 1e9 / 16.0 / n_tensors);
  auto make = [&](Flat& m) {
    std::vector<rh::optim::ParamGroup> groups(1);
    groups[0].name = "decay";
    for (const auto& p : m.named_parameters()) groups[0].params.emplace_back(p.key(), p.value());
    return std::make_unique<rh::optim::PrecisionAdam>(groups, rh::optim::OptimizerConfig{});
  };
  Flat model(n_tensors, numel), model2(n_tensors, numel);
  auto opt = make(model), opt2 = make(model2);
  auto g = at::detail::createCPUGenerator(8);
  std::vector<torch::Tensor> all;   // every tensor a checkpoint holds, for the baselines
  for (const auto& p : opt->param_names()) {
    all.push_back(opt->param(p));
    for (StateKey k : {StateKey::master_param, StateKey::exp_avg, StateKey::exp_avg_sq}) {
      rh::optim::StoredState s{torch::rand({numel}, g), rh::optim::Dtype::fp32, std::nullopt};
      opt->set_stored(p, k, s);
      all.push_back(opt->stored(p, k).data);
    }
  }
  uint64_t bytes = 0;
  for (const auto& t : all) bytes += t.numel() * t.element_size();
  rh::ckpt::TrainState st;
  st.iteration = 1;
  rh::ckpt::SaveInput in;
  in.model = &model;
  in.optimizer = opt.get();
  in.state = &st;
  const std::string root = (dir / "ckpt").string();

  // Every round writes fresh files (a new iteration; new plain/torch files) and deletes the
  // previous round's outside the timed region: no side pays for freeing the old blocks.
  std::string plain = (dir / "plain.bin").string(), tpath = (dir / "torch.pt").string();
  auto plain_write = [&] {
    int fd = ::open(plain.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (const auto& t : all) {
      const char* p = static_cast<const char*>(t.data_ptr());
      size_t n = t.numel() * t.element_size();
      while (n) {
        ssize_t w = ::write(fd, p, n);
        if (w <= 0) throw std::runtime_error("write");
        p += w, n -= w;
      }
    }
    ::fsync(fd);
    ::close(fd);
  };
  std::vector<torch::Tensor> dest;
  for (const auto& t : all) dest.push_back(torch::ones_like(t));   // allocated and touched
  auto plain_read = [&] {
    int fd = ::open(plain.c_str(), O_RDONLY);
    for (auto& t : dest) {
      char* p = static_cast<char*>(t.data_ptr());
      size_t n = t.numel() * t.element_size();
      while (n) {
        ssize_t r = ::read(fd, p, n);
        if (r <= 0) throw std::runtime_error("read");
        p += r, n -= r;
      }
    }
    ::close(fd);
  };
  rh::ckpt::TrainState st2;
  // Rounds interleave the three sides, so disk noise (a shared machine) spreads over all alike.
  std::vector<double> save, write, tsave, load, read, tload, tload_only, verify, apply, peak_extra;
  for (int r = 0; r < reps; ++r) {
    if (r > 0) {
      fs::remove_all(fs::path(root) / rh_iter_name(st.iteration));
      fs::remove(plain);
      fs::remove(tpath);
      ::sync();
    }
    st.iteration = r + 1;
    plain = (dir / ("plain" + std::to_string(r) + ".bin")).string();
    tpath = (dir / ("torch" + std::to_string(r) + ".pt")).string();
    save.push_back(seconds([&] { rh::ckpt::save_checkpoint(root, in); }));
    write.push_back(seconds(plain_write));
    tsave.push_back(seconds([&] {
      torch::save(all, tpath);
      fsync_path(tpath);
    }));
  }
  for (int r = 0; r < reps; ++r) {
    if (cold) evict_tree(root);
    rh::ckpt::LoadReport rep;
    const double rss0 = status_mb("VmRSS");
    reset_peak();
    load.push_back(seconds([&] { rep = rh::ckpt::load_checkpoint(root, model2, *opt2, st2, {}, {}); }));
    peak_extra.push_back(status_mb("VmHWM") - rss0);
    verify.push_back(rep.verify_seconds);
    apply.push_back(rep.apply_seconds);
    if (cold) evict(plain);
    read.push_back(seconds(plain_read));
    if (cold) evict(tpath);
    double only = 0;
    tload.push_back(seconds([&] {
      std::vector<torch::Tensor> back;
      only = seconds([&] { torch::load(back, tpath); });
      for (size_t i = 0; i < back.size(); ++i) dest[i].copy_(back[i]);
    }));
    tload_only.push_back(only);
  }
  const double t_save = median(save), t_write = median(write), t_tsave = median(tsave);
  const double t_load = median(load), t_read = median(read), t_tload = median(tload);
  bool same = true;
  for (const auto& p : opt->param_names())
    same = same && torch::equal(opt->stored(p, StateKey::exp_avg).data, opt2->stored(p, StateKey::exp_avg).data);

  const double mb = bytes / 1e6;
  std::printf("bench_checkpoint: %.0f MB of tensors (%lld x %lld fp32 params + master + 2 moments), median of %d\n", mb,
              (long long)n_tensors, (long long)numel, reps);
  std::printf("  save_checkpoint %7.3f s %7.0f MB/s | plain write+fsync %7.3f s | torch::save+fsync %7.3f s\n", t_save,
              mb / t_save, t_write, t_tsave);
  std::printf("  load_checkpoint %7.3f s %7.0f MB/s | plain read        %7.3f s | torch::load+copy  %7.3f s\n", t_load,
              mb / t_load, t_read, t_tload);
  std::printf("    (%s) load = verify %.3f s (nothing touched yet) + restore %.3f s; torch::load alone %.3f s\n",
              cold ? "cold: files evicted from the page cache before each load" : "warm: files in the page cache",
              median(verify), median(apply), median(tload_only));
  std::printf(
      "    first load (fresh staging memory) %.3f s = %.2fx plain read; loads after it reuse the pool;\n"
      "    peak memory a load adds over the state it replaces: first %.0f MB, median %.0f MB (%.2fx the %.0f MB "
      "state)\n",
      load[0], t_read / load[0], peak_extra[0], median(peak_extra), median(peak_extra) / mb, mb);
  std::printf("  save: %.2fx plain write (target >= 0.8), %.2fx faster than torch::save (target >= 3)\n",
              t_write / t_save, t_tsave / t_save);
  std::printf("  load: %.2fx plain read (target >= 0.85), %.2fx faster than torch::load+copy (target >= 3)\n",
              t_read / t_load, t_tload / t_load);
  std::printf("  loaded state equal to saved: %s\n", same ? "yes" : "NO");
  fs::remove_all(dir);
  return same ? 0 : 1;
}
