// Counter-based synthetic corpus; see data.h.
#include "harness/train/data.h"

#include <stdexcept>
#include <string>

namespace rh {

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

namespace {
uint64_t key(uint64_t seed, uint64_t a, uint64_t b) { return mix64(mix64(mix64(seed) ^ a) ^ b); }
}   // namespace

SyntheticCorpus::SyntheticCorpus(uint64_t seed, int64_t vocab_size, int64_t seq_len, int64_t branching, double noise)
    : seed_(seed), vocab_(vocab_size), seq_len_(seq_len), branching_(branching) {
  if (vocab_size < 2) throw std::invalid_argument("corpus: vocab_size must be >= 2");
  if (seq_len < 1) throw std::invalid_argument("corpus: seq_len must be >= 1");
  if (branching < 1 || branching > vocab_size)
    throw std::invalid_argument("corpus: branching must be in [1, vocab_size]");
  if (!(noise >= 0.0 && noise <= 1.0)) throw std::invalid_argument("corpus: noise must be in [0, 1]");
  noise_threshold_ = noise >= 1.0 ? UINT64_MAX : static_cast<uint64_t>(noise * 18446744073709551616.0);
  successors_.resize(static_cast<size_t>(vocab_ * branching_));
  for (int64_t v = 0; v < vocab_; ++v)
    for (int64_t j = 0; j < branching_; ++j)
      successors_[static_cast<size_t>(v * branching_ + j)] = static_cast<int64_t>(
          key(seed_ ^ 0x5EC0D, static_cast<uint64_t>(v), static_cast<uint64_t>(j)) % static_cast<uint64_t>(vocab_));
}

std::vector<int64_t> SyntheticCorpus::sample(int64_t index) const {
  if (index < 0) throw std::out_of_range("corpus: negative sample index " + std::to_string(index));
  std::vector<int64_t> out(static_cast<size_t>(seq_len_ + 1));
  const uint64_t i = static_cast<uint64_t>(index);
  out[0] = static_cast<int64_t>(key(seed_, i, 0) % static_cast<uint64_t>(vocab_));
  for (int64_t t = 1; t <= seq_len_; ++t) {
    const uint64_t r = key(seed_, i, static_cast<uint64_t>(t));
    const uint64_t r2 = mix64(r);
    if (r < noise_threshold_) {
      out[static_cast<size_t>(t)] = static_cast<int64_t>(r2 % static_cast<uint64_t>(vocab_));
    } else {
      const int64_t prev = out[static_cast<size_t>(t - 1)];
      out[static_cast<size_t>(t)] =
          successors_[static_cast<size_t>(prev * branching_) + r2 % static_cast<uint64_t>(branching_)];
    }
  }
  return out;
}

void SyntheticCorpus::fill(int64_t first, int64_t count, int64_t* tokens, int64_t* targets) const {
  for (int64_t s = 0; s < count; ++s) {
    const auto seq = sample(first + s);
    for (int64_t t = 0; t < seq_len_; ++t) {
      tokens[s * seq_len_ + t] = seq[static_cast<size_t>(t)];
      targets[s * seq_len_ + t] = seq[static_cast<size_t>(t + 1)];
    }
  }
}

}   // namespace rh
