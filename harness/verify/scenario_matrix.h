// A [[matrix]] expanded into its cells: the cartesian product of its named axes (first axis
// slowest), less the [[matrix.exclude]] cells, each cell named "<matrix>/<axis>=<value>,..." and
// given the matrix's settings, its axis values (a key each value sets, or a preset per value)
// and the [[matrix.expect]] entries whose `when` matches it. An exclude or expect that matches no
// cell is an error, as is a product above kMaxMatrixCells (counted before any cell is built).
#pragma once
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "harness/verify/scenario.h"

namespace rh::scenario_file {

// Appends the matrix's cells to `out`; `base` holds what [defaults] set.
void expand_matrix(const toml::table& matrix, const Scenario& base, const std::string& file,
                   std::vector<Scenario>& out);

}   // namespace rh::scenario_file
