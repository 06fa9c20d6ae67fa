#include "common/closest_match.h"

#include <algorithm>

namespace forge {

size_t EditDistance(std::string_view a, std::string_view b) {
  // Three rows of the dynamic-programming table: i-2, i-1 and i.
  std::vector<size_t> two(b.size() + 1), one(b.size() + 1), row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) one[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      row[j] = std::min({one[j] + 1, row[j - 1] + 1, one[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        row[j] = std::min(row[j], two[j - 2] + 1);  // two neighbours swapped
    }
    std::swap(two, one);
    std::swap(one, row);
  }
  return one[b.size()];
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
