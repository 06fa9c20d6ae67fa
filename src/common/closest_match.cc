#include "common/closest_match.h"

#include <algorithm>

namespace forge {

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string_view ClosestMatch(std::string_view word, const std::vector<std::string_view>& candidates) {
  std::string_view best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (std::string_view c : candidates) {
    const size_t d = EditDistance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

}  // namespace forge
