// Where a process's time goes, by phase, for the matrix benchmark (bench/bench_matrix.cpp): the
// training job, each cell's check and the matrix runner add up seconds per named phase and write
// them as phases.json beside their other outputs. Nothing reads them to decide anything.
// LibTorch-free.
#pragma once
#include <chrono>
#include <map>
#include <string>

namespace rh {

class PhaseTimes {
 public:
  void add(const std::string& phase, double seconds) { seconds_[phase] += seconds; }
  const std::map<std::string, double>& seconds() const { return seconds_; }

  // Adds the time from construction to destruction to `phase`.
  class Scope {
   public:
    Scope(PhaseTimes& t, std::string phase) : t_(t), phase_(std::move(phase)) {}
    ~Scope() { t_.add(phase_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count()); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    PhaseTimes& t_;
    std::string phase_;
    std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  };

 private:
  std::map<std::string, double> seconds_;
};

}   // namespace rh
