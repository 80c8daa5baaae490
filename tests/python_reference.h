// The independent Python computations the numeric tests compare with (tests/*_reference.py, run
// with Debian's /usr/bin/python3 + python3-numpy): each script runs once per test process and
// writes JSON into the build directory, which this returns parsed.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace rh::testing {

// script: a file name under tests/ ("sched_reference.py"); out: the JSON file it writes under
// the build directory. Throws std::runtime_error naming the command if the script fails.
inline const nlohmann::json& python_reference(const std::string& script, const std::string& out) {
  static std::mutex mu;
  static std::map<std::string, nlohmann::json> cache;
  std::lock_guard<std::mutex> lk(mu);
  const std::string path = std::string(RH_BINARY_DIR) + "/" + out;
  if (auto it = cache.find(path); it != cache.end()) return it->second;
  const std::string cmd = "/usr/bin/python3 " RH_SOURCE_DIR "/tests/" + script + " " + path;
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  std::ifstream f(path);
  return cache.emplace(path, nlohmann::json::parse(f)).first->second;
}

// For a script that computes from an input (`script IN OUT`): writes `in` to stem_in.json, runs the
// script, returns stem_out.json parsed and removes both files. Not cached: each input is its own
// computation. Throws std::runtime_error naming the command if the script fails.
inline nlohmann::json python_reference_of(const std::string& script, const nlohmann::json& in,
                                          const std::string& stem) {
  const std::string ip = stem + "_in.json", op = stem + "_out.json";
  std::ofstream(ip) << in.dump();
  const std::string cmd = "/usr/bin/python3 " RH_SOURCE_DIR "/tests/" + script + " " + ip + " " + op;
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  nlohmann::json out = nlohmann::json::parse(std::ifstream(op));
  std::remove(ip.c_str());
  std::remove(op.c_str());
  return out;
}

}   // namespace rh::testing
