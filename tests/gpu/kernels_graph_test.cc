// The fused kernels enqueue work only (no allocation, no synchronisation), so a step built from
// them can be captured in a CUDA graph. Captures every entry point in one graph (global capture
// mode: any synchronising call would end the capture with an error), replays it, and requires
// bitwise the results of the same calls launched directly (all kernels are deterministic).
#include <gtest/gtest.h>

#include <vector>

#include "gpu_test_util.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"

namespace forge {
namespace {

using test::bf16;
using test::DeviceBuffer;

constexpr int64_t kN = 512;  // tokens
constexpr int kD = 256, kV = 1024, kFfn = 384, kB = 2, kT = 256, kH = 4, kKV = 2, kHd = 64;
constexpr int kQkv = (kH + 2 * kKV) * kHd;

// Read-only inputs shared by both runs.
struct Inputs {
  std::vector<int32_t> tokens = test::RandomInts(kN, 0, kV, 1);
  std::vector<float> x = test::RandomNormalBf16(kN * kD, 1.0f, 2);
  std::vector<float> w = test::RandomUniformBf16(kD, 0.5f, 1.5f, 3);
  std::vector<float> dout = test::RandomNormalBf16(kN * kD, 1.0f, 4);
  std::vector<float> qkv = test::RandomNormalBf16(kN * kQkv, 1.0f, 5);
  std::vector<float> gate_up = test::RandomNormalBf16(kN * 2 * kFfn, 2.0f, 6);
  std::vector<float> dsw = test::RandomNormalBf16(kN * kFfn, 1.0f, 7);
  std::vector<float> logits = test::RandomNormalBf16(kN * kV, 3.0f, 8);
  std::vector<float> param = test::RandomNormal(kV * kD, 0.5f, 9);
  std::vector<float> zeros = std::vector<float>(kV * kD, 0.0f);
};

// Everything the calls write, freshly initialised from the inputs.
struct State {
  explicit State(const Inputs& in)
      : tokens(in.tokens), x(test::ToBf16(in.x)), w(test::ToBf16(in.w)),
        dout(test::ToBf16(in.dout)), dwte(in.zeros), out(kN * kD), rstd(kN),
        dx(test::ToBf16(in.dout)), dw(std::vector<float>(kD, 0.0f)),
        norm_ws(cuda::RmsNormBackwardWorkspace(kN, kD)),
        emb_ws(cuda::EmbeddingBackwardWorkspace(kN, kV)), qkv(test::ToBf16(in.qkv)),
        gate_up(test::ToBf16(in.gate_up)), dsw(test::ToBf16(in.dsw)), sw(kN * kFfn),
        dgu(kN * 2 * kFfn), logits(test::ToBf16(in.logits)), losses(kN), mean(1),
        param(in.param), param_bf16(kV * kD), m(in.zeros), v(in.zeros),
        norm_partial(cuda::GradNormWorkspace()), sumsq(1), clip(1), hyper(1), desc(1),
        rope_freq(test::RopeFreqs(kHd, 1e4f)) {
    hyper.Upload({cuda::AdamWHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 1}});
    // The embedding gradient is the optimizer's gradient.
    desc.Upload({cuda::AdamWTensor{param.data(), param_bf16.data(), dwte.data(), m.data(),
                                   v.data(), kV * kD, 0.1f}});
  }

