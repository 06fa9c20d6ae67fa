#include "worker/parallel/copy_engine_allreduce.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace forge {
namespace {

constexpr int kMaxWorld = 8;  // one host
constexpr int kReady = 0, kDone = 1;

struct Sources {
  const float* p[kMaxWorld];
};

// out[i] = ((src0[i] + src1[i]) + src2[i]) + ...: the rank order, whatever the world size.
// `out` may be one of the sources (each element is read before it is written).
__global__ void SumInRankOrder(float* out, Sources src, int world, int64_t n) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t n4 = n / 4;
  for (int64_t i = first; i < n4; i += stride) {
    float4 acc = reinterpret_cast<const float4*>(src.p[0])[i];
    for (int q = 1; q < world; ++q) {
      const float4 v = reinterpret_cast<const float4*>(src.p[q])[i];
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    reinterpret_cast<float4*>(out)[i] = acc;
  }
  for (int64_t i = n4 * 4 + first; i < n; i += stride) {
    float acc = src.p[0][i];
    for (int q = 1; q < world; ++q) acc += src.p[q][i];
    out[i] = acc;
  }
}

// What a rank tells its peers at setup (all-gathered as raw bytes).
struct PeerBlob {
  int32_t pid = 0;
  int32_t device = 0;
  int32_t ok = 0;
  int32_t pad = 0;
  int64_t count = 0;
  char host[64] = {};
  cudaIpcMemHandle_t base_handle{}, flags_handle{};
};
static_assert(sizeof(PeerBlob) % 4 == 0, "the setup exchange moves whole 4-byte words");

using cuda::CeilDiv;
// Chunk of one rank: a multiple of 4 floats, so every chunk starts 16-byte aligned.
int64_t ChunkOf(int64_t n, int world) { return CeilDiv(CeilDiv(n, world), 4) * 4; }

std::string CudaErr(cudaError_t e) { return std::string(cudaGetErrorString(e)); }

}  // namespace

StatusOr<std::unique_ptr<CopyEngineAllReduce>> CopyEngineAllReduce::Create(
    int rank, int world, int device, float* base, int64_t count, int64_t max_count,
    const Exchange& exchange) {
  std::unique_ptr<CopyEngineAllReduce> c(new CopyEngineAllReduce());
  FORGE_RETURN_IF_ERROR(c->Init(rank, world, device, base, count, max_count, exchange));
  return StatusOr<std::unique_ptr<CopyEngineAllReduce>>(std::move(c));
}

CopyEngineAllReduce::~CopyEngineAllReduce() {
  for (cudaStream_t s : lanes_) {
    if (s) cudaStreamSynchronize(s);
  }
  // A peer's two mappings are stored together, once both opened (MapPeers).
  for (size_t p = 0; p < peer_base_.size(); ++p) {
    if (int(p) == rank_ || peer_base_[p] == nullptr) continue;
    cudaIpcCloseMemHandle(peer_base_[p]);
    cudaIpcCloseMemHandle(peer_flags_[p]);
  }
  for (cudaEvent_t e : lane_done_) {
    if (e) cudaEventDestroy(e);
  }
  if (fork_) cudaEventDestroy(fork_);
  if (release_) {
    cudaStreamSynchronize(release_);
    cudaStreamDestroy(release_);
  }
  if (release_values_) cudaFreeHost(release_values_);
  for (cudaStream_t s : lanes_) {
    if (s) cudaStreamDestroy(s);
  }
  if (scratch_) cudaFree(scratch_);
  if (flags_) cudaFree(flags_);
}

