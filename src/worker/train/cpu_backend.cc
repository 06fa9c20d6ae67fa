// The float32 CPU reference backend: CpuModel for forward/backward, cpu::AdamWUpdate for the
// optimizer. Everything runs on the calling thread (OpenBLAS threads the GEMMs).
#include <cmath>

#include "kernels/cpu/adamw.h"
#include "worker/model/cpu_model.h"
#include "worker/train/backend.h"

namespace forge {
namespace {

UnitBuffers ZerosLike(const ParamLayout& layout) {
  UnitBuffers b(layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) b[u].assign(layout.units[u].numel, 0.0f);
  return b;
}

Status CheckShapes(const ParamLayout& layout, const UnitBuffers& b, const char* what) {
  if (b.size() != layout.units.size())
    return Status::Invalid(std::string(what) + ": expected " +
                           std::to_string(layout.units.size()) + " units, got " +
                           std::to_string(b.size()));
  for (size_t u = 0; u < b.size(); ++u)
    if (static_cast<int64_t>(b[u].size()) != layout.units[u].numel)
      return Status::Invalid(std::string(what) + ": unit " + layout.units[u].name + " has " +
                             std::to_string(b[u].size()) + " floats, expected " +
                             std::to_string(layout.units[u].numel));
  return Status::Ok();
}

class CpuBackend final : public TrainBackend {
 public:
  explicit CpuBackend(const RunConfig& cfg)
      : cfg_(cfg), model_(cfg.model, cfg.batch.micro_batch), layout_(model_.layout()) {
    params_ = ZerosLike(layout_);
    grads_ = ZerosLike(layout_);
    m_ = ZerosLike(layout_);
    v_ = ZerosLike(layout_);
  }

  const char* name() const override { return "cpu"; }

  Status SetParams(const UnitBuffers& master) override {
    FORGE_RETURN_IF_ERROR(CheckShapes(layout_, master, "SetParams"));
    params_ = master;
    m_ = ZerosLike(layout_);
    v_ = ZerosLike(layout_);
    return Status::Ok();
  }
  Status GetParams(UnitBuffers* master) override {
    *master = params_;
    return Status::Ok();
  }
  Status GetMoments(UnitBuffers* m, UnitBuffers* v) override {
    *m = m_;
    *v = v_;
    return Status::Ok();
  }
  Status SetMoments(const UnitBuffers& m, const UnitBuffers& v) override {
    FORGE_RETURN_IF_ERROR(CheckShapes(layout_, m, "SetMoments(m)"));
    FORGE_RETURN_IF_ERROR(CheckShapes(layout_, v, "SetMoments(v)"));
    m_ = m;
    v_ = v;
    return Status::Ok();
  }

  Status TrainStep(const std::vector<MicroBatch>& micro, const StepHyper& hyper, bool,
                   StepStats* stats) override {
    float loss = 0.0f;
    FORGE_RETURN_IF_ERROR(Accumulate(micro, &loss));
    double sumsq = 0.0;
    for (const auto& g : grads_) sumsq += cpu::SumSquares(g.data(), int64_t(g.size()));
    const float norm = static_cast<float>(std::sqrt(sumsq));
    const float clip = cfg_.optimizer.grad_clip;
    const float scale = (clip > 0.0f && norm > clip) ? clip / (norm + 1e-6f) : 1.0f;
    for (size_t u = 0; u < layout_.units.size(); ++u) {
      for (const auto& t : layout_.units[u].tensors) {
        cpu::AdamWParams a{hyper.lr,
                           cfg_.optimizer.beta1,
                           cfg_.optimizer.beta2,
                           cfg_.optimizer.eps,
                           t.weight_decay ? cfg_.optimizer.weight_decay : 0.0f,
                           hyper.step,
                           scale};
        cpu::AdamWUpdate(params_[u].data() + t.offset, grads_[u].data() + t.offset,
                         m_[u].data() + t.offset, v_[u].data() + t.offset, t.numel, a);
      }
    }
    if (stats) {
      stats->loss = loss;
      stats->grad_norm = norm;
      stats->valid = true;
    }
    return Status::Ok();
  }

  Status EvalLoss(const MicroBatch& batch, float* loss) override {
    *loss = model_.Forward(params_, batch.inputs, batch.targets, cfg_.batch.micro_batch);
    return Status::Ok();
  }

  Status ComputeGradients(const std::vector<MicroBatch>& micro, UnitBuffers* grads,
                          float* loss) override {
    FORGE_RETURN_IF_ERROR(Accumulate(micro, loss));
    *grads = grads_;
    return Status::Ok();
  }

 private:
  // grads_ = gradient of the mean loss over the micro-batches; *loss = that mean.
  Status Accumulate(const std::vector<MicroBatch>& micro, float* loss) {
    if (micro.empty()) return Status::Invalid("TrainStep: no micro-batches");
    for (auto& g : grads_) std::fill(g.begin(), g.end(), 0.0f);
    const float w = 1.0f / static_cast<float>(micro.size());
    double total = 0.0;
    for (const auto& mb : micro) {
      total += model_.Forward(params_, mb.inputs, mb.targets, cfg_.batch.micro_batch);
      model_.Backward(params_, w, &grads_);
    }
    *loss = static_cast<float>(total / double(micro.size()));
    if (!std::isfinite(*loss)) return Status::Internal("CPU backend: non-finite loss");
    return Status::Ok();
  }

  RunConfig cfg_;
  CpuModel model_;
  const ParamLayout& layout_;
  UnitBuffers params_, grads_, m_, v_;
};

}  // namespace

std::unique_ptr<TrainBackend> MakeCpuBackend(const RunConfig& cfg) {
  return std::make_unique<CpuBackend>(cfg);
}

}  // namespace forge
