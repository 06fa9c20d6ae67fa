// Data parallelism for the CUDA backend over NCCL, kept apart from the model: it plugs into
// CudaModel's per-unit hooks (cuda_model.h) and owns every collective of a step. The mode's
// per-unit collectives (which one sums a gradient, hsdp's replica sum, the gathers) are
// worker/parallel/mode_executor.h's, the CPU backend's too: this class calls them from the
// hooks and is their storage (device buffers, the bf16 staging, the hand-over between the
// shard and replica streams); when and on which stream they run, and the overlap, are its own.
//
//   ddp    each unit's gradient is all-reduced on the NCCL stream as soon as the unit's
//          backward finished (on the step's last micro-step only), overlapped with the
//          backward of the units before it; the compute stream waits for all of them just
//          before the optimizer. Gradients are then identical everywhere, so the grad norm
//          needs no collective; AdamW runs on the full model on every rank, deferred into
//          the next forward as on one GPU (CudaModelOptions::defer_update): the embedding's
//          sum ends the backward, and the update after it would have nothing to hide behind
//          at the step's end. A tied embedding's gradient is summed in two parts where that
//          moves fewer bytes at the end (lookup_apart_rule.h; CudaModelHooks::lookup_grad):
//          the LM head's, complete at the backward's start, all-reduced in block L-1's comm
//          window; then every rank's lookup rows and tokens all-gathered (world x tokens x d
//          bf16, not the vocabulary x d of the whole gradient) and added into the sum in the
//          same order on every rank.
//   zero1  each unit's gradient is reduce-scattered the same way into this rank's fp32 slot;
//   zero2  the grad norm's sum of squares is all-reduced (one float); AdamW updates this
//          rank's slots of the master weights and moments and writes their bf16 values into
//          the full compute copy, which is then all-gathered in place unit by unit; the next
//          forward waits for each unit's gather just before it reads the unit, so the gathers
//          overlap the forward of the units before. AdamW is deferred (CudaModelOptions::
//          defer_update): it runs unit by unit on the model's low-priority update stream, and
//          each unit's gather waits for that unit's update, so the update overlaps the next
//          forward too (worker/model/deferred_update.h). On the GPU zero2 is zero1: the flat
//          gradient buffer is the backward's working memory either way (fsdp is the mode
//          that frees it).
//   fsdp   no full-size parameters or gradients stay: each rank keeps its slots (fp32 master,
//          moments, gradient sum and the bf16 values). Blocks are gathered into two rotating
//          bf16 buffers just before use, the next block prefetched (forward: l+1 while l runs;
//          backward: l-1 while l runs); their gradients go to two rotating fp32 buffers and
//          are reduce-scattered into the slots as soon as each block's backward ends, on every
//          micro-step (accumulated in the slot). The root units (embedding, tied with the LM
//          head, and the final unit: the final norm, with an untied head) stay gathered for
//          the whole step, as is usual for FSDP's root module: they are used at both ends of
//          the pass. AdamW is deferred as under zero (root units first, then the blocks in
//          order), and right after the norm the next step's embedding, first two blocks and
//          final unit are gathered, in that order (the forward needs the final unit last), each
//          once its update wrote its slot; every later block's gather waits for its own update.
//          An untied embedding is looked up in the slots where that moves fewer bytes
//          (FsdpLooksUpInSlots, lookup_apart_rule.h; CudaModelHooks::lookup_rows, lookup_grad):
//          the forward all-gathers the ranks' tokens, each rank writes the elements of all
//          their rows its slot holds (-0 elsewhere) and a bf16 reduce-scatter hands every rank
//          its rows, bit for bit the lookup in the gathered table; the backward all-gathers
//          every rank's lookup rows and adds those its slot holds into the gradient slot, each
//          rank's rows summed first and those sums in rank order, as a reduce-scatter of every
//          rank's own gradient adds them on two ranks. The table is never gathered, and the
//          step's first and last collectives move rows instead of the vocabulary. hsdp does
//          the same in its shard group.
//          FP8 (delayed scaling, after its first step): the blocks' linear weights are
//          gathered as E4M3 bytes, half the bytes of bf16. Once per parameter update (after
//          AdamW and the scale update, or SetParams / new scaling state) each rank casts its slot
//          of each block's four weights with the weights' scales into a per-block FP8 slot
//          copy, on the NCCL stream just before the block's first gather (their amaxes kept
//          aside and max-folded into the model's weight amax slots before ShareFp8Amax, so an
//          evaluation pass's ResetAmax cannot drop them); the
//          gather moves those bytes (as bf16 pairs: an all-gather does no arithmetic) into
//          a rotating FP8 unit buffer, and the blocks' other elements (norm weights), packed
//          per rank, in a second small bf16 all-gather into the bf16 buffer. The model takes
//          the gathered E4M3 weights (CudaModelHooks::fp8_weights) instead of casting the
//          stale bf16 ones; every cast is elementwise with one scale per weight, so the bytes,
//          amaxes and scale_invs are those of casting the whole weight. Steps whose casts
//          measure their tensor first (the current recipe, the delayed recipe's first step)
//          gather bf16 and cast in the model, as do shapes the byte transpose cannot take
//          (ChooseFp8Gather, fp8_gather_rule.h, decides, as it does for the memory estimate
//          and `forge plan`; its note, logged at start-up, says which path runs and why).
//   hsdp   fsdp over `comm`, the shard group (parallel.shard_group_size consecutive ranks,
//          worker/parallel/hybrid_groups.h), plus the replica group `replica` (the ranks
//          holding the same shard): on the step's last micro-step each unit's gradient slot,
//          once reduce-scattered (and accumulated), is all-reduced over `replica` on that
//          comm's own stream, overlapping the rest of the backward; the compute stream waits
//          for both comms before the optimizer. The loss and the FP8 amaxes are reduced over
//          both groups, the grad norm over the shard group only (replicas hold the same
//          slots) and then broadcast from replica 0 (shard groups may sum it in different
//          NCCL orders). Every replica group then applies the same update to the same slots.
//          The backend maps shard_group_size 1 to ddp and the world size to fsdp.
//
// parallel.grad_reduce bf16 (ddp, zero1, zero2) halves the gradient collectives' bytes. ddp
// keeps the summed gradient in bf16: the model's grads16 (CudaModelOptions::grads16), where
// each unit is all-reduced in place and the norm and AdamW read it (no widening pass); in a
// step of one micro-step the BF16 weight GEMMs write the blocks' matrices there directly, so
// only the rest (norm weights, embedding) is cast (CudaModel::CastUnitGradsToBf16). zero: on
// the NCCL stream, each unit's fp32 gradient is rounded to bf16 into one comm buffer (sized for
// the largest padded unit), reduce-scattered in bf16 (in place) and widened into this rank's
// fp32 slot. One buffer is enough: cast,
// collective and widening of a unit all run in order on the NCCL stream, so the next unit's
// cast cannot start before the previous unit's widening has read the buffer (no events
// needed). The sum is NCCL's, computed once per element and copied to every rank, so ranks stay
// bitwise equal; the error against an fp32 sum is the rounding of each rank's contribution
// plus NCCL's bf16 partial sums (about world * 2^-8 relative, per element). fsdp stays fp32
// (its reduce-scatters read rotating buffers of their own): Create rejects bf16 for it.
//
// parallel.ddp_allreduce copy_engine (ddp, fp32): the flat gradient buffer is registered with
// NcclComm::EnableCopyEngineAllReduce at Create, so the same AllReduceSum calls move their bytes
// with the copy engines (worker/parallel/copy_engine_allreduce.h); nothing else here changes.
//
// Comm windows (every mode): a unit's gradient collective is not started the moment the
// unit's backward ends but at the next block's attention backward (CudaModelHooks::comm_window),
// so it overlaps kernels of many short CTAs instead of the GEMMs: cuBLASLt's persistent GEMMs
// launch one CTA per SM, and the CTAs that find their SM held by the collective's kernel run
// only after the others finish, which made the backward GEMMs ~17% slower under ddp. Block 0
// and the embedding (no window after them) start at once. fsdp's block all-gathers move the same
// way: the next block's gather starts at this block's attention (forward: forward_window;
// backward: comm_window) rather than at the block's start, where the QKV GEMM runs; its
// reduce-scatters still free each rotating buffer in time, as block l's starts in block l-1's
// window and block l-2, the buffer's next user, waits for it. CudaBackendOptions::comm_windows
// off: at once, always.
//
// The loss of a step is the mean over ranks of each rank's mean (equal token counts), summed
// by one all-reduce of a float; callers divide by the world size. Gradients use
// dloss = 1 / (tokens * world), so the summed gradient is the global mean's.
//
// Every call only enqueues work (the gathers of GatherSlots end in a host sync).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "kernels/cuda/adamw.h"
#include "worker/model/cuda_model.h"
#include "worker/model/unit_buffers.h"
#include "worker/parallel/mode_executor.h"
#include "worker/parallel/mode_rules.h"
#include "worker/parallel/nccl_comm.h"
#include "worker/parallel/stream_wait_timer.h"

