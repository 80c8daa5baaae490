// Compressed checkpoints (byte planes + zstd blocks) on ~1 GB of trained-like state, one run:
//   1. bytes/param of the whole checkpoint directory, uncompressed and compressed, for bf16
//      moments + int16 remainders (bf16 weights) and for fp8 moments + remainders;
//   2. save and load time, compressed against uncompressed (save_checkpoint / load_checkpoint,
//      fsync included, files in the page cache, median of --reps), and the state loaded back
//      from the compressed checkpoint compared bit for bit with the saved one;
//   3. per key, the stored size and single-core encode speed of: plain zstd at its default level
//      (3) of the raw bytes (in the same 1 MiB blocks, and as one frame per tensor), byte planes +
//      zstd at levels 1 and 3, byte planes + zstd's fast level -3 with Huffman literals forced,
//      byte planes + an order-0 Huffman code (computed size: code lengths from the histogram,
//      256-byte table per plane; no coder is implemented) and the order-0 entropy bound.
// Trained-like values: a flat model of bf16 weights ~ N(0, 0.02^2) per tensor scale, trained
// --steps optimizer steps (the harness's PrecisionAdam, lr 1e-4) on gradients whose scale varies
// by tensor (1e-4 .. 1e-2) and by element (log-normal), so moments and remainders come from the
// real update rule. A tiny model's entropy may not match a real one's.
//   bench_compress [--gb 1.0] [--reps 3] [--steps 4] [--dir /tmp]
// Targets: bf16 moments + remainders <= 6.5 B/param, fp8 moments <= 5.0, >= 10 %
// smaller than plain zstd default level on the same bytes, compressed save and load >= 0.5x.
#include <zstd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "harness/checkpoint/checkpoint.h"
#include "harness/checkpoint/compress.h"

namespace fs = std::filesystem;
using rh::optim::Dtype;
using rh::optim::StateKey;
using rh_bench::median;
using rh_bench::seconds;

namespace {

struct Flat : torch::nn::Module {
  std::vector<torch::Tensor> ps;
  Flat(int64_t n_tensors, int64_t numel, uint64_t seed) {
    auto g = at::detail::createCPUGenerator(seed);
    for (int64_t i = 0; i < n_tensors; ++i)
      ps.push_back(register_parameter("layer" + std::to_string(i) + "_weight",
                                      (torch::randn({numel}, g) * 0.02 * (0.5 + 0.1 * i)).to(torch::kBFloat16)));
  }
};

std::unique_ptr<rh::optim::PrecisionAdam> make_opt(Flat& m, Dtype moments) {
  std::vector<rh::optim::ParamGroup> groups(1);
  groups[0].name = "decay";
  groups[0].weight_decay = 0.1;
  for (const auto& p : m.named_parameters()) groups[0].params.emplace_back(p.key(), p.value());
  rh::optim::OptimizerConfig c;
  c.use_precision_aware_optimizer = true;
  c.store_param_remainders = true;
  c.main_params_dtype = Dtype::fp32;
  c.exp_avg_dtype = moments;
  c.exp_avg_sq_dtype = moments;
  return std::make_unique<rh::optim::PrecisionAdam>(std::move(groups), c);
}

uint64_t dir_bytes(const fs::path& d) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(d))
    if (e.is_regular_file() && e.path().filename() != "disk.csv") n += e.file_size();
  return n;
}

struct Span {
  std::string kind;
  const uint8_t* p;
  uint64_t bytes;
  int itemsize;
};

struct ModeResult {
  uint64_t stored = 0;
  double seconds = 0;
};

// One codec over every span of a kind, on one core.
ModeResult run_codec(const std::vector<Span>& spans, const rh::ckpt::CodecOptions& o) {
  ModeResult r;
  r.seconds = seconds([&] {
    for (const Span& s : spans)
      for (const auto& b : rh::ckpt::encode_tensor(s.p, s.bytes, s.itemsize, o, 1)) r.stored += b.bytes.size();
  });
  return r;
}

ModeResult whole_frame_zstd(const std::vector<Span>& spans, int level) {
  ModeResult r;
  r.seconds = seconds([&] {
    for (const Span& s : spans) {
      std::vector<uint8_t> out(ZSTD_compressBound(s.bytes));
      const size_t n = ZSTD_compress(out.data(), out.size(), s.p, s.bytes, level);
      if (ZSTD_isError(n)) throw std::runtime_error("zstd");
      r.stored += n;
    }
  });
  return r;
}

// Order-0 Huffman (computed) and entropy bound per plane of every 1 MiB block.
void planes_bounds(const std::vector<Span>& spans, uint64_t* huff, uint64_t* ent) {
  *huff = *ent = 0;
  std::vector<uint8_t> pl(rh::ckpt::kCompressBlockBytes);
  for (const Span& s : spans)
    for (uint64_t off = 0; off < s.bytes; off += rh::ckpt::kCompressBlockBytes) {
      const uint64_t len = std::min(rh::ckpt::kCompressBlockBytes, s.bytes - off), n = len / s.itemsize;
      rh::ckpt::split_planes(s.p + off, n, s.itemsize, pl.data());
      for (int j = 0; j < s.itemsize; ++j) {
        *huff += std::min<uint64_t>(rh::ckpt::huffman_bytes(pl.data() + j * n, n), n);
        *ent += static_cast<uint64_t>(rh::ckpt::byte_entropy(pl.data() + j * n, n) * n / 8.0);
      }
    }
}

