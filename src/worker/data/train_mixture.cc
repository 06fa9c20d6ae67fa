// A run's training sources and the weighted draw of its batches (train_mixture.h).
#include "worker/data/train_mixture.h"

#include <utility>

namespace forge {
namespace {

// Why two datasets cannot be mixed ("" when they can): token ids must mean the same text.
std::string TokenizerMismatch(const DatasetManifest& a, const DatasetManifest& b) {
  if (a.tokenizer != b.tokenizer) return "tokenizer " + a.tokenizer + " vs " + b.tokenizer;
  if (a.vocab_size != b.vocab_size)
    return "vocabulary size " + std::to_string(a.vocab_size) + " vs " +
           std::to_string(b.vocab_size);
  if (a.eot_token != b.eot_token)
    return "end-of-text token " + std::to_string(a.eot_token) + " vs " +
           std::to_string(b.eot_token);
  return "";
}

}  // namespace

StatusOr<TrainMixture> TrainMixture::Open(const std::vector<DataSourceConfig>& sources,
                                          int64_t seq_len, uint64_t seed, bool shuffle) {
  if (sources.empty()) return Status::Invalid("no data source to train on");
  TrainMixture m(seq_len, seed, shuffle);
  for (const DataSourceConfig& src : sources) {
    auto ds = TokenDataset::Open(src.dir);
    if (!ds.ok())
      return ds.status().Annotate("opening dataset " + src.dir +
                                  " (run `forge data prepare` first)");
    if (!m.datasets_.empty()) {
      const std::string why = TokenizerMismatch(m.datasets_[0].manifest(), ds->manifest());
      if (!why.empty())
        return Status::Invalid("data sources " + m.datasets_[0].dir() + " and " + src.dir +
                               " were tokenized differently (" + why +
                               "): a mixture needs one tokenizer");
    }
    const int64_t n = NumSequences(ds->split(Split::kTrain).size(), seq_len);
    if (n <= 0)
      return Status::Invalid("dataset " + src.dir + ": its train split of " +
                             std::to_string(ds->split(Split::kTrain).size()) +
                             " tokens holds no sequence of " + std::to_string(seq_len + 1) +
                             " tokens");
    m.datasets_.push_back(std::move(ds).value());
  }
  DataPlan fresh;
  for (size_t s = 0; s < sources.size(); ++s)
    fresh.sources.push_back({m.datasets_[s].dir(), sources[s].weight, int64_t(s), 0});
  FORGE_RETURN_IF_ERROR(m.SetPlan(fresh));
  return m;
}

Status TrainMixture::SetPlan(const DataPlan& plan) {
  if (plan.sources.size() != datasets_.size())
    return Status::Invalid("data plan lists " + std::to_string(plan.sources.size()) +
                           " sources, the run opened " + std::to_string(datasets_.size()));
  std::vector<double> weights;
  for (size_t s = 0; s < plan.sources.size(); ++s) {
    if (plan.sources[s].dir != datasets_[s].dir())
      return Status::Invalid("data plan source " + std::to_string(s) + " is " +
                             plan.sources[s].dir + ", the run opened " + datasets_[s].dir());
    if (plan.sources[s].base < 0 || plan.sources[s].stream < 0)
      return Status::Invalid("data plan source " + plan.sources[s].dir +
                             ": negative base or stream");
    weights.push_back(plan.sources[s].weight);
  }
  if (plan.origin < 0) return Status::Invalid("data plan: negative origin");
  FORGE_ASSIGN_OR_RETURN(MixtureSchedule schedule, MixtureSchedule::Make(weights, seed_));
  schedule_.assign(1, std::move(schedule));
  orders_.clear();
  for (size_t s = 0; s < datasets_.size(); ++s)
    orders_.emplace_back(datasets_[s].split(Split::kTrain).size(), seq_len_, seed_, shuffle_,
                         plan.sources[s].stream);
  plan_ = plan;
  return Status::Ok();
}

Status TrainMixture::FillTrainBatch(int64_t cursor, int rank, int world, int micro_batch,
                                    int micro_step, int32_t* inputs, int32_t* targets) const {
  if (world < 1 || rank < 0 || rank >= world || micro_batch < 1 || micro_step < 0)
    return Status::Invalid("batch slice: rank " + std::to_string(rank) + " of world " +
                           std::to_string(world) + ", micro_batch " +
                           std::to_string(micro_batch) + ", micro_step " +
                           std::to_string(micro_step) + " is not a valid slice");
  if (cursor < plan_.origin)
    return Status::Invalid("data cursor " + std::to_string(cursor) +
                           " lies before the data plan's origin " +
                           std::to_string(plan_.origin));
  const int64_t first = SliceStart(cursor, rank, world, micro_batch, micro_step);
  const auto draws = schedule_[0].DrawsFrom(first - plan_.origin, micro_batch);
  for (int j = 0; j < micro_batch; ++j) {
    const MixtureSchedule::Draw& d = draws[size_t(j)];
    const int64_t n = plan_.sources[size_t(d.source)].base + d.index;
    const int64_t seq = orders_[size_t(d.source)].SequenceAt(n);
    FORGE_RETURN_IF_ERROR(ReadSequence(datasets_[size_t(d.source)].split(Split::kTrain), seq,
                                       seq_len_, inputs + j * seq_len_, targets + j * seq_len_)
                              .Annotate("data source " + datasets_[size_t(d.source)].dir()));
  }
  return Status::Ok();
}

DataUsage TrainMixture::UsageAt(int64_t cursor) const {
  DataUsage u;
  u.cursor = cursor;
  u.origin = plan_.origin;
  const std::vector<int64_t> counts = schedule_[0].CountsBefore(cursor - plan_.origin);
  for (size_t s = 0; s < datasets_.size(); ++s) {
    SourceUsage su;
    su.source = plan_.sources[s];
    su.sequences = su.source.base + counts[s];
    su.tokens = su.sequences * seq_len_;
    su.epoch_sequences = orders_[s].num_sequences();
    su.epoch = su.sequences / su.epoch_sequences;
    u.sources.push_back(std::move(su));
  }
  return u;
}

}  // namespace forge