namespace forge {

class CudaDataParallel final : private ModeStorage {
 public:
  // `comm` (and `replica`) and `model` must outlive this. `rules` (mode_rules.h) are those of
  // a world of more than one rank. The model must have been created with shard_world =
  // comm->world(), shard_rank = comm->rank(), and shard_optimizer and shard_params as the
  // rules say. hsdp: `comm` is the shard group, `replica` the replica group. With
  // `symmetric_memory`, fsdp's gather and reduce-scatter buffers come from
  // comm->AllocSymmetric (the model's from CudaModelOptions::collective_alloc).
  static StatusOr<std::unique_ptr<CudaDataParallel>> Create(
      NcclComm* comm, const ModeRules& rules, CudaModel* model,
      GradReduce grad_reduce = GradReduce::kFp32, DdpAllReduce ddp_allreduce = DdpAllReduce::kNccl,
      bool comm_windows = true, NcclComm* replica = nullptr, bool fp8_gather = true,
      bool symmetric_memory = false);
  ~CudaDataParallel() override;

  // Ranks in all: the shard comm's world times the replicas.
  int world() const { return world_ * replicas_; }
  bool sharded() const { return rules_.sharded(); }
  // fsdp: gradients leave the rotating buffers on every micro-step, so every micro-step's
  // backward overwrites them (accumulate_grads false) and runs the grad hooks.
  bool fsdp() const { return rules_.shard_params; }
  // ddp with bf16 collectives: sums in the model's bf16 gradient copy (CudaModelOptions::grads16).
  bool ddp_bf16() const { return !sharded() && grad_reduce_ == GradReduce::kBf16; }
  // Before each ForwardBackward of a step: whether it is the step's first micro-step (fsdp
  // reduce-scatters the first into the gradient slots and adds the later ones).
  // `last`: the step's last micro-step (a step of one micro-step lets ddp's bf16 collectives
  // take the weight GEMMs' bf16 output directly, CudaModelHooks::grads_to_bf16).
  void BeginMicroStep(bool first, bool last) {
    first_micro_ = first;
    last_micro_ = last;
    const bool direct = ddp_bf16() && first && last;
    grad_hooks_.grads_to_bf16 = allreduce_hooks_.grads_to_bf16 = direct;
    // ddp sums the tied embedding's lookup rows apart on the pass that sums the gradient;
    // fsdp adds an untied one's into the slot on every micro-step.
    grad_hooks_.lookup_grad = last || fsdp() ? allreduce_hooks_.lookup_grad : nullptr;
  }
  // The model's parameters (SetParams) or FP8 scaling state were replaced: fsdp's gathered
  // copies and FP8 slot casts are stale.
  void ParamsChanged();
  // fsdp in FP8: how the blocks' weights are gathered and why, one line for the start-up log
  // (empty otherwise).
  const std::string& fp8_gather_note() const { return fp8_gather_note_; }
  // Block gathers so far that moved the linear weights as E4M3 bytes.
  int64_t fp8_block_gathers() const { return fp8_block_gathers_; }

