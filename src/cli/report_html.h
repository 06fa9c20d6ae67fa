// `forgectl report`: one run's recorded history (GetRunHistory) as a self-contained HTML page.
// Charts are inline SVG polylines over the step axis (loss train + validation, throughput,
// MFU, GPU memory, step time), each with axes, labels and min/max ticks; then the run's
// events and checkpoints. No scripts, fonts, stylesheets or any other external reference:
// the file opens anywhere, offline. Every text from the run (names, messages, paths) is
// HTML-escaped.
#pragma once

#include <string>
#include <string_view>

#include "forge/v1/runs.pb.h"

namespace forge::cli {

// The page's charts, in order (tests count them): each is one <svg class="chart"> with one
// <polyline> per series that has points.
inline constexpr int kReportCharts = 5;

std::string RenderRunReportHtml(const v1::RunHistory& history);

// & < > " ' as entities.
std::string HtmlEscape(std::string_view s);

}  // namespace forge::cli
