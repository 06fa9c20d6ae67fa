// RunConfig parsing: presets and overrides, defaults, enums, every kind of error with its exact
// key path and line, ValidateRunConfig, and every file in configs/.
#include "common/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "config_test_util.h"

namespace forge {
namespace {

// YAML text from lines, so that a test's line numbers are the list positions (1-based).
std::string Y(std::initializer_list<const char*> lines) {
  std::string out;
  for (const char* l : lines) out += std::string(l) + "\n";
  return out;
}

using test::FailsWith;
using test::ParseOk;

// ---------------------------------------------------------------------------------------------

TEST(ConfigPresetTest, PresetsSetTheAgreedDims) {
  struct Want {
    const char* name;
    int n_layer, d_model, n_head, n_kv_head, ffn, vocab, seq_len, head_dim;
  };
  for (const Want& w : {Want{"tiny", 4, 128, 4, 4, 384, 50257, 128, 32},
                        Want{"gpt124m", 12, 768, 12, 12, 2048, 50257, 1024, 64},
                        Want{"gpt350m", 24, 1024, 16, 16, 2816, 50257, 1024, 64}}) {
    SCOPED_TRACE(w.name);
    ModelConfig m;
    m.n_layer = 99;
    ASSERT_TRUE(ApplyModelPreset(w.name, &m).ok());
    EXPECT_EQ(m.preset, w.name);
    EXPECT_EQ(m.n_layer, w.n_layer);
    EXPECT_EQ(m.d_model, w.d_model);
    EXPECT_EQ(m.n_head, w.n_head);
    EXPECT_EQ(m.n_kv_head, w.n_kv_head);
    EXPECT_EQ(m.ffn, w.ffn);
    EXPECT_EQ(m.vocab, w.vocab);
    EXPECT_EQ(m.seq_len, w.seq_len);
    EXPECT_EQ(m.head_dim(), w.head_dim);
    EXPECT_EQ(m.padded_vocab(), 50304);  // the PyTorch anchor's V
  }
}

TEST(ConfigPresetTest, PresetLeavesNonDimFieldsAlone) {
  ModelConfig m;
  m.rope_theta = 500000.0f;
  m.qk_norm = true;
  ASSERT_TRUE(ApplyModelPreset("gpt124m", &m).ok());
  EXPECT_EQ(m.rope_theta, 500000.0f);
  EXPECT_TRUE(m.qk_norm);
}

TEST(ConfigPresetTest, UnknownPresetIsInvalidAndNamesTheChoices) {
  ModelConfig m;
  for (const char* bad : {"gpt3", "", "Tiny"}) {
    Status s = ApplyModelPreset(bad, &m);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("tiny|gpt124m|gpt350m"), std::string::npos) << s.message();
  }
  EXPECT_EQ(m.n_layer, ModelConfig{}.n_layer);  // untouched on failure
}

// ---------------------------------------------------------------------------------------------

TEST(ConfigParseTest, PresetFromYaml) {
  RunConfig c = ParseOk(Y({"model:", "  preset: gpt350m"}));
  EXPECT_EQ(c.model.preset, "gpt350m");
  EXPECT_EQ(c.model.n_layer, 24);
  EXPECT_EQ(c.model.d_model, 1024);
  EXPECT_EQ(c.model.ffn, 2816);
  EXPECT_EQ(c.model.seq_len, 1024);
  EXPECT_EQ(c.source_path, "t.yaml");
}

TEST(ConfigParseTest, OverridesApplyAfterThePresetWhereverWritten) {
  // seq_len comes before preset in the file and must still win.
  RunConfig c = ParseOk(Y({"model:", "  seq_len: 256", "  preset: gpt124m", "  n_layer: 2",
                           "  qk_norm: true", "  rope_theta: 500000"}));
  EXPECT_EQ(c.model.preset, "gpt124m");
  EXPECT_EQ(c.model.seq_len, 256);
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.d_model, 768);  // from the preset
  EXPECT_EQ(c.model.ffn, 2048);
  EXPECT_TRUE(c.model.qk_norm);
  EXPECT_EQ(c.model.rope_theta, 500000.0f);
}

TEST(ConfigParseTest, KvHeadsFollowHeadsUnlessGiven) {
  RunConfig c = ParseOk(Y({"model:", "  preset: gpt124m", "  n_head: 6"}));
  EXPECT_EQ(c.model.n_head, 6);
  EXPECT_EQ(c.model.n_kv_head, 6);  // not the preset's 12, not a silent GQA
  c = ParseOk(Y({"model:", "  preset: gpt124m", "  n_kv_head: 4"}));
  EXPECT_EQ(c.model.n_head, 12);
  EXPECT_EQ(c.model.n_kv_head, 4);
}

TEST(ConfigParseTest, ExplicitDimsWithoutPreset) {
  RunConfig c = ParseOk(Y({"model:", "  n_layer: 2", "  d_model: 64", "  n_head: 4",
                           "  n_kv_head: 2", "  ffn: 160", "  vocab: 1000", "  seq_len: 32"}));
  EXPECT_EQ(c.model.preset, "");
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.d_model, 64);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(c.model.n_kv_head, 2);
  EXPECT_EQ(c.model.ffn, 160);
  EXPECT_EQ(c.model.vocab, 1000);
  EXPECT_EQ(c.model.padded_vocab(), 1024);
  EXPECT_EQ(c.model.seq_len, 32);
}

