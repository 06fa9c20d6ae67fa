// Dataset vs run checks at start-up (see dataset_check.h).
#include "worker/data/dataset_check.h"

#include <memory>

#include "tokenizer/tokenizer.h"

namespace forge {

Status CheckDatasetsForRun(const std::vector<DatasetForRun>& datasets, int model_vocab,
                           const std::string& tokenizer_spec, const std::string& data_dir) {
  for (const DatasetForRun& d : datasets) {
    const DatasetManifest& m = *d.manifest;
    if (m.vocab_size > model_vocab) {
      return Status::Invalid("model.vocab (" + std::to_string(model_vocab) +
                             ") is smaller than the vocabulary of dataset " + d.dir + " (" +
                             std::to_string(m.vocab_size) + ", tokenizer " + m.tokenizer + ")");
    }
  }
  if (tokenizer_spec.empty()) return Status::Ok();
  auto tok = LoadTokenizer(tokenizer_spec, data_dir);
  if (!tok.ok()) return tok.status().Annotate("data.tokenizer '" + tokenizer_spec + "'");
  const Tokenizer& t = **tok;
  if (t.vocab_size() > model_vocab) {
    return Status::Invalid("model.vocab (" + std::to_string(model_vocab) +
                           ") is smaller than the vocabulary of data.tokenizer '" +
                           tokenizer_spec + "' (" + std::to_string(t.vocab_size()) + ")");
  }
  for (const DatasetForRun& d : datasets) {
    const DatasetManifest& m = *d.manifest;
    // Datasets written before identities were recorded were all GPT-2.
    const bool same = m.tokenizer_identity.empty()
                          ? (m.tokenizer == "gpt2" && t.name() == "gpt2" &&
                             t.vocab_size() == m.vocab_size)
                          : m.tokenizer_identity == t.identity();
    if (!same) {
      return Status::Invalid(
          "dataset " + d.dir + " was tokenized with " + m.tokenizer + " (" +
          (m.tokenizer_identity.empty() ? "vocab " + std::to_string(m.vocab_size)
                                        : m.tokenizer_identity) +
          "), but data.tokenizer '" + tokenizer_spec + "' is " + t.identity() +
          ": prepare the dataset with --tokenizer " + tokenizer_spec +
          " or set data.tokenizer to the dataset's tokenizer");
    }
  }
  return Status::Ok();
}

Status CheckDatasetForRun(const DatasetManifest& m, const std::string& dataset_dir,
                          int model_vocab, const std::string& tokenizer_spec,
                          const std::string& data_dir) {
  return CheckDatasetsForRun({{&m, dataset_dir}}, model_vocab, tokenizer_spec, data_dir);
}

}  // namespace forge
