// `forge data inspect DIR`: what a prepared dataset holds (the manifest's summary and its
// largest source files), a few sampled documents decoded back to text with the dataset's
// tokenizer, and with --verify a full check of every shard (header, size, payload checksum,
// every id inside the vocabulary, one end-of-text token per document).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"

namespace forge {

struct InspectOptions {
  int samples = 3;          // documents decoded from the train split (and 1 from val)
  int sample_tokens = 200;  // at most this many tokens of each
  uint64_t seed = 1;        // which documents
  bool verify = false;
  int threads = 0;          // for --verify; 0 = all hardware threads
  std::string data_dir;     // where tokenizer names resolve
};

// Prints the report line by line through `out`. A failed verification is DataLoss naming
// every bad shard (after the report).
Status InspectDataset(const std::string& dir, const InspectOptions& options,
                      const std::function<void(const std::string&)>& out);

}  // namespace forge
