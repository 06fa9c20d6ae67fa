// The collectives of the data-parallel modes, issued by one implementation for both backends:
// mode_rules.h says what a mode keeps and moves, ModeExecutor issues the Comm calls that move
// it, one unit at a time. Each backend calls the entry points at its own points of a step and
// keeps its buffers behind ModeStorage (host vectors on the CPU, device pointers on the GPU,
// where the hooks also hand work from one stream to the next):
//
//   a unit's gradient is complete   ReduceGrad: all-reduce it over the shard group (ddp, or
//                                   every mode when every rank wants the whole gradient), else
//                                   reduce-scatter it into this rank's slot; hsdp then, on the
//                                   step's last micro-step, all-reduces the sum over the
//                                   replica group
//   the update wrote this rank's    GatherAfterUpdate (zero1, zero2): the full params all-
//   slot                            gathered in place from every rank's slot
//   a unit's params (or any state)  GatherShards: the full unit from every rank's slot, over
//   are needed whole                the shard group (fsdp and hsdp before use; checkpoints)
//   the optimizer                   owned(u): the elements of unit u this rank updates;
//                                   norm_comm(): the comm the norm's sum of squares is summed
//                                   over (null: the reduced gradient is whole on every rank)
//
// The CPU backend calls them in loops after its backward and waits for the collectives
// (`pending`); the CUDA backend calls them from CudaModel's per-unit hooks with `pending` null:
// its comms are stream-ordered, so a collective's handle may be dropped once issued. Units are
// named in every collective's label ("grad block.3", "grad block.3 (bf16)", "params ...").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "worker/model/shard_layout.h"
#include "worker/parallel/comm.h"
#include "worker/parallel/mode_rules.h"

namespace forge {

// Collectives issued and not yet waited for (host comms); null where dropping them is safe.
using PendingWork = std::vector<CommWorkPtr>;

// Waits for every collective in `pending` and clears it; the first error, if any.
Status WaitAll(PendingWork* pending);

// One unit of the parameter layout, as the collectives see it.
struct ModeUnit {
  std::string name;
  int64_t numel = 0;
};

// Which collective sums a unit's gradient, and when.
struct GradPass {
  bool all_reduce = false;  // every rank wants the whole gradient (ComputeGradients)
  bool last_micro = true;   // the step's last micro-step: hsdp sums over the replicas then
};

// The buffers of one unit's gradient collective.
struct GradBuffers {
  // The whole unit: all-reduced in place (numel elements), or reduce-scattered (padded to
  // shard_world * slot elements, zero beyond numel).
  void* full = nullptr;
  void* slot = nullptr;  // reduce-scatter: where this rank's slot of the sum lands
  DType dtype = DType::kF32;
};

// Where a backend keeps a unit's data when a collective needs it, and what it does around the
// collective. Called once per unit and collective, never per element.
class ModeStorage {
 public:
  virtual ~ModeStorage() = default;

  // Unit u's gradient, ready for `op` (kAllReduce or kReduceScatter). The backend may stage it
  // first (cast it to bf16, say, in order before the collective).
  virtual StatusOr<GradBuffers> GradToReduce(int u, CollectiveOp op) = 0;
  // The shard group's collective of unit u was issued (`work` completes it): what follows it
  // in order (widen a bf16 sum, add to an accumulated slot, take the unit's norm share).
  virtual Status GradReduced(int u, CollectiveOp op, CommWork* work) {
    (void)u, (void)op, (void)work;
    return Status::Ok();
  }
  // hsdp: unit u's fp32 gradient sum of the shard group (the whole unit after kAllReduce, the
  // slot after kReduceScatter), once the replica group's collective may read it: a host
  // backend waits for `work`, a device one orders the replica comm's stream after it.
  virtual StatusOr<float*> HandOverToReplicas(int u, CollectiveOp op, CommWork* work) = 0;
  // Unit u's gradient collectives were all issued.
  virtual Status GradDone(int u) {
    (void)u;
    return Status::Ok();
  }

  // zero1/zero2: unit u's full params (padded to shard_world * slot), this rank's updated
  // slot at slot index rank; its dtype.
  virtual void* ParamsToGather(int u, DType* dtype) = 0;
  virtual Status ParamsGathered(int u) {
    (void)u;
    return Status::Ok();
  }
};

class ModeExecutor {
 public:
  // `shard` is the comm the state is sharded over (the world, or hsdp's shard group);
  // `replica` hsdp's replica group (null for every other mode, or when it has one rank). Both
  // outlive this.
  ModeExecutor(const ModeRules& rules, Comm* shard, Comm* replica, std::vector<ModeUnit> units);

  const ModeRules& rules() const { return rules_; }
  bool sharded() const { return rules_.sharded(); }
  Comm* shard_comm() const { return shard_; }
  Comm* replica_comm() const { return replica_; }
  int units() const { return int(units_.size()); }
  int64_t numel(int u) const { return units_[u].numel; }
  // Elements per rank slot of unit u (shard_layout.h; the whole unit when not sharded).
  int64_t slot(int u) const { return slot_[u]; }
  // The elements of unit u whose optimizer state this rank keeps and updates.
  ShardRange owned(int u) const { return owned_[u]; }
  // The comm the gradient norm's sum of squares is summed over: the shard group in sharded
  // modes (hsdp's replica groups hold the same slots); null for ddp, whose reduced gradient
  // is whole on every rank.
  Comm* norm_comm() const { return sharded() ? shard_ : nullptr; }
  // The shard group's collective for a unit's gradient in `pass`.
  CollectiveOp GradOp(const GradPass& pass) const {
    return sharded() && !pass.all_reduce ? CollectiveOp::kReduceScatter
                                         : CollectiveOp::kAllReduce;
  }

  // Unit u's gradient is complete: its collectives, in the order of the table above.
  Status ReduceGrad(int u, const GradPass& pass, ModeStorage* s, PendingWork* pending) const;
  // zero1/zero2, after the update: unit u's params all-gathered in place (no-op otherwise).
  Status GatherAfterUpdate(int u, ModeStorage* s, PendingWork* pending) const;
  // `full` (shard_world * slot elements) = every rank's `slot` of unit u, over the shard group;
  // `what` begins the label ("params", "gather").
  Status GatherShards(int u, const void* slot, void* full, DType dtype, std::string_view what,
                      PendingWork* pending) const;

 private:
  ModeRules rules_;
  Comm* shard_;
  Comm* replica_;
  std::vector<ModeUnit> units_;
  std::vector<int64_t> slot_;
  std::vector<ShardRange> owned_;
};

}  // namespace forge
