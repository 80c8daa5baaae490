// c10d process group and placement from the environment; see group.h.
#define USE_C10D_GLOO 1   // ProcessGroupGloo.hpp is compiled only with it (Debian builds LibTorch with Gloo)
#include "harness/ranks/group.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace rh::dist {

namespace {

// The first line of a c10d/Gloo message (they append a C++ stack trace).
std::string first_line(const std::exception& e) {
  std::string msg = e.what();
  const auto nl = msg.find('\n');
  if (nl != std::string::npos) msg.resize(nl);
  return msg;
}

const char* getenv_s(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int lo, int hi) {
  const char* v = getenv_s(name);
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    throw std::invalid_argument(std::string("environment variable ") + name + "='" + v + "': expected an integer in [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int>(x);
}

}   // namespace

bool launched_by_environment() { return getenv_s("WORLD_SIZE") || getenv_s("SLURM_NTASKS"); }

Placement placement_from_environment() {
  Placement place;
  if (getenv_s("WORLD_SIZE")) {
    place.source = "torchrun environment";
    place.world_size = env_int("WORLD_SIZE", 1, 1 << 20);
    if (!getenv_s("RANK")) throw std::invalid_argument("environment variable WORLD_SIZE is set but RANK is not");
    place.rank = env_int("RANK", 0, place.world_size - 1);
    place.local_rank = getenv_s("LOCAL_RANK") ? env_int("LOCAL_RANK", 0, 1 << 20) : place.rank;
  } else if (getenv_s("SLURM_NTASKS")) {
    place.source = "SLURM environment";
    place.world_size = env_int("SLURM_NTASKS", 1, 1 << 20);
    if (!getenv_s("SLURM_PROCID"))
      throw std::invalid_argument("environment variable SLURM_NTASKS is set but SLURM_PROCID is not");
    place.rank = env_int("SLURM_PROCID", 0, place.world_size - 1);
    place.local_rank = getenv_s("SLURM_LOCALID") ? env_int("SLURM_LOCALID", 0, 1 << 20) : 0;
  } else {
    return place;
  }
  if (place.world_size > 1) {
    if (!getenv_s("MASTER_ADDR") || !getenv_s("MASTER_PORT"))
      throw std::invalid_argument(place.source + " with " + std::to_string(place.world_size) +
                                  " ranks needs MASTER_ADDR and MASTER_PORT (rank 0's address and a free port)");
    place.master_addr = getenv_s("MASTER_ADDR");
    place.master_port = env_int("MASTER_PORT", 1, 65535);
  }
  return place;
}

struct Group::Impl {
  Placement place;
  c10::intrusive_ptr<c10d::TCPStore> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;

  void run(const c10::intrusive_ptr<c10d::Work>& w, const char* what) {
    try {
      w->wait();
    } catch (const std::exception& e) {
      throw DistError(std::string("data-parallel ") + what + " failed on rank " + std::to_string(place.rank) + " of " +
                      std::to_string(place.world_size) +
                      " (a peer died, hung past the timeout, or failed): " + first_line(e));
    }
  }
};

Group::Group(const Placement& place, std::chrono::milliseconds timeout) : impl_(std::make_unique<Impl>()) {
  impl_->place = place;
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(place.master_port);
    store_options.isServer = place.rank == 0;
    store_options.numWorkers = place.world_size;
    store_options.waitWorkers = true;
    store_options.timeout = timeout;
    impl_->store = c10::make_intrusive<c10d::TCPStore>(place.master_addr, store_options);
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
    // Bind where the peers can reach us: loopback for a local launch, else the host's name.
    const bool local = place.master_addr == "127.0.0.1" || place.master_addr == "localhost";
    gloo_options->devices.push_back(local ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                          : c10d::ProcessGroupGloo::createDefaultDevice());
    gloo_options->threads = 1;
    impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, place.rank, place.world_size, gloo_options);
  } catch (const std::exception& e) {
    throw DistError("rank " + std::to_string(place.rank) + " of " + std::to_string(place.world_size) +
                    ": rendezvous at " + place.master_addr + ":" + std::to_string(place.master_port) +
                    " failed within " + std::to_string(timeout.count() / 1000) + " s: " + first_line(e));
  }
}

Group::~Group() = default;
int Group::rank() const { return impl_->place.rank; }
int Group::size() const { return impl_->place.world_size; }

void Group::all_reduce_sum(torch::Tensor& t) {
  std::vector<at::Tensor> v{t};
  impl_->run(impl_->pg->allreduce(v), "all-reduce (sum)");
}

void Group::all_reduce_max(torch::Tensor& t) {
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MAX;
  impl_->run(impl_->pg->allreduce(v, o), "all-reduce (max)");
}

void Group::all_gather_bytes(const torch::Tensor& in, torch::Tensor& out) {
  const int64_t n = in.numel();
  std::vector<std::vector<at::Tensor>> outs(1);
  for (int r = 0; r < size(); ++r) outs[0].push_back(out.narrow(0, r * n, n));
  std::vector<at::Tensor> ins{in};
  impl_->run(impl_->pg->allgather(outs, ins), "all-gather");
  // Gloo gathers into the tensors it was given when they are contiguous views; copy defensively
  // in case it allocated.
  for (int r = 0; r < size(); ++r)
    if (outs[0][static_cast<size_t>(r)].data_ptr() != out.narrow(0, r * n, n).data_ptr())
      out.narrow(0, r * n, n).copy_(outs[0][static_cast<size_t>(r)]);
}

std::vector<std::string> Group::all_gather_strings(const std::string& mine) {
  auto len = torch::full({1}, static_cast<int64_t>(mine.size()), torch::kLong);
  auto lens = torch::empty({size()}, torch::kLong);
  {
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < size(); ++r) outs[0].push_back(lens.narrow(0, r, 1));
    std::vector<at::Tensor> ins{len};
    impl_->run(impl_->pg->allgather(outs, ins), "all-gather (lengths)");
    for (int r = 0; r < size(); ++r) lens.narrow(0, r, 1).copy_(outs[0][static_cast<size_t>(r)]);
  }
  int64_t max_len = 1;
  for (int r = 0; r < size(); ++r) max_len = std::max(max_len, lens[r].item<int64_t>());
  auto in = torch::zeros({max_len}, torch::kByte);
  std::memcpy(in.data_ptr(), mine.data(), mine.size());
  auto out = torch::empty({max_len * size()}, torch::kByte);
  all_gather_bytes(in, out);
  std::vector<std::string> strings;
  const char* bytes = static_cast<const char*>(out.data_ptr());
  for (int r = 0; r < size(); ++r)
    strings.emplace_back(bytes + r * max_len, static_cast<size_t>(lens[r].item<int64_t>()));
  return strings;
}

}   // namespace rh::dist
