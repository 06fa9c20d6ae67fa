#include "worker/parallel/mode_executor.h"

#include <utility>

namespace forge {
namespace {

// Keeps the handle for the caller to wait on, or drops it (stream-ordered comms).
Status Keep(CommWorkPtr work, PendingWork* pending) {
  if (pending != nullptr) pending->push_back(std::move(work));
  return Status::Ok();
}

std::string Label(std::string_view what, const ModeUnit& unit, DType dtype) {
  std::string s(what);
  s += ' ';
  s += unit.name;
  if (dtype == DType::kBF16) s += " (bf16)";
  return s;
}

}  // namespace

Status WaitAll(PendingWork* pending) {
  Status first;
  for (CommWorkPtr& w : *pending) {
    Status s = w->Wait();
    if (first.ok() && !s.ok()) first = s;
  }
  pending->clear();
  return first;
}

ModeExecutor::ModeExecutor(const ModeRules& rules, Comm* shard, Comm* replica,
                           std::vector<ModeUnit> units)
    : rules_(rules), shard_(shard), replica_(replica), units_(std::move(units)) {
  const int world = shard_->world(), rank = shard_->rank();
  for (const ModeUnit& u : units_) {
    slot_.push_back(sharded() ? ShardSize(u.numel, world) : u.numel);
    owned_.push_back(sharded() ? ShardOf(u.numel, rank, world) : ShardRange{0, u.numel});
  }
}

Status ModeExecutor::ReduceGrad(int u, const GradPass& pass, ModeStorage* s,
                                PendingWork* pending) const {
  const ModeUnit& unit = units_[u];
  const CollectiveOp op = GradOp(pass);
  FORGE_ASSIGN_OR_RETURN(GradBuffers g, s->GradToReduce(u, op));
  const std::string what = Label("grad", unit, g.dtype);
  StatusOr<CommWorkPtr> work =
      op == CollectiveOp::kAllReduce
          ? shard_->AllReduceSum(g.full, unit.numel, g.dtype, what)
          : shard_->ReduceScatterSum(g.full, g.slot, slot_[u], g.dtype, what);
  if (!work.ok()) return work.status();
  FORGE_RETURN_IF_ERROR(s->GradReduced(u, op, work.value().get()));
  if (replica_ != nullptr && pass.last_micro) {
    // hsdp: the shard group's sum, summed over the groups holding the same shard.
    FORGE_ASSIGN_OR_RETURN(float* sum, s->HandOverToReplicas(u, op, work.value().get()));
    const int64_t n = op == CollectiveOp::kAllReduce ? unit.numel : slot_[u];
    StatusOr<CommWorkPtr> r =
        replica_->AllReduceSum(sum, n, DType::kF32, "grad shard " + unit.name);
    if (!r.ok()) return r.status();
    FORGE_RETURN_IF_ERROR(Keep(std::move(work).value(), pending));
    FORGE_RETURN_IF_ERROR(Keep(std::move(r).value(), pending));
  } else {
    FORGE_RETURN_IF_ERROR(Keep(std::move(work).value(), pending));
  }
  return s->GradDone(u);
}

Status ModeExecutor::GatherAfterUpdate(int u, ModeStorage* s, PendingWork* pending) const {
  if (!rules_.gather_after_update) return Status::Ok();
  DType dtype = DType::kF32;
  char* full = static_cast<char*>(s->ParamsToGather(u, &dtype));
  // In place: this rank's slot is where the all-gather reads its contribution.
  const char* mine = full + shard_->rank() * slot_[u] * DTypeSize(dtype);
  StatusOr<CommWorkPtr> work =
      shard_->AllGather(mine, full, slot_[u], dtype, "params " + units_[u].name);
  if (!work.ok()) return work.status();
  FORGE_RETURN_IF_ERROR(Keep(std::move(work).value(), pending));
  return s->ParamsGathered(u);
}

Status ModeExecutor::GatherShards(int u, const void* slot, void* full, DType dtype,
                                  std::string_view what, PendingWork* pending) const {
  std::string label(what);
  label += ' ';
  label += units_[u].name;
  StatusOr<CommWorkPtr> work = shard_->AllGather(slot, full, slot_[u], dtype, label);
  if (!work.ok()) return work.status();
  return Keep(std::move(work).value(), pending);
}

}  // namespace forge