  // Hooks for a pass that only reads parameters (forward-only passes, micro-steps before the
  // last) and for the pass that completes a step's gradient: all_reduce forces all-reduce in
  // every mode (ComputeGradients, where every rank wants the full gradient).
  const CudaModelHooks* read_hooks() const { return &read_hooks_; }
  const CudaModelHooks* grad_hooks(bool all_reduce) const {
    return all_reduce ? &allreduce_hooks_ : &grad_hooks_;
  }

  // The compute stream waits for every collective issued so far (the gradient collectives of
  // the grad hooks among them).
  Status JoinComm(cudaStream_t compute);
  // stats[0] = this rank's mean loss -> summed over ranks (divide by world()).
  Status SumLoss(float* stats, cudaStream_t compute);
  // After JoinComm: grad norm (stats[1] = global sum of squares), clipping, AdamW, and for
  // zero the parameter all-gathers. stats[0] is summed over ranks as by SumLoss.
  Status Optimize(const cuda::AdamWHyper* hyper, float* stats, cudaStream_t compute);
  // zero: the full fp32 units of a sharded buffer (master, m or v: pick with `which`),
  // gathered through the gradient buffer (scratch between steps). Collective; synchronises.
  enum class State { kMaster, kM, kV, kGrad };
  Status GatherSlots(State which, UnitBuffers* out, cudaStream_t compute);
  // With a time sink on the comm (NcclComm::SetTimeSink): reports the compute stream's stalls
  // at its waits for collectives (exposed wait) and the collectives' device time, for all the
  // work known complete now; never blocks. The backend calls it at each step's start and after
  // a step's final sync.
  void CountCommTimes();

