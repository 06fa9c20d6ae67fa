// "Did you mean ...?": the known name closest to a mistyped one, for config keys and
// command-line flags alike.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace forge {

// Edit distance: insertions, deletions, substitutions and swaps of two neighbouring
// characters (the commonest typo: --stpes), each one edit.
size_t EditDistance(std::string_view a, std::string_view b);

// The candidate closest to `word`, or "" when none is near: a distance of at most a third of
// the word's length (at least 2).
std::string_view ClosestMatch(std::string_view word, const std::vector<std::string_view>& candidates);

}  // namespace forge
