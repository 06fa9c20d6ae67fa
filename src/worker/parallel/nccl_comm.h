// Comm over NCCL for device buffers: the GPU backend's data-parallel transport.
//
// Collectives run on the communicator's own stream (high priority, non-blocking), so they can
// overlap the compute stream; each completes a cudaEvent. Ordering with the compute stream:
//   - SetProducerStream(s): every later collective first waits (device-side) for the work
//     queued on `s` when it was issued, e.g. the backward kernels that wrote a gradient;
//   - CommWork::WaitOnStream(s): `s` waits for the collective without blocking the host
//     (the optimizer kernels after the all-reduce); CommWork::Wait() blocks the host.
// Buffers: f32, f64 or bf16 (sums included), in device memory of the comm's device.
//
// Setup: rank 0 creates the unique id, an IdRendezvous (rendezvous.h: MPI, TCP, or the
// coordinator's) hands it to everyone, and ncclCommInitRankConfig builds a non-blocking
// communicator, polled so that a rank that never shows up is a timeout, not a hang.
//
// Timing (SetTimeSink, comm_time_sink.h): with a sink, each collective is bracketed by two
// timing events on the communicator's stream (the first after the producer wait, so time
// queued behind compute is not counted), and the collective's device time is reported once the
// events completed: by Wait/Ready when they see it done, by the watchdog as it retires finished
// collectives, or by CountFinished. The host never waits for an event to read it.
//
// Failure: a watchdog thread polls ncclCommGetAsyncError and the oldest unfinished collective.
// An async NCCL error, or a collective older than options.timeout_s (counted from issue,
// including time queued behind earlier GPU work), aborts the communicator (ncclCommAbort, which
// also frees the hung kernels) and fails it with an error naming the rank and the collective:
// Wait() returns it, as do all later calls. If no thread takes the error within a grace period,
// the watchdog prints it and ends the process (MPI_Abort when MPI is up), so the launcher
// tears the job down.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/parallel/comm.h"
#include "worker/parallel/comm_time_sink.h"
#include "worker/parallel/rendezvous.h"

namespace forge {

struct NcclCommOptions {
  double timeout_s = 600.0;    // parallel.collective_timeout_s (also bounds init and teardown)
  int device = -1;             // CUDA device of this rank (usually the local rank); -1: current
  std::string name = "forge";  // NCCL communicator name (shows in NCCL logs)
  double abort_grace_s = -1;   // < 0: max(1 s, timeout_s / 2), capped at 30 s
  // Upper bound on the CTAs (SMs) a collective uses (ncclConfig_t::maxCTAs; 0: NCCL's
  // choice). With CudaBackendOptions::gemm_sm_margin the overlapped GEMMs leave that many
  // SMs to NCCL.
  int max_ctas = 0;
  // ncclConfig_t::CTAPolicy: 0 NCCL's default, 1 NCCL_CTA_POLICY_EFFICIENCY (fewest CTAs that
  // still give decent bandwidth: for collectives that overlap compute). -1: leave unset.
  int cta_policy = -1;
};

class NcclComm : public Comm {
 public:
  // The communication stream (a cudaStream_t).
  virtual void* stream() const = 0;
  // See above; nullptr removes the dependency (the caller orders things itself).
  virtual void SetProducerStream(void* stream) = 0;
  virtual int device() const = 0;
  // From now on, AllReduceSum of f32 buffers inside base[0, count) (one cudaMalloc allocation,
  // each call at most max_count floats) moves its bytes with the GPUs' copy engines instead of
  // NCCL's kernels (copy_engine_allreduce.h): fewer SMs taken from the compute it overlaps, and
  // a sum in rank order, the same bits on every rank. Collective. Needs every rank in its own
  // process (one per GPU, as workers run) on one host, mapping its peers with CUDA IPC;
  // otherwise an error on every rank, and NCCL keeps summing.
  virtual Status EnableCopyEngineAllReduce(float* base, int64_t count, int64_t max_count) = 0;
  // A zeroed device buffer of `bytes` from ncclMemAlloc, registered on this comm as a symmetric
  // window (NCCL_WIN_COLL_SYMMETRIC; engine.nccl_symmetric_memory): collectives on such
  // buffers, the same offset on every rank, may take NCCL's symmetric kernels (fewer SMs than
  // its ring) or run on registered buffers without staging copies. Where NCCL has no symmetric
  // kernels for the ranks (not all CUDA P2P, e.g. across nodes) it is plain memory. Collective:
  // every rank, the same sizes in the same order. Owned by the comm and freed with it, so the
  // comm must outlive its users. Only where SupportsSymmetricMemory() (Unavailable otherwise).
  virtual bool SupportsSymmetricMemory() const { return false; }
  virtual StatusOr<void*> AllocSymmetric(size_t bytes) {
    (void)bytes;
    return Status::Unavailable("symmetric NCCL memory: not on this comm");
  }
  // Comm::Split as an NcclComm (ncclCommSplit: the part shares this comm's device, options
  // and timeout, and has its own stream and watchdog). Collective over this comm.
  virtual StatusOr<std::unique_ptr<NcclComm>> SplitNccl(int color, int key,
                                                        std::string_view what) = 0;
  StatusOr<std::unique_ptr<Comm>> Split(int color, int key, std::string_view what) override {
    auto part = SplitNccl(color, key, what);
    if (!part.ok()) return part.status();
    return std::unique_ptr<Comm>(std::move(part).value());
  }

  // Collective times go to `sink` (null: not timed) for collectives issued from now on; the
  // sink must stay valid until it is replaced (SetTimeSink(nullptr) returns only once no call
  // into the old sink is running or can start). SplitNccl's parts start with this comm's sink:
  // they must be destroyed or given another before it goes.
  virtual void SetTimeSink(CommTimeSink* sink) = 0;
  virtual CommTimeSink* time_sink() const = 0;
  // The kind of the collective issued last (kBarrier before any).
  virtual CollectiveOp last_op() const = 0;
  // Reports the device time of every collective known finished now, without blocking.
  virtual void CountFinished() = 0;
};

// The copy-engine all-reduce waits for its peers' flags inside a stream, and a stream wait holds
// the hardware queue the stream is mapped to; with the driver's default 8 queues a step's ~10
// streams share them, so a compute stream could stall behind such a wait while the peer waits
// for that compute (a cycle across ranks). Call before the process's first CUDA call when
// parallel.ddp_allreduce is copy_engine: 32 queues, one per stream (a value already set stays).
inline void ReserveCudaQueuesForCopyEngine() { setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0); }

// Builds rank `rank` of `world`; collective over all ranks (each calls it, with its own
// device, at about the same time). Unavailable in builds without CUDA.
StatusOr<std::unique_ptr<NcclComm>> MakeNcclComm(int rank, int world, IdRendezvous* rendezvous,
                                                 const NcclCommOptions& options);

// Number of visible CUDA devices (0 without CUDA), for tests and launch checks.
int NcclVisibleDevices();

}  // namespace forge
