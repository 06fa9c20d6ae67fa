// deploy/k8s: the run spec in the ConfigMap is one that Forge accepts, and it agrees with the
// worker StatefulSet (enough workers, an even split of the global batch, the metrics port the
// pods expose and the PodMonitor scrapes).
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "common/config.h"

namespace forge {
namespace {

const std::string kK8s = std::string(FORGE_SOURCE_DIR) + "/deploy/k8s/";

YAML::Node Object(const std::string& file, const std::string& kind) {
  for (const YAML::Node& doc : YAML::LoadAllFromFile(kK8s + file))
    if (doc["kind"] && doc["kind"].as<std::string>() == kind) return doc;
  ADD_FAILURE() << "no " << kind << " in " << file;
  return YAML::Node();
}

TEST(K8sRunConfig, ParsesAndFitsTheWorkerStatefulSet) {
  const YAML::Node cm = Object("run-config.yaml", "ConfigMap");
  ASSERT_TRUE(cm["data"]["run.yaml"]) << "ConfigMap forge-run-config has no run.yaml";
  auto cfg = ParseRunConfig(cm["data"]["run.yaml"].as<std::string>(), "deploy/k8s run.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();

  const YAML::Node sts = Object("workers.yaml", "StatefulSet");
  ASSERT_TRUE(sts["spec"]["replicas"]);
  const int replicas = sts["spec"]["replicas"].as<int>();
  EXPECT_LE(cfg->train.workers, replicas) << "train.workers exceeds the worker replicas";
  EXPECT_EQ(cfg->batch.global_batch % (int64_t{cfg->batch.micro_batch} * cfg->train.workers), 0)
      << "global_batch " << cfg->batch.global_batch << " does not split into micro-batches of "
      << cfg->batch.micro_batch << " over " << cfg->train.workers << " workers";
  EXPECT_EQ(cfg->data.dataset_dir.rfind("/var/lib/forge/", 0), 0u)
      << "the dataset must be on the shared volume: " << cfg->data.dataset_dir;

  int metrics_port = 0;
  for (const YAML::Node& port : sts["spec"]["template"]["spec"]["containers"][0]["ports"])
    if (port["name"].as<std::string>() == "metrics") metrics_port = port["containerPort"].as<int>();
  EXPECT_EQ(cfg->metrics.port, metrics_port)
      << "metrics.port of the run must be the worker pods' 'metrics' container port";
  const YAML::Node annotations = sts["spec"]["template"]["metadata"]["annotations"];
  EXPECT_EQ(annotations["prometheus.io/port"].as<std::string>(), std::to_string(metrics_port));
}

}  // namespace
}  // namespace forge
