#include "worker/checkpoint/async_checkpointer.h"

#include <chrono>
#include <utility>

namespace forge {
namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

AsyncCheckpointer::~AsyncCheckpointer() { Join(); }

void AsyncCheckpointer::Join() {
  if (worker_.joinable()) worker_.join();
}

bool AsyncCheckpointer::Done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !running_;
}

SaveStats AsyncCheckpointer::last_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Status AsyncCheckpointer::Save(const std::string& step_dir, const ShardState& state) {
  const auto t0 = std::chrono::steady_clock::now();
  FORGE_RETURN_IF_ERROR(FinishPrevious());
  // The copy the caller waits for, into the previous save's buffers when there are some.
  ShardState snapshot = TakeSpare().value_or(ShardState{});
  snapshot.rank = state.rank;
  snapshot.world = state.world;
  snapshot.trainer = state.trainer;
  snapshot.units.resize(state.units.size());
  for (size_t u = 0; u < state.units.size(); ++u) {
    const UnitSlice& from = state.units[u];
    UnitSlice& to = snapshot.units[u];
    to.unit_numel = from.unit_numel;
    to.begin = from.begin;
    to.end = from.end;
    to.master.assign(from.master.begin(), from.master.end());
    to.m.assign(from.m.begin(), from.m.end());
    to.v.assign(from.v.begin(), from.v.end());
  }
  return Start(step_dir, std::move(snapshot), Seconds(t0));
}

Status AsyncCheckpointer::Save(const std::string& step_dir, ShardState&& state) {
  const auto t0 = std::chrono::steady_clock::now();
  FORGE_RETURN_IF_ERROR(FinishPrevious());
  return Start(step_dir, std::move(state), Seconds(t0));
}

Status AsyncCheckpointer::FinishPrevious() {
  Join();
  std::lock_guard<std::mutex> lock(mu_);
  if (!result_.has_value()) return Status::Ok();
  if (!result_->ok()) {
    const Status failed = result_->status();
    result_.reset();
    return failed.Annotate("previous checkpoint save (step " + std::to_string(stats_.step) +
                           ") failed");
  }
  return Status::Precondition("the report of the checkpoint save of step " +
                              std::to_string(stats_.step) +
                              " was not collected: call Wait() (and commit) before saving again");
}

Status AsyncCheckpointer::Start(const std::string& step_dir, ShardState state,
                                double blocked_s) {
  std::lock_guard<std::mutex> lock(mu_);
  running_ = true;
  pending_stats_ = SaveStats{};
  pending_stats_.step = state.trainer.step;
  pending_stats_.blocked_s = blocked_s;
  worker_ = std::thread([this, step_dir, s = std::move(state)]() mutable {
    const auto t0 = std::chrono::steady_clock::now();
    StatusOr<ShardReport> rep = WriteShard(step_dir, s);
    const double write_s = Seconds(t0);
    std::lock_guard<std::mutex> lock(mu_);
    pending_stats_.write_s = write_s;
    pending_stats_.bytes = rep.ok() ? rep->size : 0;
    stats_ = pending_stats_;
    result_ = std::move(rep);
    spare_ = std::move(s);
    running_ = false;
  });
  return Status::Ok();
}

std::optional<ShardState> AsyncCheckpointer::TakeSpare() {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_) return std::nullopt;
  std::optional<ShardState> s = std::move(spare_);
  spare_.reset();
  return s;
}

StatusOr<ShardReport> AsyncCheckpointer::Wait() {
  Join();
  std::lock_guard<std::mutex> lock(mu_);
  if (!result_.has_value()) {
    return Status::Precondition("AsyncCheckpointer::Wait: no checkpoint save to wait for");
  }
  StatusOr<ShardReport> r = std::move(*result_);
  result_.reset();
  return r;
}

}  // namespace forge
