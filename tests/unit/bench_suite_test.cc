// The benchmark harness without a GPU: bench/suite_table.py turns a fixture of every suite's
// JSON lines into the expected markdown (and its ratios agree with ones computed here from the
// same lines), bench/suite_lines.py reads real tool outputs (a GoogleTest log, ncu's CSV,
// nvidia-smi dmon, a `forge train` run), and bench/suite.sh --dry-run prints each suite's
// commands with the measurement settings docs/performance.md records.

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../common/run_command.h"

namespace {

using forge::test::CommandResult;
const std::string kRoot = FORGE_SOURCE_DIR;
const std::string kData = kRoot + "/tests/unit/testdata/bench_suite/";

// The command's exit code and standard output, run from the source tree (standard error goes
// where the test's does, unless the command redirects it).
CommandResult Shell(const std::string& cmd) {
  return forge::test::RunCommand("cd " + kRoot + " && " + cmd, "", forge::test::Stderr::kInherited);
}

// Whether the command printed `part`; its whole output goes into the failure message.
::testing::AssertionResult Printed(const CommandResult& r, const std::string& part) {
  if (r.out.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "no \"" << part << "\" in:\n" << r.out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<nlohmann::json> JsonLines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

// The markdown row whose first cells are `a | b | c`.
std::string Row(const std::string& md, const std::string& start) {
  std::istringstream in(md);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| " + start + " |", 0) == 0) return line;
  }
  return "";
}

std::string Ratio(double a, double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3fx", a / b);
  return buf;
}

class BenchSuiteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Shell("python3 -c 'import csv, json, re' >/dev/null 2>&1").exit_code != 0) {
      GTEST_SKIP() << "python3 not available";
    }
  }
};

