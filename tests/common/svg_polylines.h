// Reading the charts of a `forgectl report` page back (cli/report_html.h), for the renderer's
// unit test and the headless-Chromium test: the text blocks between markers, and the point
// counts of the polylines in an <svg>.
#pragma once

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace forge::test {

// Every substring of `html` from an occurrence of `open` up to the next `close` (or the end).
inline std::vector<std::string> Blocks(const std::string& html, const std::string& open,
                                       const std::string& close) {
  std::vector<std::string> out;
  for (size_t at = html.find(open); at != std::string::npos; at = html.find(open, at + 1)) {
    const size_t end = html.find(close, at);
    out.push_back(html.substr(at, end == std::string::npos ? std::string::npos : end - at));
  }
  return out;
}

// The points of each polyline in `svg`, in order; a polyline without a points attribute, or
// with a point that is not two finite numbers, counts as -1.
inline std::vector<int> PolylinePoints(const std::string& svg) {
  std::vector<int> counts;
  for (const std::string& p : Blocks(svg, "<polyline", ">")) {
    const size_t at = p.find("points=\"");
    if (at == std::string::npos) {
      counts.push_back(-1);
      continue;
    }
    std::istringstream in(p.substr(at + 8, p.find('"', at + 8) - at - 8));
    std::string pt;
    int n = 0;
    while (in >> pt) {
      double x = NAN, y = NAN;
      if (std::sscanf(pt.c_str(), "%lf,%lf", &x, &y) != 2 || !std::isfinite(x) ||
          !std::isfinite(y)) {
        n = -1;
        break;
      }
      ++n;
    }
    counts.push_back(n);
  }
  return counts;
}

}  // namespace forge::test
