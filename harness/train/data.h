// A deterministic synthetic corpus with learnable structure, addressed by (seed, sample index):
// sample i is computed from a counter-based hash, so training can resume at any sample without
// replaying earlier ones. The data position (next sample index) is part of the training state.
//
// Structure: each token v has `branching` preferred successors (a table drawn from the seed);
// with probability 1 - noise the next token is one of them, otherwise uniform. A model that learns
// the bigram table reaches about ln(branching) nats instead of ln(V).
#pragma once
#include <cstdint>
#include <vector>

namespace rh {

class SyntheticCorpus {
 public:
  SyntheticCorpus(uint64_t seed, int64_t vocab_size, int64_t seq_len, int64_t branching = 4, double noise = 0.1);

  // Writes `count` samples starting at `first` as row-major (count, seq_len) inputs and targets
  // (targets are the inputs shifted by one).
  void fill(int64_t first, int64_t count, int64_t* tokens, int64_t* targets) const;
  // One sample of seq_len + 1 tokens.
  std::vector<int64_t> sample(int64_t index) const;

  int64_t vocab_size() const { return vocab_; }
  int64_t seq_len() const { return seq_len_; }

 private:
  uint64_t seed_;
  int64_t vocab_, seq_len_, branching_;
  uint64_t noise_threshold_;          // noise as a fraction of 2^64
  std::vector<int64_t> successors_;   // (V, branching)
};

// SplitMix64 finalizer over a combined key; the corpus's only source of randomness.
uint64_t mix64(uint64_t x);

}   // namespace rh