TEST_F(BenchSuiteTest, TableOfEverySuiteFromItsLines) {
  const CommandResult r = Shell("python3 bench/suite_table.py " + kData + "lines.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, ReadFile(kData + "expected.md"));

  // Ratios computed here from the same lines: each Forge run against PyTorch's same shape, FP8
  // against Forge BF16, data-parallel runs against PyTorch's same mode and world size.
  std::map<std::string, double> torch, bf16;
  const auto lines = JsonLines(ReadFile(kData + "lines.jsonl"));
  for (const auto& l : lines) {
    if (l["suite"] != "single-gpu") continue;
    if (l.contains("compile")) torch[l["model"].get<std::string>()] = l["tokens_per_s"];
    if (l.value("precision", "") == "bf16") bf16[l["model"].get<std::string>()] = l["tokens_per_s"];
  }
  int checked = 0;
  for (const auto& l : lines) {
    if (l["suite"] != "single-gpu" || !l.contains("precision")) continue;
    const std::string model = l["model"];
    const double tps = l["tokens_per_s"];
    const std::string run = l["precision"] == "bf16" ? "Forge BF16"
                            : l["fp8_lm_head"]      ? "Forge FP8 + FP8 LM head"
                                                    : "Forge FP8";
    const std::string row = Row(r.out, model + " | " + std::to_string(l["B"].get<int>()) +
                                           " | " + run);
    ASSERT_FALSE(row.empty()) << model << " " << run;
    EXPECT_NE(row.find("| " + Ratio(tps, torch.at(model)) + " |"), std::string::npos) << row;
    EXPECT_NE(row.find("| " + Ratio(tps, bf16.at(model)) + " |"), std::string::npos) << row;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
  EXPECT_NE(Row(r.out, "ddp, bf16 gradients | 4").find("| 96.06% |"), std::string::npos);
  EXPECT_NE(Row(r.out, "ddp, bf16 gradients | 4").find(Ratio(204772, 169550)),
            std::string::npos);
  EXPECT_NE(Row(r.out, "fsdp | 4").find(Ratio(197721, 142090)), std::string::npos);
  // The exposed communication split into the stall at the waits and the compute's slowdown.
  EXPECT_NE(Row(r.out, "ddp, bf16 gradients | 2").find("| 0.72 + 1.84 |"), std::string::npos);
  // PyTorch trains one batch everywhere: a distinct-batch run gets no ratio to it.
  EXPECT_NE(Row(r.out, "ddp, distinct batches | 4").find("| yes |  |  |"), std::string::npos);
  // A run that failed is listed by its label, not dropped.
  EXPECT_TRUE(Printed(r, "- gpt350m-b24-bf16: exit 137"));
  // llama: each Forge run against torch_llama.py's run without checkpointing (its llama1b is
  // the llama3-1b preset) and against its run at the same recompute setting where there is one.
  EXPECT_NE(Row(r.out, "llama3-1b | 2 | Forge BF16 | none").find(Ratio(56421.2, 50893.3)),
            std::string::npos);
  const std::string full = Row(r.out, "llama3-1b | 2 | Forge BF16 | full");
  EXPECT_NE(full.find("| " + Ratio(46941.0, 50893.3) + " | " + Ratio(46941.0, 42720.7) + " |"),
            std::string::npos)
      << full;
  EXPECT_NE(Row(r.out, "llama3-1b | 2 | Forge BF16 | selective").find(" |  |"),
            std::string::npos);
  // llama-fsdp: per GPU against torch_llama.py's llama8b on as many GPUs, without
  // checkpointing and at the same setting; the FP8 run without the E4M3 gather is its own row.
  const std::string fsdp = Row(r.out, "llama3-8b | 2 | Forge fsdp BF16 | full");
  EXPECT_NE(fsdp.find("| " + Ratio(8305.8, 9145.0) + " | " + Ratio(8305.8, 7656.7) + " |"),
            std::string::npos)
      << fsdp;
  EXPECT_NE(Row(r.out, "llama3-8b | 2 | Forge fsdp FP8, bf16 gather | full")
                .find("| 253.90 / 15.08 |"),
            std::string::npos);
  // llama-dp: llama-fsdp's columns plus one GPU's speed and the share of it.
  EXPECT_NE(Row(r.out, "llama3-1b | 2 | Forge fsdp BF16 | none")
                .find("| 57,400 | 94.16% | " + Ratio(54045.0, 48747.4) + " |"),
            std::string::npos);
  EXPECT_NE(Row(r.out, "llama3-1b | 2 | Forge ddp BF16 | none").find("| 96.43% |"),
            std::string::npos);
  // nodes: multi-gpu's table, each run named by its topology and hsdp by its groups.
  EXPECT_NE(Row(r.out, "ddp, bf16 gradients, 2 emulated nodes | 2").find("| 30.08% |"),
            std::string::npos);
  EXPECT_NE(Row(r.out, "hsdp, groups of 1, 2 emulated nodes | 2").find("| 414.00 / 339.40 |"),
            std::string::npos);
}

TEST_F(BenchSuiteTest, LlamaFsdpSuiteRunsTheEightBillionModelOnEveryGpu) {
  const CommandResult r = Shell("bash bench/suite.sh --dry-run --world 4 llama-fsdp");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string common =
      "forge-dist-bench --config configs/llama3-8b.yaml --world 4 --mode fsdp --micro-batch 1 "
      "--steps 4 --warmup 2 --no-single --recompute ";
  auto at = [&](const std::string& what) {
    const size_t p = r.out.find(what);
    EXPECT_NE(p, std::string::npos) << what << "\n" << r.out;
    return p;
  };
  auto torch = [](const char* ac) {
    return "--nproc_per_node=4 .device/torch_llama.py llama8b 1 8192 ac=" + std::string(ac) +
           "\n";
  };
  // The settings the targets compare first (a call's deadline skips the tail): no recompute
  // in BF16 and FP8 and the recipe's none, then selective, then full beside the recipe's full.
  const size_t order[] = {at(common + "none --precision bf16\n"),
                          at(common + "none --precision fp8\n"),
                          at(torch("none")),
                          at(common + "selective --precision bf16\n"),
                          at(common + "full --precision bf16\n"),
                          at(common + "full --precision fp8\n"),
                          at(torch("full")),
                          at(common + "full --precision fp8 --fp8-gather off\n")};
  for (size_t i = 1; i < std::size(order); ++i) EXPECT_LT(order[i - 1], order[i]) << i;
}

TEST_F(BenchSuiteTest, LlamaDpSuiteRunsFsdpAndDdpAgainstOneGpuBesideTheRecipe) {
  const CommandResult r = Shell("bash bench/suite.sh --dry-run --world 4 llama-dp");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* mode : {"fsdp", "ddp"}) {
    // No --no-single: forge-dist-bench measures the one-GPU step first.
    EXPECT_TRUE(Printed(r, "forge-dist-bench --config configs/llama3-1b.yaml --world 4 --mode " +
                               std::string(mode) + " --micro-batch 2 --steps 6 --warmup 2\n"));
  }
  EXPECT_TRUE(Printed(r, "--nproc_per_node=4 .device/torch_llama.py llama1b 2 8192 ac=none\n"));
}

TEST_F(BenchSuiteTest, NodesSuiteRunsEachModeOnOneNodeAndOnTwoEmulatedOnes) {
  const CommandResult r = Shell("bash bench/suite.sh --dry-run --world 4 nodes");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string common =
      "forge-dist-bench --config configs/gpt350m.yaml --world 4 --micro-batch 16 --steps 20 ";
  for (const std::string mode :
       {"--mode ddp --grad-reduce bf16", "--mode fsdp", "--mode hsdp --shard-group-size 2"}) {
    EXPECT_TRUE(Printed(r, common + mode + "\n")) << mode;
    EXPECT_TRUE(Printed(r, common + mode + " --emulate-nodes 2\n")) << mode;
  }
  const CommandResult odd = Shell("bash bench/suite.sh --dry-run --world 3 nodes 2>&1");
  EXPECT_NE(odd.exit_code, 0);
  EXPECT_TRUE(Printed(odd, "nodes needs an even number of GPUs (got 3)"));
}

TEST_F(BenchSuiteTest, LlamaSuiteRunsTheRecomputeSettingsBesideTheRecipe) {
  const CommandResult r = Shell("bash bench/suite.sh --dry-run llama");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* mode : {"none", "selective", "full"}) {
    EXPECT_TRUE(Printed(r,
                        "forge-bench --config configs/llama3-1b.yaml --micro-batch 2 --steps 10 "
                        "--precision bf16 --recompute " +
                            std::string(mode) + "\n"));
  }
  EXPECT_TRUE(Printed(r, "--precision fp8 --recompute none\n"));
  for (const char* ac : {"none", "full"}) {
    EXPECT_TRUE(Printed(r, "--nproc_per_node=1 .device/torch_llama.py llama1b 2 8192 ac=" +
                               std::string(ac) + "\n"));
  }
  EXPECT_EQ(r.out.find("forge-bench-base"), std::string::npos);
  // --base: the previous build's binary right before the new one, on every row; the table
  // gains a build column.
  const CommandResult base = Shell("bash bench/suite.sh --dry-run --base --no-anchor llama");
  ASSERT_EQ(base.exit_code, 0) << base.out;
  EXPECT_TRUE(Printed(base,
                      "# llama3-1b-b2-fp8-none-base\n.device/run forge-bench-base --config "
                      "configs/llama3-1b.yaml --micro-batch 2 --steps 10 --precision fp8 "
                      "--recompute none\n# llama3-1b-b2-fp8-none\n.device/run forge-bench "
                      "--config configs/llama3-1b.yaml --micro-batch 2 --steps 10 --precision "
                      "fp8 --recompute none\n"));
  const CommandResult table = Shell("python3 bench/suite_table.py " + kData + "llama-base.jsonl");
  ASSERT_EQ(table.exit_code, 0) << table.out;
  EXPECT_TRUE(Printed(table, "| llama3-1b | 2 | Forge BF16 | base | none | 290.00 | 56,000 |"))
      << table.out;
  EXPECT_TRUE(Printed(table, "| llama3-1b | 2 | Forge BF16 | new | none | 280.00 | 58,000 |"))
      << table.out;
  EXPECT_TRUE(Printed(table, "| llama3-1b | 2 | PyTorch FSDP2 recipe BF16 |  | none | 331.00 |"))
      << table.out;
}

