#include "cli/report_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/human_format.h"

namespace forge::cli {
namespace {

struct Series {
  std::string name, color;
  std::vector<double> x, y;
};

struct Chart {
  std::string title, y_label, caption;
  std::vector<Series> series;
};

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// Pixel coordinates: integers and one decimal are plenty for a 640 px chart.
std::string Px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A range that is never empty, so a flat series draws as a line in the middle.
void Range(double* lo, double* hi) {
  if (*hi > *lo) return;
  const double pad = std::abs(*lo) > 0 ? std::abs(*lo) * 0.05 : 1.0;
  *lo -= pad;
  *hi += pad;
}

std::string RenderChart(const Chart& c) {
  constexpr double kW = 640, kH = 260, kLeft = 70, kRight = 20, kTop = 30, kBottom = 45;
  double x0 = 0, x1 = 0, y0 = 0, y1 = 0;
  bool any = false;
  for (const Series& s : c.series)
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!any) {
        x0 = x1 = s.x[i];
        y0 = y1 = s.y[i];
        any = true;
      }
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]);
      y1 = std::max(y1, s.y[i]);
    }
  const double data_y0 = y0, data_y1 = y1, data_x0 = x0, data_x1 = x1;
  Range(&x0, &x1);
  Range(&y0, &y1);
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return kTop + (1.0 - (y - y0) / (y1 - y0)) * ph; };

  std::string o = "<figure>\n<svg class=\"chart\" width=\"640\" height=\"260\" viewBox=\"0 0 640 260\" "
                  "role=\"img\" aria-label=\"" + HtmlEscape(c.title) + "\">\n";
  o += "<text x=\"" + Px(kW / 2) + "\" y=\"18\" class=\"title\" text-anchor=\"middle\">" +
       HtmlEscape(c.title) + "</text>\n";
  // Axes.
  o += "<line class=\"axis\" x1=\"" + Px(kLeft) + "\" y1=\"" + Px(kTop + ph) + "\" x2=\"" +
       Px(kLeft + pw) + "\" y2=\"" + Px(kTop + ph) + "\"/>\n";
  o += "<line class=\"axis\" x1=\"" + Px(kLeft) + "\" y1=\"" + Px(kTop) + "\" x2=\"" + Px(kLeft) +
       "\" y2=\"" + Px(kTop + ph) + "\"/>\n";
  o += "<text x=\"" + Px(kLeft + pw / 2) + "\" y=\"" + Px(kH - 6) +
       "\" text-anchor=\"middle\" class=\"label\">step</text>\n";
  o += "<text x=\"14\" y=\"" + Px(kTop + ph / 2) + "\" text-anchor=\"middle\" class=\"label\" "
       "transform=\"rotate(-90 14 " + Px(kTop + ph / 2) + ")\">" + HtmlEscape(c.y_label) +
       "</text>\n";
  if (any) {
    // Min/max ticks of the data on both axes.
    auto ytick = [&](double v) {
      o += "<line class=\"tick\" x1=\"" + Px(kLeft - 4) + "\" y1=\"" + Px(py(v)) + "\" x2=\"" +
           Px(kLeft) + "\" y2=\"" + Px(py(v)) + "\"/><text class=\"tick\" x=\"" + Px(kLeft - 6) +
           "\" y=\"" + Px(py(v) + 4) + "\" text-anchor=\"end\">" + Num(v) + "</text>\n";
    };
    auto xtick = [&](double v) {
      o += "<line class=\"tick\" x1=\"" + Px(px(v)) + "\" y1=\"" + Px(kTop + ph) + "\" x2=\"" +
           Px(px(v)) + "\" y2=\"" + Px(kTop + ph + 4) + "\"/><text class=\"tick\" x=\"" +
           Px(px(v)) + "\" y=\"" + Px(kTop + ph + 16) + "\" text-anchor=\"middle\">" + Num(v) +
           "</text>\n";
    };
    ytick(data_y0);
    if (data_y1 != data_y0) ytick(data_y1);
    xtick(data_x0);
    if (data_x1 != data_x0) xtick(data_x1);
  } else {
    o += "<text x=\"" + Px(kLeft + pw / 2) + "\" y=\"" + Px(kTop + ph / 2) +
         "\" text-anchor=\"middle\" class=\"label\">no data recorded</text>\n";
  }
  double legend_x = kLeft + 8;
  for (const Series& s : c.series) {
    if (s.x.empty()) continue;
    o += "<polyline class=\"series\" data-series=\"" + HtmlEscape(s.name) + "\" fill=\"none\" stroke=\"" +
         s.color + "\" stroke-width=\"1.5\" points=\"";
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (i) o += ' ';
      o += Px(px(s.x[i]));
      o += ',';
      o += Px(py(s.y[i]));
    }
    o += "\"/>\n";
    if (s.x.size() == 1)  // a lone point draws no line
      o += "<circle cx=\"" + Px(px(s.x[0])) + "\" cy=\"" + Px(py(s.y[0])) + "\" r=\"3\" fill=\"" +
           s.color + "\"/>\n";
    // A swatch and the name in the series' colour (style: the page's CSS sets text fill).
    o += "<line x1=\"" + Px(legend_x) + "\" y1=\"" + Px(kTop + 8) + "\" x2=\"" +
         Px(legend_x + 14) + "\" y2=\"" + Px(kTop + 8) + "\" stroke=\"" + s.color +
         "\" stroke-width=\"3\"/><text x=\"" + Px(legend_x + 18) + "\" y=\"" + Px(kTop + 12) +
         "\" class=\"legend\" style=\"fill:" + s.color + "\">" + HtmlEscape(s.name) + "</text>\n";
    legend_x += 30 + 7.0 * double(s.name.size());
  }
  o += "</svg>\n<figcaption>" + HtmlEscape(c.caption) + "</figcaption>\n</figure>\n";
  return o;
}

