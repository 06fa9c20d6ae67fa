// Where a run's training data lives, from its config: data.dataset_dir or data.sources, with
// the defaults `forge data prepare` writes to. The trainer, evaluation and export all read
// their datasets through here.
#pragma once

#include <string>
#include <vector>

#include "common/config.h"

namespace forge {

// cfg.data.dataset_dir, or $FORGE_DATA_DIR/dataset (the output of `forge data prepare`).
std::string DatasetDir(const RunConfig& cfg);
// The run's data sources, dirs resolved: data.sources, or DatasetDir with weight 1.
std::vector<DataSourceConfig> DataSources(const RunConfig& cfg);

}  // namespace forge