TEST(ConfigParseTest, AbsentKeysKeepTheStructDefaults) {
  const RunConfig d;
  RunConfig c = ParseOk(Y({"model:", "  preset: tiny", "eval:", "train:"}));
  EXPECT_EQ(c.name, d.name);
  EXPECT_EQ(c.seed, d.seed);
  EXPECT_EQ(c.data.dataset_dir, "");
  EXPECT_EQ(c.data.epoch_shuffle, d.data.epoch_shuffle);
  EXPECT_EQ(c.optimizer.lr, d.optimizer.lr);
  EXPECT_EQ(c.optimizer.beta1, d.optimizer.beta1);
  EXPECT_EQ(c.optimizer.beta2, d.optimizer.beta2);
  EXPECT_EQ(c.optimizer.eps, d.optimizer.eps);
  EXPECT_EQ(c.optimizer.weight_decay, d.optimizer.weight_decay);
  EXPECT_EQ(c.optimizer.grad_clip, d.optimizer.grad_clip);
  EXPECT_EQ(c.schedule.total_steps, d.schedule.total_steps);
  EXPECT_EQ(c.schedule.warmup_steps, d.schedule.warmup_steps);
  EXPECT_EQ(c.schedule.decay, DecayKind::kCosine);
  EXPECT_EQ(c.schedule.min_lr_ratio, d.schedule.min_lr_ratio);
  EXPECT_EQ(c.batch.micro_batch, d.batch.micro_batch);
  EXPECT_EQ(c.batch.global_batch, d.batch.global_batch);
  EXPECT_EQ(c.precision.compute, Precision::kBf16);
  EXPECT_EQ(c.parallel.mode, ParallelMode::kDdp);
  EXPECT_EQ(c.parallel.collective_timeout_s, d.parallel.collective_timeout_s);
  EXPECT_EQ(c.checkpoint.keep_last, d.checkpoint.keep_last);
  EXPECT_EQ(c.eval.every_steps, d.eval.every_steps);  // "eval:" with nothing under it
  EXPECT_EQ(c.eval.batches, d.eval.batches);
  EXPECT_EQ(c.train.backend, Backend::kAuto);
  EXPECT_EQ(c.train.run_dir, d.train.run_dir);
  EXPECT_EQ(c.model.rope_theta, d.model.rope_theta);
  EXPECT_EQ(c.model.norm_eps, d.model.norm_eps);
  EXPECT_EQ(c.model.init_std, d.model.init_std);
  EXPECT_EQ(c.model.init, InitScheme::kGpt2);
  EXPECT_FALSE(c.model.qk_norm);
}

TEST(ConfigParseTest, EveryKeyIsRead) {
  RunConfig c = ParseOk(Y({
      "name: exp-7.b_c",
      "seed: 18446744073709551615",
      "model:",
      "  preset: tiny",
      "  norm_eps: 1e-6",
      "  init_std: 0.01",
      "data:",
      "  dataset_dir: /data/ds",
      "  epoch_shuffle: 0",
      "optimizer:",
      "  lr: 3e-4",
      "  beta1: 0.8",
      "  beta2: 0.99",
      "  eps: 1.0e-6",
      "  weight_decay: 0",
      "  grad_clip: 0",
      "schedule:",
      "  total_steps: 77",
      "  warmup_steps: 77",
      "  decay: linear",
      "  min_lr_ratio: 1",
      "batch:",
      "  micro_batch: 3",
      "  global_batch: 12",
      "precision:",
      "  compute: fp8",
      "  fp8:",
      "    recipe: current",
      "    amax_history: 32",
      "    margin: 1",
      "    lm_head: True",
      "parallel:",
      "  mode: fsdp",
      "  collective_timeout_s: 12.5",
      "checkpoint:",
      "  dir: ck",
      "  every_steps: 5",
      "  keep_last: 1",
      "  keep_every: 20",
      "  resume: latest",
      "eval:",
      "  every_steps: 0",
      "  batches: 2",
      "  samples: [\"Once upon a time\", 'The capital of France is']",
      "  sample_tokens: 12",
      "train:",
      "  backend: cpu",
      "  activation_recompute: true",
      "  log_every: 1",
      "  run_dir: 'runs/x y'",
      "  workers: 4",
      "  max_restarts: 0",
      "  hang_timeout_s: 42.5",
      "  spike_sigma: 4.5",
      "  spike_window: 20",
      "  spike_max_in_row: 2",
      "  straggler_threshold: 1.25",
      "  straggler_reports: 7",
      "  min_workers: 3",
      "  elastic_grace_s: 7.5",
      "  node_failure_limit: 0",
      "  node_cooldown_s: 90",
  }));
  EXPECT_EQ(c.name, "exp-7.b_c");
  EXPECT_EQ(c.seed, 18446744073709551615ull);
  EXPECT_EQ(c.model.norm_eps, 1e-6f);
  EXPECT_EQ(c.model.init_std, 0.01f);
  EXPECT_EQ(c.data.dataset_dir, "/data/ds");
  EXPECT_EQ(c.data.epoch_shuffle, 0);
  EXPECT_EQ(c.optimizer.lr, 3e-4f);
  EXPECT_EQ(c.optimizer.beta1, 0.8f);
  EXPECT_EQ(c.optimizer.beta2, 0.99f);
  EXPECT_EQ(c.optimizer.eps, 1e-6f);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0f);
  EXPECT_EQ(c.optimizer.grad_clip, 0.0f);
  EXPECT_EQ(c.schedule.total_steps, 77);
  EXPECT_EQ(c.schedule.warmup_steps, 77);
  EXPECT_EQ(c.schedule.decay, DecayKind::kLinear);
  EXPECT_EQ(c.schedule.min_lr_ratio, 1.0f);
  EXPECT_EQ(c.batch.micro_batch, 3);
  EXPECT_EQ(c.batch.global_batch, 12);
  EXPECT_EQ(c.precision.compute, Precision::kFp8);
  EXPECT_EQ(c.precision.fp8.recipe, Fp8Recipe::kCurrent);
  EXPECT_EQ(c.precision.fp8.amax_history, 32);
  EXPECT_EQ(c.precision.fp8.margin, 1);
  EXPECT_TRUE(c.precision.fp8.lm_head);
  EXPECT_EQ(c.parallel.mode, ParallelMode::kFsdp);
  EXPECT_EQ(c.parallel.collective_timeout_s, 12.5);
  EXPECT_EQ(c.checkpoint.dir, "ck");
  EXPECT_EQ(c.checkpoint.every_steps, 5);
  EXPECT_EQ(c.checkpoint.keep_last, 1);
  EXPECT_EQ(c.checkpoint.keep_every, 20);
  EXPECT_EQ(c.checkpoint.resume, "latest");
  EXPECT_EQ(c.eval.every_steps, 0);
  EXPECT_EQ(c.eval.batches, 2);
  EXPECT_EQ(c.eval.samples,
            (std::vector<std::string>{"Once upon a time", "The capital of France is"}));
  EXPECT_EQ(c.eval.sample_tokens, 12);
  EXPECT_EQ(c.train.backend, Backend::kCpu);
  EXPECT_EQ(c.train.activation_recompute, Recompute::kFull);
  EXPECT_EQ(c.train.log_every, 1);
  EXPECT_EQ(c.train.run_dir, "runs/x y");
  EXPECT_EQ(c.train.workers, 4);
  EXPECT_EQ(c.train.max_restarts, 0);
  EXPECT_EQ(c.train.hang_timeout_s, 42.5);
  EXPECT_EQ(c.train.spike_sigma, 4.5);
  EXPECT_EQ(c.train.spike_window, 20);
  EXPECT_EQ(c.train.spike_max_in_row, 2);
  EXPECT_EQ(c.train.straggler_threshold, 1.25);
  EXPECT_EQ(c.train.straggler_reports, 7);
  EXPECT_EQ(c.train.min_workers, 3);
  EXPECT_EQ(MinWorkers(c.train), 3);
  EXPECT_EQ(c.train.elastic_grace_s, 7.5);
  EXPECT_EQ(c.train.node_failure_limit, 0);
  EXPECT_EQ(c.train.node_cooldown_s, 90.0);
}