Status CopyEngineAllReduce::Init(int rank, int world, int device, float* base, int64_t count,
                         int64_t max_count, const Exchange& exchange) {
  rank_ = rank;
  world_ = world;
  device_ = device;
  base_ = base;
  count_ = count;
  if (world < 2 || world > kMaxWorld) {
    return Status::Invalid("copy-engine all-reduce: world " + std::to_string(world) +
                           " (supported: 2.." + std::to_string(kMaxWorld) + " GPUs of one host)");
  }
  if (base == nullptr || count <= 0 || max_count <= 0 || max_count > count) {
    return Status::Invalid("copy-engine all-reduce: bad registered range");
  }
  chunk_cap_ = ChunkOf(max_count, world);
  const char* queues = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  if (rank == 0 && (queues == nullptr || std::atoi(queues) < 16)) {
    std::fprintf(stderr,
                 "forge: copy-engine all-reduce with CUDA_DEVICE_MAX_CONNECTIONS=%s: its stream "
                 "waits may stall other streams sharing a hardware queue "
                 "(ReserveCudaQueuesForCopyEngine before the first CUDA call)\n",
                 queues ? queues : "unset (8)");
  }

  // Every step below that can fail on one rank only is recorded in `local` and still takes
  // part in both exchanges, so all ranks reach the same verdict.
  Status local = Status::Ok();
  auto note = [&local](const Status& s) {
    if (local.ok() && !s.ok()) local = s;
  };
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", &write_value_, 12000,
                                       cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess ||
      cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &wait_value_, 12000,
                                       cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    note(Status::Unavailable("the driver has no cuStreamWriteValue64/cuStreamWaitValue64"));
  }
  const size_t flag_bytes = 256;  // >= 2 * kMaxWorld * 8
  FORGE_CUDA_CHECK(cudaMalloc(&flags_, flag_bytes));
  FORGE_CUDA_CHECK(cudaMemset(flags_, 0, flag_bytes));
  FORGE_CUDA_CHECK(cudaMalloc(&scratch_, size_t(world) * size_t(chunk_cap_) * sizeof(float)));
  FORGE_CUDA_CHECK(cudaDeviceSynchronize());  // the memsets ran on the legacy stream
  int least = 0, greatest = 0;
  FORGE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  lanes_.assign(size_t(world), nullptr);
  lane_done_.assign(size_t(world), nullptr);
  for (int p = 0; p < world; ++p) {
    if (p == rank) continue;
    FORGE_CUDA_CHECK(cudaStreamCreateWithPriority(&lanes_[p], cudaStreamNonBlocking, greatest));
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&lane_done_[p], cudaEventDisableTiming));
  }
  FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  FORGE_CUDA_CHECK(cudaStreamCreateWithFlags(&release_, cudaStreamNonBlocking));
  FORGE_CUDA_CHECK(cudaHostAlloc(&release_values_, 2 * kMaxWorld * sizeof(uint64_t),
                                 cudaHostAllocDefault));

  PeerBlob mine;
  mine.pid = static_cast<int32_t>(getpid());
  mine.device = device;
  mine.count = count;
  gethostname(mine.host, sizeof(mine.host) - 1);
  cudaError_t e = cudaIpcGetMemHandle(&mine.base_handle, base);
  if (e == cudaSuccess) e = cudaIpcGetMemHandle(&mine.flags_handle, flags_);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    note(Status::Unavailable("cudaIpcGetMemHandle: " + CudaErr(e)));
  }
  mine.ok = local.ok() ? 1 : 0;
  std::vector<uint8_t> blobs(sizeof(PeerBlob) * size_t(world));
  FORGE_RETURN_IF_ERROR(exchange(&mine, blobs.data(), sizeof(PeerBlob)));
  if (local.ok()) note(MapPeers(blobs, sizeof(PeerBlob)));

  // The verdict: every rank's outcome, so nobody runs an all-reduce a peer cannot join.
  int32_t ok = local.ok() ? 1 : 0;
  std::vector<int32_t> oks(size_t(world), 0);
  FORGE_RETURN_IF_ERROR(exchange(&ok, oks.data(), sizeof(ok)));
  std::string failed;
  for (int p = 0; p < world; ++p) {
    if (!oks[p]) failed += (failed.empty() ? "" : ", ") + std::to_string(p);
  }
  if (!failed.empty()) {
    return Status::Unavailable("copy-engine all-reduce unavailable (ranks " + failed +
                               " could not map their peers" +
                               (local.ok() ? "" : "; rank " + std::to_string(rank) + ": " +
                                                      local.message()) +
                               ")");
  }
  return Status::Ok();
}

