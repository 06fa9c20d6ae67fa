// The CUDA backend's start-up refusal of the model knobs its model lacks: each names its key,
// and the defaults (and a head_dim written as d_model / n_head) pass.
#include "worker/train/cuda_model_support.h"

#include <gtest/gtest.h>

#include <string>

namespace forge {
namespace {

void ExpectRefusedNaming(const ModelConfig& m, const std::string& start) {
  const Status s = CheckCudaSupportsModel(m);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << start;
  EXPECT_EQ(s.message().rfind(start, 0), 0u) << s.message();
  EXPECT_NE(s.message().find("not supported by the cuda backend yet"), std::string::npos)
      << s.message();
}

TEST(CudaModelSupport, DefaultsPass) {
  ModelConfig m;
  EXPECT_TRUE(CheckCudaSupportsModel(m).ok());
  m.n_kv_head = 1;  // GQA runs on cuda
  m.rope_theta = 500000.0f;
  m.explicit_head_dim = m.d_model / m.n_head;  // written out, the same model
  EXPECT_TRUE(CheckCudaSupportsModel(m).ok());
}

TEST(CudaModelSupport, EachMissingKnobNamesItsKey) {
  ModelConfig m;
  m.explicit_head_dim = 64;  // d_model 128 / 4 heads = 32
  ExpectRefusedNaming(m, "model.head_dim: 64 (attention width n_head x head_dim = 256 other "
                         "than model.d_model 128)");
  m = ModelConfig{};
  m.tie_embeddings = false;
  ExpectRefusedNaming(m, "model.tie_embeddings: false");
  m = ModelConfig{};
  m.rope_scaling.type = RopeScalingType::kLlama3;
  ExpectRefusedNaming(m, "model.rope_scaling: type llama3");
  m = ModelConfig{};
  m.qk_norm = true;
  ExpectRefusedNaming(m, "model.qk_norm: true");
}

}  // namespace
}  // namespace forge