TEST(ConfigParseTest, EnumsReadAndNameEveryValue) {
  const std::string base = Y({"model:", "  preset: tiny"});
  for (auto [text, want] : {std::pair{"cosine", DecayKind::kCosine},
                            std::pair{"linear", DecayKind::kLinear},
                            std::pair{"constant", DecayKind::kConstant}}) {
    EXPECT_EQ(ParseOk(base + "schedule:\n  decay: " + text + "\n").schedule.decay, want);
    EXPECT_STREQ(DecayKindName(want), text);
  }
  for (auto [text, want] : {std::pair{"fp32", Precision::kFp32}, std::pair{"bf16", Precision::kBf16},
                            std::pair{"fp8", Precision::kFp8}}) {
    EXPECT_EQ(ParseOk(base + "precision:\n  compute: " + text + "\n").precision.compute, want);
    EXPECT_STREQ(PrecisionName(want), text);
  }
  for (auto [text, want] :
       {std::pair{"ddp", ParallelMode::kDdp}, std::pair{"zero1", ParallelMode::kZero1},
        std::pair{"zero2", ParallelMode::kZero2}, std::pair{"fsdp", ParallelMode::kFsdp}}) {
    EXPECT_EQ(ParseOk(base + "parallel:\n  mode: " + text + "\n").parallel.mode, want);
    EXPECT_STREQ(ParallelModeName(want), text);
  }
  for (auto [text, want] : {std::pair{"auto", Backend::kAuto}, std::pair{"cpu", Backend::kCpu},
                            std::pair{"cuda", Backend::kCuda}}) {
    EXPECT_EQ(ParseOk(base + "train:\n  backend: " + text + "\n").train.backend, want);
    EXPECT_STREQ(BackendName(want), text);
  }
  for (auto [text, want] :
       {std::pair{"gpt2", InitScheme::kGpt2}, std::pair{"torch", InitScheme::kTorch}}) {
    EXPECT_EQ(ParseOk(base + "  init: " + text + "\n").model.init, want);
    EXPECT_STREQ(InitSchemeName(want), text);
  }
  for (auto [text, want] : {std::pair{"none", Recompute::kNone},
                            std::pair{"selective", Recompute::kSelective},
                            std::pair{"full", Recompute::kFull}}) {
    EXPECT_EQ(ParseOk(base + "train:\n  activation_recompute: " + text + "\n")
                  .train.activation_recompute,
              want);
    EXPECT_STREQ(RecomputeName(want), text);
  }
  // The boolean spellings of activation_recompute: true is full, false none.
  EXPECT_EQ(ParseOk(base + "train:\n  activation_recompute: true\n").train.activation_recompute,
            Recompute::kFull);
  EXPECT_EQ(ParseOk(base + "train:\n  activation_recompute: false\n").train.activation_recompute,
            Recompute::kNone);
  // Quoted enum values are still the same names.
  EXPECT_EQ(ParseOk(base + "parallel:\n  mode: \"zero2\"\n").parallel.mode, ParallelMode::kZero2);
}

TEST(ConfigParseTest, NumberSpellings) {
  RunConfig c = ParseOk(Y({"model:", "  preset: tiny", "optimizer:", "  lr: 1", "  eps: 1E-7",
                           "  beta1: +0.5", "batch:", "  micro_batch: +4", "  global_batch: 008"}));
  EXPECT_EQ(c.optimizer.lr, 1.0f);
  EXPECT_EQ(c.optimizer.eps, 1e-7f);
  EXPECT_EQ(c.optimizer.beta1, 0.5f);
  EXPECT_EQ(c.batch.micro_batch, 4);
  EXPECT_EQ(c.batch.global_batch, 8);
}

