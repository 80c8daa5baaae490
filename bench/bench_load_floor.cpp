// What a verified load can cost at best, against a plain read(), on one file of --gb in the
// page cache, with every core (the loader's own thread count). No checkpoint code: the bare
// memory passes, so bench_checkpoint's load figure can be read against its floor.
//   read1        read() into touched buffers, one thread              (bench_checkpoint's "plain")
//   verify+copy  mmap, XXH3 every 32 MiB block, then memcpy out        (what load_checkpoint does)
//   fused-mmap   mmap, per 256 KiB: XXH3 then memcpy out               (copies before all is checked)
//   fused-pread  per 256 KiB: pread() into the destination, XXH3 it   (copies before all is checked,
//                                                                      and reads without mmap)
// Only the last two could reach read() speed; both give up a guarantee the loader keeps.
//   bench_load_floor [--gb 1.0] [--reps 7] [--dir /tmp]
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>

#include "bench/bench_util.h"
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using rh_bench::median;
using rh_bench::seconds;

namespace {

constexpr size_t kBlock = 32u << 20, kChunk = 256u << 10;

// fn(block) for every kBlock block of n bytes, blocks spread round-robin over all cores.
void each_block(size_t n, const std::function<void(size_t, size_t)>& fn) {
  const size_t nb = (n + kBlock - 1) / kBlock;
  const size_t T = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> ts;
  for (size_t t = 0; t < T; ++t)
    ts.emplace_back([&, t] {
      for (size_t b = t; b < nb; b += T) fn(b * kBlock, std::min(kBlock, n - b * kBlock));
    });
  for (auto& t : ts) t.join();
}

void pread_all(int fd, char* p, size_t n, size_t off) {
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r <= 0) throw std::runtime_error("pread failed");
    p += r, n -= static_cast<size_t>(r), off += static_cast<size_t>(r);
  }
}

}   // namespace

int main(int argc, char** argv) {
  double gb = 1.0;
  int reps = 7;
  std::string base = "/tmp";
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
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
  const size_t n = static_cast<size_t>(gb * 1e9) / 4096 * 4096;
  const std::string path = base + "/rh_bench_floor_" + std::to_string(::getpid()) + ".bin";
  char* dest = static_cast<char*>(std::aligned_alloc(4096, n));
  {
    std::mt19937_64 g(7);
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t v = g();
      std::memcpy(dest + i, &v, std::min<size_t>(8, n - i));
    }
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t o = 0; o < n;) {
      ssize_t w = ::write(fd, dest + o, std::min<size_t>(n - o, 1u << 30));
      if (w <= 0) throw std::runtime_error("write " + path);
      o += static_cast<size_t>(w);
    }
    ::close(fd);   // pages stay in the page cache; dest stays touched
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  std::vector<uint64_t> want((n + kBlock - 1) / kBlock), got(want.size());
  each_block(n, [&](size_t off, size_t len) { want[off / kBlock] = XXH3_64bits(dest + off, len); });

  auto mapped = [&](const std::function<void(const char*)>& fn) {
    void* m = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) throw std::runtime_error("mmap " + path);
    fn(static_cast<const char*>(m));
    ::munmap(m, n);
  };
  std::vector<double> t_read, t_two, t_fused, t_pread;
  for (int r = 0; r < reps; ++r) {
    t_read.push_back(seconds([&] { pread_all(fd, dest, n, 0); }));
    t_two.push_back(seconds([&] {
      mapped([&](const char* m) {
        each_block(n, [&](size_t off, size_t len) { got[off / kBlock] = XXH3_64bits(m + off, len); });
        each_block(n, [&](size_t off, size_t len) { std::memcpy(dest + off, m + off, len); });
      });
    }));
    auto fused = [&](const std::function<void(size_t, size_t)>& chunk) {
      each_block(n, [&](size_t off, size_t len) {
        XXH3_state_t* s = XXH3_createState();
        XXH3_64bits_reset(s);
        for (size_t o = off; o < off + len; o += kChunk) {
          const size_t k = std::min(kChunk, off + len - o);
          chunk(o, k);
          XXH3_64bits_update(s, dest + o, k);
        }
        got[off / kBlock] = XXH3_64bits_digest(s);
        XXH3_freeState(s);
      });
    };
    t_fused.push_back(seconds(
        [&] { mapped([&](const char* m) { fused([&](size_t o, size_t k) { std::memcpy(dest + o, m + o, k); }); }); }));
    t_pread.push_back(seconds([&] { fused([&](size_t o, size_t k) { pread_all(fd, dest + o, k, o); }); }));
    if (got != want) {
      std::fprintf(stderr, "checksums differ: the passes did not see the file\n");
      return 1;
    }
  }
  ::close(fd);
  ::unlink(path.c_str());
  const double rd = median(t_read);
  std::printf("bench_load_floor: %.0f MB in the page cache, %u threads, median of %d\n", n / 1e6,
              std::max(1u, std::thread::hardware_concurrency()), reps);
  std::printf("  read1        %.3f s\n", rd);
  std::printf("  verify+copy  %.3f s  %.2fx read1   (load_checkpoint's order: nothing touched before all is checked)\n",
              median(t_two), rd / median(t_two));
  std::printf("  fused-mmap   %.3f s  %.2fx read1   (copies before the last block is checked)\n", median(t_fused),
              rd / median(t_fused));
  std::printf("  fused-pread  %.3f s  %.2fx read1   (copies before the last block is checked, no mmap)\n",
              median(t_pread), rd / median(t_pread));
  std::free(dest);
  return 0;
}