TEST_F(BenchSuiteTest, BadLineIsNamed) {
  const CommandResult r = Shell("printf '{\"suite\": \"x\"}\\n{oops\\n' | python3 bench/suite_table.py 2>&1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(Printed(r, "line 2"));
}

TEST_F(BenchSuiteTest, GtestLogBecomesOneLineATest) {
  const CommandResult r = Shell("python3 bench/suite_lines.py gtest " + kData +
                    "gtest.log --suite gpu-tests --label gpu-tests");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 5u) << r.out;
  EXPECT_EQ(lines[0]["test"], "GpuModel.Trains");
  EXPECT_EQ(lines[0]["status"], "passed");
  EXPECT_EQ(lines[0]["ms"], 1520);
  EXPECT_EQ(lines[1]["status"], "skipped");
  // The failure's ", where GetParam() = ..." is not part of the name; the summary at the log's
  // end (the same name without a time) does not count it twice.
  EXPECT_EQ(lines[2]["test"],
            "Modes/CudaDataParallelTest.MatchesOneGpuAndIsDeterministic/ddp_2gpus_accum2_fp8");
  EXPECT_EQ(lines[2]["status"], "failed");
  // Started and never ended: the binary was killed at its time limit.
  EXPECT_EQ(lines[3]["test"], "GpuFlashBackward.LargeBatch");
  EXPECT_EQ(lines[3]["status"], "unfinished");
  EXPECT_EQ(lines[4]["tests"], 4);
  EXPECT_EQ(lines[4]["passed"], 1);
  EXPECT_EQ(lines[4]["failed"], 1);
  EXPECT_EQ(lines[4]["skipped"], 1);
  EXPECT_EQ(lines[4]["unfinished"], 1);
  for (const auto& l : lines) EXPECT_EQ(l["suite"], "gpu-tests");
}

