// `forgectl report`'s renderer (cli/report_html.h): one inline <svg> per chart, a polyline per
// series with one point per record, nothing external, run text escaped.
#include "cli/report_html.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "../common/svg_polylines.h"

namespace forge::cli {
namespace {

using test::Blocks;
using test::PolylinePoints;

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

v1::RunHistory History(int steps) {
  v1::RunHistory h;
  h.mutable_run()->set_id("tiny-<b>&\"x\"");
  h.mutable_run()->set_name("<script>alert(1)</script>");
  h.mutable_run()->set_state(v1::COMPLETED);
  h.mutable_run()->set_step(steps);
  h.mutable_run()->set_total_steps(steps);
  for (int i = 1; i <= steps; ++i) {
    v1::StepMetrics* m = h.add_steps();
    m->set_step(i * 2);
    m->set_loss(5.0f / float(i));
    m->set_val_loss(i % 3 == 0 ? 4.0f / float(i) : -1.0f);
    m->set_tokens_per_second(1000.0 + i);
    m->set_step_seconds(0.1);  // flat: still a line
  }
  v1::RunEvent* e = h.add_events();
  e->set_state(v1::RUNNING);
  e->set_message("placed on <worker> & co");
  v1::Checkpoint* k = h.add_checkpoints();
  k->set_step(4);
  k->set_dir("/runs/x/step_4");
  return h;
}

TEST(ReportHtml, OneSvgPerChartWithAPolylineOfEveryRecord) {
  const std::string html = RenderRunReportHtml(History(7));
  const std::vector<std::string> svgs = Blocks(html, "<svg", "</svg>");
  ASSERT_EQ(int(svgs.size()), kReportCharts);
  // Loss: train (7) and validation (steps 3 and 6: 2); throughput; MFU; memory: allocated and
  // peak; step time.
  EXPECT_EQ(PolylinePoints(svgs[0]), (std::vector<int>{7, 2}));
  EXPECT_EQ(PolylinePoints(svgs[1]), (std::vector<int>{7}));
  EXPECT_EQ(PolylinePoints(svgs[2]), (std::vector<int>{7}));
  EXPECT_EQ(PolylinePoints(svgs[3]), (std::vector<int>{7, 7}));
  EXPECT_EQ(PolylinePoints(svgs[4]), (std::vector<int>{7}));
  // Axes, the step label and min/max ticks (steps 2 and 14; loss 5 down to validation 0.6667).
  EXPECT_NE(svgs[0].find("class=\"axis\""), std::string::npos);
  EXPECT_NE(svgs[0].find(">step</text>"), std::string::npos);
  EXPECT_NE(svgs[0].find(">14</text>"), std::string::npos);
  EXPECT_NE(svgs[0].find(">5</text>"), std::string::npos);
  EXPECT_NE(svgs[0].find(">0.6667</text>"), std::string::npos);
  EXPECT_NE(svgs[0].find(">2</text>"), std::string::npos);
  // CPU run: memory and MFU are 0 and the captions say why.
  EXPECT_NE(html.find("CPU backend does not measure memory"), std::string::npos);
  EXPECT_NE(html.find("no peak is known"), std::string::npos);
}

TEST(ReportHtml, SelfContainedAndEscaped) {
  const std::string html = RenderRunReportHtml(History(5));
  const std::string lower = Lower(html);
  EXPECT_EQ(lower.find("<script"), std::string::npos);
  EXPECT_EQ(lower.find("http://"), std::string::npos);
  EXPECT_EQ(lower.find("https://"), std::string::npos);
  EXPECT_EQ(lower.find("<link"), std::string::npos);
  EXPECT_EQ(lower.find("src="), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(html.find("tiny-&lt;b&gt;&amp;&quot;x&quot;"), std::string::npos);
  EXPECT_NE(html.find("placed on &lt;worker&gt; &amp; co"), std::string::npos);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("</html>"), std::string::npos);
}

TEST(ReportHtml, NoRecordsStillDrawsEveryChartFrame) {
  const std::string html = RenderRunReportHtml(History(0));
  EXPECT_EQ(int(Blocks(html, "<svg", "</svg>").size()), kReportCharts);
  EXPECT_EQ(html.find("<polyline"), std::string::npos);
  EXPECT_NE(html.find("no data recorded"), std::string::npos);
  EXPECT_NE(html.find("no validation was evaluated"), std::string::npos);
}

TEST(ReportHtml, OneRecordDrawsAPointMarker) {
  const std::string html = RenderRunReportHtml(History(1));
  const std::vector<std::string> svgs = Blocks(html, "<svg", "</svg>");
  ASSERT_EQ(int(svgs.size()), kReportCharts);
  EXPECT_EQ(PolylinePoints(svgs[1]), (std::vector<int>{1}));
  EXPECT_NE(svgs[1].find("<circle"), std::string::npos);
}

}  // namespace
}  // namespace forge::cli
