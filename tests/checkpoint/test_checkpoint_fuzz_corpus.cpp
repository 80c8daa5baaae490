// The fuzz corpora of the checkpoint parsers (safetensors header, manifest, pointer), replayed
// through the same entry points the libFuzzer targets call, compiled normally (no clang needed).
#include "tests/fuzz/replay.h"

TEST(FuzzCorpus, SafetensorsHeader) { rh::fuzz::replay_corpus("safetensors", rh::fuzz::safetensors_header); }
TEST(FuzzCorpus, Manifest) { rh::fuzz::replay_corpus("manifest", rh::fuzz::manifest); }
TEST(FuzzCorpus, Pointer) { rh::fuzz::replay_corpus("pointer", rh::fuzz::pointer); }
