// The scenario loader's fuzz corpus, replayed through the libFuzzer target's entry point.
#include "tests/fuzz/replay.h"

TEST(FuzzCorpus, Scenario) { rh::fuzz::replay_corpus("scenario", rh::fuzz::scenario); }
