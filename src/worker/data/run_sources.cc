#include "worker/data/run_sources.h"

#include "worker/data/corpus.h"

namespace forge {

std::string DatasetDir(const RunConfig& cfg) {
  return cfg.data.dataset_dir.empty() ? DefaultDataDir() + "/dataset" : cfg.data.dataset_dir;
}

std::vector<DataSourceConfig> DataSources(const RunConfig& cfg) {
  if (!cfg.data.sources.empty()) return cfg.data.sources;
  return {{DatasetDir(cfg), 1.0}};
}

}  // namespace forge