TEST(ConfigParseTest, EmptyStringValuesReadAsEmpty) {
  RunConfig c = ParseOk(Y({"model: {preset: tiny}", "data:", "  dataset_dir:", "checkpoint:",
                           "  resume: ''"}));
  EXPECT_EQ(c.data.dataset_dir, "");
  EXPECT_EQ(c.checkpoint.resume, "");
  EXPECT_EQ(c.model.preset, "tiny");  // flow mappings are mappings too
}

TEST(ConfigParseTest, YamlRoundTripIsExact) {
  RunConfig c = ParseOk(Y({"name: rt", "seed: 7", "model:", "  preset: gpt124m", "  n_kv_head: 4",
                           "  norm_eps: 1e-6", "  rope_theta: 12345.678"}));
  c.optimizer.lr = 0.1f + 0.2f;  // a float with no short decimal spelling
  c.optimizer.eps = 3.3e-9f;
  c.schedule.decay = DecayKind::kConstant;
  c.model.init = InitScheme::kTorch;
  c.precision.compute = Precision::kFp8;
  c.parallel.mode = ParallelMode::kZero2;
  c.parallel.collective_timeout_s = 1.0 / 3.0;
  c.train.backend = Backend::kCuda;
  c.checkpoint.dir = "we\"ird: \\path #x";
  c.data.dataset_dir = "";
  c.train.hang_timeout_s = 0.1 + 0.2;
  c.eval.samples = {"a \"quoted\" prompt: #1", "line\nbreak", "caf\xc3\xa9"};
  c.eval.sample_tokens = 7;
  c.train.spike_sigma = 0.0;
  c.train.straggler_threshold = 1.0 + 1.0 / 3.0;
  c.train.workers = 4;
  c.train.min_workers = 2;
  c.train.elastic_grace_s = 2.5;
  c.train.node_failure_limit = 5;
  c.train.node_cooldown_s = 12.5;
  const std::string yaml = RunConfigToYaml(c);
  RunConfig back = ParseOk(yaml);
  EXPECT_EQ(RunConfigToYaml(back), yaml);
  EXPECT_EQ(back.model.preset, "gpt124m");
  EXPECT_EQ(back.model.n_kv_head, 4);
  EXPECT_EQ(back.model.rope_theta, c.model.rope_theta);
  EXPECT_EQ(back.optimizer.lr, c.optimizer.lr);
  EXPECT_EQ(back.optimizer.eps, c.optimizer.eps);
  EXPECT_EQ(back.parallel.collective_timeout_s, c.parallel.collective_timeout_s);
  EXPECT_EQ(back.checkpoint.dir, c.checkpoint.dir);
  EXPECT_EQ(back.schedule.decay, DecayKind::kConstant);
  EXPECT_EQ(back.model.init, InitScheme::kTorch);
  EXPECT_EQ(back.precision.compute, Precision::kFp8);
  EXPECT_EQ(back.parallel.mode, ParallelMode::kZero2);
  EXPECT_EQ(back.train.backend, Backend::kCuda);
  EXPECT_EQ(back.seed, 7u);
  EXPECT_EQ(back.train.hang_timeout_s, c.train.hang_timeout_s);
  EXPECT_EQ(back.eval.samples, c.eval.samples);
  EXPECT_EQ(back.eval.sample_tokens, 7);
  // No samples print as an empty list, which reads back as none.
  c.eval.samples.clear();
  EXPECT_TRUE(ParseOk(RunConfigToYaml(c)).eval.samples.empty());
  EXPECT_EQ(back.train.spike_sigma, 0.0);
  EXPECT_EQ(back.train.straggler_threshold, c.train.straggler_threshold);
  EXPECT_EQ(back.train.min_workers, 2);
  EXPECT_EQ(back.train.elastic_grace_s, 2.5);
  EXPECT_EQ(back.train.node_failure_limit, 5);
  EXPECT_EQ(back.train.node_cooldown_s, 12.5);

  // Without a preset every dim is written, so it reads back as explicit dims.
  c.model.preset = "";
  back = ParseOk(RunConfigToYaml(c));
  EXPECT_EQ(back.model.preset, "");
  EXPECT_EQ(back.model.d_model, 768);
}

// ---------------------------------------------------------------------------------------------
// Errors: each names the source, the 1-based line and the key path.

TEST(ConfigErrorTest, EvalSamplesMustBePromptStrings) {
  const std::string base = Y({"model:", "  preset: tiny"});
  EXPECT_TRUE(FailsWith(base + "eval:\n  samples: hello\n", 4, "eval.samples",
                        "must be a list of prompt strings"));
  EXPECT_TRUE(FailsWith(base + "eval:\n  samples:\n    - ok\n    - [a, b]\n", 6,
                        "eval.samples[1]", "must be a prompt string"));
  EXPECT_TRUE(FailsWith(base + "eval:\n  samples:\n    - ''\n", 5, "eval.samples[0]",
                        "is an empty prompt"));
  EXPECT_TRUE(FailsWith(base + "eval:\n  sample_tokens: 0\n", 4, "eval.sample_tokens",
                        "must be in [1, 4096], got 0"));
}