  Status Enqueue(cudaStream_t s) {
    FORGE_RETURN_IF_ERROR(cuda::EmbeddingBackward(dwte.data(), dout.data(), tokens.data(), kN,
                                                  kD, kV, emb_ws.data(), emb_ws.bytes(), s));
    FORGE_RETURN_IF_ERROR(
        cuda::RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), kN, kD, 1e-5f, s));
    FORGE_RETURN_IF_ERROR(cuda::RmsNormBackward(dx.data(), dw.data(), dout.data(), x.data(),
                                                w.data(), rstd.data(), kN, kD, norm_ws.data(),
                                                norm_ws.bytes(), s));
    FORGE_RETURN_IF_ERROR(cuda::RopeApply(qkv.data(), kB, kT, kH, kKV, kHd, rope_freq.data(), false, s));
    FORGE_RETURN_IF_ERROR(cuda::SwiGluForward(sw.data(), gate_up.data(), kN, kFfn, s));
    FORGE_RETURN_IF_ERROR(cuda::SwiGluBackward(dgu.data(), dsw.data(), gate_up.data(), kN, kFfn,
                                               s));
    FORGE_RETURN_IF_ERROR(cuda::CrossEntropyForwardBackward(logits.data(), losses.data(),
                                                            tokens.data(), kN, kV, 1.0f / kN,
                                                            true, s));
    FORGE_RETURN_IF_ERROR(cuda::MeanReduce(mean.data(), losses.data(), kN, s));
    FORGE_RETURN_IF_ERROR(cuda::GlobalGradNorm(desc.data(), 1, 0.5f, sumsq.data(), clip.data(),
                                               norm_partial.data(), norm_partial.bytes(), s));
    FORGE_RETURN_IF_ERROR(cuda::AdamWMultiTensor(desc.data(), 1, hyper.data(), clip.data(), s));
    return Status::Ok();
  }

  DeviceBuffer<int32_t> tokens;
  DeviceBuffer<bf16> x, w, dout;
  DeviceBuffer<float> dwte;
  DeviceBuffer<bf16> out;
  DeviceBuffer<float> rstd;
  DeviceBuffer<bf16> dx;
  DeviceBuffer<float> dw;
  DeviceBuffer<char> norm_ws, emb_ws;
  DeviceBuffer<bf16> qkv, gate_up, dsw, sw, dgu, logits;
  DeviceBuffer<float> losses, mean, param;
  DeviceBuffer<bf16> param_bf16;
  DeviceBuffer<float> m, v;
  DeviceBuffer<char> norm_partial;
  DeviceBuffer<float> sumsq, clip;
  DeviceBuffer<cuda::AdamWHyper> hyper;
  DeviceBuffer<cuda::AdamWTensor> desc;
  DeviceBuffer<float> rope_freq;
};

template <typename T>
void ExpectSame(const DeviceBuffer<T>& a, const DeviceBuffer<T>& b, const char* what) {
  EXPECT_TRUE(test::BitwiseEqual(a.Download(), b.Download())) << what;
}

TEST(GpuKernelsGraph, CapturedCallsMatchDirectLaunches) {
  FORGE_SKIP_WITHOUT_GPU();
  const Inputs in;
  cudaStream_t s = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  State direct(in);
  ASSERT_STATUS_OK(direct.Enqueue(s));
  ASSERT_CUDA_OK(cudaStreamSynchronize(s));

  State graphed(in);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());  // uploads done before capture starts
  ASSERT_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  const Status enqueued = graphed.Enqueue(s);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  ASSERT_TRUE(enqueued.ok()) << enqueued.ToString();
  ASSERT_CUDA_OK(end);
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  ASSERT_CUDA_OK(cudaGraphLaunch(exec, s));
  ASSERT_CUDA_OK(cudaStreamSynchronize(s));

  ExpectSame(direct.dwte, graphed.dwte, "dwte");
  ExpectSame(direct.out, graphed.out, "rmsnorm out");
  ExpectSame(direct.rstd, graphed.rstd, "rstd");
  ExpectSame(direct.dx, graphed.dx, "rmsnorm dx");
  ExpectSame(direct.dw, graphed.dw, "rmsnorm dw");
  ExpectSame(direct.qkv, graphed.qkv, "rope");
  ExpectSame(direct.sw, graphed.sw, "swiglu");
  ExpectSame(direct.dgu, graphed.dgu, "swiglu backward");
  ExpectSame(direct.logits, graphed.logits, "dlogits");
  ExpectSame(direct.losses, graphed.losses, "losses");
  ExpectSame(direct.mean, graphed.mean, "mean loss");
  ExpectSame(direct.sumsq, graphed.sumsq, "grad sumsq");
  ExpectSame(direct.clip, graphed.clip, "clip");
  ExpectSame(direct.param, graphed.param, "param");
  ExpectSame(direct.param_bf16, graphed.param_bf16, "param bf16");
  ExpectSame(direct.m, graphed.m, "m");
  ExpectSame(direct.v, graphed.v, "v");
  // The step did something: the grad norm is non-zero and clipping is active.
  EXPECT_GT(graphed.sumsq.Download()[0], 0.0f);
  EXPECT_LT(graphed.clip.Download()[0], 1.0f);

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace forge
