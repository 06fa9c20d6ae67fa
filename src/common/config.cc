// Strict YAML -> RunConfig. Parsing happens in two passes: the reader checks structure and
// types (unknown keys, wrong types) and remembers the line of every key it saw; then the value
// rules (ranges and cross-field checks, shared with ValidateRunConfig) run on the result and a
// failing rule is reported at the line of the key it names.
#include "common/config.h"

#include "common/closest_match.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

#include "common/named_values.h"
#include "common/text_excerpt.h"

namespace forge {
namespace {

// ---------------------------------------------------------------------------------------------
// Names

constexpr std::array<NamedValue<DecayKind>, 3> kDecayNames{{
    {"cosine", DecayKind::kCosine}, {"linear", DecayKind::kLinear}, {"constant", DecayKind::kConstant}}};
constexpr std::array<NamedValue<Precision>, 3> kPrecisionNames{{
    {"fp32", Precision::kFp32}, {"bf16", Precision::kBf16}, {"fp8", Precision::kFp8}}};
constexpr std::array<NamedValue<ParallelMode>, 5> kParallelNames{{{"ddp", ParallelMode::kDdp},
                                                                  {"zero1", ParallelMode::kZero1},
                                                                  {"zero2", ParallelMode::kZero2},
                                                                  {"fsdp", ParallelMode::kFsdp},
                                                                  {"hsdp", ParallelMode::kHsdp}}};
constexpr std::array<NamedValue<GradReduce>, 2> kGradReduceNames{{
    {"fp32", GradReduce::kFp32}, {"bf16", GradReduce::kBf16}}};
constexpr std::array<NamedValue<InitScheme>, 2> kInitNames{
    {{"gpt2", InitScheme::kGpt2}, {"torch", InitScheme::kTorch}}};
constexpr std::array<NamedValue<DdpAllReduce>, 2> kDdpAllReduceNames{{
    {"nccl", DdpAllReduce::kNccl}, {"copy_engine", DdpAllReduce::kCopyEngine}}};
constexpr std::array<NamedValue<Fp8FastAccum>, 3> kFp8FastAccumNames{{
    {"none", Fp8FastAccum::kNone},
    {"fprop", Fp8FastAccum::kFprop},
    {"fprop_dgrad", Fp8FastAccum::kFpropDgrad}}};
constexpr std::array<NamedValue<Fp8Recipe>, 2> kFp8RecipeNames{{
    {"delayed", Fp8Recipe::kDelayed}, {"current", Fp8Recipe::kCurrent}}};
constexpr std::array<NamedValue<AttentionBackward>, 2> kAttentionBackwardNames{{
    {"flash", AttentionBackward::kFlash}, {"cudnn", AttentionBackward::kCudnn}}};
constexpr std::array<NamedValue<RopeScalingType>, 2> kRopeScalingNames{{
    {"none", RopeScalingType::kNone}, {"llama3", RopeScalingType::kLlama3}}};
// The first name of a value is the one printed.
constexpr std::array<NamedValue<Recompute>, 5> kRecomputeNames{{{"none", Recompute::kNone},
                                                                {"selective", Recompute::kSelective},
                                                                {"full", Recompute::kFull},
                                                                {"true", Recompute::kFull},
                                                                {"false", Recompute::kNone}}};
constexpr std::array<NamedValue<Backend>, 3> kBackendNames{{
    {"auto", Backend::kAuto}, {"cpu", Backend::kCpu}, {"cuda", Backend::kCuda}}};

struct Preset {
  const char* name;
  int n_layer, d_model, n_head, n_kv_head, ffn, vocab, seq_len;
  // Set by the llama3 presets only (rope_theta 0: the preset leaves RoPE and the head alone).
  float rope_theta = 0.0f;
  float rope_factor = 0.0f;  // llama3 scaling's factor; 0: no scaling
  bool tie_embeddings = true;
};

// The llama3 presets are the published Llama 3.2 1B / 3B and Llama 3.1 8B shapes (head_dim 64,
// 128, 128 = d_model / n_head; rope_theta 500000 with llama3 scaling of factor 32, 32, 8 over
// 8192 original positions; the 8B's head untied), at seq_len 8192.
constexpr std::array<Preset, 6> kPresets{{
    {"tiny", 4, 128, 4, 4, 384, 50257, 128},
    {"gpt124m", 12, 768, 12, 12, 2048, 50257, 1024},
    {"gpt350m", 24, 1024, 16, 16, 2816, 50257, 1024},
    {"llama3-1b", 16, 2048, 32, 8, 8192, 128256, 8192, 500000.0f, 32.0f, true},
    {"llama3-3b", 28, 3072, 24, 8, 8192, 128256, 8192, 500000.0f, 32.0f, true},
    {"llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 500000.0f, 8.0f, false},
}};

std::string PresetNames() {
  std::string out;
  for (const auto& p : kPresets) {
    if (!out.empty()) out += "|";
    out += p.name;
  }
  return out;
}

// The largest vocab whose padded size still fits an int.
constexpr int kMaxVocab = std::numeric_limits<int>::max() / 128 * 128;

// ---------------------------------------------------------------------------------------------
// Number formatting: shortest text that reads back to the same value.

std::string Num(int64_t v) { return std::to_string(v); }
std::string Num(int v) { return std::to_string(v); }

template <typename F>
std::string FloatText(F v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  if (ec != std::errc()) return "?";
  std::string s(buf, end);
  if (s == "inf") return ".inf";
  if (s == "-inf") return "-.inf";
  if (s == "nan" || s == "-nan") return ".nan";
  return s;
}
std::string Num(float v) { return FloatText(v); }
std::string Num(double v) { return FloatText(v); }

// ---------------------------------------------------------------------------------------------
// Value rules, shared by ValidateRunConfig and ParseRunConfig.

struct Problem {
  std::string key;                     // key path the message is about
  std::string what;                    // what is wrong, with the value given
  std::vector<std::string> line_keys;  // other keys whose line locates it if `key` was not given
};

using MaybeProblem = std::optional<Problem>;

MaybeProblem AtLeast(const std::string& key, int64_t v, int64_t lo) {
  if (v >= lo) return std::nullopt;
  return Problem{key, "must be >= " + Num(lo) + ", got " + Num(v), {}};
}

MaybeProblem InRange(const std::string& key, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return std::nullopt;
  return Problem{key, "must be in [" + Num(lo) + ", " + Num(hi) + "], got " + Num(v), {}};
}

template <typename F>
MaybeProblem Positive(const std::string& key, F v) {
  if (std::isfinite(v) && v > 0) return std::nullopt;
  return Problem{key, "must be > 0, got " + Num(v), {}};
}

template <typename F>
MaybeProblem NonNegative(const std::string& key, F v) {
  if (std::isfinite(v) && v >= 0) return std::nullopt;
  return Problem{key, "must be >= 0, got " + Num(v), {}};
}

// [0, 1) when hi_open, else [0, 1].
MaybeProblem UnitInterval(const std::string& key, float v, bool hi_open) {
  const bool ok = v >= 0 && (hi_open ? v < 1 : v <= 1);  // false for NaN
  if (ok) return std::nullopt;
  return Problem{key, std::string("must be in [0, 1") + (hi_open ? ")" : "]") + ", got " + Num(v), {}};
}

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

#define FORGE_RULE(expr)                       \
  do {                                         \
    if (MaybeProblem _p = (expr)) return _p;   \
  } while (0)

MaybeProblem CheckModel(const ModelConfig& m) {
  if (!m.preset.empty()) {
    bool known = false;
    for (const auto& p : kPresets) known = known || m.preset == p.name;
    if (!known) {
      return Problem{"model.preset",
                     "must be one of " + PresetNames() + ", got '" + TextExcerpt(m.preset) + "'", {}};
    }
  }
  FORGE_RULE(AtLeast("model.n_layer", m.n_layer, 1));
  FORGE_RULE(AtLeast("model.d_model", m.d_model, 1));
  FORGE_RULE(AtLeast("model.n_head", m.n_head, 1));
  FORGE_RULE(AtLeast("model.n_kv_head", m.n_kv_head, 1));
  if (m.explicit_head_dim != 0) {
    FORGE_RULE(AtLeast("model.head_dim", m.explicit_head_dim, 2));
    if (m.explicit_head_dim % 2 != 0) {
      return Problem{"model.head_dim", "must be even for RoPE, got " + Num(m.explicit_head_dim), {}};
    }
  } else if (m.d_model % m.n_head != 0) {
    return Problem{"model.n_head",
                   "must divide model.d_model (" + Num(m.d_model) + "), got " + Num(m.n_head) +
                       " (or give model.head_dim)",
                   {"model.d_model"}};
  } else if (m.head_dim() % 2 != 0) {
    return Problem{"model.n_head",
                   "head_dim = model.d_model / model.n_head must be even for RoPE, got " +
                       Num(m.d_model) + " / " + Num(m.n_head) + " = " + Num(m.head_dim()),
                   {"model.d_model"}};
  }
  if (m.n_head % m.n_kv_head != 0) {
    return Problem{"model.n_kv_head",
                   "must divide model.n_head (" + Num(m.n_head) + "), got " + Num(m.n_kv_head),
                   {"model.n_head"}};
  }
  FORGE_RULE(AtLeast("model.ffn", m.ffn, 1));
  FORGE_RULE(InRange("model.vocab", m.vocab, 2, kMaxVocab));
  FORGE_RULE(AtLeast("model.seq_len", m.seq_len, 2));
  FORGE_RULE(Positive("model.rope_theta", m.rope_theta));
  if (m.rope_scaling.type == RopeScalingType::kLlama3) {
    const RopeScalingConfig& r = m.rope_scaling;
    if (!(std::isfinite(r.factor) && r.factor >= 1)) {
      return Problem{"model.rope_scaling.factor", "must be >= 1, got " + Num(r.factor), {}};
    }
    FORGE_RULE(Positive("model.rope_scaling.low_freq_factor", r.low_freq_factor));
    FORGE_RULE(Positive("model.rope_scaling.high_freq_factor", r.high_freq_factor));
    if (!(r.high_freq_factor > r.low_freq_factor)) {
      return Problem{"model.rope_scaling.high_freq_factor",
                     "must be > model.rope_scaling.low_freq_factor (" + Num(r.low_freq_factor) +
                         "), got " + Num(r.high_freq_factor),
                     {"model.rope_scaling"}};
    }
    FORGE_RULE(AtLeast("model.rope_scaling.original_max_position_embeddings",
                       r.original_max_position_embeddings, 1));
  }
  FORGE_RULE(Positive("model.norm_eps", m.norm_eps));
  FORGE_RULE(Positive("model.init_std", m.init_std));
  return std::nullopt;
}

MaybeProblem CheckRunConfig(const RunConfig& c) {
  if (c.name.empty()) return Problem{"name", "must not be empty", {}};
  for (char ch : c.name) {
    if (!IsNameChar(ch)) {
      return Problem{"name",
                     "may hold only letters, digits, '.', '_' and '-', got '" + TextExcerpt(c.name) +
                         "'",
                     {}};
    }
  }
  FORGE_RULE(CheckModel(c.model));

  FORGE_RULE(InRange("data.epoch_shuffle", c.data.epoch_shuffle, 0, 1));
  if (!c.data.sources.empty() && !c.data.dataset_dir.empty()) {
    return Problem{"data.sources",
                   "data.dataset_dir and data.sources are both given: list every dataset under "
                   "data.sources (data.dataset_dir is the one-source shorthand)",
                   {"data.dataset_dir"}};
  }
  for (size_t i = 0; i < c.data.sources.size(); ++i) {
    const DataSourceConfig& src = c.data.sources[i];
    const std::string key = "data.sources[" + Num(int64_t(i)) + "]";
    if (src.dir.empty()) return Problem{key + ".dir", "must not be empty", {key}};
    if (!(src.weight > 0.0) || !std::isfinite(src.weight)) {
      return Problem{key + ".weight", "must be a finite number > 0, got " + Num(src.weight),
                     {key}};
    }
    for (size_t j = 0; j < i; ++j) {
      if (c.data.sources[j].dir == src.dir) {
        return Problem{key + ".dir",
                       "names the same dataset as data.sources[" + Num(int64_t(j)) + "] (" +
                           src.dir + "); give each dataset once, with the sum of the weights",
                       {key}};
      }
    }
  }
  if (const std::string& t = c.data.tokenizer;
      !t.empty() && t.find('/') == std::string::npos && t != "gpt2" && t != "cl100k_base" &&
      t != "o200k_base" && t != "llama3") {
    return Problem{"data.tokenizer",
                   "expected gpt2, cl100k_base, o200k_base, llama3 or a path to a tokenizer "
                   "file (with a '/'), got '" + t + "'", {}};
  }

  const OptimizerConfig& o = c.optimizer;
  FORGE_RULE(Positive("optimizer.lr", o.lr));
  FORGE_RULE(UnitInterval("optimizer.beta1", o.beta1, /*hi_open=*/true));
  FORGE_RULE(UnitInterval("optimizer.beta2", o.beta2, /*hi_open=*/true));
  FORGE_RULE(Positive("optimizer.eps", o.eps));
  FORGE_RULE(NonNegative("optimizer.weight_decay", o.weight_decay));
  FORGE_RULE(NonNegative("optimizer.grad_clip", o.grad_clip));

  const ScheduleConfig& s = c.schedule;
  FORGE_RULE(AtLeast("schedule.total_steps", s.total_steps, 1));
  FORGE_RULE(AtLeast("schedule.warmup_steps", s.warmup_steps, 0));
  if (s.warmup_steps > s.total_steps) {
    return Problem{"schedule.warmup_steps",
                   "must be <= schedule.total_steps (" + Num(s.total_steps) + "), got " +
                       Num(s.warmup_steps),
                   {"schedule.total_steps"}};
  }
  FORGE_RULE(UnitInterval("schedule.min_lr_ratio", s.min_lr_ratio, /*hi_open=*/false));

  FORGE_RULE(AtLeast("batch.micro_batch", c.batch.micro_batch, 1));
  FORGE_RULE(AtLeast("batch.global_batch", c.batch.global_batch, 1));
  if (c.batch.global_batch % c.batch.micro_batch != 0) {
    return Problem{"batch.global_batch",
                   "must be a multiple of batch.micro_batch (" + Num(c.batch.micro_batch) +
                       "), got " + Num(c.batch.global_batch),
                   {"batch.micro_batch"}};
  }

  FORGE_RULE(InRange("precision.fp8.amax_history", c.precision.fp8.amax_history, 1, 1024));
  FORGE_RULE(InRange("precision.fp8.margin", c.precision.fp8.margin, 0, 32));

  FORGE_RULE(Positive("parallel.collective_timeout_s", c.parallel.collective_timeout_s));
  if (c.parallel.grad_reduce == GradReduce::kBf16 &&
      (c.parallel.mode == ParallelMode::kFsdp || c.parallel.mode == ParallelMode::kHsdp)) {
    // fsdp's (and hsdp's) reduce-scatters read rotating fp32 buffers of their own; they stay
    // fp32.
    return Problem{"parallel.grad_reduce",
                   std::string("bf16 is not supported with parallel.mode ") +
                       ParallelModeName(c.parallel.mode),
                   {"parallel.mode"}};
  }
  if (c.parallel.mode == ParallelMode::kHsdp) {
    if (c.parallel.shard_group_size < 1)
      return Problem{"parallel.shard_group_size",
                     "parallel.mode hsdp needs it: the ranks of one shard group (usually the GPUs "
                     "of one node), >= 1, got " +
                         Num(c.parallel.shard_group_size),
                     {"parallel.mode"}};
  } else if (c.parallel.shard_group_size != 0) {
    return Problem{"parallel.shard_group_size",
                   std::string("is for parallel.mode hsdp only (mode is ") +
                       ParallelModeName(c.parallel.mode) + ")",
                   {"parallel.mode"}};
  }
  if (c.parallel.ddp_allreduce == DdpAllReduce::kCopyEngine) {
    if (c.parallel.mode != ParallelMode::kDdp) {
      return Problem{"parallel.ddp_allreduce",
                     "copy_engine is for parallel.mode ddp (the other modes reduce-scatter)",
                     {"parallel.mode"}};
    }
    if (c.parallel.grad_reduce != GradReduce::kFp32) {
      return Problem{"parallel.ddp_allreduce", "copy_engine sums fp32 gradients",
                     {"parallel.grad_reduce"}};
    }
  }

  FORGE_RULE(AtLeast("checkpoint.every_steps", c.checkpoint.every_steps, 0));
  FORGE_RULE(AtLeast("checkpoint.keep_last", c.checkpoint.keep_last, 1));
  FORGE_RULE(AtLeast("checkpoint.keep_every", c.checkpoint.keep_every, 0));

  FORGE_RULE(AtLeast("eval.every_steps", c.eval.every_steps, 0));
  FORGE_RULE(AtLeast("eval.batches", c.eval.batches, 1));
  FORGE_RULE(InRange("eval.sample_tokens", c.eval.sample_tokens, 1, 4096));

  FORGE_RULE(AtLeast("train.log_every", c.train.log_every, 1));
  FORGE_RULE(AtLeast("train.workers", c.train.workers, 1));
  FORGE_RULE(AtLeast("train.max_restarts", c.train.max_restarts, 0));
  FORGE_RULE(NonNegative("train.hang_timeout_s", c.train.hang_timeout_s));
  FORGE_RULE(NonNegative("train.spike_sigma", c.train.spike_sigma));
  FORGE_RULE(InRange("train.spike_window", c.train.spike_window, 2, 100000));
  FORGE_RULE(InRange("train.spike_max_in_row", c.train.spike_max_in_row, 1, 100000));
  if (c.train.straggler_threshold != 0.0 &&
      !(std::isfinite(c.train.straggler_threshold) && c.train.straggler_threshold > 1.0))
    return Problem{"train.straggler_threshold",
                   "must be > 1 (a ratio to the other ranks' median) or 0 (off), got " +
                       Num(c.train.straggler_threshold),
                   {}};
  FORGE_RULE(InRange("train.straggler_reports", c.train.straggler_reports, 1, 100000));
  if (c.train.min_workers != 0)  // 0: the same as train.workers
    FORGE_RULE(InRange("train.min_workers", c.train.min_workers, 1, c.train.workers));
  FORGE_RULE(NonNegative("train.elastic_grace_s", c.train.elastic_grace_s));
  FORGE_RULE(InRange("train.node_failure_limit", c.train.node_failure_limit, 0, 1000000));
  FORGE_RULE(NonNegative("train.node_cooldown_s", c.train.node_cooldown_s));
  if (c.train.run_dir.empty()) return Problem{"train.run_dir", "must not be empty", {}};

  FORGE_RULE(InRange("engine.lm_head_chunk", c.engine.lm_head_chunk, 1, 1 << 30));
  FORGE_RULE(InRange("engine.wgrad_sm_margin", c.engine.wgrad_sm_margin, -1, 1024));

  if (c.metrics.port != -1)  // -1: `any` (each rank binds a free port of its own)
    FORGE_RULE(InRange("metrics.port", c.metrics.port, 0, 65535));
  if (c.metrics.bind_address.empty())
    return Problem{"metrics.bind_address", "must not be empty (0.0.0.0 listens everywhere)", {}};
  FORGE_RULE(NonNegative("metrics.peak_tflops", c.metrics.peak_tflops));
  return std::nullopt;
}

#undef FORGE_RULE

// ---------------------------------------------------------------------------------------------
// The YAML reader.

using Entries = std::map<std::string, YAML::Node>;

std::string Join(const std::vector<std::string_view>& names) {
  std::string out;
  for (auto n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

// " (did you mean 'x'?)" for a near miss, else "".
std::string Suggestion(std::string_view key, const std::vector<std::string_view>& valid) {
  const std::string_view best = ClosestMatch(key, valid);
  return best.empty() ? "" : " (did you mean '" + std::string(best) + "'?)";
}

bool IsQuoted(const YAML::Node& n) { return n.Tag() == "!" || n.Tag() == "tag:yaml.org,2002:str"; }

// How a value reads in a message: the text as written (a bounded excerpt), a quoted string, or
// its kind.
std::string Describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "an empty value";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      return IsQuoted(n) ? "\"" + TextExcerpt(n.Scalar()) + "\"" : TextExcerpt(n.Scalar());
    default:
      return "nothing";
  }
}

bool ParseInt64(std::string_view s, int64_t* out) {
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

bool ParseUint64(std::string_view s, uint64_t* out) {
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  if (s.empty() || s[0] == '-') return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

// Accepts decimal and scientific forms (3e-3, 1.5, 2) and YAML's .inf/.nan spellings, so that the
// range rules, not the reader, explain why those are refused.
bool ParseDouble(std::string s, double* out) {
  if (s == ".inf" || s == ".Inf" || s == ".INF" || s == "+.inf") {
    *out = std::numeric_limits<double>::infinity();
    return true;
  }
  if (s == "-.inf" || s == "-.Inf" || s == "-.INF") {
    *out = -std::numeric_limits<double>::infinity();
    return true;
  }
  if (s == ".nan" || s == ".NaN" || s == ".NAN") {
    *out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  if (s.empty()) return false;
  // strtod alone would also take hex floats, "inf" and "nan"; YAML numbers use none of them.
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-')) {
      return false;
    }
  }
  char* end = nullptr;
  errno = 0;
  *out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && errno != ERANGE;
}

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  const std::string& source() const { return source_; }

  // "<source>:<line>: <path>: <what>", or without the line when none is known.
  Status ErrorAt(int line, const std::string& path, const std::string& what) const {
    std::string loc = source_;
    if (line > 0) loc += ":" + std::to_string(line);
    return Status::Invalid(loc + ": " + (path.empty() ? "" : path + ": ") + what);
  }
  Status Error(const std::string& path, const std::string& what) const {
    return ErrorAt(LineOf(path), path, what);
  }

  // The line of `path`'s key; for a key not in the file, the line of its section; 0 if none.
  int LineOf(std::string path) const {
    while (true) {
      auto it = lines_.find(path);
      if (it != lines_.end()) return it->second;
      const size_t dot = path.rfind('.');
      if (dot == std::string::npos) return 0;
      path.resize(dot);
    }
  }
  bool Has(const std::string& path) const { return lines_.count(path) != 0; }

  Status Report(const Problem& p) const {
    int line = lines_.count(p.key) ? lines_.at(p.key) : 0;
    for (size_t i = 0; line == 0 && i < p.line_keys.size(); ++i) {
      if (lines_.count(p.line_keys[i])) line = lines_.at(p.line_keys[i]);
    }
    if (line == 0) line = LineOf(p.key);
    return ErrorAt(line, p.key, p.what);
  }

  // Reads the mapping at `path` ("" for the top level) into `out`, checking that every key is
  // a known, unrepeated plain name and remembering each key's line. A null value (an empty
  // section) reads as an empty mapping.
  Status ReadMap(const YAML::Node& node, const std::string& path,
                 const std::vector<std::string_view>& valid, Entries* out) {
    out->clear();
    if (node.IsNull()) return Status::Ok();
    if (!node.IsMap()) return Error(path, "must be a mapping of keys, got " + Describe(node));
    for (auto it = node.begin(); it != node.end(); ++it) {
      const YAML::Node k = it->first;  // a copy: the iterator hands out temporaries
      const int line = k.Mark().line + 1;
      if (!k.IsScalar()) {
        return ErrorAt(line, path, "keys must be plain names, got " + Describe(k) + " as a key");
      }
      const std::string& key = k.Scalar();
      const std::string full = path.empty() ? key : path + "." + key;
      bool known = false;
      for (auto v : valid) known = known || v == key;
      if (!known) {
        const std::string shown = (path.empty() ? "" : path + ".") + TextExcerpt(key);
        if (path.empty()) {
          return ErrorAt(line, shown, "unknown top-level key" + Suggestion(key, valid) +
                                         "; valid top-level keys: " + Join(valid));
        }
        return ErrorAt(line, shown, "unknown key" + Suggestion(key, valid) + "; valid keys of " +
                                       path + ": " + Join(valid));
      }
      if (out->count(key)) {
        return ErrorAt(line, full, "duplicate key (first given on line " +
                                       std::to_string(lines_.at(full)) + ")");
      }
      lines_[full] = line;
      (*out)[key] = it->second;
    }
    return Status::Ok();
  }

  // Each Read* leaves *out alone when `key` is absent from `e`.
  Status ReadInt64(const Entries& e, const std::string& sec, const char* key, int64_t* out) {
    return ReadNumber(e, sec, key, ParseInt64, "an integer", out);
  }

  Status ReadInt(const Entries& e, const std::string& sec, const char* key, int* out) {
    int64_t v = *out;
    FORGE_RETURN_IF_ERROR(ReadInt64(e, sec, key, &v));
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
      return Error(Path(sec, key), "must fit a 32-bit integer, got " + Num(v));
    }
    *out = static_cast<int>(v);
    return Status::Ok();
  }

  // A TCP port: an integer in [0, 65535] or `any` (read as -1: the kernel picks a free one).
  Status ReadPortOrAny(const Entries& e, const std::string& sec, const char* key, int* out) {
    const YAML::Node* n = Find(e, key);
    if (!n) return Status::Ok();
    if (n->IsScalar() && n->Scalar() == "any") {
      *out = -1;
      return Status::Ok();
    }
    constexpr const char* kPort = "a port in [0, 65535] or any";
    int64_t v = 0;
    FORGE_RETURN_IF_ERROR(ReadNumber(e, sec, key, ParseInt64, kPort, &v));
    if (v < 0 || v > 65535) {
      return Error(Path(sec, key), std::string("must be ") + kPort + ", got " + Describe(*n));
    }
    *out = static_cast<int>(v);
    return Status::Ok();
  }

  Status ReadUint64(const Entries& e, const std::string& sec, const char* key, uint64_t* out) {
    return ReadNumber(e, sec, key, ParseUint64, "an integer in [0, 2^64)", out);
  }

  Status ReadDouble(const Entries& e, const std::string& sec, const char* key, double* out) {
    return ReadNumber(e, sec, key, ParseDouble, "a number", out);
  }

  Status ReadFloat(const Entries& e, const std::string& sec, const char* key, float* out) {
    double v = *out;
    FORGE_RETURN_IF_ERROR(ReadDouble(e, sec, key, &v));
    if (std::isfinite(v) && std::fabs(v) > std::numeric_limits<float>::max()) {
      return Error(Path(sec, key), "is out of float range, got " + TextExcerpt(Find(e, key)->Scalar()));
    }
    *out = static_cast<float>(v);
    return Status::Ok();
  }

  Status ReadBool(const Entries& e, const std::string& sec, const char* key, bool* out) {
    const YAML::Node* n = Find(e, key);
    if (!n) return Status::Ok();
    const std::string s = n->IsScalar() && !IsQuoted(*n) ? n->Scalar() : "";
    if (s == "true" || s == "True" || s == "TRUE") {
      *out = true;
    } else if (s == "false" || s == "False" || s == "FALSE") {
      *out = false;
    } else {
      return Error(Path(sec, key), "must be true or false, got " + Describe(*n));
    }
    return Status::Ok();
  }

  // Any scalar reads as its text; an empty value reads as "".
  Status ReadString(const Entries& e, const std::string& sec, const char* key, std::string* out) {
    const YAML::Node* n = Find(e, key);
    if (!n) return Status::Ok();
    if (n->IsNull()) {
      out->clear();
    } else if (n->IsScalar()) {
      *out = n->Scalar();
    } else {
      return Error(Path(sec, key), "must be a string, got " + Describe(*n));
    }
    return Status::Ok();
  }

  template <typename E, size_t N>
  Status ReadEnum(const Entries& e, const std::string& sec, const char* key,
                  const std::array<NamedValue<E>, N>& table, E* out) {
    const YAML::Node* n = Find(e, key);
    if (!n) return Status::Ok();
    if (const E* v = n->IsScalar() ? LookUp(table, n->Scalar()) : nullptr) {
      *out = *v;
      return Status::Ok();
    }
    return Error(Path(sec, key), "must be one of " + AllNames(table) + ", got " + Describe(*n));
  }

 private:
  // An unquoted scalar that `parse` accepts; else "must be <what>".
  template <typename T, typename Parse>
  Status ReadNumber(const Entries& e, const std::string& sec, const char* key, Parse parse,
                    const char* what, T* out) {
    const YAML::Node* n = Find(e, key);
    if (!n) return Status::Ok();
    T v{};
    if (!n->IsScalar() || IsQuoted(*n) || !parse(n->Scalar(), &v)) {
      return Error(Path(sec, key), std::string("must be ") + what + ", got " + Describe(*n));
    }
    *out = v;
    return Status::Ok();
  }

  static const YAML::Node* Find(const Entries& e, const char* key) {
    auto it = e.find(key);
    return it == e.end() ? nullptr : &it->second;
  }
  static std::string Path(const std::string& sec, const char* key) {
    return sec.empty() ? key : sec + "." + key;
  }

  std::string source_;
  std::map<std::string, int> lines_;  // key path -> 1-based line of the key
};

const std::vector<std::string_view> kTopKeys = {"name",   "seed",      "model",      "data",
                                                "optimizer", "schedule", "batch",    "precision",
                                                "parallel",  "checkpoint", "eval",   "train",
                                                "engine",    "metrics"};
const std::vector<std::string_view> kModelKeys = {
    "preset",     "n_layer",      "d_model",  "n_head",  "n_kv_head",      "head_dim",
    "ffn",        "vocab",        "seq_len",  "rope_theta", "rope_scaling", "norm_eps",
    "qk_norm",    "tie_embeddings", "init_std", "init",   "init_from"};
const std::vector<std::string_view> kRopeScalingKeys = {
    "type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
const std::vector<std::string_view> kModelDimKeys = {"n_layer", "d_model", "n_head",
                                                     "ffn",     "vocab",   "seq_len"};

Status ReadModel(Reader& r, const YAML::Node& node, ModelConfig* m) {
  Entries e;
  FORGE_RETURN_IF_ERROR(r.ReadMap(node, "model", kModelKeys, &e));
  // The preset first, wherever it is written, so that the other keys override it.
  if (e.count("preset")) {
    std::string name;
    FORGE_RETURN_IF_ERROR(r.ReadString(e, "model", "preset", &name));
    if (!ApplyModelPreset(name, m).ok()) {
      return r.Error("model.preset",
                     "must be one of " + PresetNames() + ", got " + Describe(e.at("preset")));
    }
  } else {
    m->preset.clear();
    std::vector<std::string_view> missing;
    for (auto k : kModelDimKeys) {
      if (!e.count(std::string(k))) missing.push_back(k);
    }
    if (!missing.empty()) {
      return r.Error("model", "give either preset (" + PresetNames() + ") or all of " +
                                  Join(kModelDimKeys) + "; missing: " + Join(missing));
    }
  }
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "model", "n_layer", &m->n_layer));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "model", "d_model", &m->d_model));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "model", "n_head", &m->n_head));
  // An unstated n_kv_head follows a stated n_head: overriding heads alone must not silently
  // make GQA (a preset's own n_kv_head stands when neither is given).
  if (e.count("n_head") && !e.count("n_kv_head")) m->n_kv_head = m->n_head;
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "model", "n_kv_head", &m->n_kv_head));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "model", "head_dim", &m->explicit_head_dim));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "model", "ffn", &m->ffn));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "model", "vocab", &m->vocab));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "model", "seq_len", &m->seq_len));
  FORGE_RETURN_IF_ERROR(r.ReadFloat(e, "model", "rope_theta", &m->rope_theta));
  if (e.count("rope_scaling")) {
    Entries rs;
    FORGE_RETURN_IF_ERROR(r.ReadMap(e.at("rope_scaling"), "model.rope_scaling", kRopeScalingKeys, &rs));
    RopeScalingConfig& s = m->rope_scaling;
    FORGE_RETURN_IF_ERROR(r.ReadEnum(rs, "model.rope_scaling", "type", kRopeScalingNames, &s.type));
    FORGE_RETURN_IF_ERROR(r.ReadFloat(rs, "model.rope_scaling", "factor", &s.factor));
    FORGE_RETURN_IF_ERROR(
        r.ReadFloat(rs, "model.rope_scaling", "low_freq_factor", &s.low_freq_factor));
    FORGE_RETURN_IF_ERROR(
        r.ReadFloat(rs, "model.rope_scaling", "high_freq_factor", &s.high_freq_factor));
    FORGE_RETURN_IF_ERROR(r.ReadInt(rs, "model.rope_scaling", "original_max_position_embeddings",
                                    &s.original_max_position_embeddings));
    // The numbers mean something only with a scaling type: given without one, they are an
    // error rather than silently unused.
    if (s.type == RopeScalingType::kNone) {
      for (auto key : kRopeScalingKeys) {
        if (key != "type" && rs.count(std::string(key)))
          return r.Error("model.rope_scaling." + std::string(key),
                         "given with rope_scaling type none (set type: llama3 to scale RoPE)");
      }
    }
  }
  FORGE_RETURN_IF_ERROR(r.ReadFloat(e, "model", "norm_eps", &m->norm_eps));
  FORGE_RETURN_IF_ERROR(r.ReadBool(e, "model", "qk_norm", &m->qk_norm));
  FORGE_RETURN_IF_ERROR(r.ReadBool(e, "model", "tie_embeddings", &m->tie_embeddings));
  FORGE_RETURN_IF_ERROR(r.ReadFloat(e, "model", "init_std", &m->init_std));
  FORGE_RETURN_IF_ERROR(r.ReadEnum(e, "model", "init", kInitNames, &m->init));
  FORGE_RETURN_IF_ERROR(r.ReadString(e, "model", "init_from", &m->init_from));
  return Status::Ok();
}