TEST(ConfigErrorTest, UnknownTopLevelKey) {
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "optimiser:", "  lr: 1e-3"}), 3, "optimiser",
                        "unknown top-level key (did you mean 'optimizer'?); valid top-level keys: "
                        "name, seed, model, data, optimizer, schedule, batch, precision, parallel, "
                        "checkpoint, eval, train"));
  EXPECT_TRUE(FailsWith(Y({"name: a", "", "# comment", "foo: 1", "model:", "  preset: tiny"}), 4,
                        "foo", "unknown top-level key; valid top-level keys: name,"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "Eval:", "  batches: 2"}), 3, "Eval",
                        "did you mean 'eval'?"));
}

TEST(ConfigErrorTest, UnknownNestedKey) {
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "  n_heads: 8"}), 3, "model.n_heads",
                        "unknown key (did you mean 'n_head'?); valid keys of model: preset, "
                        "n_layer, d_model, n_head, n_kv_head, head_dim, ffn, vocab, seq_len, "
                        "rope_theta, rope_scaling, norm_eps, qk_norm, tie_embeddings, init_std, "
                        "init"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "optimizer:", "  lr: 1e-3",
                           "  learning_rate: 1e-3"}),
                        5, "optimizer.learning_rate",
                        "valid keys of optimizer: lr, beta1, beta2, eps, weight_decay, grad_clip"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "train:", "  backnd: cpu"}), 4,
                        "train.backnd", "did you mean 'backend'?"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "batch: {micro_batch: 2, global: 4}"}), 3,
                        "batch.global", "valid keys of batch: micro_batch, global_batch"));
}

TEST(ConfigErrorTest, DuplicateKey) {
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "  seq_len: 64", "  seq_len: 32"}), 4,
                        "model.seq_len", "duplicate key (first given on line 3)"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "eval:", "  batches: 1", "model:",
                           "  preset: tiny"}),
                        5, "model", "duplicate key (first given on line 1)"));
}

TEST(ConfigErrorTest, WrongType) {
  const std::string base = Y({"model:", "  preset: tiny"});  // lines 1-2
  EXPECT_TRUE(FailsWith(base + "batch:\n  micro_batch: four\n", 4, "batch.micro_batch",
                        "must be an integer, got four"));
  EXPECT_TRUE(FailsWith(base + "batch:\n  micro_batch: 4.5\n", 4, "batch.micro_batch",
                        "must be an integer, got 4.5"));
  EXPECT_TRUE(FailsWith(base + "batch:\n  micro_batch: 1e3\n", 4, "batch.micro_batch",
                        "must be an integer, got 1e3"));
  EXPECT_TRUE(FailsWith(base + "batch:\n  micro_batch: \"4\"\n", 4, "batch.micro_batch",
                        "must be an integer, got \"4\""));
  EXPECT_TRUE(FailsWith(base + "optimizer:\n  lr: fast\n", 4, "optimizer.lr",
                        "must be a number, got fast"));
  EXPECT_TRUE(FailsWith(base + "optimizer:\n  lr:\n", 4, "optimizer.lr",
                        "must be a number, got an empty value"));
  EXPECT_TRUE(FailsWith(base + "optimizer:\n  lr: [1, 2]\n", 4, "optimizer.lr",
                        "must be a number, got a sequence"));
  EXPECT_TRUE(FailsWith(base + "optimizer: 3\n", 3, "optimizer",
                        "must be a mapping of keys, got 3"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  - preset", "  - tiny"}), 1, "model",
                        "must be a mapping of keys, got a sequence"));
  EXPECT_TRUE(FailsWith(base + "model_x: 1\n", 3, "model_x", "unknown top-level key"));
  EXPECT_TRUE(FailsWith(base + "train:\n  activation_recompute: yes\n", 4,
                        "train.activation_recompute",
                        "must be one of none|selective|full|true|false, got yes"));
  EXPECT_TRUE(FailsWith(base + "name: {a: 1}\n", 3, "name", "must be a string, got a mapping"));
  EXPECT_TRUE(FailsWith(base + "seed: -1\n", 3, "seed", "must be an integer in [0, 2^64), got -1"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "  vocab: 3000000000"}), 3, "model.vocab",
                        "must fit a 32-bit integer, got 3000000000"));
  EXPECT_TRUE(FailsWith(base + "optimizer:\n  lr: 1e39\n", 4, "optimizer.lr",
                        "out of float range, got 1e39"));
  EXPECT_TRUE(FailsWith(base + "checkpoint:\n  every_steps: 0x10\n", 4, "checkpoint.every_steps",
                        "must be an integer, got 0x10"));
}

TEST(ConfigErrorTest, BadEnumValue) {
  const std::string base = Y({"model:", "  preset: tiny"});
  EXPECT_TRUE(FailsWith(base + "schedule:\n  decay: exp\n", 4, "schedule.decay",
                        "must be one of cosine|linear|constant, got exp"));
  EXPECT_TRUE(FailsWith(base + "precision:\n  compute: BF16\n", 4, "precision.compute",
                        "must be one of fp32|bf16|fp8, got BF16"));
  EXPECT_TRUE(FailsWith(base + "parallel:\n  mode: zero3\n", 4, "parallel.mode",
                        "must be one of ddp|zero1|zero2|fsdp|hsdp, got zero3"));
  EXPECT_TRUE(FailsWith(base + "  init: normal\n", 3, "model.init",
                        "must be one of gpt2|torch, got normal"));
  EXPECT_TRUE(FailsWith(base + "train:\n  backend: [cpu]\n", 4, "train.backend",
                        "must be one of auto|cpu|cuda, got a sequence"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  n_layer: 2", "  preset: gpt3"}), 3, "model.preset",
                        "must be one of tiny|gpt124m|gpt350m|llama3-1b|llama3-3b|llama3-8b, got gpt3"));
}

