#include "metrics/run_aggregates.h"

#include <algorithm>

#include "metrics/families.h"
#include "metrics/metric_catalog.h"

namespace forge {
namespace {

RunSummary Fold(const std::map<int, RankStepSample>& ranks) {
  RunSummary s;
  double mfu_sum = 0.0;
  int mfu_n = 0;
  bool first = true;
  for (const auto& [rank, r] : ranks) {
    ++s.ranks;
    s.step = first ? r.step : std::min(s.step, r.step);
    first = false;
    s.tokens_per_s += r.tokens_per_s;
    if (r.mfu >= 0.0) {
      mfu_sum += r.mfu;
      ++mfu_n;
    }
    if (s.slowest_rank < 0 || r.step_seconds > s.slowest_step_seconds) {
      s.slowest_step_seconds = r.step_seconds;
      s.slowest_rank = rank;
    }
  }
  if (mfu_n > 0) s.mfu = mfu_sum / mfu_n;
  return s;
}

void RemoveIfPresent(prometheus::Family<prometheus::Gauge>* f, const prometheus::Labels& l) {
  if (f->Has(l)) f->Remove(&f->Add(l));
}

}  // namespace

RunAggregates::RunAggregates(prometheus::Registry& r) {
  tokens_per_s_ = &GaugeFamily(r, "forge_run_tokens_per_second");
  mfu_ = &GaugeFamily(r, "forge_run_mfu_ratio");
  slowest_step_ = &GaugeFamily(r, "forge_run_slowest_step_seconds");
  slowest_rank_ = &GaugeFamily(r, "forge_run_slowest_rank");
  step_ = &GaugeFamily(r, "forge_run_step");
  ranks_ = &GaugeFamily(r, "forge_run_ranks_reporting");
  worker_up_ = &GaugeFamily(r, "forge_worker_up");
  run_state_ = &GaugeFamily(r, "forge_run_state");
  hangs_ = &CounterFamily(r, "forge_hangs_total");
  straggler_ = &GaugeFamily(r, "forge_straggler");
}

void RunAggregates::SetStraggler(const std::string& run_id, int rank, bool straggling) {
  std::lock_guard<std::mutex> lock(mu_);
  straggling_[run_id][rank] = straggling;
  straggler_->Add({{"run_id", run_id}, {"rank", std::to_string(rank)}})
      .Set(straggling ? 1.0 : 0.0);
}

void RunAggregates::CountHang(const std::string& run_id) {
  std::lock_guard<std::mutex> lock(mu_);
  prometheus::Counter*& c = hang_counts_[run_id];
  if (c == nullptr) c = &hangs_->Add({{"run_id", run_id}});
  c->Increment();
}

void RunAggregates::PublishLocked(const std::string& run_id) {
  const prometheus::Labels l{{"run_id", run_id}};
  auto it = runs_.find(run_id);
  if (it == runs_.end() || it->second.empty()) {
    for (auto* f : {tokens_per_s_, mfu_, slowest_step_, slowest_rank_, step_, ranks_})
      RemoveIfPresent(f, l);
    return;
  }
  const RunSummary s = Fold(it->second);
  tokens_per_s_->Add(l).Set(s.tokens_per_s);
  if (s.mfu >= 0.0) mfu_->Add(l).Set(s.mfu);
  else RemoveIfPresent(mfu_, l);
  slowest_step_->Add(l).Set(s.slowest_step_seconds);
  slowest_rank_->Add(l).Set(s.slowest_rank);
  step_->Add(l).Set(double(s.step));
  ranks_->Add(l).Set(s.ranks);
}

void RunAggregates::ReportRank(const std::string& run_id, int rank, const RankStepSample& sample) {
  std::lock_guard<std::mutex> lock(mu_);
  runs_[run_id][rank] = sample;
  PublishLocked(run_id);
  if (straggling_[run_id].emplace(rank, false).second)  // a reporting rank's series, at 0
    straggler_->Add({{"run_id", run_id}, {"rank", std::to_string(rank)}}).Set(0.0);
}

void RunAggregates::SetWorkerUp(const std::string& run_id, int rank, bool up) {
  std::lock_guard<std::mutex> lock(mu_);
  up_[run_id][rank] = up;
  worker_up_->Add({{"run_id", run_id}, {"rank", std::to_string(rank)}}).Set(up ? 1.0 : 0.0);
}

Status RunAggregates::SetRunState(const std::string& run_id, std::string_view state) {
  if (!IsRunStateName(state))
    return Status::Invalid("run " + run_id + ": state '" + std::string(state) +
                           "' is not one of the known states");
  std::lock_guard<std::mutex> lock(mu_);
  state_[run_id] = std::string(state);
  for (std::string_view s : RunStateNames())
    run_state_->Add({{"run_id", run_id}, {"state", std::string(s)}}).Set(s == state ? 1.0 : 0.0);
  return Status::Ok();
}

void RunAggregates::ForgetRank(const std::string& run_id, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = runs_.find(run_id);
  if (it != runs_.end()) it->second.erase(rank);
  const prometheus::Labels l{{"run_id", run_id}, {"rank", std::to_string(rank)}};
  RemoveIfPresent(worker_up_, l);
  RemoveIfPresent(straggler_, l);
  if (auto u = up_.find(run_id); u != up_.end()) u->second.erase(rank);
  if (auto g = straggling_.find(run_id); g != straggling_.end()) g->second.erase(rank);
  PublishLocked(run_id);
}

void RunAggregates::ForgetRun(const std::string& run_id) {
  std::lock_guard<std::mutex> lock(mu_);
  runs_.erase(run_id);
  PublishLocked(run_id);  // removes the aggregate series
  if (auto u = up_.find(run_id); u != up_.end()) {
    for (const auto& [rank, up] : u->second) {
      const prometheus::Labels l{{"run_id", run_id}, {"rank", std::to_string(rank)}};
      RemoveIfPresent(worker_up_, l);
    }
    up_.erase(u);
  }
  if (auto g = straggling_.find(run_id); g != straggling_.end()) {
    for (const auto& [rank, on] : g->second)
      RemoveIfPresent(straggler_, {{"run_id", run_id}, {"rank", std::to_string(rank)}});
    straggling_.erase(g);
  }
  if (auto h = hang_counts_.find(run_id); h != hang_counts_.end()) {
    hangs_->Remove(h->second);
    hang_counts_.erase(h);
  }
  if (state_.erase(run_id) > 0) {
    for (std::string_view s : RunStateNames()) {
      const prometheus::Labels l{{"run_id", run_id}, {"state", std::string(s)}};
      RemoveIfPresent(run_state_, l);
    }
  }
}

StatusOr<RunSummary> RunAggregates::Summary(const std::string& run_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = runs_.find(run_id);
  if (it == runs_.end() || it->second.empty())
    return Status::NotFound("run " + run_id + ": no rank has reported a step");
  return Fold(it->second);
}

}  // namespace forge
