// The float32 CPU reference backend: CpuModel for forward/backward, cpu::AdamWUpdate for the
// optimizer, and data parallelism over a Comm (MPI across processes; a world-1 LocalComm for
// one process, so one code path serves every world size and mode).
//
// Bitwise equality across world sizes. A step's gradient is the sum of one leaf per global
// micro-step j (Backward of micro-batch j with dloss = 1/A, A = global micro-steps, into a
// zeroed buffer). Leaves are combined in the canonical order of sum_order.h: each rank sums its
// own micro-steps with CanonicalReduce and the comm sums the ranks' partial sums the same way,
// which for a power-of-two world (or one micro-step per rank) is the single-process sum
// operation for operation. The loss mean is summed in global micro-step order, the gradient
// norm exactly (exact_square_sum.h), and AdamW is element-wise: every mode on every such world
// size ends each step with bitwise the weights one process gets.
//
// Modes: what each rank keeps and moves is worker/parallel/mode_rules.h, and the collectives
// that move it are worker/parallel/mode_executor.h's, which this backend calls in loops after
// the whole backward (CpuModel has no per-unit backward hook, so there is nothing to overlap on
// the CPU) with its host vectors as the storage: the gradient of every unit is all-reduced or
// reduce-scattered into this rank's slot (hsdp: then all-reduced over the replica group), AdamW
// updates what this rank owns, and zero1/zero2 all-gather the updated params in place. With
// sharded params (fsdp, hsdp) CpuModel still needs every unit at once, so a step all-gathers the
// whole model into full buffers, runs forward/backward, reduce-scatters the gradient and frees
// the full params and gradients again: between steps memory is ~1/W, during a step a full
// model plus gradients (the GPU backend gathers unit by unit instead). Evaluation gathers once
// (BeginEval) and keeps the gathered params until the next step changes them. hsdp's ranks
// read the micro-steps of their data position (DataRank), which makes its two-level sum the
// canonical one: bitwise one process for R and G powers of two.
// Gradient accumulation keeps ceil(log2 A_local)+1 full-size buffers during backward (the
// canonical order's partial sums); with one micro-step per rank that is one buffer.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cpu/adamw.h"
#include "worker/model/cpu_model.h"
#include "worker/model/shard_layout.h"
#include "worker/parallel/comm.h"
#include "worker/parallel/exact_square_sum.h"
#include "worker/parallel/hybrid_groups.h"
#include "worker/parallel/mode_executor.h"
#include "worker/parallel/mode_rules.h"
#include "worker/parallel/sum_order.h"
#include "worker/train/backend.h"

namespace forge {
namespace {

Status CheckShapes(const ParamLayout& layout, const UnitBuffers& b, const char* what) {
  if (b.size() != layout.units.size())
    return Status::Invalid(std::string(what) + ": expected " + std::to_string(layout.units.size()) +
                           " units, got " + std::to_string(b.size()));
  for (size_t u = 0; u < b.size(); ++u)
    if (static_cast<int64_t>(b[u].size()) != layout.units[u].numel)
      return Status::Invalid(std::string(what) + ": unit " + layout.units[u].name + " has " +
                             std::to_string(b[u].size()) + " floats, expected " +
                             std::to_string(layout.units[u].numel));
  return Status::Ok();
}

class CpuBackend final : public TrainBackend, private ModeStorage {
 public:
  CpuBackend(const RunConfig& cfg, Comm* comm)
      : cfg_(cfg), model_(cfg.model, cfg.batch.micro_batch), layout_(model_.layout()) {
    if (comm == nullptr) {
      own_comm_ = MakeLocalComm();
      comm = own_comm_.get();
    }
    comm_ = comm;
    rank_ = comm->rank();
    world_ = comm->world();
    data_rank_ = DataRank(cfg.parallel, rank_, world_);
    init_ = CheckShardGroupSize(cfg.parallel, world_);
    rules_ = ModeRulesFor(cfg.parallel, world_);
    shard_comm_ = comm_;
    if (init_.ok() && rules_.reduce_over_replicas) {
      // Collective over comm: every rank constructs its backend at the same point.
      StatusOr<HybridComms> split = SplitHybridComms(comm_, cfg.parallel.shard_group_size);
      if (split.ok()) {
        hybrid_ = std::move(split).value();
        shard_comm_ = hybrid_.shard.get();
        replica_comm_ = hybrid_.replica.get();
      } else {
        init_ = split.status();
      }
    }
    shard_world_ = shard_comm_->world();
    const size_t U = layout_.units.size();
    numel_.resize(U);
    std::vector<ModeUnit> units(U);
    for (size_t u = 0; u < U; ++u) {
      numel_[u] = layout_.units[u].numel;
      units[u] = {layout_.units[u].name, numel_[u]};
    }
    exec_ = std::make_unique<ModeExecutor>(rules_, shard_comm_, replica_comm_, std::move(units));
    UnitBuffers zeros(U);
    for (size_t u = 0; u < U; ++u) zeros[u].assign(numel_[u], 0.0f);
    (void)SetParams(zeros);
  }