Status CopyEngineAllReduce::MapPeers(const std::vector<uint8_t>& blobs, size_t blob_bytes) {
  peer_base_.assign(size_t(world_), nullptr);
  peer_flags_.assign(size_t(world_), nullptr);
  PeerBlob me;
  std::memcpy(&me, blobs.data() + blob_bytes * size_t(rank_), sizeof me);
  peer_base_[rank_] = base_;
  peer_flags_[rank_] = flags_;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    PeerBlob b;
    std::memcpy(&b, blobs.data() + blob_bytes * size_t(p), sizeof b);
    const std::string who = "peer rank " + std::to_string(p);
    if (!b.ok) return Status::Unavailable(who + " failed its own setup");
    if (std::strncmp(b.host, me.host, sizeof b.host) != 0) {
      return Status::Unavailable(who + " is on host " + std::string(b.host) + ", not on " +
                                 me.host + " (CUDA IPC needs one host)");
    }
    if (b.count != count_) {
      return Status::Invalid(who + " registered " + std::to_string(b.count) +
                             " floats, this rank " + std::to_string(count_));
    }
    // CUDA IPC opens only other processes' memory. Threads of one process as ranks (with peer
    // access, or with host flags and peer copies) hang intermittently in their first
    // all-reduce on H100 pairs, cause not found (suspected: the driver's staging of
    // same-process peer copies). Workers are processes, so that path is refused rather than
    // kept untrusted.
    if (b.pid == me.pid) {
      return Status::Unavailable(who + " is a thread of this process (pid " +
                                 std::to_string(me.pid) +
                                 "): the copy-engine all-reduce needs one process per GPU, as "
                                 "forge-worker runs");
    }
    void* pb = nullptr;
    void* pf = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&pb, b.base_handle, cudaIpcMemLazyEnablePeerAccess);
    if (e == cudaSuccess) {
      e = cudaIpcOpenMemHandle(&pf, b.flags_handle, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) cudaIpcCloseMemHandle(pb);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return Status::Unavailable(who + ": cudaIpcOpenMemHandle: " + CudaErr(e));
    }
    peer_base_[p] = static_cast<float*>(pb);
    peer_flags_[p] = static_cast<uint64_t*>(pf);
  }
  return Status::Ok();
}

bool CopyEngineAllReduce::Covers(const void* buf, int64_t n) const {
  const auto* f = static_cast<const float*>(buf);
  return n >= 0 && f >= base_ && f + n <= base_ + count_ && ChunkOf(n, world_) <= chunk_cap_ &&
         (f - base_) % 4 == 0;
}

Status CopyEngineAllReduce::Signal(cudaStream_t s, int peer, int kind, uint64_t value) {
  auto fn = reinterpret_cast<PFN_cuStreamWriteValue64_v11070>(write_value_);
  const auto addr = reinterpret_cast<CUdeviceptr>(peer_flags_[peer] + kind * world_ + rank_);
  const CUresult r = fn(reinterpret_cast<CUstream>(s), addr, value, CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r != CUDA_SUCCESS) {
    return Status::Internal("copy-engine all-reduce: cuStreamWriteValue64 to rank " +
                            std::to_string(peer) + " failed (CUresult " + std::to_string(r) + ")");
  }
  return Status::Ok();
}

Status CopyEngineAllReduce::SignalPeers(cudaStream_t s, int kind, uint64_t value) {
  for (int p = 0; p < world_; ++p) {
    if (p != rank_) FORGE_RETURN_IF_ERROR(Signal(s, p, kind, value));
  }
  return Status::Ok();
}

