// `forge plan` through the `forge` binary on a shipped config: the JSON gives every mode's peak
// memory per GPU by part, the parts adding up to the peak, and the table form prints the same
// parts a row per mode beside the modes' speeds.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "mpi_launch.h"

namespace forge {
namespace {

// What `forge plan ARGS` prints (it exits 0 and writes nothing to standard error on success).
std::string Plan(const std::string& args) {
  const test::ShellResult r = test::Shell("timeout 60 " + test::Bin("forge") + " plan " + args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

const std::string kConfig = std::string(FORGE_SOURCE_DIR) + "/configs/llama3-8b.yaml";

TEST(PlanCommand, JsonGivesEachModesPeakMemoryByPart) {
  const auto j = nlohmann::json::parse(Plan(kConfig + " --gpus 4 --json"));
  ASSERT_EQ(j["modes"].size(), 5u);
  for (const auto& m : j["modes"]) {
    SCOPED_TRACE(m["mode"].get<std::string>());
    const auto& parts = m["peak_mem_parts_gib"];
    double sum = 0;
    for (const char* k :
         {"weights", "gradients", "moments", "activations", "workspace", "overhead"}) {
      ASSERT_TRUE(parts.contains(k)) << k;
      EXPECT_GE(parts[k].get<double>(), 0.0) << k;
      sum += parts[k].get<double>();
    }
    EXPECT_NEAR(sum, m["peak_mem_gib"].get<double>(), 1e-9);
  }
  // fsdp shards what ddp holds whole: weights, gradients and moments each smaller.
  const auto& ddp = j["modes"][0]["peak_mem_parts_gib"];
  const auto& fsdp = j["modes"][3]["peak_mem_parts_gib"];
  ASSERT_EQ(j["modes"][3]["mode"], "fsdp");
  for (const char* k : {"weights", "gradients", "moments"})
    EXPECT_LT(fsdp[k].get<double>(), ddp[k].get<double>()) << k;
}

TEST(PlanCommand, TablePrintsThePartsOfEveryMode) {
  const std::string text = Plan(kConfig + " --gpus 4");
  const size_t at = text.find("peak GiB per GPU by part");
  ASSERT_NE(at, std::string::npos) << text;
  const auto j = nlohmann::json::parse(Plan(kConfig + " --gpus 4 --json"));
  for (const auto& m : j["modes"]) {
    const auto& p = m["peak_mem_parts_gib"];
    char row[160];
    std::snprintf(row, sizeof row, "%-6s %9.1f %9.1f %9.1f %11.1f %9.1f %6.2f %9.1f",
                  m["mode"].get<std::string>().c_str(), p["weights"].get<double>(),
                  p["gradients"].get<double>(), p["moments"].get<double>(),
                  p["activations"].get<double>(), p["workspace"].get<double>(),
                  p["overhead"].get<double>(), m["peak_mem_gib"].get<double>());
    EXPECT_NE(text.find(row, at), std::string::npos) << row << "\n" << text;
  }
}

}  // namespace
}  // namespace forge