const char* StateName(v1::RunState s) {
  const std::string& n = v1::RunState_Name(s);
  return n.empty() ? "UNKNOWN" : n.c_str();
}

}  // namespace

std::string HtmlEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += ch;
    }
  }
  return out;
}

std::string RenderRunReportHtml(const v1::RunHistory& h) {
  const v1::Run& run = h.run();
  Series train{"train", "#1f77b4", {}, {}}, val{"validation", "#d62728", {}, {}};
  Series tps{"tokens/s", "#2ca02c", {}, {}}, mfu{"MFU %", "#9467bd", {}, {}};
  Series alloc{"allocated", "#ff7f0e", {}, {}}, peak{"peak", "#8c564b", {}, {}};
  Series step_s{"step time", "#17becf", {}, {}};
  bool any_memory = false, any_mfu = false;
  for (const v1::StepMetrics& m : h.steps()) {
    const double x = double(m.step());
    train.x.push_back(x);
    train.y.push_back(m.loss());
    if (m.val_loss() >= 0) {
      val.x.push_back(x);
      val.y.push_back(m.val_loss());
    }
    tps.x.push_back(x);
    tps.y.push_back(m.tokens_per_second());
    mfu.x.push_back(x);
    mfu.y.push_back(100.0 * m.mfu());
    any_mfu |= m.mfu() > 0;
    alloc.x.push_back(x);
    alloc.y.push_back(double(m.gpu_allocated_bytes()) / double(1 << 30));
    peak.x.push_back(x);
    peak.y.push_back(double(m.gpu_peak_bytes()) / double(1 << 30));
    any_memory |= m.gpu_allocated_bytes() > 0 || m.gpu_peak_bytes() > 0;
    step_s.x.push_back(x);
    step_s.y.push_back(m.step_seconds());
  }
  const std::string n = std::to_string(h.steps_size());
  std::vector<Chart> charts = {
      {"Loss", "loss",
       "Training loss of every recorded step (" + n + " records)" +
           (val.x.empty() ? "; no validation was evaluated."
                          : "; validation loss where evaluated (" + std::to_string(val.x.size()) +
                                " points)."),
       {train, val}},
      {"Throughput", "tokens/s", "Training tokens per second of the whole run.", {tps}},
      {"Model FLOPs utilisation", "MFU %",
       any_mfu ? "Per GPU, against the dense BF16 peak of the device (or metrics.peak_tflops)."
               : "0 throughout: no peak is known for this device (a CPU run without "
                 "metrics.peak_tflops).",
       {mfu}},
      {"GPU memory", "GiB",
       any_memory ? "Rank 0's device memory: its own buffers (allocated) and the high-water mark "
                    "(peak)."
                  : "0 throughout: the CPU backend does not measure memory (GPU runs report "
                    "rank 0's allocated and peak device memory).",
       {alloc, peak}},
      {"Step time", "seconds", "Mean wall time of a step over each record's window.", {step_s}},
  };
  static_assert(kReportCharts == 5, "update kReportCharts with the chart list");

  std::string o;
  o += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  o += "<title>Forge run " + HtmlEscape(run.id()) + "</title>\n";
  o += "<style>\n"
       "body{font-family:sans-serif;margin:2em;color:#222;max-width:1400px}\n"
       "figure{display:inline-block;width:642px;margin:0 0.5em 1.5em 0;vertical-align:top}\n"
       "figcaption{font-size:12px;color:#555;max-width:640px}\n"
       "svg.chart{background:#fafafa;border:1px solid #ddd}\n"
       "svg .axis{stroke:#333;stroke-width:1}\n"
       "svg line.tick{stroke:#333}\n"
       "svg text{font-size:11px;fill:#333}\n"
       "svg text.title{font-size:14px;font-weight:bold}\n"
       "table{border-collapse:collapse;font-size:13px}\n"
       "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}\n"
       "</style>\n</head>\n<body>\n";
  o += "<h1>Run " + HtmlEscape(run.id()) + "</h1>\n<p>";
  o += "name <b>" + HtmlEscape(run.name()) + "</b> &middot; state <b>" + StateName(run.state()) +
       "</b>";
  if (!run.state_reason().empty()) o += " (" + HtmlEscape(run.state_reason()) + ")";
  o += " &middot; step " + std::to_string(run.step()) + " of " +
       std::to_string(run.total_steps()) + " &middot; " + std::to_string(run.workers()) +
       " worker(s) &middot; attempt " + std::to_string(run.attempt()) + ", " +
       std::to_string(run.restarts()) + " restart(s) &middot; created " +
       FormatUtcTime(run.created_unix_ms()) + "</p>\n";
  o += "<section id=\"charts\">\n";
  for (const Chart& c : charts) o += RenderChart(c);
  o += "</section>\n";

  o += "<h2>Events</h2>\n<table id=\"events\">\n<tr><th>time</th><th>state</th><th>event</th></tr>\n";
  for (const v1::RunEvent& e : h.events())
    o += "<tr><td>" + FormatUtcTime(e.time_unix_ms()) + "</td><td>" + StateName(e.state()) + "</td><td>" +
         HtmlEscape(e.message()) + "</td></tr>\n";
  o += "</table>\n";
  o += "<h2>Checkpoints</h2>\n";
  if (h.checkpoints().empty()) {
    o += "<p>none kept</p>\n";
  } else {
    o += "<table id=\"checkpoints\">\n<tr><th>step</th><th>ranks</th><th>MB</th><th>committed</th>"
         "<th>directory</th></tr>\n";
    for (const v1::Checkpoint& k : h.checkpoints())
      o += "<tr><td>" + std::to_string(k.step()) + "</td><td>" + std::to_string(k.world_size()) +
           "</td><td>" + Num(double(k.bytes()) / 1e6) + "</td><td>" +
           FormatUtcTime(k.committed_unix_ms()) + "</td><td>" + HtmlEscape(k.dir()) + "</td></tr>\n";
    o += "</table>\n";
  }
  o += "</body>\n</html>\n";
  return o;
}

}  // namespace forge::cli