  const char* name() const override { return "cpu"; }

  Status SetParams(const UnitBuffers& master) override {
    FORGE_RETURN_IF_ERROR(init_);
    FORGE_RETURN_IF_ERROR(CheckShapes(layout_, master, "SetParams"));
    const size_t U = numel_.size();
    if (fsdp_like()) {
      ReleaseFull(&params_);
      params_ready_ = false;
      param_shard_.resize(U);
      for (size_t u = 0; u < U; ++u) TakeSlot(master[u], u, &param_shard_[u]);
    } else {
      params_.resize(U);
      for (size_t u = 0; u < U; ++u) AssignPadded(master[u].data(), u, &params_[u]);
      params_ready_ = true;
    }
    m_.assign(U, {});
    v_.assign(U, {});
    for (size_t u = 0; u < U; ++u) {
      const int64_t n = sharded() ? exec_->slot(u) : numel_[u];
      m_[u].assign(n, 0.0f);
      v_[u].assign(n, 0.0f);
    }
    return Status::Ok();
  }

  Status GetParams(UnitBuffers* master) override {
    if (fsdp_like() && !params_ready_) return GatherSlots(param_shard_, master);
    master->resize(numel_.size());
    for (size_t u = 0; u < numel_.size(); ++u)
      (*master)[u].assign(params_[u].begin(), params_[u].begin() + numel_[u]);
    return Status::Ok();
  }

  Status GetMoments(UnitBuffers* m, UnitBuffers* v) override {
    if (!sharded()) {
      *m = m_;
      *v = v_;
      return Status::Ok();
    }
    FORGE_RETURN_IF_ERROR(GatherSlots(m_, m));
    return GatherSlots(v_, v);
  }

  Status SetMoments(const UnitBuffers& m, const UnitBuffers& v) override {
    FORGE_RETURN_IF_ERROR(CheckShapes(layout_, m, "SetMoments(m)"));
    FORGE_RETURN_IF_ERROR(CheckShapes(layout_, v, "SetMoments(v)"));
    if (!sharded()) {
      m_ = m;
      v_ = v;
      return Status::Ok();
    }
    for (size_t u = 0; u < numel_.size(); ++u) {
      TakeSlot(m[u], u, &m_[u]);
      TakeSlot(v[u], u, &v_[u]);
    }
    return Status::Ok();
  }

  Status BeginEval() override {
    if (fsdp_like() && !params_ready_) return GatherParams();
    return Status::Ok();
  }

