// Collective communication between the ranks of one data-parallel job. Two implementations:
// MpiComm (host buffers, Open MPI; mpi_comm.h) and NcclComm (device buffers; nccl_comm.h),
// plus the single-process comm below (world 1: every collective is a copy or a no-op).
//
// Semantics follow NCCL so both implementations are interchangeable:
//   AllReduceSum(buf, n)                  in place: buf = sum over ranks of buf
//   ReduceScatterSum(send, recv, n)       send holds world*n elements; rank r receives
//                                         elements [r*n, (r+1)*n) of the sum
//   AllGather(send, recv, n)              recv (world*n) = concatenation of every rank's send (n)
//   Broadcast(buf, n, root)               buf = root's buf
//   Barrier()
//   Split(color, key)                     a new communicator of the ranks with the same color
// In place is allowed where NCCL allows it: AllGather with send == recv + rank*n, and
// ReduceScatterSum with recv == send + rank*n.
//
// Every call only starts the collective and returns a CommWork; buffers must stay untouched
// (and alive) until its Wait() returns. All ranks must issue the same collectives in the same
// order. A collective that does not complete within the communicator's timeout
// (parallel.collective_timeout_s) is an error naming the rank and the collective: Wait()
// returns it, and the job is aborted if nobody waits (MpiComm's watchdog; NCCL async error
// checking).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace forge {

enum class DType { kF32, kF64, kBF16 };
int DTypeSize(DType t);
const char* DTypeName(DType t);

enum class CollectiveOp { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };
inline constexpr int kCollectiveKinds = 5;
static_assert(int(CollectiveOp::kBarrier) + 1 == kCollectiveKinds, "one count per kind");
const char* CollectiveName(CollectiveOp op);  // "all_reduce", "reduce_scatter", ...

// Completion handle of one collective.
class CommWork {
 public:
  virtual ~CommWork() = default;
  // Blocks until the collective completed on this rank. Errors (timeout, communicator
  // failure) name the rank, the collective and its sequence number.
  virtual Status Wait() = 0;
  // True once complete; never blocks (errors surface through Wait()).
  virtual bool Ready() = 0;
  // Makes the device stream `stream` (a cudaStream_t) wait for completion without blocking
  // the host (NCCL); host implementations simply Wait().
  virtual Status WaitOnStream(void* stream) {
    (void)stream;
    return Wait();
  }
};

using CommWorkPtr = std::unique_ptr<CommWork>;

class Comm {
 public:
  virtual ~Comm() = default;
  virtual const char* name() const = 0;  // "local", "mpi", "nccl"
  virtual int rank() const = 0;
  virtual int world() const = 0;

  // `what` labels the collective in error messages ("grad block.3"); counts are elements.
  virtual StatusOr<CommWorkPtr> AllReduceSum(void* buf, int64_t count, DType dtype,
                                             std::string_view what = {}) = 0;
  virtual StatusOr<CommWorkPtr> ReduceScatterSum(const void* send, void* recv, int64_t recv_count,
                                                 DType dtype, std::string_view what = {}) = 0;
  virtual StatusOr<CommWorkPtr> AllGather(const void* send, void* recv, int64_t send_count,
                                          DType dtype, std::string_view what = {}) = 0;
  virtual StatusOr<CommWorkPtr> Broadcast(void* buf, int64_t count, DType dtype, int root,
                                          std::string_view what = {}) = 0;
  virtual StatusOr<CommWorkPtr> Barrier(std::string_view what = {}) = 0;

  // Collective over this comm (every rank calls it, at the same point in its sequence of
  // collectives): the ranks passing the same `color` (>= 0) form a new communicator of the same
  // kind, ranked by `key` (ties by rank here). Its collectives are its own (they never match
  // this comm's), it has its own timeout watchdog, and it may be used alongside this one.
  // MPI_Comm_split for MpiComm, ncclCommSplit for NcclComm, a world-1 comm for the local one.
  // Comms that cannot split say so (FailedPrecondition).
  virtual StatusOr<std::unique_ptr<Comm>> Split(int color, int key, std::string_view what = {});

  // Ends the whole job now (every rank), after printing `why` on stderr: for fatal errors
  // where other ranks may be blocked in a collective this rank will never join.
  [[noreturn]] virtual void Abort(const Status& why) = 0;
};

// Start + Wait in one call.
Status AllReduceSumBlocking(Comm* comm, void* buf, int64_t count, DType dtype,
                            std::string_view what = {});
Status AllGatherBlocking(Comm* comm, const void* send, void* recv, int64_t send_count, DType dtype,
                         std::string_view what = {});
Status BroadcastBlocking(Comm* comm, void* buf, int64_t count, DType dtype, int root,
                         std::string_view what = {});
Status BarrierBlocking(Comm* comm, std::string_view what = {});

// A handle whose collective already completed (for implementations that finish in the call).
CommWorkPtr CompletedWork();

// The world-1 communicator for host buffers: rank 0 of 1, every collective completes at once
// (a copy where send and recv differ, else nothing). Single-process training uses it, so one
// code path serves every world size.
std::unique_ptr<Comm> MakeLocalComm();

// One issued collective as the communicators keep it: what DescribeCollective names, and when
// it was issued (for the timeout and the time sink).
struct CollectiveCall {
  uint64_t seq = 0;
  CollectiveOp kind = CollectiveOp::kBarrier;
  std::string what;
  int64_t count = 0;
  DType dtype = DType::kF32;
  std::chrono::steady_clock::time_point start;
};

// "rank R: all_reduce #N (what, count x dtype)": how errors name a collective.
std::string DescribeCollective(int rank, CollectiveOp op, uint64_t seq, std::string_view what,
                               int64_t count, DType dtype);

}  // namespace forge