 private:
  CudaDataParallel(NcclComm* comm, const ModeRules& rules, CudaModel* model, GradReduce grad_reduce,
                   DdpAllReduce ddp_allreduce);
  Status Init();
  Status EnableCopyEngine();
  // The NCCL stream waits for `e` (recorded on a stream the collective depends on).
  Status CommWaits(cudaEvent_t e);
  Status CommWaitsStream(cudaStream_t s);
  // The compute stream waits for `e` (on the NCCL stream, after a collective of kind `op`).
  Status ComputeWaits(cudaStream_t compute, cudaEvent_t e, CollectiveOp op);
  // FP8: every rank's amax slots all-gathered and max-reduced in place, so all ranks derive
  // the same scales (and a checkpoint's rank-0 scaling state is every rank's).
  Status ShareFp8Amax(cudaStream_t compute);
  Status OnGradReady(int unit, cudaEvent_t compute_done, cudaEvent_t wgrad_done,
                     bool all_reduce);
  // ddp with a tied embedding (CudaModelHooks::lookup_grad): every rank's lookup rows and
  // tokens all-gathered and added into the embedding's summed gradient, on the NCCL stream.
  Status OnLookupGrad(const cuda::bf16* dx0, const int32_t* tokens, int64_t n,
                      cudaStream_t compute);
  // fsdp with an untied embedding looked up in the slots (see the file comment): the rows of
  // this rank's n tokens into `out` (CudaModelHooks::lookup_rows), and every rank's lookup rows
  // added into the embedding's gradient slot (lookup_grad).
  Status OnSlotLookup(const int32_t* tokens, int64_t n, cuda::bf16* out, cudaStream_t compute);
  Status OnSlotLookupGrad(const cuda::bf16* dx0, const int32_t* tokens, int64_t n,
                          cudaStream_t compute);
  // n lookup rows a rank fit the lookup buffers.
  Status CheckLookupRows(int64_t n) const;
  // For a lookup of n rows a rank in the slots: the embedding's unit and the element range
  // [lo, hi) of the flat table this rank's slot holds.
  struct EmbeddingSlot {
    int unit = 0;
    int64_t lo = 0, hi = 0;
  };
  StatusOr<EmbeddingSlot> LookupSlot(int64_t n) const;