TEST_F(BenchSuiteTest, NcuLogSummedOverTheLastWholeStep) {
  const CommandResult r = Shell("python3 bench/suite_lines.py ncu " + kData +
                    "ncu.csv --top 1 --suite profile --label ncu-bf16");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 6u) << r.out;
  // Rows 3-7 of the fixture lie between the last two embedding forwards: 0.06 + 2 + 2 + 0.5 +
  // 1.5 ms (ncu's nanoseconds, with thousands separators).
  EXPECT_EQ(lines[0]["kernels"], 5);
  EXPECT_DOUBLE_EQ(lines[0]["ms"].get<double>(), 6.06);
  EXPECT_EQ(lines[1]["family"], "gemm");
  EXPECT_DOUBLE_EQ(lines[1]["ms"].get<double>(), 4.0);
  EXPECT_EQ(lines[1]["kernels"], 2);
  EXPECT_EQ(lines[2]["family"], "optimizer");
  EXPECT_EQ(lines[3]["family"], "rmsnorm");
  EXPECT_EQ(lines[4]["family"], "embedding");
  EXPECT_EQ(lines[5]["kernel"], "nvjet_tst_128x256_64x4");
  EXPECT_EQ(lines[5]["calls"], 2);
}

TEST_F(BenchSuiteTest, DmonRangeWhileLoaded) {
  const CommandResult r = Shell("python3 bench/suite_lines.py dmon " + kData +
                    "dmon.txt --suite profile --label power-bf16");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  // The idle first sample (120 W) and the one without a power reading are left out.
  EXPECT_EQ(lines[0]["samples"], 2);
  EXPECT_EQ(lines[0]["power_w_min"], 685.0);
  EXPECT_EQ(lines[0]["power_w_max"], 693.0);
  EXPECT_EQ(lines[0]["sm_mhz_min"], 1605.0);
  EXPECT_EQ(lines[0]["sm_mhz_max"], 1755.0);
}