  Status TrainStep(const std::vector<MicroBatch>& micro, const StepHyper& hyper, bool,
                   StepStats* stats) override {
    FORGE_RETURN_IF_ERROR(init_);
    if (fsdp_like() && !params_ready_) FORGE_RETURN_IF_ERROR(GatherParams());
    float loss = 0.0f;
    FORGE_RETURN_IF_ERROR(Accumulate(micro, &loss));
    UnitBuffers& grads = acc_[0];
    PendingWork works;

    // Gradient communication, last unit first (the order backward produces them).
    const int U = static_cast<int>(numel_.size());
    if (sharded()) grad_shard_.resize(U);
    for (int u = U - 1; u >= 0; --u)
      FORGE_RETURN_IF_ERROR(exec_->ReduceGrad(u, GradPass{}, this, &works));
    FORGE_RETURN_IF_ERROR(WaitAll(&works));
    if (sharded()) {
      if (rules_.free_full_grads) {
        acc_.clear();
        acc_.shrink_to_fit();
      } else {
        for (int u = 0; u < U; ++u) grads[u].resize(numel_[u]);
      }
      if (fsdp_like()) {
        ReleaseFull(&params_);
        params_ready_ = false;
      }
    }

    // Global gradient norm: exact, so the same for any split over ranks. Sharded modes sum
    // their slots' squares over the executor's norm comm (the shard group: hsdp's replica
    // groups hold the same shards).
    ExactSquareSum sumsq;
    for (int u = 0; u < U; ++u) {
      if (sharded())
        sumsq.Add(grad_shard_[u].data(), exec_->owned(u).size());
      else
        sumsq.Add(grads[u].data(), numel_[u]);
    }
    if (Comm* norm_comm = exec_->norm_comm()) {
      auto wire = sumsq.ToDoubles();
      FORGE_RETURN_IF_ERROR(AllReduceSumBlocking(norm_comm, wire.data(), int64_t(wire.size()),
                                                 DType::kF64, "grad norm"));
      sumsq = ExactSquareSum::FromDoubles(wire.data());
    }
    const float norm = static_cast<float>(std::sqrt(sumsq.Value()));
    const float clip = cfg_.optimizer.grad_clip;
    const float scale = (clip > 0.0f && norm > clip) ? clip / (norm + 1e-6f) : 1.0f;

    // AdamW on what this rank owns: the full unit (ddp) or its shard, split at tensor
    // boundaries (weight decay is per tensor). Non-finite gradients skip the update, as on the
    // GPU, and so does a loss spike (a loss or norm above the trainer's limits); the loss and
    // the norm are global, so every rank agrees.
    const bool skip = !std::isfinite(norm) || hyper.skip_above.Exceeded(loss, norm);
    if (skip) ++skipped_steps_;
    for (int u = 0; u < U && !skip; ++u) {
      // Element e of the unit lives at p[e - off] etc.: full buffers have off = 0, slots
      // start at the shard's first element.
      const ShardRange own = exec_->owned(u);
      const int64_t off = own.begin;
      float* p = fsdp_like() ? param_shard_[u].data() : params_[u].data() + off;
      const float* g = sharded() ? grad_shard_[u].data() : grads[u].data();
      float* m = m_[u].data();
      float* v = v_[u].data();
      for (const auto& t : layout_.units[u].tensors) {
        const int64_t lo = std::max(own.begin, t.offset);
        const int64_t hi = std::min(own.end, t.offset + t.numel);
        if (lo >= hi) continue;
        cpu::AdamWParams a{hyper.lr,
                           cfg_.optimizer.beta1,
                           cfg_.optimizer.beta2,
                           cfg_.optimizer.eps,
                           t.weight_decay ? cfg_.optimizer.weight_decay : 0.0f,
                           hyper.step,
                           scale};
        cpu::AdamWUpdate(p + (lo - off), g + (lo - off), m + (lo - off), v + (lo - off), hi - lo,
                         a);
      }
    }

    // zero1/zero2: every rank gets the updated params back (in place: slot r is the shard).
    if (rules_.gather_after_update) {
      for (int u = 0; u < U; ++u)
        FORGE_RETURN_IF_ERROR(exec_->GatherAfterUpdate(u, this, &works));
      FORGE_RETURN_IF_ERROR(WaitAll(&works));
      for (int u = 0; u < U; ++u) params_[u].resize(numel_[u]);
    }

    if (stats) {
      stats->loss = loss;
      stats->grad_norm = norm;
      stats->skipped_steps = skipped_steps_;
      stats->valid = true;
    }
    return Status::Ok();
  }

  bool SkipsAboveLimits() const override { return true; }

  Status EvalLoss(const MicroBatch& batch, float* loss) override {
    if (!params_ready_)
      return Status::Precondition("cpu backend (fsdp): EvalLoss before BeginEval()");
    *loss = model_.Forward(params_, batch.inputs, batch.targets, cfg_.batch.micro_batch);
    return Status::Ok();
  }

