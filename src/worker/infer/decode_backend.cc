#include "worker/infer/decode_backend.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "worker/train/backend.h"  // CudaDeviceAvailable

namespace forge {

Status DecodeBackend::AppendGreedy(std::span<const int> seqs,
                                   std::span<const std::vector<int32_t>> tokens,
                                   std::vector<int32_t>* next) {
  std::vector<float> logits;
  FORGE_RETURN_IF_ERROR(Append(seqs, tokens, false, &logits));
  const int vocab = model().vocab, padded = model().padded_vocab();
  next->resize(seqs.size());
  for (size_t k = 0; k < seqs.size(); ++k) {
    const float* row = logits.data() + k * size_t(padded);
    (*next)[k] = int32_t(std::max_element(row, row + vocab) - row);
  }
  return Status::Ok();
}

Status CheckReset(int batch, int max_len) {
  if (batch < 1 || max_len < 1)
    return Status::Invalid("decode: batch and max_len must be >= 1, got " + std::to_string(batch) +
                           ", " + std::to_string(max_len));
  return Status::Ok();
}

StatusOr<AppendRows> PlanAppend(std::span<const int> seqs,
                                std::span<const std::vector<int32_t>> tokens,
                                std::span<const int> lengths, int max_len, int padded_vocab,
                                int vocab) {
  if (lengths.empty()) return Status::Precondition("decode: Append before Reset");
  if (seqs.size() != tokens.size())
    return Status::Invalid("decode: " + std::to_string(seqs.size()) + " sequences, " +
                           std::to_string(tokens.size()) + " token lists");
  const int batch = int(lengths.size());
  AppendRows rows;
  std::vector<bool> seen(size_t(batch), false);
  for (size_t k = 0; k < seqs.size(); ++k) {
    const int s = seqs[k];
    if (s < 0 || s >= batch || seen[size_t(s)])
      return Status::Invalid("decode: sequence " + std::to_string(s) +
                             " out of range or given twice");
    seen[size_t(s)] = true;
    if (tokens[k].empty())
      return Status::Invalid("decode: nothing to append to sequence " + std::to_string(s));
    if (lengths[size_t(s)] + int64_t(tokens[k].size()) > max_len)
      return Status::Invalid("decode: sequence " + std::to_string(s) + " would hold " +
                             std::to_string(lengths[size_t(s)] + tokens[k].size()) +
                             " tokens, more than the " + std::to_string(max_len) + " reserved");
    for (size_t i = 0; i < tokens[k].size(); ++i) {
      const int32_t t = tokens[k][i];
      if (t < 0 || t >= padded_vocab)
        return Status::Invalid("decode: token id " + std::to_string(t) +
                               " outside the vocabulary of " + std::to_string(vocab));
      rows.ids.push_back(t);
      rows.pos.push_back(lengths[size_t(s)] + int32_t(i));
      rows.row_seq.push_back(s);
    }
    rows.last.push_back(int32_t(rows.ids.size()) - 1);
  }
  return rows;
}

Status CheckTargets(std::span<const std::vector<int32_t>> tokens,
                    std::span<const std::vector<int32_t>> targets, int padded_vocab) {
  if (targets.size() != tokens.size())
    return Status::Invalid("decode: " + std::to_string(targets.size()) + " target lists for " +
                           std::to_string(tokens.size()) + " sequences");
  for (size_t k = 0; k < tokens.size(); ++k) {
    if (targets[k].size() != tokens[k].size())
      return Status::Invalid("decode: sequence " + std::to_string(k) + " has " +
                             std::to_string(tokens[k].size()) + " tokens but " +
                             std::to_string(targets[k].size()) + " targets");
    for (int32_t t : targets[k])
      if (t < 0 || t >= padded_vocab)
        return Status::Invalid("decode: target id " + std::to_string(t) +
                               " outside the padded vocabulary of " +
                               std::to_string(padded_vocab));
  }
  return Status::Ok();
}

Status DecodeBackend::AppendLosses(std::span<const int> seqs,
                                   std::span<const std::vector<int32_t>> tokens,
                                   std::span<const std::vector<int32_t>> targets,
                                   std::vector<float>* losses) {
  const int padded = model().padded_vocab();
  FORGE_RETURN_IF_ERROR(CheckTargets(tokens, targets, padded));
  std::vector<float> logits;
  FORGE_RETURN_IF_ERROR(Append(seqs, tokens, true, &logits));
  losses->clear();
  size_t row = 0;
  for (size_t k = 0; k < tokens.size(); ++k)
    for (size_t i = 0; i < tokens[k].size(); ++i, ++row) {
      const float* r = logits.data() + row * size_t(padded);
      const double mx = *std::max_element(r, r + padded);
      double sum = 0.0;
      for (int v = 0; v < padded; ++v) sum += std::exp(double(r[v]) - mx);
      losses->push_back(float(mx + std::log(sum) - double(r[targets[k][i]])));
    }
  return Status::Ok();
}

StatusOr<std::unique_ptr<DecodeBackend>> MakeDecodeBackend(Backend kind, const ModelConfig& m,
                                                           UnitBuffers params) {
  if (kind == Backend::kCuda || (kind == Backend::kAuto && CudaDeviceAvailable()))
    return MakeCudaDecodeBackend(m, params);
  return MakeCpuDecodeBackend(m, std::move(params));
}

}  // namespace forge
