// Whether a dataset can feed a model, checked before the first step: its token ids must fit
// the model's vocabulary (model.vocab), and when the run names a tokenizer (data.tokenizer),
// the dataset must have been made with that very tokenizer: same identity, i.e. the same name
// and the same files (tokenizer.h). Training on ids from another tokenizer runs without any
// numerical sign of trouble, so this is the only place the mistake can be caught.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "worker/data/dataset_manifest.h"

namespace forge {

struct DatasetForRun {
  const DatasetManifest* manifest = nullptr;
  std::string dir;
};

// Every dataset of a run (the sources of a mixture) against the model and data.tokenizer
// (`tokenizer_spec`; "" skips the tokenizer check; names resolve under `data_dir`, and the
// tokenizer is loaded once). Errors name the dataset directory and the config key.
Status CheckDatasetsForRun(const std::vector<DatasetForRun>& datasets, int model_vocab,
                           const std::string& tokenizer_spec, const std::string& data_dir);
Status CheckDatasetForRun(const DatasetManifest& m, const std::string& dataset_dir,
                          int model_vocab, const std::string& tokenizer_spec,
                          const std::string& data_dir);

}  // namespace forge