// data.sources: a non-empty list of {dir, weight} mappings, both keys required.
Status ReadDataSources(Reader& r, const YAML::Node& node, DataConfig* d) {
  if (!node.IsSequence() || node.size() == 0) {
    return r.Error("data.sources",
                   "must be a non-empty list of {dir: PATH, weight: W}, got " + Describe(node));
  }
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string path = "data.sources[" + std::to_string(i) + "]";
    const YAML::Node item = node[i];
    if (!item.IsMap()) {
      return r.ErrorAt(item.Mark().line + 1, path,
                       "must be a mapping {dir: PATH, weight: W}, got " + Describe(item));
    }
    Entries e;
    FORGE_RETURN_IF_ERROR(r.ReadMap(item, path, {"dir", "weight"}, &e));
    for (const char* key : {"dir", "weight"}) {
      if (!e.count(key)) {
        return r.ErrorAt(item.Mark().line + 1, path + "." + key, "is required");
      }
    }
    DataSourceConfig src;
    FORGE_RETURN_IF_ERROR(r.ReadString(e, path, "dir", &src.dir));
    FORGE_RETURN_IF_ERROR(r.ReadDouble(e, path, "weight", &src.weight));
    d->sources.push_back(std::move(src));
  }
  return Status::Ok();
}

// eval.samples: a list of non-empty prompt strings (an empty list or null: none).
Status ReadEvalSamples(Reader& r, const Entries& e, EvalConfig* ev) {
  auto it = e.find("samples");
  if (it == e.end() || it->second.IsNull()) return Status::Ok();
  const YAML::Node& node = it->second;
  if (!node.IsSequence())
    return r.Error("eval.samples", "must be a list of prompt strings, got " + Describe(node));
  ev->samples.clear();
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string path = "eval.samples[" + std::to_string(i) + "]";
    const YAML::Node item = node[i];
    if (!item.IsScalar())
      return r.ErrorAt(item.Mark().line + 1, path, "must be a prompt string, got " + Describe(item));
    if (item.Scalar().empty())
      return r.ErrorAt(item.Mark().line + 1, path, "is an empty prompt");
    ev->samples.push_back(item.Scalar());
  }
  return Status::Ok();
}

