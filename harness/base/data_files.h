// Where the tool's data files lie (the plot script, the projection models, the scenario files),
// found relative to the running executable, never through a path baked in at build time:
//   $RH_DATA_DIR                            if set
//   <exe dir>/share/resume-harness          a build tree (CMake copies the files there)
//   <exe dir>/../share/resume-harness       an install (cmake --install build --prefix P: P/bin)
// The first that exists wins; the build tree's tests (build/tests/) find build/share that way too.
#pragma once
#include <string>

namespace rh {

std::string data_dir();                          // "" if none of the places exists
std::string data_file(const std::string& rel);   // data_dir()/rel ("" + rel when there is none)

}   // namespace rh
