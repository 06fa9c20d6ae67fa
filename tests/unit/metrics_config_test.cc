// The `metrics:` section of the run config (port, bind_address, peak_tflops): defaults, strict
// keys with their line, ranges, port `any`, and the YAML round trip.
#include <gtest/gtest.h>

#include <string>

#include "common/config.h"

namespace forge {
namespace {

const char* kModel = "model:\n  preset: tiny\n";

TEST(MetricsConfig, OffByDefault) {
  auto c = ParseRunConfig(kModel, "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->metrics.port, 0);
  EXPECT_EQ(c->metrics.bind_address, "0.0.0.0");
  EXPECT_EQ(c->metrics.peak_tflops, 0.0);
}

TEST(MetricsConfig, EveryKeyIsRead) {
  auto c = ParseRunConfig(std::string(kModel) +
                              "metrics:\n  port: 9401\n  bind_address: 127.0.0.1\n"
                              "  peak_tflops: 123.5\n",
                          "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->metrics.port, 9401);
  EXPECT_EQ(c->metrics.bind_address, "127.0.0.1");
  EXPECT_EQ(c->metrics.peak_tflops, 123.5);
}

TEST(MetricsConfig, UnknownKeyIsAnErrorAtItsLine) {
  auto c = ParseRunConfig(std::string(kModel) + "metrics:\n  port: 9401\n  prot: 1\n", "t.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find("t.yaml:5: metrics.prot: unknown key"), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("port, bind_address, peak_tflops"), std::string::npos);
}

TEST(MetricsConfig, RangesAreChecked) {
  auto bad_port = ParseRunConfig(std::string(kModel) + "metrics:\n  port: 70000\n", "t.yaml");
  ASSERT_FALSE(bad_port.ok());
  EXPECT_NE(bad_port.status().message().find(
                "t.yaml:4: metrics.port: must be a port in [0, 65535] or any, got 70000"),
            std::string::npos)
      << bad_port.status().message();
  auto negative = ParseRunConfig(std::string(kModel) + "metrics:\n  port: -1\n", "t.yaml");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("metrics.port: must be a port in [0, 65535] or any"),
            std::string::npos)
      << negative.status().message();
  auto bad_peak = ParseRunConfig(std::string(kModel) + "metrics:\n  peak_tflops: -1\n", "t.yaml");
  ASSERT_FALSE(bad_peak.ok());
  EXPECT_NE(bad_peak.status().message().find("metrics.peak_tflops: must be >= 0"),
            std::string::npos);
  auto empty_bind = ParseRunConfig(std::string(kModel) + "metrics:\n  bind_address: \"\"\n", "t.yaml");
  ASSERT_FALSE(empty_bind.ok());
  EXPECT_NE(empty_bind.status().message().find("metrics.bind_address"), std::string::npos);
}

// `any`: every rank binds a free port of its own (-1 in the struct), and prints back as `any`.
TEST(MetricsConfig, AnyPortReadsAndRoundTrips) {
  auto c = ParseRunConfig(std::string(kModel) + "metrics:\n  port: any\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->metrics.port, -1);
  const std::string yaml = RunConfigToYaml(*c);
  EXPECT_NE(yaml.find("  port: any\n"), std::string::npos) << yaml;
  auto back = ParseRunConfig(yaml, "rt.yaml");
  ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << yaml;
  EXPECT_EQ(back->metrics.port, -1);
  auto quoted = ParseRunConfig(std::string(kModel) + "metrics:\n  port: \"any\"\n", "t.yaml");
  ASSERT_TRUE(quoted.ok()) << quoted.status().ToString();
  EXPECT_EQ(quoted->metrics.port, -1);
}

TEST(MetricsConfig, YamlRoundTrip) {
  auto c = ParseRunConfig(kModel, "t.yaml");
  ASSERT_TRUE(c.ok());
  c->metrics.port = 9500;
  c->metrics.bind_address = "::1";
  c->metrics.peak_tflops = 1.0 / 3.0;
  const std::string yaml = RunConfigToYaml(*c);
  auto back = ParseRunConfig(yaml, "rt.yaml");
  ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << yaml;
  EXPECT_EQ(back->metrics.port, 9500);
  EXPECT_EQ(back->metrics.bind_address, "::1");
  EXPECT_EQ(back->metrics.peak_tflops, 1.0 / 3.0);
}

}  // namespace
}  // namespace forge
