// One libFuzzer target; RH_FUZZ_ENTRY names the entry point (scripts/fuzz.sh sets it).
#include "tests/fuzz/entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)rh::fuzz::RH_FUZZ_ENTRY(data, size);
  return 0;
}