  Status IssueGradCollective(int unit, cudaEvent_t compute_done, cudaEvent_t wgrad_done,
                             bool all_reduce);
  // Comm windows (see the file comment): the collectives of waiting_ start here.
  Status OnCommWindow(int unit, cudaStream_t compute);
  Status IssueWaiting();
  // ModeStorage (mode_executor.h), on the NCCL stream: ddp's bf16 sums in grads16 and its norm
  // share; zero's bf16 sums through comm_bf16_ (see the file comment); fsdp's rotating
  // gradient buffers, their later micro-steps added into the slot; hsdp's replica stream
  // ordered after the shard stream.
  StatusOr<GradBuffers> GradToReduce(int unit, CollectiveOp op) override;
  Status GradReduced(int unit, CollectiveOp op, CommWork* work) override;
  StatusOr<float*> HandOverToReplicas(int unit, CollectiveOp op, CommWork* work) override;
  Status GradDone(int unit) override;
  void* ParamsToGather(int unit, DType* dtype) override;
  Status ParamsGathered(int unit) override;
  Status OnBeforeForward(int unit, cudaStream_t compute);
  Status GatherParams(cudaStream_t compute);
  // fsdp
  Status InitFsdp();
  // fsdp in FP8 (see the file comment): sets up the E4M3 gather where it applies, and the note.
  Status InitFp8Gather(bool enabled);
  // This rank's slot of block l's linear weights cast to E4M3 (on the NCCL stream, before
  // the block's first gather after an update).
  Status CastFp8Slot(int l, const cuda::bf16* slot16, cudaStream_t s);
  // CudaModelHooks::fp8_weights: block `unit`'s gathered E4M3 unit, or null.
  const uint8_t* GatheredFp8(int unit) const;
  Status OnFsdpForward(int unit, cudaStream_t compute);
  // fsdp with comm windows: the next block's gather, from block `unit`'s attention forward.
  Status OnForwardWindow(int unit, cudaStream_t compute);
  Status OnFsdpBackward(int unit, cudaStream_t compute);
  // hsdp: the replica stream waits for everything issued on the shard comm's stream so far.
  Status ReplicaWaitsShard();
  // hsdp: n floats of `buf` (device) summed over the replica group, after the shard stream's
  // work; the compute stream waits for it.
  Status SumOverReplicas(float* buf, int64_t n, const char* what, cudaStream_t compute);
  Status CastSlot(int u, cuda::bf16* full);
  Status GatherCastSlot(int u, cuda::bf16* full);
  // Root unit i (0: the embedding, 1: the final unit) gathered once per parameter update; the
  // first call after an update also starts the FP8 slot casts' new round.
  Status EnsureRoot(int i, cudaStream_t compute, bool wait);
  Status Release(int layer, cudaStream_t compute);
  Status Ensure(int layer, cudaStream_t compute, bool wait);
  Status AllocDevice(void** p, size_t bytes);
  Status AllocCollective(void** p, size_t bytes);
  int block_of(int unit) const;  // layer index, or -1 for a root unit
  // fsdp: the rotating (block) or root fp32 gradient buffer unit u's backward writes.
  float* FsdpGradBuffer(int unit) const;

  NcclComm* comm_;
  NcclComm* replica_ = nullptr;  // hsdp's replica group (null otherwise)
  int replicas_ = 1;
  cudaStream_t replica_stream_ = nullptr;
  cudaEvent_t shard_point_ = nullptr;    // shard stream point the replica stream waits for
  cudaEvent_t replica_point_ = nullptr;  // replica stream point the compute stream waits for
  ModeRules rules_;
  std::unique_ptr<ModeExecutor> exec_;  // over comm_ and replica_ (Init)
  CudaModel* model_;
  GradReduce grad_reduce_;
  DdpAllReduce ddp_allreduce_;
  cuda::bf16* comm_bf16_ = nullptr;  // grad_reduce bf16: the largest padded unit
  int rank_ = 0, world_ = 1;
  cudaStream_t nccl_stream_ = nullptr;
  cudaEvent_t compute_point_ = nullptr;        // compute-stream point the NCCL stream waits for
  std::vector<cudaEvent_t> params_gathered_;  // per unit, on the NCCL stream (zero)
  std::vector<bool> gather_pending_;
  CudaModelHooks read_hooks_, grad_hooks_, allreduce_hooks_;
  cudaEvent_t comm_point_ = nullptr;  // NCCL-stream point the compute stream waits for
  StreamWaitTimer waits_;             // the compute stream's stalls at those points
  // Gradient collectives held for the next comm window (ddp, zero1, zero2).
  struct WaitingUnit {
    int unit;
    cudaEvent_t compute_done, wgrad_done;
    bool all_reduce;
  };
  bool comm_windows_ = false;  // CudaBackendOptions::comm_windows
  std::vector<WaitingUnit> waiting_;