TEST(ConfigErrorTest, OutOfRange) {
  const std::string base = Y({"model:", "  preset: tiny"});
  const std::string opt = base + "optimizer:\n";  // keys from line 4
  EXPECT_EQ(ParseRunConfig(opt + "  beta2: 1.5\n", "configs/x.yaml").status().message(),
            "configs/x.yaml:4: optimizer.beta2: must be in [0, 1), got 1.5");
  EXPECT_TRUE(FailsWith(opt + "  beta1: 1\n", 4, "optimizer.beta1", "must be in [0, 1), got 1"));
  EXPECT_TRUE(FailsWith(opt + "  lr: -3e-3\n", 4, "optimizer.lr", "must be > 0, got -0.003"));
  EXPECT_TRUE(FailsWith(opt + "  lr: .nan\n", 4, "optimizer.lr", "must be > 0, got .nan"));
  EXPECT_TRUE(FailsWith(opt + "  lr: 1e-3\n  eps: 0\n", 5, "optimizer.eps", "must be > 0, got 0"));
  EXPECT_TRUE(FailsWith(opt + "  grad_clip: -1\n", 4, "optimizer.grad_clip",
                        "must be >= 0, got -1"));
  EXPECT_TRUE(FailsWith(opt + "  weight_decay: -.inf\n", 4, "optimizer.weight_decay",
                        "must be >= 0, got -.inf"));
  EXPECT_TRUE(FailsWith(base + "schedule:\n  min_lr_ratio: 1.5\n", 4, "schedule.min_lr_ratio",
                        "must be in [0, 1], got 1.5"));
  EXPECT_TRUE(FailsWith(base + "schedule:\n  total_steps: 0\n  warmup_steps: 0\n", 4,
                        "schedule.total_steps", "must be >= 1, got 0"));
  EXPECT_TRUE(FailsWith(base + "batch:\n  micro_batch: 0\n", 4, "batch.micro_batch",
                        "must be >= 1, got 0"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "  seq_len: 1"}), 3, "model.seq_len",
                        "must be >= 2, got 1"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "  vocab: 1"}), 3, "model.vocab",
                        "must be in [2, 2147483520], got 1"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "  n_layer: 0"}), 3, "model.n_layer",
                        "must be >= 1, got 0"));
  EXPECT_TRUE(FailsWith(base + "checkpoint:\n  keep_last: 0\n", 4, "checkpoint.keep_last",
                        "must be >= 1, got 0"));
  EXPECT_TRUE(FailsWith(base + "data:\n  epoch_shuffle: 2\n", 4, "data.epoch_shuffle",
                        "must be in [0, 1], got 2"));
  EXPECT_TRUE(FailsWith(base + "parallel:\n  collective_timeout_s: 0\n", 4,
                        "parallel.collective_timeout_s", "must be > 0, got 0"));
  EXPECT_TRUE(FailsWith(base + "eval:\n  batches: 0\n", 4, "eval.batches", "must be >= 1, got 0"));
  EXPECT_TRUE(FailsWith(base + "train:\n  log_every: 0\n", 4, "train.log_every",
                        "must be >= 1, got 0"));
  EXPECT_TRUE(FailsWith(base + "train:\n  hang_timeout_s: -1\n", 4, "train.hang_timeout_s",
                        "must be >= 0, got -1"));
  EXPECT_TRUE(FailsWith(base + "train:\n  max_restarts: -1\n", 4, "train.max_restarts",
                        "must be >= 0, got -1"));
  EXPECT_TRUE(FailsWith(base + "train:\n  spike_sigma: -2\n", 4, "train.spike_sigma",
                        "must be >= 0, got -2"));
  EXPECT_TRUE(FailsWith(base + "train:\n  spike_window: 1\n", 4, "train.spike_window",
                        "must be in [2, 100000], got 1"));
  EXPECT_TRUE(FailsWith(base + "train:\n  spike_max_in_row: 0\n", 4, "train.spike_max_in_row",
                        "must be in [1, 100000], got 0"));
  EXPECT_TRUE(FailsWith(base + "train:\n  straggler_threshold: 0.9\n", 4,
                        "train.straggler_threshold",
                        "must be > 1 (a ratio to the other ranks' median) or 0 (off), got 0.9"));
  EXPECT_TRUE(FailsWith(base + "train:\n  straggler_reports: 0\n", 4,
                        "train.straggler_reports", "must be in [1, 100000], got 0"));
  EXPECT_TRUE(FailsWith(base + "train:\n  workers: 2\n  min_workers: 3\n", 5,
                        "train.min_workers", "must be in [1, 2], got 3"));
  EXPECT_TRUE(FailsWith(base + "train:\n  min_workers: -1\n", 4, "train.min_workers",
                        "must be in [1, 1], got -1"));
  EXPECT_TRUE(FailsWith(base + "train:\n  elastic_grace_s: -2\n", 4, "train.elastic_grace_s",
                        "must be >= 0, got -2"));
  EXPECT_TRUE(FailsWith(base + "train:\n  node_failure_limit: -1\n", 4,
                        "train.node_failure_limit", "must be in [0, 1000000], got -1"));
  EXPECT_TRUE(FailsWith(base + "train:\n  node_cooldown_s: -1\n", 4, "train.node_cooldown_s",
                        "must be >= 0, got -1"));
  EXPECT_TRUE(FailsWith(base + "name: a/b\n", 3, "name",
                        "may hold only letters, digits, '.', '_' and '-', got 'a/b'"));
  EXPECT_TRUE(FailsWith(base + "name: ''\n", 3, "name", "must not be empty"));
}

