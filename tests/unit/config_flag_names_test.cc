// The enum names command-line flags take (forge-bench, forge-dist-bench): the config's own
// spelling, and an error naming the flag and the choices.
#include <gtest/gtest.h>

#include "common/config.h"

namespace forge {
namespace {

TEST(ConfigFlagNamesTest, ReadTheConfigSpelling) {
  ParallelMode mode = ParallelMode::kDdp;
  ASSERT_TRUE(ParallelModeFromName("fsdp", "--mode", &mode).ok());
  EXPECT_EQ(mode, ParallelMode::kFsdp);
  GradReduce reduce = GradReduce::kFp32;
  ASSERT_TRUE(GradReduceFromName("bf16", "--grad-reduce", &reduce).ok());
  EXPECT_EQ(reduce, GradReduce::kBf16);
  DdpAllReduce all = DdpAllReduce::kNccl;
  ASSERT_TRUE(DdpAllReduceFromName("copy_engine", "--ddp-allreduce", &all).ok());
  EXPECT_EQ(all, DdpAllReduce::kCopyEngine);
  Fp8FastAccum fast = Fp8FastAccum::kNone;
  ASSERT_TRUE(Fp8FastAccumFromName("fprop_dgrad", "--fp8-fast-accum", &fast).ok());
  EXPECT_EQ(fast, Fp8FastAccum::kFpropDgrad);
}

TEST(ConfigFlagNamesTest, UnknownNameListsTheChoicesAndChangesNothing) {
  ParallelMode mode = ParallelMode::kZero1;
  const Status st = ParallelModeFromName("zero9", "--mode", &mode);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "--mode: must be one of ddp|zero1|zero2|fsdp|hsdp, got zero9");
  EXPECT_EQ(mode, ParallelMode::kZero1);
  Fp8FastAccum fast = Fp8FastAccum::kFprop;
  EXPECT_FALSE(Fp8FastAccumFromName("FPROP", "--fp8-fast-accum", &fast).ok());
  EXPECT_EQ(fast, Fp8FastAccum::kFprop);
}

}  // namespace
}  // namespace forge