  Status ComputeGradients(const std::vector<MicroBatch>& micro, UnitBuffers* grads,
                          float* loss) override {
    FORGE_RETURN_IF_ERROR(init_);
    if (fsdp_like() && !params_ready_) FORGE_RETURN_IF_ERROR(GatherParams());
    FORGE_RETURN_IF_ERROR(Accumulate(micro, loss));
    // Every rank wants the whole gradient: all-reduced in every mode. hsdp sums over the shard
    // group, then over replicas: the canonical order for its data positions
    // (hybrid_groups.h), as TrainStep sums.
    PendingWork works;
    for (int u = int(numel_.size()) - 1; u >= 0; --u)
      FORGE_RETURN_IF_ERROR(exec_->ReduceGrad(u, GradPass{.all_reduce = true}, this, &works));
    FORGE_RETURN_IF_ERROR(WaitAll(&works));
    *grads = acc_[0];
    if (rules_.free_full_grads) {
      acc_.clear();
      acc_.shrink_to_fit();
    }
    return Status::Ok();
  }

 private:
  bool sharded() const { return rules_.sharded(); }
  bool fsdp_like() const { return rules_.shard_params; }

  // ModeStorage: the step's gradient is acc_[0], its slots grad_shard_ (sized by TrainStep).
  StatusOr<GradBuffers> GradToReduce(int u, CollectiveOp op) override {
    std::vector<float>& g = acc_[0][u];
    if (op == CollectiveOp::kAllReduce) return GradBuffers{g.data(), nullptr, DType::kF32};
    g.resize(PaddedSize(numel_[u], shard_world_));  // zero padding, within capacity
    grad_shard_[u].resize(exec_->slot(u));
    return GradBuffers{g.data(), grad_shard_[u].data(), DType::kF32};
  }
  StatusOr<float*> HandOverToReplicas(int u, CollectiveOp op, CommWork* work) override {
    FORGE_RETURN_IF_ERROR(work->Wait());
    return op == CollectiveOp::kAllReduce ? acc_[0][u].data() : grad_shard_[u].data();
  }
  void* ParamsToGather(int u, DType* dtype) override {
    *dtype = DType::kF32;
    params_[u].resize(PaddedSize(numel_[u], shard_world_));  // within capacity
    return params_[u].data();
  }

  // dst = src (n floats) with capacity for the padded size, so collectives can grow it in place.
  void AssignPadded(const float* src, size_t u, std::vector<float>* dst) const {
    dst->clear();
    dst->reserve(PaddedSize(numel_[u], shard_world_));
    dst->assign(src, src + numel_[u]);
  }
  // dst = this rank's slot of unit u taken from a full buffer (slot floats, zero-padded).
  void TakeSlot(const std::vector<float>& full, size_t u, std::vector<float>* dst) const {
    dst->assign(exec_->slot(u), 0.0f);
    const ShardRange own = exec_->owned(u);
    std::copy(full.begin() + own.begin, full.begin() + own.end, dst->begin());
  }
  static void ReleaseFull(UnitBuffers* b) {
    b->clear();
    b->shrink_to_fit();
  }

  // Full units from every rank's slot (collective over the shard comm).
  Status GatherSlots(const UnitBuffers& slots, UnitBuffers* full) {
    const size_t U = numel_.size();
    full->resize(U);
    PendingWork works;
    for (size_t u = 0; u < U; ++u) {
      (*full)[u].reserve(PaddedSize(numel_[u], shard_world_));
      (*full)[u].resize(PaddedSize(numel_[u], shard_world_));
      FORGE_RETURN_IF_ERROR(exec_->GatherShards(int(u), slots[u].data(), (*full)[u].data(),
                                                DType::kF32, "gather", &works));
    }
    FORGE_RETURN_IF_ERROR(WaitAll(&works));
    for (size_t u = 0; u < U; ++u) (*full)[u].resize(numel_[u]);
    return Status::Ok();
  }