Status ReadSections(Reader& r, const Entries& top, RunConfig* c) {
  FORGE_RETURN_IF_ERROR(r.ReadString(top, "", "name", &c->name));
  FORGE_RETURN_IF_ERROR(r.ReadUint64(top, "", "seed", &c->seed));

  if (!top.count("model")) {
    return r.Error("model", "required section is missing (give preset: " + PresetNames() +
                                " or explicit dims)");
  }
  FORGE_RETURN_IF_ERROR(ReadModel(r, top.at("model"), &c->model));

  // Sections that are absent keep their defaults; a null node reads as an empty mapping.
  auto section = [&](const char* name) { return top.count(name) ? top.at(name) : YAML::Node(); };
  Entries e;

  FORGE_RETURN_IF_ERROR(
      r.ReadMap(section("data"), "data", {"dataset_dir", "sources", "epoch_shuffle", "tokenizer"},
                &e));
  FORGE_RETURN_IF_ERROR(r.ReadString(e, "data", "dataset_dir", &c->data.dataset_dir));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "data", "epoch_shuffle", &c->data.epoch_shuffle));
  FORGE_RETURN_IF_ERROR(r.ReadString(e, "data", "tokenizer", &c->data.tokenizer));
  if (e.count("sources")) FORGE_RETURN_IF_ERROR(ReadDataSources(r, e.at("sources"), &c->data));

  OptimizerConfig& o = c->optimizer;
  FORGE_RETURN_IF_ERROR(r.ReadMap(section("optimizer"), "optimizer",
                                  {"lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip"}, &e));
  FORGE_RETURN_IF_ERROR(r.ReadFloat(e, "optimizer", "lr", &o.lr));
  FORGE_RETURN_IF_ERROR(r.ReadFloat(e, "optimizer", "beta1", &o.beta1));
  FORGE_RETURN_IF_ERROR(r.ReadFloat(e, "optimizer", "beta2", &o.beta2));
  FORGE_RETURN_IF_ERROR(r.ReadFloat(e, "optimizer", "eps", &o.eps));
  FORGE_RETURN_IF_ERROR(r.ReadFloat(e, "optimizer", "weight_decay", &o.weight_decay));
  FORGE_RETURN_IF_ERROR(r.ReadFloat(e, "optimizer", "grad_clip", &o.grad_clip));

  ScheduleConfig& s = c->schedule;
  FORGE_RETURN_IF_ERROR(r.ReadMap(section("schedule"), "schedule",
                                  {"total_steps", "warmup_steps", "decay", "min_lr_ratio"}, &e));
  FORGE_RETURN_IF_ERROR(r.ReadInt64(e, "schedule", "total_steps", &s.total_steps));
  FORGE_RETURN_IF_ERROR(r.ReadInt64(e, "schedule", "warmup_steps", &s.warmup_steps));
  FORGE_RETURN_IF_ERROR(r.ReadEnum(e, "schedule", "decay", kDecayNames, &s.decay));
  FORGE_RETURN_IF_ERROR(r.ReadFloat(e, "schedule", "min_lr_ratio", &s.min_lr_ratio));

  FORGE_RETURN_IF_ERROR(r.ReadMap(section("batch"), "batch", {"micro_batch", "global_batch"}, &e));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "batch", "micro_batch", &c->batch.micro_batch));
  FORGE_RETURN_IF_ERROR(r.ReadInt64(e, "batch", "global_batch", &c->batch.global_batch));

  PrecisionConfig& p = c->precision;
  FORGE_RETURN_IF_ERROR(
      r.ReadMap(section("precision"), "precision", {"compute", "fp8"}, &e));
  FORGE_RETURN_IF_ERROR(r.ReadEnum(e, "precision", "compute", kPrecisionNames, &p.compute));
  {
    const YAML::Node fp8_node = e.count("fp8") ? e.at("fp8") : YAML::Node();
    Entries f;
    FORGE_RETURN_IF_ERROR(r.ReadMap(fp8_node, "precision.fp8",
                                    {"recipe", "amax_history", "margin", "lm_head",
                                     "fast_accum"},
                                    &f));
    FORGE_RETURN_IF_ERROR(
        r.ReadEnum(f, "precision.fp8", "recipe", kFp8RecipeNames, &p.fp8.recipe));
    FORGE_RETURN_IF_ERROR(r.ReadInt(f, "precision.fp8", "amax_history", &p.fp8.amax_history));
    FORGE_RETURN_IF_ERROR(r.ReadInt(f, "precision.fp8", "margin", &p.fp8.margin));
    FORGE_RETURN_IF_ERROR(r.ReadBool(f, "precision.fp8", "lm_head", &p.fp8.lm_head));
    FORGE_RETURN_IF_ERROR(
        r.ReadEnum(f, "precision.fp8", "fast_accum", kFp8FastAccumNames, &p.fp8.fast_accum));
  }

  FORGE_RETURN_IF_ERROR(
      r.ReadMap(section("parallel"), "parallel",
                {"mode", "grad_reduce", "ddp_allreduce", "collective_timeout_s",
                 "shard_group_size"},
                &e));
  FORGE_RETURN_IF_ERROR(r.ReadEnum(e, "parallel", "mode", kParallelNames, &c->parallel.mode));
  FORGE_RETURN_IF_ERROR(
      r.ReadEnum(e, "parallel", "grad_reduce", kGradReduceNames, &c->parallel.grad_reduce));
  FORGE_RETURN_IF_ERROR(r.ReadEnum(e, "parallel", "ddp_allreduce", kDdpAllReduceNames,
                                   &c->parallel.ddp_allreduce));
  FORGE_RETURN_IF_ERROR(
      r.ReadDouble(e, "parallel", "collective_timeout_s", &c->parallel.collective_timeout_s));
  FORGE_RETURN_IF_ERROR(
      r.ReadInt(e, "parallel", "shard_group_size", &c->parallel.shard_group_size));

  CheckpointConfig& k = c->checkpoint;
  FORGE_RETURN_IF_ERROR(r.ReadMap(section("checkpoint"), "checkpoint",
                                  {"dir", "every_steps", "keep_last", "keep_every", "resume"}, &e));
  FORGE_RETURN_IF_ERROR(r.ReadString(e, "checkpoint", "dir", &k.dir));
  FORGE_RETURN_IF_ERROR(r.ReadInt64(e, "checkpoint", "every_steps", &k.every_steps));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "checkpoint", "keep_last", &k.keep_last));
  FORGE_RETURN_IF_ERROR(r.ReadInt64(e, "checkpoint", "keep_every", &k.keep_every));
  FORGE_RETURN_IF_ERROR(r.ReadString(e, "checkpoint", "resume", &k.resume));

  FORGE_RETURN_IF_ERROR(r.ReadMap(section("eval"), "eval",
                                  {"every_steps", "batches", "samples", "sample_tokens"}, &e));
  FORGE_RETURN_IF_ERROR(r.ReadInt64(e, "eval", "every_steps", &c->eval.every_steps));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "eval", "batches", &c->eval.batches));
  FORGE_RETURN_IF_ERROR(ReadEvalSamples(r, e, &c->eval));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "eval", "sample_tokens", &c->eval.sample_tokens));

  TrainConfig& t = c->train;
  FORGE_RETURN_IF_ERROR(r.ReadMap(section("train"), "train",
                                  {"backend", "activation_recompute", "log_every", "run_dir",
                                   "workers", "max_restarts", "hang_timeout_s", "spike_sigma",
                                   "spike_window", "spike_max_in_row", "straggler_threshold",
                                   "straggler_reports", "min_workers",
                                   "elastic_grace_s", "node_failure_limit", "node_cooldown_s"},
                                  &e));
  FORGE_RETURN_IF_ERROR(r.ReadEnum(e, "train", "backend", kBackendNames, &t.backend));
  FORGE_RETURN_IF_ERROR(
      r.ReadEnum(e, "train", "activation_recompute", kRecomputeNames, &t.activation_recompute));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "train", "log_every", &t.log_every));
  FORGE_RETURN_IF_ERROR(r.ReadString(e, "train", "run_dir", &t.run_dir));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "train", "workers", &t.workers));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "train", "max_restarts", &t.max_restarts));
  FORGE_RETURN_IF_ERROR(r.ReadDouble(e, "train", "hang_timeout_s", &t.hang_timeout_s));
  FORGE_RETURN_IF_ERROR(r.ReadDouble(e, "train", "spike_sigma", &t.spike_sigma));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "train", "spike_window", &t.spike_window));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "train", "spike_max_in_row", &t.spike_max_in_row));
  FORGE_RETURN_IF_ERROR(
      r.ReadDouble(e, "train", "straggler_threshold", &t.straggler_threshold));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "train", "straggler_reports", &t.straggler_reports));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "train", "min_workers", &t.min_workers));
  FORGE_RETURN_IF_ERROR(r.ReadDouble(e, "train", "elastic_grace_s", &t.elastic_grace_s));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "train", "node_failure_limit", &t.node_failure_limit));
  FORGE_RETURN_IF_ERROR(r.ReadDouble(e, "train", "node_cooldown_s", &t.node_cooldown_s));

  EngineConfig& g = c->engine;
  FORGE_RETURN_IF_ERROR(r.ReadMap(section("engine"), "engine",
                                  {"cuda_graph", "deterministic_attention", "attention_backward",
                                   "lm_head_chunk", "wgrad_stream", "wgrad_sm_margin",
                                   "fused_epilogues", "gemm_autotune", "nccl_symmetric_memory"},
                                  &e));
  FORGE_RETURN_IF_ERROR(r.ReadBool(e, "engine", "cuda_graph", &g.cuda_graph));
  FORGE_RETURN_IF_ERROR(
      r.ReadBool(e, "engine", "deterministic_attention", &g.deterministic_attention));
  FORGE_RETURN_IF_ERROR(r.ReadEnum(e, "engine", "attention_backward", kAttentionBackwardNames,
                                   &g.attention_backward));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "engine", "lm_head_chunk", &g.lm_head_chunk));
  FORGE_RETURN_IF_ERROR(r.ReadBool(e, "engine", "wgrad_stream", &g.wgrad_stream));
  FORGE_RETURN_IF_ERROR(r.ReadInt(e, "engine", "wgrad_sm_margin", &g.wgrad_sm_margin));
  FORGE_RETURN_IF_ERROR(r.ReadBool(e, "engine", "fused_epilogues", &g.fused_epilogues));
  FORGE_RETURN_IF_ERROR(r.ReadBool(e, "engine", "gemm_autotune", &g.gemm_autotune));
  FORGE_RETURN_IF_ERROR(r.ReadBool(e, "engine", "nccl_symmetric_memory", &g.nccl_symmetric_memory));

  MetricsConfig& mc = c->metrics;
  FORGE_RETURN_IF_ERROR(
      r.ReadMap(section("metrics"), "metrics", {"port", "bind_address", "peak_tflops"}, &e));
  FORGE_RETURN_IF_ERROR(r.ReadPortOrAny(e, "metrics", "port", &mc.port));
  FORGE_RETURN_IF_ERROR(r.ReadString(e, "metrics", "bind_address", &mc.bind_address));
  FORGE_RETURN_IF_ERROR(r.ReadDouble(e, "metrics", "peak_tflops", &mc.peak_tflops));
  return Status::Ok();
}