TEST_F(BenchSuiteTest, TrainRunGivesValidationLossesAndSummary) {
  const CommandResult r = Shell("python3 bench/suite_lines.py train " + kData + "metrics_fp8lm.jsonl " +
                    kData + "train_fp8lm.log --suite fp8-accuracy --label fp8lm");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_EQ(lines[0]["step"], 100);
  EXPECT_DOUBLE_EQ(lines[0]["val_loss"].get<double>(), 7.1244);
  EXPECT_EQ(lines[1]["step"], 2000);
  EXPECT_EQ(lines[2]["summary"], true);
  EXPECT_EQ(lines[2]["steps"], 2000);
  EXPECT_DOUBLE_EQ(lines[2]["seconds"].get<double>(), 48.8);
  EXPECT_DOUBLE_EQ(lines[2]["final_val_loss"].get<double>(), 5.0595);
  EXPECT_DOUBLE_EQ(lines[2]["first_val_loss"].get<double>(), 10.9782);
  EXPECT_EQ(lines[2]["first_train_step"], 100);
  EXPECT_DOUBLE_EQ(lines[2]["first_train_loss"].get<double>(), 7.2);
  EXPECT_EQ(lines[2]["final_train_step"], 2000);
  EXPECT_DOUBLE_EQ(lines[2]["final_train_loss"].get<double>(), 5.0);
  EXPECT_EQ(lines[2]["skipped_steps"], 0);

  const CommandResult missing = Shell("python3 bench/suite_lines.py train /nonexistent/metrics.jsonl " +
                          kData + "train_fp8lm.log --suite fp8-accuracy --label fp8lm");
  const auto err = JsonLines(missing.out);
  ASSERT_EQ(err.size(), 1u) << missing.out;
  EXPECT_NE(err[0]["error"].get<std::string>().find("/nonexistent/metrics.jsonl"),
            std::string::npos);
}

// A run whose ranks trained in processes of their own (forge-worker per GPU): the closing line
// has no first validation loss, so it comes from the log's step-0 line.
TEST_F(BenchSuiteTest, TrainRunOverWorkersTakesTheFirstValidationLossFromItsLog) {
  const CommandResult r = Shell("python3 bench/suite_lines.py train " + kData + "metrics_fsdp.jsonl " +
                    kData + "train_fsdp.log --suite llama-train --label llama3-8b");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_EQ(lines[2]["summary"], true);
  EXPECT_EQ(lines[2]["steps"], 200);
  EXPECT_DOUBLE_EQ(lines[2]["first_val_loss"].get<double>(), 12.6021);
  EXPECT_DOUBLE_EQ(lines[2]["final_val_loss"].get<double>(), 5.982);
  EXPECT_DOUBLE_EQ(lines[2]["first_train_loss"].get<double>(), 12.574268);
  EXPECT_DOUBLE_EQ(lines[2]["final_train_loss"].get<double>(), 6.948205);
}

