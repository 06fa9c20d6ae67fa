// The training data of a run: its sources' datasets opened, and each rank's batches drawn from
// them by the data plan (data_plan.h) and the weighted apportionment (mixture.h).
//
// Global position p (sampler.h's layout: a rank's micro-step reads positions
// SliceStart(c, r, W, b, k) + j) draws from source s = the mixture's source of p - origin, as
// that source's sequence n_s = base_s + (its draws before p - origin), i.e. sequence
// SamplingPlan_s.SequenceAt(n_s) of its train split, SamplingPlan_s shuffling with the
// source's stream. With one source, origin 0 and base 0 this is exactly FillTrainBatch over that
// dataset (the same sequences in the same slots, bitwise).
//
// Validation reads the first source's val split (FillEvalBatch).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/data/data_plan.h"
#include "worker/data/dataset.h"
#include "worker/data/mixture.h"
#include "worker/data/sampler.h"

namespace forge {

class TrainMixture {
 public:
  // Opens every source (dirs resolved). They must share the tokenizer (name, vocabulary size,
  // end-of-text token): otherwise InvalidArgument naming the two dirs. Each source's train
  // split must hold at least one sequence of seq_len + 1 tokens. The plan starts as a fresh
  // one (origin 0, bases 0, stream = index) until SetPlan.
  static StatusOr<TrainMixture> Open(const std::vector<DataSourceConfig>& sources,
                                     int64_t seq_len, uint64_t seed, bool shuffle);

  int size() const { return static_cast<int>(datasets_.size()); }
  const TokenDataset& dataset(int s) const { return datasets_[size_t(s)]; }
  const DataPlan& plan() const { return plan_; }

  // The plan must list the opened sources' dirs, in order.
  Status SetPlan(const DataPlan& plan);

  // Fills one rank's micro-step of the global batch at global cursor `cursor` (>= the plan's
  // origin), as FillTrainBatch does for one dataset.
  Status FillTrainBatch(int64_t cursor, int rank, int world, int micro_batch, int micro_step,
                        int32_t* inputs, int32_t* targets) const;

  // What each source has given at global cursor `cursor` (>= origin).
  DataUsage UsageAt(int64_t cursor) const;

 private:
  TrainMixture(int64_t seq_len, uint64_t seed, bool shuffle)
      : seq_len_(seq_len), seed_(seed), shuffle_(shuffle) {}

  int64_t seq_len_;
  uint64_t seed_;
  bool shuffle_;
  std::vector<TokenDataset> datasets_;
  DataPlan plan_;
  std::vector<MixtureSchedule> schedule_;  // one, once a plan is set (no default constructor)
  std::vector<SamplingPlan> orders_;       // per source, with its stream
};

}  // namespace forge