// A double-quoted YAML string.
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", ch);
      out += buf;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

const char* BoolText(bool b) { return b ? "true" : "false"; }

}  // namespace

Status ApplyModelPreset(const std::string& name, ModelConfig* m) {
  for (const auto& p : kPresets) {
    if (name != p.name) continue;
    m->preset = p.name;
    m->n_layer = p.n_layer;
    m->d_model = p.d_model;
    m->n_head = p.n_head;
    m->n_kv_head = p.n_kv_head;
    m->explicit_head_dim = 0;
    m->ffn = p.ffn;
    m->vocab = p.vocab;
    m->seq_len = p.seq_len;
    if (p.rope_theta > 0) {
      m->rope_theta = p.rope_theta;
      m->rope_scaling = RopeScalingConfig{};
      if (p.rope_factor > 0) {
        m->rope_scaling.type = RopeScalingType::kLlama3;
        m->rope_scaling.factor = p.rope_factor;
      }
      m->tie_embeddings = p.tie_embeddings;
    }
    return Status::Ok();
  }
  return Status::Invalid("unknown model preset '" + name + "' (valid: " + PresetNames() + ")");
}

StatusOr<RunConfig> ParseRunConfig(const std::string& yaml_text, const std::string& source) {
  Reader r(source);
  // YAML is Unicode text; a spec that is not arrives here from files and requests alike.
  if (auto bad = LocateInvalidUtf8(yaml_text))
    return r.ErrorAt(bad->line, "", "not valid UTF-8 text: " + DescribeUtf8Error(*bad));
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(yaml_text);
  } catch (const YAML::Exception& ex) {
    return r.ErrorAt(ex.mark.is_null() ? 0 : ex.mark.line + 1, "", "YAML syntax error: " + ex.msg);
  }
  const std::string expected = "expected a mapping with keys among: " + Join(kTopKeys);
  if (docs.empty() || docs[0].IsNull()) {
    return r.ErrorAt(0, "", "config is empty; " + expected);
  }
  if (docs.size() > 1) {
    return r.ErrorAt(docs[1].Mark().line + 1, "",
                     "holds " + std::to_string(docs.size()) +
                         " YAML documents (the second starts here); expected one");
  }
  const YAML::Node& root = docs[0];
  if (!root.IsMap()) {
    return r.ErrorAt(root.Mark().line + 1, "",
                     "top level must be a mapping, got " + Describe(root) + "; " + expected);
  }

  RunConfig cfg;
  cfg.source_path = source;
  Entries top;
  FORGE_RETURN_IF_ERROR(r.ReadMap(root, "", kTopKeys, &top));
  FORGE_RETURN_IF_ERROR(ReadSections(r, top, &cfg));
  if (MaybeProblem p = CheckRunConfig(cfg)) return r.Report(*p);
  return cfg;
}

