// Internal to the safetensors files of the checkpoint room: the memory behind a SafetensorsFile
// (a copy-on-write mapping, or pooled memory a file is read or decoded into) and the block-parallel
// runner the reader and the compressed format share. safetensors.cpp reads, safetensors_write.cpp
// writes, safetensors_compressed.cpp compresses and decodes.
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "harness/checkpoint/safetensors.h"

namespace rh::ckpt {

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t len = 0;
  std::unique_ptr<Arena> owned;   // a decoded (compressed) file's buffer instead of a mapping
  bool borrowed = false;          // bytes someone else owns (locating damage in a check callback)
  ~Mapping() {
    if (addr && len && !owned && !borrowed) ::munmap(addr, len);
  }
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(addr); }
};

namespace detail {

// Pooled anonymous memory (an Arena) for `bytes` of a file read or decoded into it, refused
// naming the file when it exceeds this machine's memory (a hostile manifest and a sparse file, or
// a compressed table, must not make the loader allocate without bound) or cannot be had.
std::shared_ptr<SafetensorsFile::Mapping> owned_mapping(const std::string& path, uint64_t bytes, const char* why);

// Runs fn(j) for every j in [0, n) on up to hardware_concurrency threads (each takes the next
// index), and returns each job's exception message ("" when it succeeded), so the caller reports
// the first failure in job order whatever order the threads met them in.
std::vector<std::string> run_blocks_on_all_cores(size_t n, const std::function<void(size_t)>& fn);

}   // namespace detail
}   // namespace rh::ckpt