Status CopyEngineAllReduce::OnLanes(cudaStream_t s,
                            const std::function<Status(int peer, cudaStream_t lane)>& work) {
  FORGE_CUDA_CHECK(cudaEventRecord(fork_, s));
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    FORGE_CUDA_CHECK(cudaStreamWaitEvent(lanes_[p], fork_, 0));
    FORGE_RETURN_IF_ERROR(work(p, lanes_[p]));
    FORGE_CUDA_CHECK(cudaEventRecord(lane_done_[p], lanes_[p]));
    FORGE_CUDA_CHECK(cudaStreamWaitEvent(s, lane_done_[p], 0));
  }
  return Status::Ok();
}

Status CopyEngineAllReduce::Await(cudaStream_t s, int kind, uint64_t value) {
  auto fn = reinterpret_cast<PFN_cuStreamWaitValue64_v11070>(wait_value_);
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    const auto addr = reinterpret_cast<CUdeviceptr>(flags_ + kind * world_ + p);
    const CUresult r = fn(reinterpret_cast<CUstream>(s), addr, value, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS) {
      return Status::Internal("copy-engine all-reduce: cuStreamWaitValue64 failed (CUresult " +
                              std::to_string(r) + ")");
    }
  }
  return Status::Ok();
}

void CopyEngineAllReduce::Release() {
  // GEQ compares cyclically ((int64)(flag - value) >= 0): far ahead, not UINT64_MAX.
  for (int i = 0; i < 2 * world_; ++i) release_values_[i] = seq_ + (uint64_t{1} << 62);
  cudaMemcpyAsync(flags_, release_values_, 2 * world_ * sizeof(uint64_t), cudaMemcpyDefault,
                  release_);
}

Status CopyEngineAllReduce::Enqueue(float* buf, int64_t n, cudaStream_t s) {
  if (!Covers(buf, n)) {
    return Status::Invalid("copy-engine all-reduce: buffer outside the registered range");
  }
  const uint64_t seq = ++seq_;
  const int64_t off = buf - base_;
  const int64_t chunk = ChunkOf(n, world_);
  const int64_t lo = std::min(n, rank_ * chunk), len = std::min(n, lo + chunk) - lo;
  const size_t bytes = size_t(len) * sizeof(float);

  // 1. Ready, both ways.
  FORGE_RETURN_IF_ERROR(SignalPeers(s, kReady, seq));
  FORGE_RETURN_IF_ERROR(Await(s, kReady, seq));
  if (len > 0) {
    // 2. Pull this rank's chunk of every peer, one lane each (they run side by side).
    FORGE_RETURN_IF_ERROR(OnLanes(s, [&](int p, cudaStream_t lane) {
      FORGE_CUDA_CHECK(cudaMemcpyAsync(scratch_ + p * chunk_cap_, peer_base_[p] + off + lo,
                                       bytes, cudaMemcpyDeviceToDevice, lane));
      return Status::Ok();
    }));
    // 3. The sum, in rank order, into this rank's own chunk.
    Sources src{};
    for (int q = 0; q < world_; ++q) {
      src.p[q] = q == rank_ ? buf + lo : scratch_ + q * chunk_cap_;
    }
    const int threads = 256;
    const int64_t want = CeilDiv(std::max<int64_t>(len / 4, 1), threads);
    const int blocks = static_cast<int>(std::min<int64_t>(want, 1024));
    SumInRankOrder<<<blocks, threads, 0, s>>>(buf + lo, src, world_, len);
    FORGE_CUDA_CHECK(cudaGetLastError());
    // 4. Push the sum to every peer; each lane then sets its peer's done flag (fenced after
    // the copy). The stream waits for the lanes: the chunk they read is this rank's gradient.
    FORGE_RETURN_IF_ERROR(OnLanes(s, [&](int p, cudaStream_t lane) {
      FORGE_CUDA_CHECK(cudaMemcpyAsync(peer_base_[p] + off + lo, buf + lo, bytes,
                                       cudaMemcpyDeviceToDevice, lane));
      return Signal(lane, p, kDone, seq);
    }));
  } else {
    FORGE_RETURN_IF_ERROR(SignalPeers(s, kDone, seq));
  }
  // 5. Every peer's chunk has arrived here.
  return Await(s, kDone, seq);
}

}  // namespace forge
