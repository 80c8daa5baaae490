// "Did you mean ...?" for a mistyped subcommand, flag or scenario name: the closest candidate by
// edit distance (insertions, deletions, substitutions, each 1), when it is close enough to be a
// typo (at most a third of the longer word, and at most 3). LibTorch-free.
#pragma once
#include <string>
#include <vector>

namespace rh {

size_t edit_distance(const std::string& a, const std::string& b);

// The closest candidate, or "" when none is close enough. Ties: the first in the list.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

// " (did you mean 'x'?)" or "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}   // namespace rh
