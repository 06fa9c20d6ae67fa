#include "worker/parallel/comm.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/named_values.h"

namespace forge {

int DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kBF16: return 2;
  }
  return 0;
}

const char* DTypeName(DType t) {
  static constexpr std::array<NamedValue<DType>, 3> kNames{
      {{"f32", DType::kF32}, {"f64", DType::kF64}, {"bf16", DType::kBF16}}};
  return NameOf(kNames, t);
}

const char* CollectiveName(CollectiveOp op) {
  static constexpr std::array<NamedValue<CollectiveOp>, 5> kNames{
      {{"all_reduce", CollectiveOp::kAllReduce},
       {"reduce_scatter", CollectiveOp::kReduceScatter},
       {"all_gather", CollectiveOp::kAllGather},
       {"broadcast", CollectiveOp::kBroadcast},
       {"barrier", CollectiveOp::kBarrier}}};
  return NameOf(kNames, op);
}

std::string DescribeCollective(int rank, CollectiveOp op, uint64_t seq, std::string_view what,
                               int64_t count, DType dtype) {
  std::string s = "rank " + std::to_string(rank) + ": " + CollectiveName(op) + " #" +
                  std::to_string(seq) + " (";
  if (!what.empty()) s += std::string(what) + ", ";
  if (op == CollectiveOp::kBarrier) {
    s += "no data)";
  } else {
    s += std::to_string(count) + " x " + DTypeName(dtype) + ")";
  }
  return s;
}

namespace {

Status WaitFor(StatusOr<CommWorkPtr> work) {
  if (!work.ok()) return work.status();
  return (*work)->Wait();
}

class DoneWork final : public CommWork {
 public:
  Status Wait() override { return Status::Ok(); }
  bool Ready() override { return true; }
};

}  // namespace

CommWorkPtr CompletedWork() { return CommWorkPtr(new DoneWork); }

StatusOr<std::unique_ptr<Comm>> Comm::Split(int, int, std::string_view what) {
  return Status::Precondition(std::string("the ") + name() + " comm cannot split" +
                              (what.empty() ? "" : " (" + std::string(what) + ")"));
}

namespace {

class LocalComm final : public Comm {
 public:
  const char* name() const override { return "local"; }
  int rank() const override { return 0; }
  int world() const override { return 1; }

  StatusOr<CommWorkPtr> AllReduceSum(void*, int64_t, DType, std::string_view) override {
    return Done();
  }
  StatusOr<CommWorkPtr> ReduceScatterSum(const void* send, void* recv, int64_t n, DType t,
                                         std::string_view) override {
    return Copy(send, recv, n, t);
  }
  StatusOr<CommWorkPtr> AllGather(const void* send, void* recv, int64_t n, DType t,
                                  std::string_view) override {
    return Copy(send, recv, n, t);
  }
  StatusOr<CommWorkPtr> Broadcast(void*, int64_t, DType, int root, std::string_view) override {
    if (root != 0) return Status::Invalid("broadcast root " + std::to_string(root) + " >= world 1");
    return Done();
  }
  StatusOr<CommWorkPtr> Barrier(std::string_view) override { return Done(); }
  StatusOr<std::unique_ptr<Comm>> Split(int color, int, std::string_view) override {
    if (color < 0) return Status::Invalid("split color must be >= 0");
    return std::unique_ptr<Comm>(new LocalComm);
  }

  [[noreturn]] void Abort(const Status& why) override {
    std::fprintf(stderr, "forge: rank 0: aborting: %s\n", why.ToString().c_str());
    std::fflush(stderr);
    std::exit(1);
  }

 private:
  static StatusOr<CommWorkPtr> Done() { return CommWorkPtr(new DoneWork); }
  static StatusOr<CommWorkPtr> Copy(const void* send, void* recv, int64_t n, DType t) {
    if (n < 0) return Status::Invalid("negative collective count");
    if (send != recv) std::memmove(recv, send, size_t(n) * DTypeSize(t));
    return Done();
  }
};

}  // namespace

Status AllReduceSumBlocking(Comm* comm, void* buf, int64_t count, DType dtype,
                            std::string_view what) {
  return WaitFor(comm->AllReduceSum(buf, count, dtype, what));
}
Status AllGatherBlocking(Comm* comm, const void* send, void* recv, int64_t send_count, DType dtype,
                         std::string_view what) {
  return WaitFor(comm->AllGather(send, recv, send_count, dtype, what));
}
Status BroadcastBlocking(Comm* comm, void* buf, int64_t count, DType dtype, int root,
                         std::string_view what) {
  return WaitFor(comm->Broadcast(buf, count, dtype, root, what));
}
Status BarrierBlocking(Comm* comm, std::string_view what) { return WaitFor(comm->Barrier(what)); }

std::unique_ptr<Comm> MakeLocalComm() { return std::make_unique<LocalComm>(); }

}  // namespace forge
