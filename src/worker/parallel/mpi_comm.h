// Comm over MPI (Open MPI) for host buffers: the CPU backend's data-parallel transport.
//
// Sums (all-reduce, reduce-scatter) are computed in Forge's canonical order (sum_order.h) by
// default: an all-to-all hands each rank every rank's copy of its chunk, the rank sums them
// with CanonicalSum, and (for all-reduce) an all-gather returns the chunks. Bandwidth is that
// of a ring all-reduce, and the result is bitwise independent of MPI's algorithm choice, of
// message sizes and of timing, which is what makes CPU data-parallel training bitwise equal
// to one process. canonical_sums=false uses MPI_Iallreduce / MPI_Ireduce_scatter_block.
//
// Every collective is non-blocking (MPI_I*); CommWork::Wait drives MPI progress. A watchdog
// thread watches the oldest unfinished collective: past options.timeout_s it fails the
// communicator with an error naming the rank and the collective (Wait returns it, as do all
// later calls), and if no thread takes that error within a grace period it prints it and
// aborts the job (MPI_Abort), so a hang never stays silent.
//
// One thread at a time may call into a given MpiComm.
#pragma once

#include <memory>

#include "common/status.h"
#include "worker/parallel/comm.h"

namespace forge {

// MPI_Init_thread asking for MPI_THREAD_MULTIPLE (the watchdog may call MPI_Abort while the
// owner thread is inside MPI). Safe to call more than once.
Status InitMpi();
// MPI_Finalize if MPI was initialised and not yet finalised.
void FinalizeMpi();
bool MpiInitialized();

struct MpiCommOptions {
  double timeout_s = 600.0;    // parallel.collective_timeout_s
  bool canonical_sums = true;  // see above
  // How long the watchdog lets a timed-out collective's error wait for a taker before it
  // aborts the job itself; < 0: max(1 s, timeout_s / 2), capped at 30 s.
  double abort_grace_s = -1.0;
};

// A communicator over all ranks of MPI_COMM_WORLD (duplicated, so Forge's collectives never
// mix with anyone else's). Collective: every rank must call it. Requires InitMpi().
StatusOr<std::unique_ptr<Comm>> MakeMpiComm(const MpiCommOptions& options);

}  // namespace forge
