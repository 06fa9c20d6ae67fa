// `forgectl report` end to end: a short real CPU run (two ranks under mpirun) through
// forge-coordinator, its history written as HTML by forgectl, then loaded by headless Chromium
// (Debian's `chromium`; the test skips without it) and checked in the DOM the browser built:
// every chart's <svg> holds a polyline with one finite point per recorded step.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../common/svg_polylines.h"
#include "control_plane_harness.h"

namespace forge::test {
namespace {

constexpr int kCharts = 5;  // cli/report_html.h kReportCharts
constexpr int kSteps = 16;

std::string Chromium() {
  for (const char* name : {"chromium", "chromium-browser"}) {
    ShellResult r = Shell(std::string("command -v ") + name);
    if (r.exit_code == 0) {
      std::string path = r.output;
      while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
      return path;
    }
  }
  return "";
}

TEST(ReportChromium, ForgectlReportRendersEveryChartInHeadlessChromium) {
  const std::string chromium = Chromium();
  if (chromium.empty())
    GTEST_SKIP() << "chromium is not installed (setup.sh installs Debian's `chromium`): the "
                    "report cannot be rendered here";
  ControlPlane cp("report");
  cp.StartCoordinator();
  const std::string spec = cp.dir() + "/report.yaml";
  std::ofstream(spec) << "name: report\n"
                      << "seed: 5\n"
                      << "model: {n_layer: 2, d_model: 32, n_head: 4, ffn: 64, vocab: 256,"
                         " seq_len: 16}\n"
                      << "data: {dataset_dir: " << cp.dir() << "/data}\n"
                      << "schedule: {total_steps: " << kSteps << ", warmup_steps: 2}\n"
                      << "batch: {micro_batch: 4, global_batch: 8}\n"
                      << "checkpoint: {every_steps: 8, keep_last: 5}\n"
                      << "eval: {every_steps: 4, batches: 2}\n"
                      << "train: {backend: cpu, log_every: 1, workers: 2}\n";
  cp.StartWorkers(2, 10);
  const ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  ASSERT_FALSE(run.empty()) << sub.output;
  const ShellResult watch = cp.Ctl("watch " + run);
  ASSERT_EQ(watch.exit_code, 0) << watch.output << ReadFile(cp.dir() + "/workers.0.log");

  const std::string html = cp.dir() + "/run.html";
  const ShellResult rep = cp.Ctl("report " + run + " -o " + html);
  ASSERT_EQ(rep.exit_code, 0) << rep.output;
  EXPECT_TRUE(Contains(rep.output, std::to_string(kSteps) + " step records")) << rep.output;
  const std::string page = ReadFile(html);
  EXPECT_FALSE(Contains(page, "<script")) << "the page must not need scripts";
  EXPECT_FALSE(Contains(page, "http://") || Contains(page, "https://"))
      << "the page must not reference anything outside itself";
  // Unknown runs are NOT_FOUND, and write nothing.
  const ShellResult missing = cp.Ctl("report no-such-run -o " + cp.dir() + "/missing.html");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_TRUE(Contains(missing.output, "NOT_FOUND")) << missing.output;
  EXPECT_FALSE(std::filesystem::exists(cp.dir() + "/missing.html"));

  // The DOM after Chromium parsed and laid out the page (offline: a fresh profile, no network
  // services).
  const ShellResult dom = Shell(
      "timeout 90 " + chromium +
      " --headless --no-sandbox --disable-gpu --disable-background-networking"
      " --disable-component-update --disable-sync --no-first-run --user-data-dir=" +
      cp.dir() + "/chromium-profile --dump-dom file://" + html + " 2>" + cp.dir() +
      "/chromium.log");
  ASSERT_EQ(dom.exit_code, 0) << ReadFile(cp.dir() + "/chromium.log");
  const std::vector<std::string> svgs = Blocks(dom.output, "<svg", "</svg>");
  ASSERT_EQ(int(svgs.size()), kCharts) << dom.output.substr(0, 2000);
  for (int i = 0; i < kCharts; ++i) {
    const std::vector<int> lines = PolylinePoints(svgs[i]);
    ASSERT_FALSE(lines.empty()) << "chart " << i << " has no polyline:\n" << svgs[i];
    // The first series of every chart has a point per recorded step (log_every 1).
    EXPECT_EQ(lines[0], kSteps) << "chart " << i << ":\n" << svgs[i].substr(0, 600);
    for (int n : lines) EXPECT_GT(n, 0) << "chart " << i;
  }
  // Loss: train and validation (evaluated every 4 steps).
  const std::vector<int> loss = PolylinePoints(svgs[0]);
  ASSERT_EQ(loss.size(), 2u) << svgs[0];
  EXPECT_EQ(loss[1], kSteps / 4);
  EXPECT_TRUE(Contains(dom.output, "Run " + run)) << "title text";
  EXPECT_TRUE(Contains(dom.output, "CPU backend does not measure memory"));
}

}  // namespace
}  // namespace forge::test