// The commands of each suite, as the device call would run them.
TEST_F(BenchSuiteTest, DryRunPrintsEachSuitesCommands) {
  const CommandResult single = Shell("bash bench/suite.sh --dry-run single-gpu");
  ASSERT_EQ(single.exit_code, 0) << single.out;
  for (const char* line : {
           ".device/run forge-bench --config configs/gpt350m.yaml --micro-batch 16 --steps 30 "
           "--precision bf16\n",
           ".device/run forge-bench --config configs/gpt350m.yaml --micro-batch 24 --steps 30 "
           "--precision bf16\n",
           ".device/run forge-bench --config configs/gpt124m.yaml --micro-batch 16 --steps 30 "
           "--precision bf16\n",
           ".device/run forge-bench --config configs/gpt350m.yaml --micro-batch 16 --steps 30 "
           "--precision fp8 --fp8-lm-head 0\n",
           ".device/run forge-bench --config configs/gpt350m.yaml --micro-batch 16 --steps 30 "
           "--precision fp8 --fp8-lm-head 1\n",
           ".device/run forge-bench --config configs/gpt350m.yaml --micro-batch 24 --steps 30 "
           "--precision fp8 --fp8-lm-head 1\n",
           "python3 .device/torch_baseline.py gpt350m:16:c gpt350m:24:c gpt124m:16:c\n"}) {
    EXPECT_TRUE(Printed(single, line));
  }
  EXPECT_EQ(single.out.find("forge-bench-base"), std::string::npos);
  // --base: the previous build's binary right before the new one, on every row.
  const CommandResult base = Shell("bash bench/suite.sh --dry-run --base --no-anchor single-gpu");
  ASSERT_EQ(base.exit_code, 0);
  EXPECT_TRUE(Printed(base,
                      "# gpt350m-b16-bf16-base\n.device/run forge-bench-base --config "
                      "configs/gpt350m.yaml --micro-batch 16 --steps 30 --precision bf16\n"
                      "# gpt350m-b16-bf16\n.device/run forge-bench --config "
                      "configs/gpt350m.yaml --micro-batch 16 --steps 30 --precision bf16\n"));
  // --only: the runs whose label matches, e.g. half a suite per call.
  const CommandResult only = Shell("bash bench/suite.sh --dry-run --only 'fp8lm$' single-gpu");
  ASSERT_EQ(only.exit_code, 0);
  EXPECT_EQ(only.out.find("--precision bf16"), std::string::npos) << only.out;
  EXPECT_EQ(only.out.find("--fp8-lm-head 0"), std::string::npos) << only.out;
  EXPECT_TRUE(Printed(only, "# gpt350m-b24-fp8lm\n"));
  EXPECT_EQ(only.out.find("torch_baseline"), std::string::npos) << only.out;
  EXPECT_EQ(base.out.find("torch_baseline"), std::string::npos);

  const CommandResult multi = Shell("bash bench/suite.sh --dry-run --world 2 multi-gpu");
  ASSERT_EQ(multi.exit_code, 0);
  for (const char* flags :
       {"--mode ddp\n", "--mode ddp --grad-reduce bf16\n", "--mode zero1\n", "--mode fsdp\n",
        "--mode ddp --distinct-batches --accum-check\n"}) {
    EXPECT_TRUE(Printed(multi, std::string(".device/run forge-dist-bench --config "
                                           "configs/gpt350m.yaml --world 2 --micro-batch 16 "
                                           "--steps 20 ") +
                                   flags));
  }
  EXPECT_TRUE(Printed(multi, "--nproc_per_node=2 .device/torch_dist.py ddp gpt350m 16\n"));
  EXPECT_TRUE(Printed(multi, "--nproc_per_node=2 .device/torch_dist.py fsdp gpt350m 16\n"));
  EXPECT_TRUE(Printed(multi, "NCCL_NVLS_ENABLE=0"));

  const CommandResult acc = Shell("bash bench/suite.sh --dry-run --out /tmp/acc fp8-accuracy");
  ASSERT_EQ(acc.exit_code, 0);
  EXPECT_TRUE(Printed(acc,
                      "'s/compute: bf16/compute: fp8\\n  fp8:\\n    lm_head: true/' -e "
                      "'s/global_batch: 32/global_batch: 16/' -e "
                      "'s/every_steps: 250/every_steps: 100/' configs/gpt124m.yaml > "
                      "/tmp/acc/fp8-accuracy-logs/acc_fp8lm.yaml\n"));
  EXPECT_TRUE(Printed(acc,
                      ".device/run forge train /tmp/acc/fp8-accuracy-logs/acc_bf16.yaml "
                      "--direct --checkpoint-every 0 --run-dir "
                      "/tmp/acc/fp8-accuracy-logs/acc_bf16\n"));
  // llama-train: the shipped configs with one micro-step a step; 1B and 3B on a GPU each, 8B
  // fsdp over all of them (none on one GPU).
  const CommandResult train = Shell("bash bench/suite.sh --dry-run --world 2 --out /tmp/lt llama-train");
  ASSERT_EQ(train.exit_code, 0) << train.out;
  EXPECT_TRUE(Printed(train, "tar -xJf .devdata/llama3.tar.xz -C /tmp/forge-suite-data\n"));
  EXPECT_TRUE(Printed(train,
                      "-e 's/global_batch: 32/global_batch: 2/' -e "
                      "'s/warmup_steps: 200/warmup_steps: 30/' -e "
                      "'s/total_steps: 5000/total_steps: 300/' -e "
                      "'s/every_steps: 250/every_steps: 100/' -e 's/batches: 8/batches: 4/' "
                      "configs/llama3-1b.yaml > /tmp/lt/llama-train-logs/train_llama3-1b.yaml\n"));
  EXPECT_TRUE(Printed(train,
                      "env FORGE_DATA_DIR=/tmp/forge-suite-data CUDA_VISIBLE_DEVICES=1 "
                      ".device/run forge train /tmp/lt/llama-train-logs/train_llama3-3b.yaml "
                      "--direct --checkpoint-every 0 --run-dir "
                      "/tmp/lt/llama-train-logs/train_llama3-3b\n"));
  EXPECT_TRUE(Printed(train,
                      "'s/global_batch: 32/global_batch: 2/' -e "
                      "'s/warmup_steps: 200/warmup_steps: 30/' -e "
                      "'s/total_steps: 5000/total_steps: 200/'"));
  EXPECT_TRUE(Printed(train,
                      "CUDA_VISIBLE_DEVICES=0,1 .device/run forge train "
                      "/tmp/lt/llama-train-logs/train_llama3-8b.yaml --checkpoint-every 0 "
                      "--run-dir /tmp/lt/llama-train-logs/train_llama3-8b\n"));
  const CommandResult one = Shell("bash bench/suite.sh --dry-run --world 1 llama-train");
  ASSERT_EQ(one.exit_code, 0) << one.out;
  EXPECT_TRUE(Printed(one, "# train-llama3-8b skipped: fsdp needs 2 or more GPUs (found 1)"));
  const CommandResult own = Shell("bash bench/suite.sh --dry-run --data /tmp/mine.tar.xz llama-train");
  EXPECT_TRUE(Printed(own, "tar -xJf /tmp/mine.tar.xz -C"));

  const CommandResult shipped = Shell("bash bench/suite.sh --dry-run --as-shipped fp8-accuracy");
  EXPECT_EQ(shipped.out.find("global_batch: 16"), std::string::npos) << shipped.out;

  const CommandResult tests = Shell("bash bench/suite.sh --dry-run --filter 'Gpu*' gpu-tests");
  ASSERT_EQ(tests.exit_code, 0);
  EXPECT_TRUE(Printed(tests, ".device/run forge_gpu_tests '--gtest_filter=Gpu*'\n"));
  // On several GPUs: the one-GPU cases in a shard a GPU, then the multi-GPU cases over all.
  const CommandResult sharded = Shell("bash bench/suite.sh --dry-run --world 2 gpu-tests");
  ASSERT_EQ(sharded.exit_code, 0);
  EXPECT_TRUE(Printed(sharded, "env CUDA_VISIBLE_DEVICES=1 GTEST_TOTAL_SHARDS=2 "
                               "GTEST_SHARD_INDEX=1 .device/run forge_gpu_tests "
                               "'--gtest_filter=-CudaDataParallel.*:"));
  EXPECT_TRUE(Printed(sharded, "# gpu-tests-multi\n.device/run forge_gpu_tests "
                               "'--gtest_filter=CudaDataParallel.*:"));

  const CommandResult profile = Shell("bash bench/suite.sh --dry-run --out /tmp/p profile");
  ASSERT_EQ(profile.exit_code, 0);
  EXPECT_TRUE(
      Printed(profile,
              ".device/run ncu --clock-control none "
              "--cache-control none --metrics gpu__time_duration.sum --csv "
              "--page raw --log-file /tmp/p/profile-logs/ncu-fp8lm.csv forge-bench --config "
              "configs/gpt350m.yaml --micro-batch 16 --warmup 1 --steps 1 "
              "--cuda-graph 0 --precision fp8 --fp8-lm-head 1\n"));
}

