// The harness version and the git commit it was built from (generated at build time).
#pragma once

namespace rh {
const char* git_commit();
inline const char* harness_version() { return RH_VERSION; }
}  // namespace rh
