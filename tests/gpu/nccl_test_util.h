// Multi-GPU test scaffolding: one thread per rank, each on its own device, the NCCL unique id
// handed over by an in-process IdRendezvous (the same hook MPI / TCP / the coordinator plug
// into), and per-rank failures collected for the main thread to report. Tests of what the
// data-parallel code does (not of NCCL) use RunRanksOnAnyGpus, which falls back to ranks
// sharing the GPUs (thread_nccl_comm.h) where there are fewer GPUs than ranks.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "thread_nccl_comm.h"
#include "worker/parallel/nccl_comm.h"

namespace forge {

// A rank's test value for element i: small multiples of 2^-10, exact in fp32 and bf16.
inline float Value(int rank, int64_t i) {
  return std::ldexp(float((rank * 7919 + i * 104729) % 2001) - 1000.0f, -10);
}

// Waits for an issued collective (or returns why it was not issued).
inline Status Finish(StatusOr<CommWorkPtr> w) { return w.ok() ? (*w)->Wait() : w.status(); }

// Rank 0 publishes the id; the other threads wait for it.
class ThreadRendezvous final : public IdRendezvous {
 public:
  Status Exchange(int rank, int, UniqueIdBytes* id) override {
    std::unique_lock<std::mutex> l(mu_);
    if (rank == 0) {
      id_ = *id;
      ready_ = true;
      cv_.notify_all();
      return Status::Ok();
    }
    if (!cv_.wait_for(l, std::chrono::seconds(60), [&] { return ready_; }))
      return Status::Unavailable("thread rendezvous: rank 0 never published the id");
    *id = id_;
    return Status::Ok();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool ready_ = false;
  UniqueIdBytes id_{};
};

// Per-rank failures, collected from the rank threads and reported by the main thread.
struct Errors {
  std::mutex mu;
  std::vector<std::string> list;
  void Add(int rank, const std::string& what) {
    std::lock_guard<std::mutex> l(mu);
    list.push_back("rank " + std::to_string(rank) + ": " + what);
  }
  void Check(int rank, bool ok, const std::string& what) {
    if (!ok) Add(rank, what);
  }
  void Ok(int rank, const Status& s, const std::string& what) {
    if (!s.ok()) Add(rank, what + ": " + s.ToString());
  }
};

// Runs body(rank, comm) on `world` threads, one device each.
template <typename Body>
void RunRanks(int world, const NcclCommOptions& base, Errors* errors, Body body) {
  ThreadRendezvous rdv;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      NcclCommOptions o = base;
      o.device = r;
      auto comm = MakeNcclComm(r, world, &rdv, o);
      if (!comm.ok()) {
        errors->Add(r, "MakeNcclComm: " + comm.status().ToString());
        return;
      }
      body(r, comm->get());
    });
  }
  for (auto& t : threads) t.join();
}

// As RunRanks where there are `world` GPUs. With fewer (at least one), the ranks share them
// (rank r on GPU r mod the count) over ThreadNcclComm, whose collectives run on the host: the
// modes' logic, the ranks' agreement and resume are tested, NCCL is not. Says so on stdout.
template <typename Body>
void RunRanksOnAnyGpus(int world, const NcclCommOptions& base, Errors* errors, Body body) {
  const int gpus = NcclVisibleDevices();
  if (gpus >= world) return RunRanks(world, base, errors, body);
  std::printf("[ thread ranks ] %d ranks on %d GPU(s), collectives on the host (not NCCL)\n",
              world, gpus);
  auto group = MakeThreadRankGroup(world, base.timeout_s);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r % gpus);
      auto comm = MakeThreadNcclComm(group, r, r % gpus);
      if (!comm.ok()) {
        errors->Add(r, "MakeThreadNcclComm: " + comm.status().ToString());
        return;
      }
      body(r, comm->get());
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace forge
