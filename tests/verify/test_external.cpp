// External trainers: placeholders, metric parsing (regex / CSV / JSON lines, printed resolution),
// the captured-process runner (argv without a shell, cwd, process-group timeout, output cap), the
// [trainer] table's errors, and whole external cells run with tests/external/fake_trainer.py
// (a standard-library stand-in that can misbehave), each verdict and diagnosis asserted.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "harness/base/text.h"
#include "harness/checkpoint/errors.h"
#include "harness/process/process.h"
#include "harness/verify/diagnosis.h"
#include "harness/verify/external.h"
#include "harness/verify/external_check.h"
#include "harness/verify/external_metrics.h"
#include "harness/verify/scenario.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace rh;

namespace {

using rh::testutil::slurp;

fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("rh_external_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}


// ---- placeholders ----

struct PlaceholderCase {
  const char* text;
  const char* expanded;   // nullptr: an error containing `error`
  const char* error;
};

class Placeholders : public ::testing::TestWithParam<PlaceholderCase> {};

TEST_P(Placeholders, ExpandOrRefuse) {
  const auto& placeholder_case = GetParam();
  const std::map<std::string, std::string> vars = {{"iterations", "20"}, {"save_dir", "/s"}, {"iteration", "10"}};
  if (placeholder_case.expanded) {
    EXPECT_EQ(expand_placeholders(placeholder_case.text, vars), placeholder_case.expanded);
  } else {
    try {
      expand_placeholders(placeholder_case.text, vars);
      FAIL() << "expanded " << placeholder_case.text;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(placeholder_case.error), std::string::npos) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Placeholders,
                         ::testing::Values(PlaceholderCase{"--iters={iterations}", "--iters=20", nullptr},
                                           PlaceholderCase{"{save_dir}/iter_{iteration:07}", "/s/iter_0000010",
                                                           nullptr},
                                           PlaceholderCase{"{{literal}}", "{literal}", nullptr},
                                           PlaceholderCase{"{load_dir}", nullptr, "{load_dir} has no value"},
                                           PlaceholderCase{"{iterations", nullptr, "unmatched '{'"},
                                           PlaceholderCase{"a}b", nullptr, "unmatched '}'"},
                                           PlaceholderCase{"{iteration:7}", nullptr, "zero-padded width"},
                                           PlaceholderCase{"{save_dir:07}", nullptr, "not an integer"}));

TEST(Placeholders, CheckNamesTheUnknownOne) {
  EXPECT_NO_THROW(check_placeholders("{save_dir}/x", {"save_dir"}));
  try {
    check_placeholders("{save_dri}/x", {"save_dir", "load_dir"});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown placeholder {save_dri} (expected {save_dir}, {load_dir})"),
              std::string::npos)
        << e.what();
  }
}

// ---- metrics ----

TEST(ExternalMetrics, StdoutRegexRowsByIteration) {
  const std::string log =
      "starting\n iter 1: loss 4.125000 lr 1.0e-03\niter 2: loss 4.000000 lr 2.0e-03\nwarning\r\niter 2: loss 4.000000 "
      "lr 2.0e-03\r\n";
  const auto metrics =
      parse_stdout_metrics(log, R"(iter (?P<iteration>\d+): loss (?P<loss>\S+) lr (?<lr>\S+))", "stdout");
  ASSERT_EQ(metrics.rows.size(), 3u);
  EXPECT_EQ(metrics.rows[0].iteration, 1);
  EXPECT_EQ(metrics.rows[0].line, 2u);
  ASSERT_EQ(metrics.rows[0].values.size(), 2u);
  EXPECT_EQ(metrics.rows[0].values[0], (std::pair<std::string, std::string>{"loss", "4.125000"}));
  EXPECT_EQ(metrics.rows[0].values[1], (std::pair<std::string, std::string>{"lr", "1.0e-03"}));
  EXPECT_EQ(metrics.rows[2].values[1].second, "2.0e-03");   // \r stripped
  EXPECT_EQ(metrics.find(2), &metrics.rows[1]);             // the first row of an iteration
  EXPECT_EQ(metrics.find(3), nullptr);
  EXPECT_EQ(metrics.resolution.at("loss"), "6 decimals: a difference below 5e-07 cannot be seen");
  EXPECT_EQ(metrics.resolution.at("lr"), "2 significant digits: a relative difference below 5e-02 cannot be seen");
}

TEST(ExternalMetrics, BadIterationNamesTheLine) {
  try {
    parse_stdout_metrics("iter 1: loss 1\niter 1x: loss 2\n", R"(iter (?P<iteration>\S+): loss (?P<loss>\S+))",
                         "the run's stdout");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the run's stdout:2: iteration '1x' is not a non-negative integer"),
              std::string::npos)
        << e.what();
  }
}

TEST(ExternalMetrics, LongLinesAreNotMatched) {
  const std::string huge = "iter 5: loss " + std::string(kMaxMetricLineBytes, '1') + "\niter 6: loss 2\n";
  const auto metrics = parse_stdout_metrics(huge, R"(iter (?P<iteration>\d+): loss (?P<loss>\S+))", "stdout");
  ASSERT_EQ(metrics.rows.size(), 1u);
  EXPECT_EQ(metrics.rows[0].iteration, 6);
}

TEST(ExternalMetrics, RegexProblems) {
  EXPECT_EQ(regex_problem(R"(it (?P<iteration>\d+) (?P<loss>\S+))"), "");
  EXPECT_NE(regex_problem("(unclosed").find("does not compile"), std::string::npos);
  EXPECT_EQ(regex_problem(R"((?P<loss>\S+))"), "has no (?P<iteration>...) group");
  EXPECT_EQ(regex_problem(R"((?P<iteration>\d+))"), "has no metric group besides (?P<iteration>...)");
}

TEST(ExternalMetrics, CsvAndJsonLines) {
  const auto csv_metrics =
      parse_metrics_file("loss,iteration,note\n0.5,1,\"a, \"\"b\"\"\"\n0x1.8p-1,2,x\n", "csv", "m.csv");
  ASSERT_EQ(csv_metrics.rows.size(), 2u);
  EXPECT_EQ(csv_metrics.rows[0].iteration, 1);
  EXPECT_EQ(csv_metrics.rows[0].values[1].second, "a, \"b\"");
  EXPECT_EQ(csv_metrics.resolution.at("loss"), "1 decimals: a difference below 5e-02 cannot be seen");
  const auto jsonl_metrics =
      parse_metrics_file("{\"iteration\": 3, \"loss\": 0.1, \"tokens\": 7}\n\n", "jsonl", "m.jsonl");
  ASSERT_EQ(jsonl_metrics.rows.size(), 1u);
  EXPECT_EQ(jsonl_metrics.rows[0].values[0].second, "0.10000000000000001");   // the parsed double, exactly
  EXPECT_EQ(jsonl_metrics.resolution.at("loss"), "");
  for (const char* bad : {"{\"loss\": 1}\n", "[1]\n", "{\"iteration\": -1}\n", "{\"iteration\": 1\n"})
    EXPECT_THROW(parse_metrics_file(bad, "jsonl", "m.jsonl"), std::invalid_argument) << bad;
  EXPECT_THROW(parse_metrics_file("loss\n1\n", "csv", "m.csv"), std::invalid_argument);
  EXPECT_THROW(parse_metrics_file("iteration,loss\n1\n", "csv", "m.csv"), std::invalid_argument);
}

TEST(ExternalMetrics, PrintedResolution) {
  EXPECT_EQ(printed_resolution("0x1.8p+1"), "");
  EXPECT_EQ(printed_resolution("12"), "");
  EXPECT_EQ(printed_resolution("3.1415926535897931"), "");   // 17 significant digits
  EXPECT_EQ(printed_resolution("4.1235"), "4 decimals: a difference below 5e-05 cannot be seen");
}

// What a captured or logged metric may be, and what each reader refuses (issues 41 and 42).

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

struct CaptureCase {
  const char* name;
  const char* line;    // one stdout line
  const char* regex;
  const char* value;   // the loss's text, or nullptr: refused with `error`
  const char* error;
};

class MetricCapture : public ::testing::TestWithParam<CaptureCase> {};

TEST_P(MetricCapture, NumberOrOneLineError) {
  const auto& capture = GetParam();
  const std::string log = std::string("starting\n") + capture.line + "\n";
  if (capture.value) {
    const auto metrics = parse_stdout_metrics(log, capture.regex, "out.log");
    ASSERT_EQ(metrics.rows.size(), 1u);
    EXPECT_EQ(metrics.rows[0].values.at(0).second, capture.value);
  } else {
    const std::string message = message_of([&] { parse_stdout_metrics(log, capture.regex, "out.log"); });
    EXPECT_NE(message.find(capture.error), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

constexpr const char* kAnyText = R"(iter (?P<iteration>\d+): loss (?P<loss>\S+))";
constexpr const char* kNumber = R"(iter (?P<iteration>\d+): loss (?P<loss>[-+.\w]+))";

INSTANTIATE_TEST_SUITE_P(
    Cases, MetricCapture,
    ::testing::Values(
        CaptureCase{"comma", "iter 3: loss 4.7714, lr 1e-3", kAnyText, nullptr,
                    "out.log:2: metric loss captured '4.7714,', which is not a number"},
        CaptureCase{"tensor", "iter 3: loss tensor(4.7714)", kAnyText, nullptr, "captured 'tensor(4.7714)'"},
        CaptureCase{"word", "iter 3: loss 4.77abc", kNumber, nullptr, "captured '4.77abc'"},
        CaptureCase{"empty", "iter 3: loss ", R"(iter (?P<iteration>\d+): loss (?P<loss>\d*))", nullptr,
                    "captured ''"},
        CaptureCase{"number_before_comma", "iter 3: loss 4.7714, lr 1e-3", kNumber, "4.7714", nullptr},
        CaptureCase{"exponent", "iter 3: loss -4.771394E+00 |", kNumber, "-4.771394E+00", nullptr},
        CaptureCase{"nan", "iter 3: loss nan", kNumber, "nan", nullptr},
        CaptureCase{"inf", "iter 3: loss -inf", kNumber, "-inf", nullptr},
        CaptureCase{"hex", "iter 3: loss 0x1.8p+1", kNumber, "0x1.8p+1", nullptr}),
    [](const auto& info) { return std::string(info.param.name); });

struct ResolutionCase {
  const char* text;
  const char* resolution;
};

class PrintedResolutionOf : public ::testing::TestWithParam<ResolutionCase> {};

TEST_P(PrintedResolutionOf, Text) { EXPECT_EQ(printed_resolution(GetParam().text), GetParam().resolution); }

INSTANTIATE_TEST_SUITE_P(
    Cases, PrintedResolutionOf,
    ::testing::Values(ResolutionCase{"false", ""},   // text, not a number: compared as text
                      ResolutionCase{"cosine", ""},
                      ResolutionCase{"4.7714,", ""},   // \S+ on "loss 4.7714, lr": was "5 decimals"
                      ResolutionCase{"0.000e+00", "4 significant digits: a relative difference below 5e-04 cannot be seen"},
                      ResolutionCase{"-4.771394E+00",
                                     "7 significant digits: a relative difference below 5e-07 cannot be seen"},
                      ResolutionCase{"4.7714", "4 decimals: a difference below 5e-05 cannot be seen"},
                      ResolutionCase{"nan", ""}, ResolutionCase{"-inf", ""}));

struct FileCase {
  const char* name;
  const char* format;
  const char* text;
  // On success: "iteration metric=text ..." per row (JSON keys sorted), rows separated by " | ";
  // else nullptr.
  const char* rows;
  const char* error;
};

std::string rows_text(const MetricLog& log) {
  std::string out;
  for (const auto& row : log.rows) {
    out += (out.empty() ? "" : " | ") + std::to_string(row.iteration);
    for (const auto& [name, text] : row.values) out += " " + name + "=" + text;
  }
  return out;
}

class MetricsFile : public ::testing::TestWithParam<FileCase> {};

TEST_P(MetricsFile, ReadOrRefused) {
  const auto& file_case = GetParam();
  const fs::path dir = temp_dir(std::string("mfile_") + file_case.name);
  const fs::path path = dir / (std::string("m.") + file_case.format);
  write_text(path, file_case.text);
  for (bool streamed : {false, true}) {
    auto read = [&] {
      return streamed ? read_metrics_file(path.string(), 1 << 20, file_case.format)
                      : parse_metrics_file(file_case.text, file_case.format, path.string());
    };
    if (file_case.rows) {
      EXPECT_EQ(rows_text(read()), file_case.rows) << "streamed " << streamed;
    } else {
      const std::string message = message_of([&] { read(); });
      EXPECT_NE(message.find(path.string() + ":" + file_case.error), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MetricsFile,
    ::testing::Values(
        FileCase{"csv_column_twice", "csv", "iteration,loss,lr,loss\n1,2.5,0.1,2.5\n", nullptr,
                 "1: column 'loss' is named twice (columns 2 and 4)"},
        FileCase{"csv_iteration_twice", "csv", "iteration,loss,iteration\n1,2.5,1\n", nullptr,
                 "1: column 'iteration' is named twice"},
        FileCase{"jsonl_booleans", "jsonl", "{\"iteration\": 1, \"finite\": true, \"skipped\": false, \"eval\": null}\n",
                 "1 eval=null finite=true skipped=false", nullptr},
        FileCase{"jsonl_nan", "jsonl",
                 "{\"iteration\": 1, \"loss\": NaN, \"gn\": Infinity, \"lo\": -Infinity, \"s\": \"NaN, Infinity\"}\n"
                 "{\"iteration\": 2, \"loss\": [NaN], \"x\":NaN}\n",
                 "1 gn=inf lo=-inf loss=nan s=NaN, Infinity | 2 x=nan", nullptr},
        FileCase{"jsonl_nan_and_mark", "jsonl", "{\"iteration\": 1, \"s\": \"\\u0001rh:NaN\", \"loss\": NaN}\n",
                 nullptr, "1: a line with a bare NaN or Infinity must not also hold the escape \\u0001"},
        FileCase{"jsonl_bad_token", "jsonl", "{\"iteration\": 1, \"loss\": NaNx}\n", nullptr, "1: "},
        FileCase{"jsonl_key_twice", "jsonl", "{\"iteration\": 1, \"loss\": 1.5, \"loss\": 2.5}\n", nullptr,
                 "1: duplicate key 'loss'"},
        FileCase{"jsonl_repeated_iteration", "jsonl",
                 "{\"iteration\": 1, \"loss\": 2}\n{\"iteration\": 1, \"loss\": 3}\n", "1 loss=2 | 1 loss=3",
                 nullptr}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(ExternalMetrics, RepeatedIterationKeepsEveryRowAndSaysSo) {
  const std::string log = "iter 1: loss 4\niter 2: loss 3\nresuming\niter 2: loss 2.5\niter 3: loss 2\niter 2: loss 1\n";
  const auto metrics = parse_stdout_metrics(log, kNumber, "out.log");
  ASSERT_EQ(metrics.rows.size(), 5u);
  ASSERT_EQ(metrics.repeated.size(), 2u);
  EXPECT_EQ(metrics.repeated[0].iteration, 2);
  EXPECT_EQ(metrics.repeated[0].first_line, 2u);
  EXPECT_EQ(metrics.repeated[0].line, 4u);
  EXPECT_EQ(metrics.repeated[1].line, 6u);
  EXPECT_EQ(metrics.count(2), 3u);
  EXPECT_EQ(metrics.find(2), &metrics.rows[1]);
  EXPECT_EQ(metrics.find(2, 1), &metrics.rows[2]);
  EXPECT_EQ(metrics.find(2, 2), &metrics.rows[4]);
  EXPECT_EQ(metrics.find(2, 3), nullptr);
  EXPECT_EQ(metrics.count(7), 0u);
  // A log built by hand (rows pushed directly) is found alike.
  MetricLog by_hand;
  by_hand.rows = metrics.rows;
  EXPECT_EQ(by_hand.find(2, 2)->line, 6u);
  EXPECT_EQ(by_hand.count(2), 3u);
  by_hand.append(MetricRow{2, {}, 9});
  EXPECT_EQ(by_hand.count(2), 4u);
  EXPECT_EQ(by_hand.repeated.size(), 3u);
}

TEST(ExternalMetrics, StreamedFileMatchesTheText) {
  // Lines across the 64 KiB read blocks, CRLF, no final newline, a line over the limit skipped.
  std::string log;
  for (int i = 1; i <= 3000; ++i)
    log += "iter " + std::to_string(i) + ": loss " + std::to_string(i) + ".25" + std::string(i % 7, ' ') +
           (i % 5 ? "\n" : "\r\n");
  log += "iter 5000: loss " + std::string(kMaxMetricLineBytes, '1') + "\niter 5001: loss 1.5";
  const fs::path dir = temp_dir("mstream");
  write_text(dir / "out.log", log);
  const auto from_text = parse_stdout_metrics(log, kNumber, "out.log");
  const auto streamed = read_stdout_metrics((dir / "out.log").string(), log.size(), kNumber);
  ASSERT_EQ(streamed.rows.size(), 3001u);
  EXPECT_EQ(rows_text(streamed), rows_text(from_text));
  EXPECT_EQ(streamed.rows.back().line, 3002u);
  EXPECT_EQ(streamed.rows[2999].values.at(0).second, "3000.25");
  // The cap, a FIFO and a missing file: bad input, naming the file.
  EXPECT_NE(message_of([&] { read_stdout_metrics((dir / "out.log").string(), 100, kNumber); })
                .find("out.log: " + std::to_string(log.size()) + " bytes, more than the 100-byte limit"),
            std::string::npos);
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  EXPECT_NE(message_of([&] { read_metrics_file((dir / "fifo").string(), 100, "csv"); }).find("fifo: is a FIFO"),
            std::string::npos);
  EXPECT_NE(message_of([&] { read_metrics_file((dir / "none.csv").string(), 100, "csv"); }).find("none.csv"),
            std::string::npos);
  // A metrics file's line over the limit is refused, not cut.
  write_text(dir / "long.csv", "iteration,note\n1," + std::string(kMaxMetricLineBytes, 'x') + "\n");
  EXPECT_NE(message_of([&] { read_metrics_file((dir / "long.csv").string(), 1 << 20, "csv"); })
                .find("long.csv:2: a line longer than 65536 bytes"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(ExternalMetrics, RegexProgramAndTimeAreBounded) {
  // RE2's cost is bytes x program size: a regex over the program limit is refused by name.
  std::string big = R"((?P<iteration>\d+)(?P<x>)";
  for (int i = 0; i < 40; ++i) big += "[a-z]{0,40}";
  big += ")";
  const std::string problem = regex_problem(big);
  EXPECT_NE(problem.find("RE2 instructions, more than the limit of " + std::to_string(kMaxMetricRegexProgramSize)),
            std::string::npos)
      << problem;
  EXPECT_NE(message_of([&] { parse_stdout_metrics("1 a\n", big, "out.log"); })
                .find("trainer.metrics.stdout_regex: compiles to"),
            std::string::npos);
  EXPECT_EQ(regex_problem(R"(iteration\s+(?P<iteration>\d+)/.*lm loss: (?P<lm_loss>[-+.\w]+))"), "");
  // And the matching time: with a limit of 0 CPU seconds, the first check (after 64 lines) stops it.
  std::string log;
  for (int i = 0; i < 200; ++i) log += "iter " + std::to_string(i) + ": loss 1.5\n";
  const std::string message = message_of([&] { parse_stdout_metrics(log, kNumber, "out.log", 0); });
  EXPECT_NE(message.find("out.log:64: matching trainer.metrics.stdout_regex took more than 0 CPU seconds"),
            std::string::npos)
      << message;
  EXPECT_EQ(parse_stdout_metrics(log, kNumber, "out.log").rows.size(), 200u);
}

// ---- the captured runner ----

CapturedSpec spec_in(const fs::path& dir, std::vector<std::string> argv) {
  CapturedSpec spec;
  spec.argv = std::move(argv);
  spec.cwd = dir.string();
  spec.stdout_path = (dir / "out.log").string();
  spec.stderr_path = (dir / "err.log").string();
  spec.timeout_s = 30;
  return spec;
}

TEST(RunCaptured, ArgvIsNeverAShellCommandAndRunsInCwd) {
  const fs::path work_dir = temp_dir("argv");
  auto spec = spec_in(work_dir, {"sh", "-c", "pwd; echo \"$1\"; echo err >&2", "x", "; touch pwned"});
  spec.env = {{"RH_TEST_VAR", "1"}};
  const auto run_exit = run_captured(spec);
  EXPECT_TRUE(run_exit.ok()) << run_exit.describe();
  EXPECT_EQ(slurp(work_dir / "out.log"), work_dir.string() + "\n; touch pwned\n");
  EXPECT_EQ(slurp(work_dir / "err.log"), "err\n");
  EXPECT_FALSE(fs::exists(work_dir / "pwned"));
  EXPECT_THROW(run_captured(spec_in(work_dir, {"no-such-command-rh"})), std::runtime_error);
}

TEST(RunCaptured, TimeoutKillsTheWholeProcessGroup) {
  const fs::path work_dir = temp_dir("timeout");
  auto spec = spec_in(work_dir, {"sh", "-c", "sleep 300 & echo $! > grandchild.pid; wait"});
  // 5 s, not 1: under load the shell had not yet written grandchild.pid when the timeout struck,
  // and std::stoi("") ended the test with an exception.
  spec.timeout_s = 5;
  const auto t0 = std::chrono::steady_clock::now();
  const auto run_exit = run_captured(spec);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30);
  EXPECT_TRUE(run_exit.timed_out);
  EXPECT_FALSE(run_exit.ok());
  const std::string pid_text = slurp(work_dir / "grandchild.pid");
  ASSERT_FALSE(pid_text.empty()) << "the shell did not start its grandchild within the timeout";
  const pid_t grandchild_pid = std::stoi(pid_text);
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = ::kill(grandchild_pid, 0) != 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(gone) << "the grandchild " << grandchild_pid << " outlived the timeout";
}

TEST(RunCaptured, OutputBeyondTheCapStopsTheRun) {
  const fs::path work_dir = temp_dir("cap");
  auto spec = spec_in(work_dir, {"yes"});
  spec.output_cap_bytes = 1 << 20;
  const auto run_exit = run_captured(spec);
  EXPECT_TRUE(run_exit.output_capped);
  EXPECT_FALSE(run_exit.ok());
  EXPECT_EQ(fs::file_size(work_dir / "out.log"), 1u << 20);
}

// A trainer that fills the disk under the run directory (a 64 KiB tmpfs mounted in a private
// mount namespace, `unshare -rm`): the capture of its output fails with ENOSPC, and the tool exits
// 4 (the disk failed), not 1 (a cell failed), naming the capture file. The ballast sits in the
// run's save directory, which the tool removes after the cell, so only the capture meets the full
// disk. Skipped where unprivileged namespaces are not allowed (RunCaptured's /dev/full case in
// tests/process/test_supervise.cpp covers the same error without one).
TEST(ExternalDisk, FullDiskWhileCapturingOutputExitsFour) {
  const fs::path work_dir = temp_dir("diskfull");
  fs::create_directories(work_dir / "mnt");
  if (rh::testutil::run_logged({"/usr/bin/unshare", "-rm", "true"}, work_dir / "probe.log").code != 0)
    GTEST_SKIP() << "unshare -rm is not allowed here";
  std::ofstream(work_dir / "full.toml")
      << "[defaults]\nsave_at = 1\n[defaults.trainer]\niterations = 2\ntimeout_s = 60\n"
         "command = [\"/bin/sh\", \"-c\", \"head -c 49152 /dev/zero > \\\"$0/ballast\\\"; i=0; "
         "while [ $i -lt 4000 ]; do echo 'iter 1: loss 1.0 and some padding'; i=$((i+1)); done\", \"{save_dir}\"]\n"
         "resume_command = [\"/bin/true\"]\n"
         "metrics = { stdout_regex = 'iter (?P<iteration>\\d+): loss (?P<loss>\\S+)' }\n"
         "[[scenario]]\nname = \"cell\"\n";
  const auto run =
      rh::testutil::run_logged({"/usr/bin/unshare", "-rm", "/bin/sh", "-c",
                                "mount -t tmpfs -o size=64k tmpfs \"$0\" && exec \"$@\"", (work_dir / "mnt").string(),
                                RH_TOOL, "check", "cell", "-f", (work_dir / "full.toml").string(), "--run-dir",
                                (work_dir / "mnt" / "run").string()},
                               work_dir / "log");
  EXPECT_EQ(run.code, 4) << run.log;
  EXPECT_NE(run.log.find("stdout.log: No space left on device (the disk failed, not the input)"), std::string::npos)
      << run.log;
  fs::remove_all(work_dir);
}

// ---- the [trainer] table ----

std::string minimal(const std::string& trainer_extra, const std::string& top = "") {
  return "[defaults]\nsave_at = 10\n" + top +
         "[defaults.trainer]\ncommand = [\"t\", \"{iterations}\"]\nresume_command = [\"t\", \"{load_dir}\"]\n" +
         trainer_extra +
         "[defaults.trainer.metrics]\nstdout_regex = 'i (?P<iteration>\\d+) (?P<loss>\\S+)'\n[[scenario]]\nname = "
         "\"a\"\n";
}

struct TableError {
  const char* name;
  std::string text;
  const char* error;
};

class TrainerTable : public ::testing::TestWithParam<TableError> {};

TEST_P(TrainerTable, RefusedWithFileLineAndKey) {
  try {
    load_scenarios_text(GetParam().text, "ext.toml");
    FAIL() << "accepted";
  } catch (const ScenarioError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("ext.toml:", 0), 0u) << message;
    EXPECT_NE(message.find(GetParam().error), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, TrainerTable,
    ::testing::Values(
        TableError{"unknown_key", minimal("comand = [\"x\"]\n"), "trainer.comand: unknown key"},
        TableError{"command_type", "[defaults.trainer]\ncommand = \"python3 train.py\"\n[[scenario]]\nname = \"a\"\n",
                   "trainer.command: expected an array"},
        TableError{"placeholder", minimal("args = [\"{save_dri}\"]\n"), "unknown placeholder {save_dri}"},
        TableError{"timeout", minimal("timeout_s = -1\n"), "trainer.timeout_s"},
        TableError{"determinism", minimal("determinism_runs = 0\n"), "trainer.determinism_runs"},
        TableError{"format", minimal("checkpoint = { path = \"x\", format = \"pickle\" }\n"),
                   "trainer.checkpoint.format: expected auto, safetensors or torch"},
        TableError{"round_trip", minimal("round_trip = true\n"), "trainer.round_trip: needs trainer.checkpoint.path"},
        TableError{"fault", minimal("", "fault = \"skip_rng_restore\"\n"), "built-in trainer's"},
        TableError{"diagnosis", minimal("", "expect_diagnosis = \"rng\"\n"), "expected one of none, nondeterministic"},
        TableError{"within_noise_one_run",
                   minimal("determinism_runs = 1\n", "expect = \"within-noise\"\nreason = \"GPU kernels\"\n"),
                   "expect = \"within-noise\" needs an external trainer with trainer.determinism_runs >= 2"},
        TableError{"preset", minimal("preset = \"deepspeed\"\n"), "trainer.preset: expected megatron, got 'deepspeed'"},
        TableError{"probe_word", minimal("probe = \"yes\"\n"), "trainer.probe: expected true, false or \"auto\""},
        TableError{"noise_exact", minimal("noise = true\n"), "trainer.noise judges against run-to-run noise"},
        TableError{"noise_factor", minimal("noise_factor = 0.5\n"), "trainer.noise_factor: expected 1 to 1000"},
        TableError{"ignore_not_array", minimal("checkpoint = { path = \"x\", ignore = \"run_info/*\" }\n"),
                   "trainer.checkpoint.ignore: expected an array of { key"},
        TableError{"ignore_no_reason", minimal("checkpoint = { path = \"x\", ignore = [{ key = \"run_info/*\" }] }\n"),
                   "trainer.checkpoint.ignore[0].reason: expected the reason"},
        TableError{"ignore_blank_reason",
                   minimal("checkpoint = { path = \"x\", ignore = [{ key = \"t\", reason = \"  \" }] }\n"),
                   "trainer.checkpoint.ignore[0].reason: expected the reason"},
        TableError{"ignore_no_key", minimal("checkpoint = { path = \"x\", ignore = [{ reason = \"time\" }] }\n"),
                   "trainer.checkpoint.ignore[0].key: expected a non-empty key glob"},
        TableError{"ignore_unknown",
                   minimal("checkpoint = { path = \"x\", ignore = [{ key = \"t\", reason = \"r\", why = 1 }] }\n"),
                   "trainer.checkpoint.ignore[0].why: unknown key (expected key, reason)"},
        TableError{"regex",
                   "[defaults.trainer]\ncommand=[\"t\"]\nresume_command=[\"t\"]\nmetrics={stdout_regex='(?P<loss>x)'}\n"
                   "[[scenario]]\nname=\"a\"\n",
                   "has no (?P<iteration>...) group"},
        TableError{"regex_program",
                   "[defaults.trainer]\ncommand=[\"t\"]\nresume_command=[\"t\"]\n"
                   "metrics={stdout_regex='(?P<iteration>\\d+)(?P<x>[a-z]{1000}[a-z]{1000}[a-z]{1000})'}\n"
                   "[[scenario]]\nname=\"a\"\n",
                   "trainer.metrics.stdout_regex: compiles to"},
        TableError{"no_metrics",
                   "[defaults.trainer]\ncommand = [\"t\"]\nresume_command = [\"t\"]\n[[scenario]]\nname = \"a\"\n",
                   "trainer.metrics: expected exactly one of stdout_regex or file"},
        TableError{"csv_format",
                   "[defaults.trainer]\ncommand = [\"t\"]\nresume_command = [\"t\"]\n"
                   "metrics = { file = \"m\", format = \"xml\" }\n[[scenario]]\nname = \"a\"\n",
                   "trainer.metrics.format: expected csv or jsonl"}),
    [](const auto& info) { return std::string(info.param.name); });

// trainer.preset = "megatron": Megatron-LM's training_log line (megatron/training/training.py, main
// 001b00c, copied here as it prints), its checkpoint directory, and the flags the check needs,
// added only where the command does not name them; the table's own keys override the preset.
TEST(TrainerPreset, MegatronFillsTheLogLineCheckpointAndFlags) {
  const std::string text =
      "[defaults]\nsave_at = 10\n[defaults.trainer]\ncommand = [\"t\"]\nresume_command = [\"old\"]\n"
      "metrics = { stdout_regex = 'i (?P<iteration>\\d+) (?P<loss>\\S+)' }\n"
      "[[scenario]]\nname = \"m\"\n[scenario.trainer]\npreset = \"megatron\"\n"
      "command = [\"torchrun\", \"pretrain_gpt.py\", \"--train-iters\", \"20\", \"--log-interval=5\"]\n"
      "[[scenario]]\nname = \"own\"\n[scenario.trainer]\npreset = \"megatron\"\ncommand = [\"x\"]\n"
      "checkpoint = { path = \"{save_dir}/ckpt\" }\n";
  const auto all = load_scenarios_text(text, "m.toml");
  const ExternalTrainer& t = *all.at(0).trainer;
  EXPECT_EQ(t.checkpoint.path, "{save_dir}/iter_{iteration:07}");
  EXPECT_EQ(t.args, (std::vector<std::string>{"--exit-interval", "{iterations}", "--save-interval", "{save_at}",
                                              "--save", "{save_dir}", "--load", "{load_dir}"}));   // not --log-interval
  EXPECT_EQ(t.resume_command, t.command);   // the inherited ["old"] is cleared
  const std::string line =
      " [2026-12-07 12:00:00.123456] iteration       11/      20 | consumed samples:          176 | elapsed time per "
      "iteration (ms): 812.3 | learning rate: 2.999999E-04 | global batch size:    16 | lm loss: 4.771394E+00 | "
      "loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |\n";
  const auto log = parse_stdout_metrics(line, t.metrics.stdout_regex, "stdout");
  ASSERT_EQ(log.rows.size(), 1u);
  EXPECT_EQ(log.rows[0].iteration, 11);
  EXPECT_EQ(log.rows[0].values,
            (std::vector<std::pair<std::string, std::string>>{{"lr", "2.999999E-04"}, {"lm_loss", "4.771394E+00"}}));
  EXPECT_EQ(all.at(1).trainer->checkpoint.path, "{save_dir}/ckpt");   // the table's own key wins
}

TEST(TrainerTable, ArgsAppendFromDefaultsPresetsAndAxes) {
  const std::string text = minimal("args = [\"--a\"]\n") +
                           "[[matrix]]\nname = \"m\"\ntrainer = { args = [\"--m\"] }\n"
                           "  [[matrix.axis]]\n  name = \"x\"\n  key = \"trainer.args\"\n  values = [\"--fast\"]\n"
                           "  [[matrix.axis]]\n  name = \"bug\"\n  values = [\"rng\"]\n"
                           "  [matrix.axis.presets]\n  rng = { trainer = { args = [\"--bug\", \"rng\"] } }\n";
  const auto all = load_scenarios_text(text, "ext.toml");
  ASSERT_EQ(all.size(), 2u);
  ASSERT_TRUE(all[1].trainer);
  EXPECT_EQ(all[1].name, "m/x=--fast,bug=rng");
  EXPECT_EQ(all[1].trainer->args, (std::vector<std::string>{"--a", "--m", "--fast", "--bug", "rng"}));
  EXPECT_EQ(all[0].trainer->args, (std::vector<std::string>{"--a"}));
  EXPECT_EQ(all[0].cfg.train.iterations, 20);
}

// ---- whole cells with the fake trainer ----

struct CellCase {
  const char* name;
  const char* mode;    // fake_trainer.py --mode
  const char* level;   // log | checkpoints
  Outcome outcome;
  const char* diagnosis;    // "" for an error outcome
  const char* divergence;   // text the first divergence (or error) must contain
};

std::string cell_toml(const CellCase& cell_case) {
  const std::string src = RH_SOURCE_DIR;
  std::string toml =
      "[defaults]\nsave_at = 10\n[defaults.trainer]\niterations = 20\ntimeout_s = 5\noutput_cap_mb = 1\n"
      "command = [\"/usr/bin/python3\", \"" +
      src +
      "/tests/external/fake_trainer.py\", \"--iters\", \"{iterations}\", "
      "\"--save-every\", \"{save_at}\", \"--out\", \"{save_dir}\", \"--mode\", \"" +
      cell_case.mode +
      "\"]\n"
      "resume_command = [\"/usr/bin/python3\", \"" +
      src +
      "/tests/external/fake_trainer.py\", \"--iters\", \"{iterations}\", "
      "\"--save-every\", \"{save_at}\", \"--out\", \"{save_dir}\", \"--load\", \"{load_dir}\", \"--mode\", \"" +
      cell_case.mode + "\"]\n";
  if (std::string(cell_case.mode) == "csv" || std::string(cell_case.mode) == "jsonl")
    toml += "metrics = { file = \"{run_dir}/metrics." + std::string(cell_case.mode) + "\", format = \"" +
            cell_case.mode + "\" }\n";
  else toml += "metrics = { stdout_regex = 'iter (?P<iteration>\\d+): loss (?P<loss>\\S+)' }\n";
  if (std::string(cell_case.level) == "checkpoints")
    toml += "round_trip = true\ncheckpoint = { path = \"{save_dir}/iter_{iteration}.safetensors\" }\n";
  if (std::string(cell_case.level) == "torch") toml += "checkpoint = { path = \"{save_dir}/iter_{iteration}.pt\" }\n";
  return toml + "[[scenario]]\nname = \"cell\"\nexpect = \"diverge\"\nreason = \"test\"\n";
}

// The README's old `\S+` on a log with a comma after the loss: bad input naming the file, the line
// and the text, not a NaN loss compared silently (issue 42).
TEST(ExternalCellBadInput, CapturedTextThatIsNotANumberNamesFileAndLine) {
  const fs::path work_dir = temp_dir("cell_comma");
  const std::string toml =
      "[defaults]\nsave_at = 1\n[defaults.trainer]\niterations = 2\ntimeout_s = 5\n"
      "command = [\"/bin/sh\", \"-c\", \"echo start; echo 'iter 1: loss 4.7714, lr 0.1'\"]\n"
      "resume_command = [\"/bin/sh\", \"-c\", \"echo 'iter 2: loss 4.5, lr 0.1'\"]\n"
      "metrics = { stdout_regex = 'iter (?P<iteration>\\d+): loss (?P<loss>\\S+)' }\n"
      "[[scenario]]\nname = \"cell\"\nexpect = \"diverge\"\nreason = \"test\"\n";
  const auto scenario = load_scenarios_text(toml, (work_dir / "ext.toml").string()).front();
  CheckOptions options;
  options.tool = RH_TOOL;
  options.work_dir = (work_dir / "cell").string();
  const auto result = run_check(scenario, options);
  EXPECT_EQ(to_string(result.outcome), std::string("error")) << result.first_divergence;
  EXPECT_TRUE(result.bad_input) << result.first_divergence;
  EXPECT_NE(result.first_divergence.find("uninterrupted_1/stdout.log:2: metric loss captured '4.7714,', which is "
                                         "not a number"),
            std::string::npos)
      << result.first_divergence;
  fs::remove_all(work_dir);
}

class ExternalCell : public ::testing::TestWithParam<CellCase> {};

TEST_P(ExternalCell, VerdictAndDiagnosis) {
  const auto& cell_case = GetParam();
  const fs::path work_dir = temp_dir(std::string("cell_") + cell_case.name);
  const auto scenario = load_scenarios_text(cell_toml(cell_case), (work_dir / "ext.toml").string()).front();
  CheckOptions options;
  options.tool = RH_TOOL;
  options.work_dir = (work_dir / "cell").string();
  const auto result = run_check(scenario, options);
  EXPECT_EQ(to_string(result.outcome), std::string(to_string(cell_case.outcome)))
      << result.first_divergence << " | " << result.explanation;
  EXPECT_EQ(result.diagnosis, cell_case.diagnosis) << result.first_divergence;
  EXPECT_NE(result.first_divergence.find(cell_case.divergence), std::string::npos) << result.first_divergence;
  EXPECT_EQ(result.first_divergence.find('\n'), std::string::npos) << result.first_divergence;
  EXPECT_TRUE(fs::exists(work_dir / "cell" / "result.json"));
  EXPECT_GT(result.trainer_seconds, 0);
  const std::string mode = cell_case.mode;
  EXPECT_EQ(result.bad_input, mode == "bad_iteration" || mode.rfind("garbage", 0) == 0) << result.first_divergence;
  fs::remove_all(work_dir);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ExternalCell,
    ::testing::Values(
        CellCase{"correct_log", "ok", "log", Outcome::identical, "none", ""},
        CellCase{"correct_checkpoints", "ok", "checkpoints", Outcome::identical, "none", ""},
        CellCase{"correct_csv", "csv", "log", Outcome::identical, "none", ""},
        CellCase{"correct_jsonl", "jsonl", "log", Outcome::identical, "none", ""},
        CellCase{"rng_log", "rng_not_saved", "log", Outcome::diverged, "resumed-metrics", "iteration 11: metric loss"},
        CellCase{"rng_checkpoints", "rng_not_saved", "checkpoints", Outcome::diverged, "not-restored",
                 "iteration 11: metric loss"},
        CellCase{"nondeterministic", "nondeterministic", "log", Outcome::nondeterministic, "nondeterministic",
                 "uninterrupted runs differ: iteration 1"},
        CellCase{"iters_dependent", "iters_dependent", "log", Outcome::diverged, "before-save",
                 "interrupted run: iteration 1"},
        CellCase{"crash", "crash_interrupted", "log", Outcome::error, "", "the interrupted run exited with code 3"},
        CellCase{"hang", "hang", "log", Outcome::error, "", "after its time ran out"},
        CellCase{"spam", "spam", "log", Outcome::error, "", "printed more than 1 MiB"},
        CellCase{"bad_iteration", "bad_iteration", "log", Outcome::error, "", "is not a non-negative integer"},
        CellCase{"no_checkpoint", "no_checkpoint", "checkpoints", Outcome::error, "", "was not written"},
        CellCase{"garbage_checkpoint", "garbage_checkpoint", "checkpoints", Outcome::error, "", "iter_10.safetensors"},
        // through the shared torch bridge: refused naming the file, and the bridge serves on
        CellCase{"garbage_torch", "garbage_torch", "torch", Outcome::error, "", "iter_10.pt: not a torch.save file"},
        CellCase{"garbage_torch_again", "garbage_torch", "torch", Outcome::error, "",
                 "iter_10.pt: not a torch.save file"},
        // a legacy torch file whose torch.load would append to ../../../pwned_<iters>.patch
        // (issue 41): bad input, never a divergence; HostileTorch below checks nothing was written
        CellCase{"garbage_legacy_torch", "garbage_legacy_torch", "torch", Outcome::error, "",
                 "iter_10.pt: a legacy (torch < 1.6, non-zip pickle format) torch.save file, refused"}),
    [](const auto& info) { return std::string(info.param.name); });

// Issue 41 through the tool's own path: a trainer writing a legacy torch file that steers torch's
// loader (dump_patches) into writing outside the run directory gets an error, and nothing appears
// outside; the bridge, started from a directory holding a json.py (here with trust_pickle, which
// starts a bridge process of its own), never imports it.
TEST(HostileTorch, LegacyFileWritesNothingAndCwdIsNotImported) {
  const fs::path base = temp_dir("hostile_torch");
  const fs::path cwd = base / "cwd", marker = base / "imported";
  fs::create_directories(cwd);
  for (const char* mod : {"json", "zipfile", "struct"})
    std::ofstream(cwd / (std::string(mod) + ".py")) << "open('" << marker.string() << "', 'w').write('" << mod << "')\n";
  const fs::path before = fs::current_path();
  fs::current_path(cwd);
  for (const bool trust : {false, true}) {
    // trusted, the legacy file would be torch.load-ed (and write): the trusted run reads garbage
    std::string toml =
        cell_toml(CellCase{"h", trust ? "garbage_torch" : "garbage_legacy_torch", "torch", Outcome::error, "", ""});
    const std::string key = "checkpoint = { path = \"{save_dir}/iter_{iteration}.pt\" }";
    if (trust) toml.replace(toml.find(key), key.size() - 2, "checkpoint = { path = \"{save_dir}/iter_{iteration}.pt\", trust_pickle = true");
    const auto scenario = load_scenarios_text(toml, (base / "ext.toml").string()).front();
    CheckOptions options;
    options.tool = RH_TOOL;
    options.work_dir = (base / "run" / "cell").string();
    const auto result = run_check(scenario, options);
    EXPECT_EQ(to_string(result.outcome), std::string("error")) << result.first_divergence;
    EXPECT_TRUE(result.bad_input) << result.first_divergence;
    fs::remove_all(base / "run");
  }
  fs::current_path(before);
  std::vector<std::string> stray;
  for (const auto& e : fs::directory_iterator(base))
    if (e.path().filename() != "cwd" && e.path().filename() != "ext.toml") stray.push_back(e.path().filename().string());
  EXPECT_TRUE(stray.empty()) << "written outside the run directory: " << stray.front();
  EXPECT_FALSE(fs::exists(marker)) << "the bridge imported " << slurp(marker.string()) << ".py from its cwd";
  fs::remove_all(base);
}

// ---- the diagnoses' table ----

// The codes are the names result.json, summary.csv and expect_diagnosis use: each enum value has
// its own, in the order the check applies them, and the two without a fixed cause have none.
TEST(ExternalDiagnosis, CodesAreTheWrittenNamesInOrder) {
  const std::vector<std::pair<Diagnosis, std::string>> expected = {{Diagnosis::none, "none"},
                                                                   {Diagnosis::nondeterministic, "nondeterministic"},
                                                                   {Diagnosis::before_save, "before-save"},
                                                                   {Diagnosis::saved_state, "saved-state"},
                                                                   {Diagnosis::round_trip, "round-trip"},
                                                                   {Diagnosis::after_load, "after-load"},
                                                                   {Diagnosis::not_in_checkpoint, "not-in-checkpoint"},
                                                                   {Diagnosis::resumed_metrics, "resumed-metrics"},
                                                                   {Diagnosis::final_state, "final-state"},
                                                                   {Diagnosis::not_restored, "not-restored"},
                                                                   {Diagnosis::lossy_save, "lossy-save"},
                                                                   {Diagnosis::metadata, "metadata"},
                                                                   {Diagnosis::within_noise, "within-noise"},
                                                                   {Diagnosis::beyond_noise, "beyond-noise"}};
  std::string codes;
  for (const auto& [diagnosis, code] : expected) {
    EXPECT_EQ(to_string(diagnosis), code);
    EXPECT_TRUE(is_diagnosis_code(code)) << code;
    const bool no_cause = diagnosis == Diagnosis::none || diagnosis == Diagnosis::resumed_metrics;
    EXPECT_EQ(std::string(cause_of(diagnosis)).empty(), no_cause) << code;
    codes += (codes.empty() ? "" : ", ") + code;
  }
  EXPECT_EQ(diagnosis_codes(), codes);
  EXPECT_FALSE(is_diagnosis_code("rng"));
  EXPECT_FALSE(is_diagnosis_code(""));
}

}   // namespace