TEST(ConfigErrorTest, CrossField) {
  // n_head must divide d_model: reported at n_head's line.
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "  n_head: 5"}), 3, "model.n_head",
                        "must divide model.d_model (128), got 5"));
  // Only d_model is in the file: the message names n_head, the line is d_model's.
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: gpt124m", "  d_model: 100"}), 3, "model.n_head",
                        "must divide model.d_model (100), got 12"));
  // Odd head_dim breaks RoPE's rotation pairs.
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "  d_model: 12", "  n_head: 4"}), 4,
                        "model.n_head",
                        "head_dim = model.d_model / model.n_head must be even for RoPE, got "
                        "12 / 4 = 3"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "  n_kv_head: 3"}), 3, "model.n_kv_head",
                        "must divide model.n_head (4), got 3"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "schedule:", "  total_steps: 400",
                           "  warmup_steps: 500"}),
                        5, "schedule.warmup_steps", "must be <= schedule.total_steps (400), got 500"));
  // warmup keeps its default (50): the line is that of the total_steps that broke the rule.
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "schedule:", "  total_steps: 10"}), 4,
                        "schedule.warmup_steps", "must be <= schedule.total_steps (10), got 50"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "batch:", "  micro_batch: 16",
                           "  global_batch: 20"}),
                        5, "batch.global_batch", "must be a multiple of batch.micro_batch (16), got 20"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "batch:", "  micro_batch: 3"}), 4,
                        "batch.global_batch", "must be a multiple of batch.micro_batch (3), got 8"));
}

TEST(ConfigErrorTest, ModelSectionRequiredAndComplete) {
  EXPECT_TRUE(FailsWith(Y({"name: x"}), 0, "model", "required section is missing"));
  EXPECT_TRUE(FailsWith(Y({"name: x", "model:", "  n_layer: 2", "  d_model: 64", "  n_head: 4"}), 2,
                        "model", "give either preset (tiny|gpt124m|gpt350m|llama3-1b|llama3-3b|llama3-8b) or all of n_layer, "
                                 "d_model, n_head, ffn, vocab, seq_len; missing: ffn, vocab, seq_len"));
  EXPECT_TRUE(FailsWith(Y({"model:"}), 1, "model", "missing: n_layer, d_model"));
}

TEST(ConfigErrorTest, SyntaxEmptyAndShape) {
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: [tiny", "eval:"}), 3, "", "YAML syntax error:"));
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "   seq_len: 4"}), 3, "",
                        "YAML syntax error:"));
  EXPECT_TRUE(FailsWith("", 0, "", "config is empty; expected a mapping with keys among: name,"));
  EXPECT_TRUE(FailsWith(Y({"# nothing but", "# comments"}), 0, "", "config is empty"));
  EXPECT_TRUE(FailsWith(Y({"- model", "- eval"}), 1, "",
                        "top level must be a mapping, got a sequence"));
  EXPECT_TRUE(FailsWith(Y({"", "hello"}), 2, "", "top level must be a mapping, got hello"));
  // Reported where the second document's content starts.
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "---", "eval:", "  batches: 1"}), 4, "",
                        "holds 2 YAML documents (the second starts here); expected one"));
}

// YAML is Unicode text: a byte that is not UTF-8 is named with its line and column.
TEST(ConfigErrorTest, NotUtf8IsNamedWithLineAndColumn) {
  EXPECT_TRUE(FailsWith(Y({"model:", "  preset: tiny", "name: caf\xe9"}), 3, "",
                        "not valid UTF-8 text: column 10 (byte offset 31): ill-formed UTF-8 at "
                        "byte 0xe9"));
  // An overlong '/' (C0 AF) and a lone continuation byte; well-formed UTF-8 passes.
  EXPECT_TRUE(FailsWith(Y({"# \xc0\xaf", "model: {preset: tiny}"}), 1, "", "column 3"));
  EXPECT_TRUE(FailsWith(Y({"model: {preset: tiny}", "# \x80"}), 2, "", "byte 0x80"));
  EXPECT_EQ(ParseOk(Y({"model: {preset: tiny}", "data: {dataset_dir: /d/caf\xc3\xa9}"}))
                .data.dataset_dir,
            "/d/caf\xc3\xa9");
}

// A value quoted in an error is a bounded excerpt, whatever its size.
TEST(ConfigErrorTest, HugeValuesAreQuotedAsShortExcerpts) {
  const std::string huge(100000, 'x');
  const std::string model = "model: {preset: tiny}\n";
  for (const std::string& yaml :
       {model + "optimizer: {lr: " + huge + "}\n",
        // (YAML takes keys of at most 1024 characters: longer ones are a syntax error)
        model + "optimizer: {" + huge.substr(0, 1000) + ": 1}\n",
        model + "name: \"" + huge + " y\"\n", "model: {preset: " + huge + "}\n",
        model + "train: {backend: " + huge + "}\n"}) {
    StatusOr<RunConfig> r = ParseRunConfig(yaml, "t.yaml");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_LT(r.status().message().size(), 600u) << r.status().message().substr(0, 600);
    EXPECT_NE(r.status().message().find("xxx... (1000"), std::string::npos)  // 1000 or 100000
        << r.status().message().substr(0, 600);
  }
}

// ---------------------------------------------------------------------------------------------

TEST(ConfigValidateTest, DefaultsAreValid) {
  EXPECT_TRUE(ValidateRunConfig(RunConfig{}).ok());
  RunConfig c;
  ASSERT_TRUE(ApplyModelPreset("gpt350m", &c.model).ok());
  EXPECT_TRUE(ValidateRunConfig(c).ok());
}

