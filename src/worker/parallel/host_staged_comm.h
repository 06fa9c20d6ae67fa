// A host-buffer Comm on top of an NcclComm: each collective copies its host buffer into a
// device scratch, runs the NCCL collective and copies the result back before returning. For
// the trainer's few small host collectives (stop flags, evaluation losses, checkpoint reports)
// in a GPU job, so a GPU job needs no second transport (MPI) beside NCCL: torchrun-style and
// coordinator launches have none. Blocking and slow per call (two copies + a sync): not for
// bulk data.
#pragma once

#include <memory>

#include "worker/parallel/nccl_comm.h"

namespace forge {

// `nccl` must outlive the result. Unavailable in builds without CUDA.
StatusOr<std::unique_ptr<Comm>> MakeHostStagedComm(NcclComm* nccl);

}  // namespace forge
