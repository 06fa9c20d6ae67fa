#include "worker/infer/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "worker/checkpoint/safetensors.h"
#include "common/splitmix64.h"

namespace forge {
namespace {

// Uniform in [0, 1) from (seed, stream, step).
double Uniform(uint64_t seed, uint64_t stream, uint64_t step) {
  const uint64_t h = SplitMix64(SplitMix64(SplitMix64(seed) ^ stream) ^ step);
  return double(h >> 11) * 0x1.0p-53;
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int32_t SampleToken(const float* logits, int vocab, const SamplingOptions& opt, uint64_t stream,
                    uint64_t step) {
  if (opt.temperature <= 0.0) {
    return int32_t(std::max_element(logits, logits + vocab) - logits);
  }
  // Candidates by descending logit (ties by id), cut to top-k.
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  const int k = opt.top_k > 0 ? std::min(opt.top_k, vocab) : vocab;
  auto order = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (k < vocab) {
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), order);
    ids.resize(k);
  } else {
    std::sort(ids.begin(), ids.end(), order);
  }
  std::vector<double> p(ids.size());
  const double mx = logits[ids[0]] / opt.temperature;
  double sum = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    p[i] = std::exp(logits[ids[i]] / opt.temperature - mx);
    sum += p[i];
  }
  size_t keep = ids.size();
  if (opt.top_p < 1.0) {
    double cum = 0.0;
    for (size_t i = 0; i < ids.size(); ++i) {
      cum += p[i] / sum;
      if (cum >= opt.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  const double u = Uniform(opt.seed, stream, step) * kept;
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return ids[i];
  }
  return ids[keep - 1];
}

StatusOr<std::vector<Generation>> Generate(DecodeBackend* backend,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& opt,
                                           std::vector<float>* prompt_logits,
                                           GenerateStats* stats) {
  const ModelConfig& m = backend->model();
  const int vocab = m.vocab, padded = m.padded_vocab();
  const int max_len = opt.max_len > 0 ? opt.max_len : m.seq_len;
  if (prompts.empty()) return Status::Invalid("generate: no prompts");
  if (opt.max_new_tokens < 0) return Status::Invalid("generate: max_new_tokens must be >= 0");
  const int B = int(prompts.size());
  std::vector<Generation> out(B);
  for (int i = 0; i < B; ++i) {
    if (prompts[i].empty()) return Status::Invalid("generate: prompt " + std::to_string(i) + " is empty");
    if (int(prompts[i].size()) > max_len)
      return Status::Invalid("generate: prompt " + std::to_string(i) + " has " +
                             std::to_string(prompts[i].size()) +
                             " tokens, more than the model's context of " +
                             std::to_string(max_len));
    out[i].prompt = prompts[i];
  }
  FORGE_RETURN_IF_ERROR(backend->Reset(B, max_len));
  GenerateStats st;
  const auto t0 = std::chrono::steady_clock::now();

  // Greedy decoding without prompt logits asks the backend for the argmax only
  // (AppendGreedy: on the GPU, the vocabulary rows never leave the device).
  const bool greedy = opt.sampling.temperature <= 0.0 && prompt_logits == nullptr;
  std::vector<int> seqs(B);
  std::iota(seqs.begin(), seqs.end(), 0);
  std::vector<float> logits;
  std::vector<int32_t> next;
  if (greedy) {
    FORGE_RETURN_IF_ERROR(backend->AppendGreedy(seqs, prompts, &next));
  } else {
    FORGE_RETURN_IF_ERROR(backend->Append(seqs, prompts, prompt_logits != nullptr, &logits));
  }
  // Each sequence's next-token logits: its last row.
  std::vector<const float*> last(B);
  if (prompt_logits) {
    prompt_logits->clear();
    int64_t row = 0;
    for (int i = 0; i < B; ++i) {
      for (size_t t = 0; t < prompts[i].size(); ++t, ++row) {
        const float* r = logits.data() + row * padded;
        prompt_logits->insert(prompt_logits->end(), r, r + vocab);
      }
      last[i] = logits.data() + (row - 1) * padded;
    }
  } else if (!greedy) {
    for (int i = 0; i < B; ++i) last[i] = logits.data() + int64_t(i) * padded;
  }
  for (int i = 0; i < B; ++i) st.prompt_tokens += int64_t(prompts[i].size());
  const auto t1 = std::chrono::steady_clock::now();
  st.prefill_seconds = Seconds(t0, t1);

  // Each sequence takes its next token (sampled from its latest logits, or the backend's
  // argmax), then goes on (appends that token) unless it chose a stop token, has
  // max_new_tokens, or fills the context.
  std::vector<bool> done(B, opt.max_new_tokens == 0);
  for (int i = 0; i < B; ++i)
    if (done[i]) out[i].stop = "max_new_tokens";
  auto take = [&](int i, int32_t t) {
    Generation& g = out[i];
    g.tokens.push_back(t);
    ++st.new_tokens;
    if (std::find(opt.stop_ids.begin(), opt.stop_ids.end(), t) != opt.stop_ids.end()) {
      done[i] = true;
      g.stop = "stop_token";
    } else if (int(g.tokens.size()) >= opt.max_new_tokens) {
      done[i] = true;
      g.stop = "max_new_tokens";
    } else if (backend->length(i) >= max_len) {
      done[i] = true;
      g.stop = "context";
    }
  };
  auto choose = [&](int i, const float* row) {
    take(i, SampleToken(row, vocab, opt.sampling, uint64_t(i), out[i].tokens.size()));
  };
  for (int i = 0; i < B; ++i)
    if (!done[i]) greedy ? take(i, next[i]) : choose(i, last[i]);
  std::vector<std::vector<int32_t>> step_tokens;
  for (;;) {
    seqs.clear();
    step_tokens.clear();
    for (int i = 0; i < B; ++i) {
      if (done[i]) continue;
      seqs.push_back(i);
      step_tokens.push_back({out[i].tokens.back()});
    }
    if (seqs.empty()) break;
    if (greedy) {
      FORGE_RETURN_IF_ERROR(backend->AppendGreedy(seqs, step_tokens, &next));
      for (size_t k = 0; k < seqs.size(); ++k) take(seqs[k], next[k]);
    } else {
      FORGE_RETURN_IF_ERROR(backend->Append(seqs, step_tokens, false, &logits));
      for (size_t k = 0; k < seqs.size(); ++k)
        choose(seqs[k], logits.data() + int64_t(k) * padded);
    }
  }
  st.decode_seconds = Seconds(t1, std::chrono::steady_clock::now());
  if (stats) *stats = st;
  return out;
}

Status WriteGenerationDump(const std::string& path, const std::vector<Generation>& gens,
                           const std::vector<float>& prompt_logits, int vocab,
                           const GenerateOptions& opt, const std::vector<std::string>& texts) {
  std::vector<SafetensorsOut> t;
  int64_t row = 0;
  for (size_t i = 0; i < gens.size(); ++i) {
    const int64_t n = int64_t(gens[i].prompt.size());
    if (size_t((row + n) * vocab) > prompt_logits.size())
      return Status::Invalid("generation dump: fewer logits than prompt positions");
    const std::string k = std::to_string(i);
    t.push_back({"prompt." + k, {n}, SafetensorsDtype::kI32, nullptr, gens[i].prompt});
    const float* src = prompt_logits.data() + row * vocab;
    const int64_t count = n * vocab;
    t.push_back({"logits." + k, {n, vocab}, SafetensorsDtype::kF32,
                 [src, count](float* dst) { std::copy(src, src + count, dst); }, {}});
    t.push_back({"generated." + k, {int64_t(gens[i].tokens.size())}, SafetensorsDtype::kI32,
                 nullptr, gens[i].tokens});
    row += n;
  }
  std::map<std::string, std::string> meta = {
      {"format", "forge-generation"},
      {"prompts", std::to_string(gens.size())},
      {"vocab", std::to_string(vocab)},
      {"max_new_tokens", std::to_string(opt.max_new_tokens)},
      {"temperature", std::to_string(opt.sampling.temperature)},
      {"top_k", std::to_string(opt.sampling.top_k)},
      {"top_p", std::to_string(opt.sampling.top_p)},
      {"seed", std::to_string(opt.sampling.seed)}};
  for (size_t i = 0; i < texts.size() && i < gens.size(); ++i)
    meta["prompt_text." + std::to_string(i)] = texts[i];
  return WriteSafetensors(path, t, meta);
}

}  // namespace forge
