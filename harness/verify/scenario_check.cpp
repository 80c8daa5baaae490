// Checks on a scenario file's scenarios and names; see scenario_check.h.
#include "harness/verify/scenario_check.h"

#include "harness/verify/scenario_toml.h"

namespace rh::scenario_file {

void check_complete(const Scenario& s, const toml::node& at) {
  if (s.trainer) {
    try {
      validate_trainer(*s.trainer);
    } catch (const std::invalid_argument& e) {
      fail(s.file, at, s.name, e.what());
    }
    if (s.fault != Fault::none || s.dp_size != 1 || s.resume_dp_size > 1 || s.allow_lossy || s.exact_master_conversion ||
        s.exact_rebucket || s.resume_ddp_bucket_size >= 0)
      fail(s.file, at, s.name,
           "fault, dp_size, resume_dp_size, resume_ddp_bucket_size, allow_lossy, exact_master_conversion and "
           "exact_rebucket are the built-in trainer's; "
           "an external trainer's own flags go in trainer.args");
  } else if (!s.expect_diagnosis.empty()) {
    fail(s.file, at, s.name, "expect_diagnosis needs an external trainer ([trainer])");
  }
  if (s.expect.kind != Expectation::Kind::exact && s.expect.reason.empty())
    fail(s.file, at, s.name, "expect = \"" + to_string(s.expect.kind) + "\" needs a reason");
  if (s.expect.kind == Expectation::Kind::within_noise && (!s.trainer || s.trainer->determinism_runs < 2))
    fail(s.file, at, s.name,
         "expect = \"within-noise\" needs an external trainer with trainer.determinism_runs >= 2 (the noise is "
         "measured between its uninterrupted runs)");
  if (s.trainer && s.trainer->noise && s.expect.kind != Expectation::Kind::within_noise &&
      s.expect.kind != Expectation::Kind::diverge)
    fail(s.file, at, s.name, "trainer.noise judges against run-to-run noise: expect within-noise or diverge");
  if (s.trainer && s.trainer->noise && s.trainer->determinism_runs < 2)
    fail(s.file, at, s.name, "trainer.noise needs trainer.determinism_runs >= 2 to measure the noise");
  if (s.expect.kind == Expectation::Kind::tolerance && s.expect.tolerances.empty())
    fail(s.file, at, s.name, "expect = \"tolerance\" needs a [tolerance] table of metrics");
  if (s.save_at < 1 || s.save_at >= s.cfg.train.iterations)
    fail(s.file, at, s.name,
         "save_at (" + std::to_string(s.save_at) +
             ") must be in [1, iterations - 1 = " + std::to_string(s.cfg.train.iterations - 1) + "]");
  if (s.dp_size < 1 || s.dp_size > 64) fail(s.file, at, s.name, "dp_size must be in [1, 64]");
  if (s.resume_dp_size < 0 || s.resume_dp_size > 64)
    fail(s.file, at, s.name, "resume_dp_size must be in [0, 64] (0: the same as dp_size)");
  const int64_t n_micro = s.cfg.train.micro_batch > 0 ? s.cfg.train.global_batch / s.cfg.train.micro_batch : 0;
  for (int64_t dp : {s.dp_size, s.resume_dp()})
    if (n_micro > 0 && n_micro % dp != 0)
      fail(s.file, at, s.name,
           std::to_string(dp) + " data-parallel ranks do not divide the " + std::to_string(n_micro) +
               " micro-batches of an iteration (train.global_batch / train.micro_batch)");
  try {
    validate(s.cfg);
  } catch (const std::invalid_argument& e) {
    fail(s.file, at, s.name, e.what());
  }
}

void check_name_part(const std::string& file, const toml::node& n, const std::string& key, const std::string& name,
                     bool slash_groups) {
  if (name.find('\\') != std::string::npos) fail(file, n, key, quote_name(name) + " contains a path separator ('\\')");
  if (!slash_groups && name.find('/') != std::string::npos)
    fail(file, n, key, quote_name(name) + " contains a path separator ('/')");
  try {
    (void)safe_name(name);
  } catch (const ScenarioError& e) {
    fail(file, n, key, e.what());
  }
  size_t b = 0;
  while (slash_groups) {
    const size_t e = name.find('/', b);
    const std::string seg = name.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (seg.empty() || seg == "." || seg == "..")
      fail(file, n, key, quote_name(name) + " has an empty, '.' or '..' path segment");
    if (e == std::string::npos) break;
    b = e + 1;
  }
}

}   // namespace rh::scenario_file