bool same_state(const rh::optim::PrecisionAdam& a, const rh::optim::PrecisionAdam& b, Flat& ma, Flat& mb) {
  for (const auto& p : a.param_names())
    for (StateKey k : {StateKey::master_param, StateKey::exp_avg, StateKey::exp_avg_sq}) {
      const auto sa = a.stored(p, k), sb = b.stored(p, k);
      if (!torch::equal(sa.data, sb.data) || sa.scale.has_value() != sb.scale.has_value() ||
          (sa.scale && std::memcmp(&*sa.scale, &*sb.scale, 4) != 0))
        return false;
    }
  auto pa = ma.named_parameters(), pb = mb.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    if (!torch::equal(pa[i].value(), pb[i].value())) return false;
  return true;
}

void one_config(const char* name, Dtype moments, double gb, int reps, int steps, const fs::path& dir) {
  const int64_t n_tensors = 16;
  const double bpp = moments == Dtype::fp8 ? 6.0 : 8.0;   // raw bytes per param of this mode
  const int64_t numel = static_cast<int64_t>(gb * 1e9 / bpp / n_tensors);
  Flat model(n_tensors, numel, 7), model2(n_tensors, numel, 9);
  auto opt = make_opt(model, moments), opt2 = make_opt(model2, moments);
  auto g = at::detail::createCPUGenerator(8);
  std::vector<double> tscale;
  for (int64_t i = 0; i < n_tensors; ++i) tscale.push_back(std::pow(10.0, -4.0 + 2.0 * i / (n_tensors - 1)));
  const double t_train = seconds([&] {
    for (int s = 0; s < steps; ++s) {
      for (int64_t i = 0; i < n_tensors; ++i)
        model.ps[i].mutable_grad() =
            (torch::randn({numel}, g) * tscale[i] * torch::exp(torch::randn({numel}, g) * 0.7)).to(torch::kBFloat16);
      opt->accumulate_grads();
      opt->step(1e-4);
      opt->zero_grads();
    }
  });
  rh::ckpt::TrainState st;
  st.iteration = steps;
  rh::ckpt::SaveInput in;
  in.model = &model;
  in.optimizer = opt.get();
  in.state = &st;
  const std::string root_p = (dir / (std::string(name) + "_plain")).string();
  const std::string root_z = (dir / (std::string(name) + "_zstd")).string();
  std::vector<double> sp, sz, lp, lz, vz;
  rh::ckpt::SaveResult rp, rz;
  for (int r = 0; r < reps; ++r) {
    st.iteration = steps + r;
    if (r > 0) {
      fs::remove_all(root_p);
      fs::remove_all(root_z);
      ::sync();
    }
    in.policy.compress = rh::ckpt::Compression::none;
    sp.push_back(seconds([&] { rp = rh::ckpt::save_checkpoint(root_p, in); }));
    in.policy.compress = rh::ckpt::Compression::zstd;
    if (r == 0) rh::ckpt::Arena::release_pool();   // the first compressed save as in a fresh process
    sz.push_back(seconds([&] { rz = rh::ckpt::save_checkpoint(root_z, in); }));
  }
  rh::ckpt::TrainState st2;
  bool same = true;
  for (int r = 0; r < reps; ++r) {
    if (r == 0) rh::ckpt::Arena::release_pool();   // the first uncompressed load as in a fresh process
    lp.push_back(seconds([&] { rh::ckpt::load_checkpoint(root_p, model2, *opt2, st2, {}, {}); }));
    rh::ckpt::LoadReport rep;
    if (r == 0) rh::ckpt::Arena::release_pool();   // the first compressed load as in a fresh process
    lz.push_back(seconds([&] { rep = rh::ckpt::load_checkpoint(root_z, model2, *opt2, st2, {}, {}); }));
    vz.push_back(rep.verify_seconds);
    same = same && same_state(*opt, *opt2, model, model2);
  }
  const double params = static_cast<double>(n_tensors * numel);
  const uint64_t bp = dir_bytes(rp.dir), bz = dir_bytes(rz.dir);
  std::printf("\n== %s: %lld params (%lld x %lld), %d optimizer steps in %.1f s; uncompressed %.0f MB\n", name,
              (long long)(n_tensors * numel), (long long)n_tensors, (long long)numel, steps, t_train, bp / 1e6);
  std::printf("  bytes/param: uncompressed %.3f, compressed %.3f (%.1f %% of uncompressed)\n", bp / params, bz / params,
              100.0 * bz / bp);
  std::printf("  save: uncompressed %.3f s, compressed %.3f s = %.2fx the speed (target >= 0.5)\n", median(sp),
              median(sz), median(sp) / median(sz));
  std::printf(
      "  load: uncompressed %.3f s, compressed %.3f s = %.2fx the speed (target >= 0.5); compressed verify+decode %.3f "
      "s\n",
      median(lp), median(lz), median(lp) / median(lz), median(vz));
  std::printf(
      "  first save and load (no pooled memory, as in a fresh process, the way a resume loads): save uncompressed %.3f "
      "s,"
      " compressed %.3f s = %.2fx; load uncompressed %.3f s, compressed %.3f s = %.2fx (the medians reuse pooled"
      " buffers, as every save after the first in a training run)\n",
      sp[0], sz[0], sp[0] / sz[0], lp[0], lz[0], lp[0] / lz[0]);
  std::printf("  state loaded from the compressed checkpoint equal to the saved one, bit for bit: %s\n",
              same ? "yes" : "NO");

  // Codec comparison on the same bytes, per key.
  std::map<std::string, std::vector<Span>> spans;
  for (const auto& p : model.named_parameters())
    spans["model bf16"].push_back(
        {"model", static_cast<const uint8_t*>(p.value().data_ptr()), static_cast<uint64_t>(p.value().numel() * 2), 2});
  std::vector<torch::Tensor> keep;
  for (const auto& p : opt->param_names())
    for (StateKey k : {StateKey::master_param, StateKey::exp_avg, StateKey::exp_avg_sq}) {
      torch::Tensor t = opt->stored(p, k).data.contiguous();
      keep.push_back(t);
      const std::string kind = std::string(k == StateKey::master_param ? "remainder" : rh::optim::key_name(k)) + " " +
                               c10::toString(t.scalar_type());
      spans[kind].push_back({kind, static_cast<const uint8_t*>(t.data_ptr()),
                             static_cast<uint64_t>(t.numel() * t.element_size()), static_cast<int>(t.element_size())});
    }
  std::printf("  per key: stored bytes as %% of raw (single-core encode MB/s)\n");
  std::printf("  %-22s %15s %15s %15s %15s %15s %15s %10s %10s\n", "key", "zstd-3 blocks", "zstd-3 frame",
              "planes+zstd-1", "planes+zstd-3", "planes+fast-3H", "planes+z1 mm7", "planes+Huf", "entropy");
  uint64_t tot_raw = 0, tot_plain = 0, tot_z1 = 0;
  for (const auto& [kind, sv] : spans) {
    uint64_t raw = 0;
    for (const Span& s : sv) raw += s.bytes;
    rh::ckpt::CodecOptions plain;
    plain.level = 3;
    plain.byte_planes = false;
    plain.raw_entropy_bits = 9;   // always try zstd
    rh::ckpt::CodecOptions z1, z3, fast, mm7;
    mm7.min_match = 7;
    z3.level = 3;
    fast.level = -3;
    fast.huffman_literals = true;
    const ModeResult a = run_codec(sv, plain), b = whole_frame_zstd(sv, 3), c = run_codec(sv, z1),
                     d = run_codec(sv, z3), e = run_codec(sv, fast), f = run_codec(sv, mm7);
    uint64_t huf = 0, ent = 0;
    planes_bounds(sv, &huf, &ent);
    auto cell = [&](const ModeResult& m) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%5.1f%% (%4.0f)", 100.0 * m.stored / raw, raw / 1e6 / m.seconds);
      return std::string(buf);
    };
    std::printf("  %-22s %15s %15s %15s %15s %15s %15s %9.1f%% %9.1f%%\n", kind.c_str(), cell(a).c_str(),
                cell(b).c_str(), cell(c).c_str(), cell(d).c_str(), cell(e).c_str(), cell(f).c_str(), 100.0 * huf / raw,
                100.0 * ent / raw);
    tot_raw += raw;
    tot_plain += a.stored;
    tot_z1 += c.stored;
  }
  std::printf(
      "  all tensors: planes+zstd-1 %.1f %% of raw vs plain zstd-3 (blocks) %.1f %%: %.1f %% smaller (target >= 10)\n",
      100.0 * tot_z1 / tot_raw, 100.0 * tot_plain / tot_raw, 100.0 * (1.0 - double(tot_z1) / tot_plain));
  fs::remove_all(root_p);
  fs::remove_all(root_z);
}

}   // namespace

int main(int argc, char** argv) {
  double gb = 1.0;
  int reps = 3, steps = 4;
  std::string base = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--gb") gb = std::stod(argv[i + 1]);
    else if (a == "--reps") reps = std::stoi(argv[i + 1]);
    else if (a == "--steps") steps = std::stoi(argv[i + 1]);
    else if (a == "--dir") base = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  torch::set_num_threads(1);
  const fs::path dir = fs::path(base) / ("rh_bench_compress_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::printf("bench_compress: %.2f GB checkpoints, median of %d, %u cores for the codec\n", gb, reps,
              std::thread::hardware_concurrency());
  one_config("bf16 moments + remainders", Dtype::bf16, gb, reps, steps, dir);
  one_config("fp8 moments + remainders", Dtype::fp8, gb, reps, steps, dir);
  fs::remove_all(dir);
  return 0;
}
