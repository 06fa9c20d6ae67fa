// deploy/prometheus/ checked by Prometheus's own tool: the scrape configs load, the alert rules
// parse, and their promtool unit tests (deploy/prometheus/tests/alerts_test.yml) pass. Skipped
// with a message where promtool is not installed (Debian package `prometheus`).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "../common/run_command.h"

namespace forge {
namespace {

using test::CommandResult;
namespace fs = std::filesystem;
const std::string kDeploy = std::string(FORGE_SOURCE_DIR) + "/deploy/prometheus";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class Promtool : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::RunCommand("command -v promtool").exit_code != 0)
      GTEST_SKIP() << "promtool not found: install the Debian package prometheus "
                      "(--no-install-recommends) to check deploy/prometheus/";
    dir_ = ::testing::TempDir() + "/promtool_test_" + std::to_string(::getpid());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string dir_;
};

TEST_F(Promtool, StaticScrapeConfigIsValid) {
  const CommandResult r = test::RunCommand("promtool check config " + kDeploy + "/prometheus.yml");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("SUCCESS: 1 rule files found"), std::string::npos) << r.out;
}

TEST_F(Promtool, KubernetesScrapeConfigIsValid) {
  // Debian's Prometheus is built without Kubernetes discovery; there the job's relabelling is
  // checked with file discovery in its place (the rest of the file unchanged).
  fs::copy_file(kDeploy + "/alerts.yml", dir_ + "/alerts.yml");
  std::string cfg = ReadFile(kDeploy + "/prometheus-k8s.yml");
  std::ofstream(dir_ + "/k8s.yml") << cfg;
  CommandResult r = test::RunCommand("promtool check config " + dir_ + "/k8s.yml");
  if (r.exit_code != 0 && r.out.find("field kubernetes_sd_configs not found") != std::string::npos) {
    const std::string from = "    kubernetes_sd_configs:\n      - role: pod\n";
    const size_t at = cfg.find(from);
    ASSERT_NE(at, std::string::npos) << "expected the pod discovery block";
    cfg.replace(at, from.size(), "    file_sd_configs:\n      - files: [targets.json]\n");
    std::ofstream(dir_ + "/k8s.yml") << cfg;
    std::printf("promtool lacks Kubernetes discovery: checking forge-pods with file_sd in its place\n");
    r = test::RunCommand("promtool check config " + dir_ + "/k8s.yml");
  }
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

TEST_F(Promtool, AlertRulesParseAndTheirUnitTestsPass) {
  CommandResult r = test::RunCommand("promtool check rules " + kDeploy + "/alerts.yml");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  // promtool must find every rule the file declares.
  const std::string rules = ReadFile(kDeploy + "/alerts.yml");
  int declared = 0;
  for (size_t at = rules.find("- alert:"); at != std::string::npos;
       at = rules.find("- alert:", at + 1)) {
    ++declared;
  }
  ASSERT_GE(declared, 8);
  EXPECT_NE(r.out.find("SUCCESS: " + std::to_string(declared) + " rules found"), std::string::npos)
      << r.out;
  r = test::RunCommand("promtool test rules " + kDeploy + "/tests/alerts_test.yml");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("SUCCESS"), std::string::npos) << r.out;
  std::printf("%s", r.out.c_str());
}

TEST_F(Promtool, ABrokenRuleIsCaught) {
  std::string rules = ReadFile(kDeploy + "/alerts.yml");
  const size_t at = rules.find("increase(forge_skipped_steps_total[15m])");
  ASSERT_NE(at, std::string::npos);
  rules.replace(at, 8, "increase(");  // unbalanced parenthesis
  std::ofstream(dir_ + "/broken.yml") << rules;
  const CommandResult r = test::RunCommand("promtool check rules " + dir_ + "/broken.yml");
  EXPECT_NE(r.exit_code, 0) << r.out;
}

}  // namespace
}  // namespace forge