  // fsdp: materialise the full params from the shards.
  Status GatherParams() {
    FORGE_RETURN_IF_ERROR(GatherSlots(param_shard_, &params_));
    params_ready_ = true;
    return Status::Ok();
  }

  // acc_[0] = sum over this rank's micro-steps of Backward(dloss = 1/A_global), in canonical
  // order; *loss = the global mean loss (same on every rank).
  Status Accumulate(const std::vector<MicroBatch>& micro, float* loss) {
    if (micro.empty()) return Status::Invalid("TrainStep: no micro-batches");
    const int64_t local = int64_t(micro.size());
    const int64_t global = local * world_;
    const size_t U = numel_.size();
    const int slots = CanonicalSumSlots(local);
    if (int(acc_.size()) < slots) acc_.resize(slots);
    for (int s = 0; s < slots; ++s) {
      if (acc_[s].size() == U) continue;
      acc_[s].resize(U);
      for (size_t u = 0; u < U; ++u) {
        acc_[s][u].reserve(PaddedSize(numel_[u], shard_world_));
        acc_[s][u].resize(numel_[u]);
      }
    }
    const float dloss = 1.0f / static_cast<float>(global);
    std::vector<double> losses(global, 0.0);  // by global micro-step k*W + data rank
    CanonicalReduce(
        local,
        [&](int64_t k, int s) {
          for (auto& g : acc_[s]) std::fill(g.begin(), g.end(), 0.0f);
          const MicroBatch& mb = micro[k];
          losses[k * world_ + data_rank_] =
              model_.Forward(params_, mb.inputs, mb.targets, cfg_.batch.micro_batch);
          model_.Backward(params_, dloss, &acc_[s]);
        },
        [&](int d, int s) {
          for (size_t u = 0; u < U; ++u) {
            float* a = acc_[d][u].data();
            const float* b = acc_[s][u].data();
            for (int64_t i = 0; i < numel_[u]; ++i) a[i] += b[i];
          }
        });
    // Each slot has one contributor (others add +0.0): the sum is exact in any order.
    FORGE_RETURN_IF_ERROR(
        AllReduceSumBlocking(comm_, losses.data(), global, DType::kF64, "losses"));
    double total = 0.0;
    for (double l : losses) total += l;
    // A non-finite loss is not an error: its gradients are non-finite too, and TrainStep skips
    // the update and counts it (StepStats::skipped_steps), as the CUDA backend does.
    *loss = static_cast<float>(total / double(global));
    return Status::Ok();
  }

  RunConfig cfg_;
  std::unique_ptr<Comm> own_comm_;
  Comm* comm_ = nullptr;
  int rank_ = 0, world_ = 1;
  int data_rank_ = 0;  // the position of this rank's micro-steps (hybrid_groups.h)
  ModeRules rules_;
  // Where the state is sharded: comm_ itself, or hsdp's shard group; hsdp's replica group
  // (null when it has one rank). shard_world_: the ranks the state is sharded over.
  HybridComms hybrid_;
  Comm* shard_comm_ = nullptr;
  Comm* replica_comm_ = nullptr;
  int shard_world_ = 1;
  std::unique_ptr<ModeExecutor> exec_;  // the mode's collectives over those comms
  Status init_;  // a failed hsdp split: every entry point returns it
  CpuModel model_;
  const ParamLayout& layout_;
  std::vector<int64_t> numel_;  // per unit

  UnitBuffers params_;  // full (capacity padded); fsdp: only while params_ready_
  bool params_ready_ = false;
  int64_t skipped_steps_ = 0;  // steps whose update was skipped (non-finite gradients)
  UnitBuffers param_shard_;       // fsdp/hsdp: this rank's slot of the master weights
  UnitBuffers m_, v_;             // ddp: full; zero/fsdp: this rank's slot
  UnitBuffers grad_shard_;        // zero/fsdp: this rank's slot of the summed gradient
  std::vector<UnitBuffers> acc_;  // accumulation slots (canonical partial sums)
};

}  // namespace

std::unique_ptr<TrainBackend> MakeCpuBackend(const RunConfig& cfg, Comm* comm) {
  return std::make_unique<CpuBackend>(cfg, comm);
}

}  // namespace forge