// The suites run for real against stand-ins for the packed binaries, nvidia-smi and the
// anchor (testdata/bench_suite/fake_device: fixed JSON lines, one B 24 FP8 run that fails, a
// test binary with one failed test): the lines are tagged and kept, the table made from them,
// the failures listed and the exit status 1.
TEST_F(BenchSuiteTest, SuiteRunsOnStandInsAndTablesTheirLines) {
  const std::string fake = kData + "fake_device";
  const std::string out = ::testing::TempDir() + "/bench_suite_out";
  const std::string env = "PATH=" + fake + "/bin:$PATH FORGE_DEVICE_DIR=" + fake + " ";
  Shell("rm -rf " + out);
  const CommandResult single = Shell(env + "bash bench/suite.sh --out " + out + " single-gpu 2>/dev/null");
  EXPECT_EQ(single.exit_code, 1) << single.out;
  const auto lines = JsonLines(single.out);
  ASSERT_EQ(lines.size(), 10u) << single.out;  // the GPU, 5 runs, 1 error, 3 anchor shapes
  for (const auto& l : lines) EXPECT_EQ(l["suite"], "single-gpu");
  EXPECT_EQ(lines[1]["label"], "gpt350m-b16-bf16");
  EXPECT_EQ(lines[1]["tokens_per_s"], 204800.0);
  EXPECT_EQ(lines[6]["label"], "gpt350m-b24-fp8lm");
  EXPECT_EQ(lines[6]["error"], "exit 1");
  EXPECT_TRUE(Printed(single,
                      "| gpt350m | 16 | Forge FP8 | 60.00 | 273,066 | 50.0% | 20.00 | 3.0 | "
                      "1.333x | 1.667x |"));
  EXPECT_TRUE(Printed(single, "- gpt350m-b24-fp8lm: exit 1"));
  EXPECT_EQ(ReadFile(out + "/single-gpu.md"),
            single.out.substr(single.out.find("### single-gpu")));
  EXPECT_EQ(JsonLines(ReadFile(out + "/single-gpu.jsonl")).size(), lines.size());
  // The logs come back as one file: each run's output, by its label.
  const CommandResult log = Shell("tar xzf " + out + "/single-gpu-logs.tar.gz -O "
                        "single-gpu-logs/gpt350m-b24-fp8lm.log");
  EXPECT_TRUE(Printed(log, "out of memory"));
  EXPECT_EQ(Shell("ls " + out).out,
            "single-gpu-logs.tar.gz\nsingle-gpu.jsonl\nsingle-gpu.md\n");

  const CommandResult tests = Shell(env + "bash bench/suite.sh --out " + out + " gpu-tests 2>/dev/null");
  EXPECT_EQ(tests.exit_code, 1);
  EXPECT_TRUE(Printed(tests, "| gpu-tests-run | 4 | 1 | 1 | 1 | 1 | 3.8 |"));
  EXPECT_TRUE(Printed(tests, "| GpuFlashBackward.LargeBatch | unfinished | 0 |"));
  // Two GPUs: two shards side by side and the multi-GPU run, each a row, and their sum.
  const CommandResult two =
      Shell(env + "bash bench/suite.sh --world 2 --out " + out + " gpu-tests 2>/dev/null");
  EXPECT_EQ(two.exit_code, 1);
  EXPECT_TRUE(Printed(two, "| gpu-tests-shard1 | 4 | 1 | 1 | 1 | 1 | 3.8 |")) << two.out;
  EXPECT_TRUE(Printed(two, "| gpu-tests-multi | 4 | 1 | 1 | 1 | 1 | 3.8 |")) << two.out;
  EXPECT_TRUE(Printed(two, "| all | 12 | 3 | 3 | 3 | 3 | 11.4 |")) << two.out;
}

TEST_F(BenchSuiteTest, UnknownSuiteOrOptionIsAnError) {
  const CommandResult list = Shell("bash bench/suite.sh --list");
  EXPECT_EQ(list.exit_code, 0);
  EXPECT_EQ(list.out,
            "single-gpu llama multi-gpu llama-dp nodes llama-fsdp fp8-accuracy llama-train "
            "generation gpu-tests profile\n");
  const CommandResult help = Shell("bash bench/suite.sh --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_TRUE(Printed(help, "bench/suite.sh [--dry-run]"));
  const CommandResult bad = Shell("bash bench/suite.sh --dry-run single-gpuu 2>&1");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(Printed(bad, "unknown suite 'single-gpuu'"));
  EXPECT_TRUE(Printed(bad, "suites: single-gpu llama multi-gpu"));
  const CommandResult opt = Shell("bash bench/suite.sh --dry --run single-gpu 2>&1");
  EXPECT_EQ(opt.exit_code, 2);
  EXPECT_TRUE(Printed(opt, "unknown option --dry"));
}

}  // namespace