TEST(ConfigValidateTest, CrossFieldErrorsWithoutLines) {
  RunConfig c;
  c.model.n_kv_head = 3;
  EXPECT_EQ(ValidateRunConfig(c).message(), "model.n_kv_head: must divide model.n_head (4), got 3");
  c = RunConfig{};
  c.source_path = "cfg.yaml";
  c.batch.micro_batch = 4;
  c.batch.global_batch = 6;
  Status s = ValidateRunConfig(c);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "cfg.yaml: batch.global_batch: must be a multiple of batch.micro_batch (4), got 6");
  c = RunConfig{};
  c.schedule.warmup_steps = c.schedule.total_steps + 1;
  EXPECT_NE(ValidateRunConfig(c).message().find("schedule.warmup_steps"), std::string::npos);
  c = RunConfig{};
  c.model.preset = "huge";
  EXPECT_NE(ValidateRunConfig(c).message().find("model.preset: must be one of"), std::string::npos);
  c = RunConfig{};
  c.optimizer.beta2 = 1.0f;
  EXPECT_EQ(ValidateRunConfig(c).message(), "optimizer.beta2: must be in [0, 1), got 1");
  c = RunConfig{};
  c.train.run_dir = "";
  EXPECT_EQ(ValidateRunConfig(c).message(), "train.run_dir: must not be empty");
}

// ---------------------------------------------------------------------------------------------

std::vector<std::filesystem::path> ConfigFiles() {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(FORGE_SOURCE_DIR "/configs")) {
    if (e.path().extension() == ".yaml" || e.path().extension() == ".yml") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ConfigFilesTest, EveryShippedConfigParses) {
  const auto files = ConfigFiles();
  ASSERT_GE(files.size(), 3u);
  for (const auto& f : files) {
    StatusOr<RunConfig> r = LoadRunConfig(f.string());
    EXPECT_TRUE(r.ok()) << f << ": " << r.status().ToString();
    if (r.ok()) {
      EXPECT_EQ(r->source_path, f.string());
      EXPECT_TRUE(ValidateRunConfig(*r).ok());
    }
  }
}

TEST(ConfigFilesTest, TinyIsTheAgreedCpuRun) {
  StatusOr<RunConfig> r = LoadRunConfig(FORGE_SOURCE_DIR "/configs/tiny.yaml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const RunConfig& c = r.value();
  EXPECT_EQ(c.model.preset, "tiny");
  EXPECT_EQ(c.model.seq_len, 128);
  EXPECT_EQ(c.model.d_model, 128);
  EXPECT_EQ(c.batch.micro_batch, 16);
  EXPECT_EQ(c.batch.global_batch, 16);
  EXPECT_EQ(c.optimizer.lr, 3e-3f);
  EXPECT_EQ(c.schedule.warmup_steps, 30);
  EXPECT_EQ(c.schedule.decay, DecayKind::kCosine);
  EXPECT_EQ(c.schedule.min_lr_ratio, 0.1f);
  EXPECT_GT(c.schedule.total_steps, c.schedule.warmup_steps);
  EXPECT_EQ(c.eval.every_steps, 100);
  EXPECT_EQ(c.eval.batches, 8);
  EXPECT_EQ(c.data.dataset_dir, "");  // the CLI resolves $FORGE_DATA_DIR/dataset
}

TEST(ConfigFilesTest, GpuConfigs) {
  StatusOr<RunConfig> a = LoadRunConfig(FORGE_SOURCE_DIR "/configs/gpt124m.yaml");
  StatusOr<RunConfig> b = LoadRunConfig(FORGE_SOURCE_DIR "/configs/gpt350m.yaml");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  for (const RunConfig* c : {&a.value(), &b.value()}) {
    EXPECT_EQ(c->model.seq_len, 1024);
    EXPECT_EQ(c->model.padded_vocab(), 50304);
    EXPECT_EQ(c->batch.micro_batch, 16);
    EXPECT_EQ(c->precision.compute, Precision::kBf16);
    EXPECT_GT(c->schedule.warmup_steps, 0);  // the schedule lengths are tunables
    EXPECT_LT(c->schedule.warmup_steps, c->schedule.total_steps);
  }
  EXPECT_EQ(a->model.n_layer, 12);
  EXPECT_EQ(a->optimizer.lr, 6e-4f);
  EXPECT_EQ(b->model.n_layer, 24);
  EXPECT_EQ(b->optimizer.lr, 3e-4f);
}

TEST(ConfigFilesTest, LoadReportsMissingFilesAndNamesThePathInErrors) {
  StatusOr<RunConfig> r = LoadRunConfig("/nonexistent/forge.yaml");
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/forge.yaml"), std::string::npos);

  const std::string path = ::testing::TempDir() + "/forge_config_test_bad.yaml";
  {
    std::ofstream out(path);
    out << "model:\n  preset: tiny\noptimizer:\n  beta2: 1.5\n";
  }
  r = LoadRunConfig(path);
  EXPECT_EQ(r.status().message(), path + ":4: optimizer.beta2: must be in [0, 1), got 1.5");
  std::filesystem::remove(path);
}

// A directory reads as nothing: it must be named as a directory, not called an empty config.
TEST(ConfigFilesTest, ADirectoryIsNamedAsOne) {
  StatusOr<RunConfig> r = LoadRunConfig(FORGE_SOURCE_DIR "/configs");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find(FORGE_SOURCE_DIR "/configs: is a directory, not a config file"),
            std::string::npos) << m;
  EXPECT_NE(m.find("gpt124m.yaml"), std::string::npos) << m;  // what the user may have meant
  EXPECT_EQ(m.find("empty"), std::string::npos) << m;
  const std::string empty_dir = ::testing::TempDir() + "/forge_config_test_dir";
  std::filesystem::create_directories(empty_dir);
  r = LoadRunConfig(empty_dir);
  EXPECT_EQ(r.status().message(), empty_dir + ": is a directory, not a config file");
  std::filesystem::remove_all(empty_dir);
}

}  // namespace
}  // namespace forge
