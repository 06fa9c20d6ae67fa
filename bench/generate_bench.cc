// forge-generate-bench: text generation speed on the GPU (worker/infer/cuda_decode_backend.cc),
// one JSON line per (model, batch): the prefill of B prompts of --prompt-len tokens in one
// call, then --new-tokens greedy steps of B sequences (no stop token, so every step decodes the
// whole batch). Weights are the model's initialisation (InitParams; speed does not depend on
// their values). A --warmup generation first makes the GEMM plans and the KV cache, untimed.
//
//   forge-generate-bench --model gpt350m,llama3-1b --batch 1,32 --prompt-len 128 --new-tokens 128
//
// bench/hf_generate_anchor.py measures Hugging Face transformers' generate on the same shapes.
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "common/config.h"
#include "common/flags.h"
#include "worker/infer/decode_backend.h"
#include "worker/infer/generate.h"
#include "worker/model/init.h"
#include "worker/model/param_layout.h"

namespace forge {
namespace {

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

int Main(int argc, char** argv) {
  const char* prog = "forge-generate-bench";
  FlagParser flags(prog, "", "Greedy generation speed on the GPU (JSON lines).");
  flags.Value("--model", "LIST", "comma-separated model presets (default gpt350m,llama3-1b)");
  flags.Value("--batch", "LIST", "comma-separated batch sizes (default 1,32)");
  flags.Value("--prompt-len", "N", "tokens per prompt (default 128)");
  flags.Value("--new-tokens", "N", "tokens generated per prompt (default 128)");
  flags.Value("--warmup", "N", "untimed generations first (default 1)");
  flags.Value("--repeat", "N", "timed generations; the fastest is reported (default 3)");
  int rc = 0;
  if (bench::ParseFlagsOrExit(flags, prog, argc, argv, &rc)) return rc;
  int prompt_len = 128, new_tokens = 128, warmup = 1, repeat = 3;
  for (auto [name, v] : {std::pair{"--prompt-len", &prompt_len}, {"--new-tokens", &new_tokens},
                         {"--warmup", &warmup}, {"--repeat", &repeat}})
    if (Status s = flags.GetInt(name, v); !s.ok()) return bench::FailJson(prog, s.message());
  if (prompt_len < 1 || new_tokens < 1 || warmup < 0 || repeat < 1)
    return bench::FailJson(prog, "--prompt-len, --new-tokens, --repeat must be >= 1, --warmup >= 0");
  std::vector<int> batches;
  for (const std::string& b : SplitList(flags.Get("--batch", "1,32"))) {
    int v = 0;
    if (!bench::ParseInt(b.c_str(), &v) || v < 1)
      return bench::FailJson(prog, "--batch: expected positive counts, got " + b);
    batches.push_back(v);
  }
  for (const std::string& preset : SplitList(flags.Get("--model", "gpt350m,llama3-1b"))) {
    ModelConfig m;
    if (Status s = ApplyModelPreset(preset, &m); !s.ok())
      return bench::FailJson(prog, "--model: " + s.message());
    const ParamLayout layout = MakeParamLayout(m);
    UnitBuffers params;
    InitParams(m, layout, 1, &params);
    auto backend = MakeDecodeBackend(Backend::kCuda, m, std::move(params));
    if (!backend.ok()) return bench::FailJson(prog, backend.status().ToString());
    for (int B : batches) {
      std::vector<std::vector<int32_t>> prompts(B);
      uint32_t x = 12345;
      for (auto& p : prompts)
        for (int t = 0; t < prompt_len; ++t) {
          x = x * 1664525u + 1013904223u;
          p.push_back(int32_t((x >> 8) % uint32_t(m.vocab)));
        }
      GenerateOptions opt;
      opt.max_new_tokens = new_tokens;
      opt.max_len = prompt_len + new_tokens;
      GenerateStats best;
      double best_total = 0;
      for (int r = 0; r < warmup + repeat; ++r) {
        GenerateStats st;
        auto g = Generate(backend->get(), prompts, opt, nullptr, &st);
        if (!g.ok()) return bench::FailJson(prog, g.status().ToString());
        const double total = st.prefill_seconds + st.decode_seconds;
        if (r >= warmup && (best_total == 0 || total < best_total)) best = st, best_total = total;
      }
      // The first new token comes from the prefill; the rest from decode steps.
      const int64_t steps_tokens = best.new_tokens - B;
      nlohmann::ordered_json j = {
          {"bench", "generate"},
          {"model", preset},
          {"B", B},
          {"prompt_len", prompt_len},
          {"new_tokens", new_tokens},
          {"backend", "forge-cuda"},
          {"prefill_s", best.prefill_seconds},
          {"prefill_tokens_per_s", best.prompt_tokens / best.prefill_seconds},
          {"decode_s", best.decode_seconds},
          {"decode_ms_per_step", 1e3 * best.decode_seconds / std::max(1, new_tokens - 1)},
          {"decode_tokens_per_s", steps_tokens / best.decode_seconds},
          {"tokens_per_s", best.new_tokens / best_total}};
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace forge

int main(int argc, char** argv) { return forge::Main(argc, argv); }