StatusOr<RunConfig> LoadRunConfig(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    // A directory opens and reads as nothing, which would pass for an empty config.
    std::vector<std::string> yaml;
    for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
      const std::string ext = entry.path().extension().string();
      if (ext == ".yaml" || ext == ".yml") yaml.push_back(entry.path().filename().string());
    }
    std::sort(yaml.begin(), yaml.end());
    std::string hint;
    for (size_t i = 0; i < yaml.size() && i < 5; ++i) hint += (i ? ", " : "") + yaml[i];
    if (yaml.size() > 5) hint += ", ...";
    return Status::Invalid(path + ": is a directory, not a config file" +
                           (hint.empty() ? "" : " (config files in it: " + hint + ")"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status::NotFound(path + ": cannot open config file: " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::IoError(path + ": error reading config file");
  return ParseRunConfig(text.str(), path);
}

Status ValidateRunConfig(const RunConfig& cfg) {
  MaybeProblem p = CheckRunConfig(cfg);
  if (!p) return Status::Ok();
  const std::string where = cfg.source_path.empty() ? "" : cfg.source_path + ": ";
  return Status::Invalid(where + p->key + ": " + p->what);
}

const char* PrecisionName(Precision p) { return NameOf(kPrecisionNames, p); }
const char* ParallelModeName(ParallelMode m) { return NameOf(kParallelNames, m); }
const char* GradReduceName(GradReduce g) { return NameOf(kGradReduceNames, g); }
const char* DdpAllReduceName(DdpAllReduce a) { return NameOf(kDdpAllReduceNames, a); }
const char* InitSchemeName(InitScheme i) { return NameOf(kInitNames, i); }
const char* Fp8FastAccumName(Fp8FastAccum f) { return NameOf(kFp8FastAccumNames, f); }
const char* DecayKindName(DecayKind d) { return NameOf(kDecayNames, d); }
const char* BackendName(Backend b) { return NameOf(kBackendNames, b); }
const char* RecomputeName(Recompute r) { return NameOf(kRecomputeNames, r); }
const char* Fp8RecipeName(Fp8Recipe r) { return NameOf(kFp8RecipeNames, r); }
const char* AttentionBackwardName(AttentionBackward a) {
  return NameOf(kAttentionBackwardNames, a);
}
const char* RopeScalingTypeName(RopeScalingType t) { return NameOf(kRopeScalingNames, t); }
Status ParallelModeFromName(std::string_view name, const std::string& what, ParallelMode* out) {
  return ValueOf(kParallelNames, name, what, out);
}
Status GradReduceFromName(std::string_view name, const std::string& what, GradReduce* out) {
  return ValueOf(kGradReduceNames, name, what, out);
}
Status DdpAllReduceFromName(std::string_view name, const std::string& what, DdpAllReduce* out) {
  return ValueOf(kDdpAllReduceNames, name, what, out);
}
Status Fp8FastAccumFromName(std::string_view name, const std::string& what, Fp8FastAccum* out) {
  return ValueOf(kFp8FastAccumNames, name, what, out);
}

std::string RunConfigToYaml(const RunConfig& c) {
  std::ostringstream y;
  const ModelConfig& m = c.model;
  y << "name: " << Quote(c.name) << "\n";
  y << "seed: " << c.seed << "\n";
  y << "model:\n";
  if (!m.preset.empty()) y << "  preset: " << m.preset << "\n";
  y << "  n_layer: " << m.n_layer << "\n"
    << "  d_model: " << m.d_model << "\n"
    << "  n_head: " << m.n_head << "\n"
    << "  n_kv_head: " << m.n_kv_head << "\n"
    << "  head_dim: " << m.head_dim() << "\n"
    << "  ffn: " << m.ffn << "\n"
    << "  vocab: " << m.vocab << "\n"
    << "  seq_len: " << m.seq_len << "\n"
    << "  rope_theta: " << Num(m.rope_theta) << "\n";
  y << "  rope_scaling:\n"
    << "    type: " << RopeScalingTypeName(m.rope_scaling.type) << "\n";
  if (m.rope_scaling.type != RopeScalingType::kNone) {
    y << "    factor: " << Num(m.rope_scaling.factor) << "\n"
      << "    low_freq_factor: " << Num(m.rope_scaling.low_freq_factor) << "\n"
      << "    high_freq_factor: " << Num(m.rope_scaling.high_freq_factor) << "\n"
      << "    original_max_position_embeddings: "
      << m.rope_scaling.original_max_position_embeddings << "\n";
  }
  y << "  norm_eps: " << Num(m.norm_eps) << "\n"
    << "  qk_norm: " << BoolText(m.qk_norm) << "\n"
    << "  tie_embeddings: " << BoolText(m.tie_embeddings) << "\n"
    << "  init_std: " << Num(m.init_std) << "\n"
    << "  init: " << InitSchemeName(m.init) << "\n";
  if (!m.init_from.empty()) y << "  init_from: " << Quote(m.init_from) << "\n";
  y << "data:\n"
    << "  dataset_dir: " << Quote(c.data.dataset_dir) << "\n";
  if (!c.data.sources.empty()) {
    y << "  sources:\n";
    for (const DataSourceConfig& src : c.data.sources)
      y << "    - {dir: " << Quote(src.dir) << ", weight: " << Num(src.weight) << "}\n";
  }
  y << "  epoch_shuffle: " << c.data.epoch_shuffle << "\n";
  y << "  tokenizer: " << Quote(c.data.tokenizer) << "\n";
  const OptimizerConfig& o = c.optimizer;
  y << "optimizer:\n"
    << "  lr: " << Num(o.lr) << "\n"
    << "  beta1: " << Num(o.beta1) << "\n"
    << "  beta2: " << Num(o.beta2) << "\n"
    << "  eps: " << Num(o.eps) << "\n"
    << "  weight_decay: " << Num(o.weight_decay) << "\n"
    << "  grad_clip: " << Num(o.grad_clip) << "\n";
  const ScheduleConfig& s = c.schedule;
  y << "schedule:\n"
    << "  total_steps: " << s.total_steps << "\n"
    << "  warmup_steps: " << s.warmup_steps << "\n"
    << "  decay: " << DecayKindName(s.decay) << "\n"
    << "  min_lr_ratio: " << Num(s.min_lr_ratio) << "\n";
  y << "batch:\n"
    << "  micro_batch: " << c.batch.micro_batch << "\n"
    << "  global_batch: " << c.batch.global_batch << "\n";
  const PrecisionConfig& p = c.precision;
  y << "precision:\n"
    << "  compute: " << PrecisionName(p.compute) << "\n"
    << "  fp8:\n"
    << "    recipe: " << Fp8RecipeName(p.fp8.recipe) << "\n"
    << "    amax_history: " << p.fp8.amax_history << "\n"
    << "    margin: " << p.fp8.margin << "\n"
    << "    lm_head: " << BoolText(p.fp8.lm_head) << "\n"
    << "    fast_accum: " << Fp8FastAccumName(p.fp8.fast_accum) << "\n";
  y << "parallel:\n"
    << "  mode: " << ParallelModeName(c.parallel.mode) << "\n"
    << "  grad_reduce: " << GradReduceName(c.parallel.grad_reduce) << "\n"
    << "  ddp_allreduce: " << DdpAllReduceName(c.parallel.ddp_allreduce) << "\n"
    << "  collective_timeout_s: " << Num(c.parallel.collective_timeout_s) << "\n";
  if (c.parallel.mode == ParallelMode::kHsdp)
    y << "  shard_group_size: " << c.parallel.shard_group_size << "\n";
  const CheckpointConfig& k = c.checkpoint;
  y << "checkpoint:\n"
    << "  dir: " << Quote(k.dir) << "\n"
    << "  every_steps: " << k.every_steps << "\n"
    << "  keep_last: " << k.keep_last << "\n"
    << "  keep_every: " << k.keep_every << "\n"
    << "  resume: " << Quote(k.resume) << "\n";
  y << "eval:\n"
    << "  every_steps: " << c.eval.every_steps << "\n"
    << "  batches: " << c.eval.batches << "\n";
  if (c.eval.samples.empty()) {
    y << "  samples: []\n";
  } else {
    y << "  samples:\n";
    for (const std::string& p : c.eval.samples) y << "    - " << Quote(p) << "\n";
  }
  y << "  sample_tokens: " << c.eval.sample_tokens << "\n";
  const TrainConfig& t = c.train;
  y << "train:\n"
    << "  backend: " << BackendName(t.backend) << "\n"
    << "  activation_recompute: " << RecomputeName(t.activation_recompute) << "\n"
    << "  log_every: " << t.log_every << "\n"
    << "  run_dir: " << Quote(t.run_dir) << "\n"
    << "  workers: " << t.workers << "\n"
    << "  max_restarts: " << t.max_restarts << "\n"
    << "  hang_timeout_s: " << Num(t.hang_timeout_s) << "\n"
    << "  spike_sigma: " << Num(t.spike_sigma) << "\n"
    << "  spike_window: " << t.spike_window << "\n"
    << "  spike_max_in_row: " << t.spike_max_in_row << "\n"
    << "  straggler_threshold: " << Num(t.straggler_threshold) << "\n"
    << "  straggler_reports: " << t.straggler_reports << "\n"
    << "  min_workers: " << t.min_workers << "\n"
    << "  elastic_grace_s: " << Num(t.elastic_grace_s) << "\n"
    << "  node_failure_limit: " << t.node_failure_limit << "\n"
    << "  node_cooldown_s: " << Num(t.node_cooldown_s) << "\n";
  const EngineConfig& g = c.engine;
  y << "engine:\n"
    << "  cuda_graph: " << BoolText(g.cuda_graph) << "\n"
    << "  deterministic_attention: " << BoolText(g.deterministic_attention) << "\n"
    << "  attention_backward: " << AttentionBackwardName(g.attention_backward) << "\n"
    << "  lm_head_chunk: " << g.lm_head_chunk << "\n"
    << "  wgrad_stream: " << BoolText(g.wgrad_stream) << "\n"
    << "  wgrad_sm_margin: " << g.wgrad_sm_margin << "\n"
    << "  fused_epilogues: " << BoolText(g.fused_epilogues) << "\n"
    << "  gemm_autotune: " << BoolText(g.gemm_autotune) << "\n"
    << "  nccl_symmetric_memory: " << BoolText(g.nccl_symmetric_memory) << "\n";
  y << "metrics:\n"
    << "  port: " << (c.metrics.port == -1 ? "any" : std::to_string(c.metrics.port)) << "\n"
    << "  bind_address: " << Quote(c.metrics.bind_address) << "\n"
    << "  peak_tflops: " << Num(c.metrics.peak_tflops) << "\n";
  return y.str();
}

int MinWorkers(const TrainConfig& t) { return t.min_workers > 0 ? t.min_workers : t.workers; }

}  // namespace forge
