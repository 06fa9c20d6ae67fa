// Ranks as threads that may share GPUs: an NcclComm whose collectives the ranks' threads carry
// out together on the host, so the data-parallel logic (what each mode reduces, gathers, frees
// and when; bitwise agreement between ranks; resume) can be tested on a machine with fewer GPUs
// than ranks. NCCL refuses two ranks on one GPU, hence this stand-in; it tests none of NCCL
// itself (nccl_comm_test.cc does, on enough GPUs).
//
// A collective is synchronous: the rank's thread first drains its producer stream (when set)
// and the communicator's own stream (which holds every cudaStreamWaitEvent the caller queued
// there), copies its send buffer to the host, meets the other ranks, computes the result in
// rank order (the same bits on every rank; run to run too), copies it back and returns a
// finished CommWork. Everything the caller orders through the communicator's stream or a
// CommWork therefore holds. Sums: f32 and f64 in their own precision, bf16 in fp32 rounded once
// to bf16 (NCCL rounds its bf16 partial sums as it goes, so bf16 results differ from NCCL's in
// the last bit; both are within the tests' bf16 bounds). Not supported: the copy-engine
// all-reduce (an error), collective timing (SetTimeSink is kept but nothing is timed) and CUDA
// graph capture (backends run eagerly with several ranks).
#pragma once

#include <memory>

#include "worker/parallel/nccl_comm.h"

namespace forge {

class ThreadRankGroup;  // what the ranks of one communicator share

std::shared_ptr<ThreadRankGroup> MakeThreadRankGroup(int world, double timeout_s);

// Rank `rank` of `group`, its stream on `device`. Each rank's thread uses its own comm.
StatusOr<std::unique_ptr<NcclComm>> MakeThreadNcclComm(std::shared_ptr<ThreadRankGroup> group,
                                                       int rank, int device);

}  // namespace forge