  // ddp, tied embedding, and fsdp's lookup in the slots: every rank's lookup rows [world *
  // tokens, d], their tokens, and the embedding backward's scratch for that many rows (null
  // when neither path runs).
  cuda::bf16* lookup_dx_ = nullptr;
  int32_t* lookup_tokens_ = nullptr;
  void* lookup_ws_ = nullptr;
  size_t lookup_ws_bytes_ = 0;
  // The embedding's last grad_ready came from a pass whose hooks take the lookup apart: its
  // all-reduce carries the LM head's part, and OnLookupGrad completes it.
  bool emb_lookup_apart_ = false;
  bool slot_lookup_ = false;  // fsdp: the untied embedding looked up in the slots

  // fsdp state (see the file comment).
  bool first_micro_ = true;
  bool last_micro_ = true;
  std::vector<void*> allocations_;
  // [max(world, replicas) + 1, amax slots of both groups] (FP8 only)
  float* fp8_gathered_ = nullptr;
  cuda::bf16* root_params_[2] = {};  // embedding (null with slot_lookup_), final unit (gathered)
  float* root_grads_[2] = {};        // [0] also GatherSlots' scratch (largest unit)
  bool share_root_grads_ = false;    // [1] is [0]: an untied head's final unit (InitFsdp)
  cudaEvent_t root_gathered_[2] = {};  // NCCL stream: root_params_[i] filled (or the lookup's rows)
  bool root_valid_[2] = {false, false};
  bool slots_new_ = true;              // an update since the FP8 slot casts' last round began
  cudaEvent_t root_rs_done_ = nullptr;  // last reduce-scatter out of a root gradient buffer
  bool root_rs_pending_ = false;
  cuda::bf16* block_params_[2] = {};
  float* block_grads_[2] = {};
  int holder_[2] = {-1, -1};            // layer whose parameters block_params_[b] holds
  cudaEvent_t gathered_[2] = {};        // NCCL stream: block_params_[b] filled
  cudaEvent_t released_[2] = {};        // compute stream: last reader of block_params_[b]
  bool released_pending_[2] = {false, false};
  cudaEvent_t rs_done_[2] = {};         // NCCL stream: block_grads_[b] read by its RS
  bool rs_pending_[2] = {false, false};

  // fsdp's E4M3 gather (InitFp8Gather; see the file comment).
  bool fp8_gather_ = false;       // set up: the path runs whenever fp8_slots_valid_
  bool symmetric_memory_ = false;  // AllocCollective from the comm's symmetric memory
  bool fp8_slots_valid_ = false;  // fp8_slots_ are the current slots cast with current scales
  bool holder_fp8_[2] = {false, false};  // block_params8_[b] holds holder_[b]'s E4M3 weights
  int64_t fp8_slot_ = 0;                  // a block's slot (elements = bytes in E4M3)
  uint8_t* fp8_slots_ = nullptr;          // [L, fp8_slot_]: this rank's slots, E4M3 where linear
  std::vector<bool> fp8_slot_cast_;       // [L]: block l's slot cast since the last update
  uint8_t* block_params8_[2] = {};        // gathered E4M3 units (padded, bytes)
  float* fp8_slot_amax_ = nullptr;        // [L * 4] slots of 4 floats: the slot casts' amaxes
  float** fp8_weight_amax_ = nullptr;     // [L * 4] (device): the model's weight amax slots
  // A block's other elements (norm weights): rank r's part is packed into nl_max_ bf16 values,
  // all-gathered, and scattered back to their unit offsets.
  int64_t nl_count_ = 0, nl_max_ = 0, nl_mine_ = 0;
  int64_t* nl_pack_ = nullptr;          // [nl_mine_]: offsets in this rank's slot
  int64_t* nl_dst_ = nullptr;           // [nl_count_]: unit offset of each element
  int64_t* nl_src_ = nullptr;           // [nl_count_]: its position in nl_gathered_
  cuda::bf16* nl_send_ = nullptr;       // [nl_max_]
  cuda::bf16* nl_gathered_ = nullptr;   // [world, nl_max_]
  std::string fp8_gather_note_;
  int64_t fp8_block_gathers_ = 0;
};

}  // namespace forge
