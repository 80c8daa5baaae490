// The harness version and the git commit it was built from (generated at build time).
#pragma once

namespace rh {
const char* git_commit();
inline const char* harness_version() { return RH_VERSION; }
// Every error the tool prints starts with this (its own, CLI11's, the report's), so a script or a
// reader finds them by one prefix.
inline constexpr const char* kErrorPrefix = "resume-harness: error: ";
}   // namespace rh
