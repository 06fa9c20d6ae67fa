// Sampling plan: per-epoch orders and batch filling (layout documented in sampler.h).
#include "worker/data/sampler.h"

#include <string>

namespace forge {
namespace {

Status CheckSlice(int rank, int world, int micro_batch, int micro_step) {
  if (world < 1 || rank < 0 || rank >= world || micro_batch < 1 || micro_step < 0) {
    return Status::Invalid("batch slice: rank " + std::to_string(rank) + " of world " +
                           std::to_string(world) + ", micro_batch " +
                           std::to_string(micro_batch) + ", micro_step " +
                           std::to_string(micro_step) + " is not a valid slice");
  }
  return Status::Ok();
}

Status FillSequence(const TokenStream& ts, int64_t seq, int64_t seq_len, int32_t* scratch,
                    int32_t* inputs, int32_t* targets) {
  FORGE_RETURN_IF_ERROR(ts.Read(seq * seq_len, seq_len + 1, scratch));
  for (int64_t t = 0; t < seq_len; ++t) {
    inputs[t] = scratch[t];
    targets[t] = scratch[t + 1];
  }
  return Status::Ok();
}

}  // namespace

Status ReadSequence(const TokenStream& ts, int64_t seq, int64_t seq_len, int32_t* inputs,
                    int32_t* targets) {
  std::vector<int32_t> scratch(static_cast<size_t>(seq_len + 1));
  return FillSequence(ts, seq, seq_len, scratch.data(), inputs, targets);
}

int64_t NumSequences(int64_t num_tokens, int64_t seq_len) {
  if (seq_len <= 0 || num_tokens < 1) return 0;
  return (num_tokens - 1) / seq_len;
}

SamplingPlan::SamplingPlan(int64_t num_tokens, int64_t seq_len, uint64_t seed, bool shuffle,
                           int64_t stream)
    : seq_len_(seq_len),
      num_sequences_(NumSequences(num_tokens, seq_len)),
      seed_(StreamSeed(seed, stream)),
      shuffle_(shuffle),
      cache_(std::make_shared<Cache>()) {}

std::shared_ptr<const std::vector<uint32_t>> SamplingPlan::Permutation(int64_t epoch) const {
  Cache& c = *cache_;
  std::lock_guard<std::mutex> lock(c.mu);
  for (int k = 0; k < 2; ++k) {
    if (c.epoch[k] == epoch) return c.perm[k];
  }
  // Keep two epochs: a global batch may straddle an epoch boundary. Replace the older.
  const int slot = c.epoch[0] < c.epoch[1] ? 0 : 1;
  c.epoch[slot] = epoch;
  c.perm[slot] = std::make_shared<const std::vector<uint32_t>>(
      EpochPermutation(num_sequences_, seed_, epoch));
  return c.perm[slot];
}

int64_t SamplingPlan::SequenceAt(int64_t cursor) const {
  const int64_t epoch = cursor / num_sequences_;
  const int64_t pos = cursor % num_sequences_;
  if (!shuffle_) return pos;
  if (num_sequences_ > kShuffleTableMaxSequences)
    return FeistelPermutation(num_sequences_, seed_, epoch)(pos);
  return (*Permutation(epoch))[static_cast<size_t>(pos)];
}

int64_t SliceStart(int64_t cursor, int rank, int world, int micro_batch, int micro_step) {
  return cursor + static_cast<int64_t>(micro_step) * world * micro_batch +
         static_cast<int64_t>(rank) * micro_batch;
}

Status FillTrainBatch(const TokenStream& train, const SamplingPlan& plan, int64_t cursor,
                      int rank, int world, int micro_batch, int micro_step, int32_t* inputs,
                      int32_t* targets) {
  FORGE_RETURN_IF_ERROR(CheckSlice(rank, world, micro_batch, micro_step));
  if (cursor < 0) return Status::Invalid("negative data cursor " + std::to_string(cursor));
  if (plan.num_sequences() <= 0) {
    return Status::Precondition("train split of " + std::to_string(train.size()) +
                                " tokens holds no sequence of " +
                                std::to_string(plan.seq_len() + 1) + " tokens");
  }
  if (NumSequences(train.size(), plan.seq_len()) != plan.num_sequences()) {
    return Status::Precondition("sampling plan was built for another train split size");
  }
  const int64_t T = plan.seq_len();
  std::vector<int32_t> scratch(static_cast<size_t>(T + 1));
  const int64_t first = SliceStart(cursor, rank, world, micro_batch, micro_step);
  for (int j = 0; j < micro_batch; ++j) {
    const int64_t seq = plan.SequenceAt(first + j);
    FORGE_RETURN_IF_ERROR(
        FillSequence(train, seq, T, scratch.data(), inputs + j * T, targets + j * T));
  }
  return Status::Ok();
}

Status FillEvalBatch(const TokenStream& val, int64_t seq_len, int64_t batch_index,
                     int micro_batch, int32_t* inputs, int32_t* targets) {
  if (micro_batch < 1 || batch_index < 0 || seq_len < 1) {
    return Status::Invalid("eval batch: bad batch_index/micro_batch/seq_len");
  }
  const int64_t S = NumSequences(val.size(), seq_len);
  if (S <= 0) {
    return Status::Precondition("val split of " + std::to_string(val.size()) +
                                " tokens holds no sequence of " + std::to_string(seq_len + 1) +
                                " tokens");
  }
  std::vector<int32_t> scratch(static_cast<size_t>(seq_len + 1));
  for (int j = 0; j < micro_batch; ++j) {
    const int64_t seq = (batch_index * micro_batch + j) % S;
    FORGE_RETURN_IF_ERROR(FillSequence(val, seq, seq_len, scratch.data(), inputs + j * seq_len,
                                       targets + j * seq_len));
  }
  return Status::Ok();
}

}  // namespace forge
