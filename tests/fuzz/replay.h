// Replays a fuzz corpus directory through an entry point (tests/fuzz/entries.h), as CTest runs
// it. File names say what each input must do: "ok-*" must parse, "refuse-*" (the inputs that
// crashed, hung or passed wrongly before they were fixed, and what the fuzzer found) must be refused;
// any other name (inputs the fuzzer kept) must only not crash. Anything but the parser's own
// error escaping is a failure.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "tests/fuzz/entries.h"

namespace rh::fuzz {

inline void replay_corpus(const std::string& target, const std::function<Outcome(const uint8_t*, size_t)>& entry) {
  const std::filesystem::path dir = std::filesystem::path(RH_FUZZ_CORPUS) / target;
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  size_t n = 0, ok = 0, refuse = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), {});
    const std::string name = e.path().filename().string();
    Outcome got = kRefused;
    try {
      got = entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& ex) {
      ADD_FAILURE() << target << " input " << name << " escaped with " << ex.what();
      continue;
    }
    ++n;
    if (name.rfind("ok-", 0) == 0) {
      ++ok;
      EXPECT_EQ(got, kAccepted) << target << " input " << name << " was refused";
    } else if (name.rfind("refuse-", 0) == 0) {
      ++refuse;
      EXPECT_EQ(got, kRefused) << target << " input " << name << " was accepted";
    }
  }
  EXPECT_GT(ok, 0u) << "no ok-* seed (a real file) in " << dir;
  EXPECT_GT(refuse, 0u) << "no refuse-* input in " << dir;
  std::cout << target << ": " << n << " inputs replayed (" << ok << " real files, " << refuse << " hostile)\n";
}

}   // namespace rh::fuzz
