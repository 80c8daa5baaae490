// Scenario names as directory names, and the error every scenario problem raises. Free of
// LibTorch, so the reports room (which reads run directories) can use it without the torch headers.
#pragma once
#include <cstddef>
#include <stdexcept>
#include <string>

namespace rh {

// Raised for every problem in a scenario file; the message starts with "file:line:".
struct ScenarioError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// The one way a scenario name becomes a directory (or golden-file) name: letters, digits, '-', '_',
// '.', '=' kept, '/' -> "__", anything else -> '+'. Refuses (ScenarioError) an empty name, "." and
// "..", control characters and results longer than kMaxScenarioDirName, so a directory made
// from it is always a new child of the directory it is joined to.
constexpr size_t kMaxScenarioDirName = 200;
std::string safe_name(const std::string& canonical);
// The name quoted for a message: control characters escaped, at most 200 characters.
std::string quote_name(const std::string& name);

}   // namespace rh
