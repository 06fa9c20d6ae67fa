#include "plan/plan_calibration.h"

#include <cctype>
#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file_io.h"

namespace forge::plan {
namespace {

using Json = nlohmann::json;

// The H200 defaults. Sources: docs/performance.md (PERF) and
// ../shared/notes/verified-figures.md (VF), all on H200s with the project's CUDA step.
PlanCalibration H200() {
  PlanCalibration c;
  c.device = "NVIDIA H200";
  c.source = "built-in (H200)";
  c.peak_bf16_tflops = 989.4;  // common/peak_flops.h
  // GEMMs: least squares of the one-GPU step over gpt124m B16 (593,990 tokens/s), gpt350m B16
  // (218,172) and B24 (221,853) and llama3-1b B2 (59,232), PERF's table of record, with the
  // attention, elementwise and optimizer terms below fixed: 745 * d / (d + 180), i.e. 604
  // (d 768), 632 (1024), 685 (2048), every step within 0.6%. (forge-gemm-bench's 745-869 TFLOP/s
  // are GEMMs timed alone, cooler and without the second stream.)
  c.gemm_tflops_max = 745;
  c.gemm_half_width = 180;
  // FP8: fitted to gpt350m B16 FP8 (281,405) and FP8 + FP8 LM head (295,750) tokens/s (VF):
  // GEMMs 1.56x BF16's, 8 more HBM bytes per layer, column and token (within 0.4% of both).
  c.fp8_gemm_speedup = 1.56;
  c.fp8_elementwise_bytes = 8;
  // Attention (model FLOPs 12 L (H hd) T a token), from forge-bench --profile on one H200 (an
  // eager single-stream step, phases timed with events): gpt350m B16 at T 1024 11.69 ms a step
  // (forward 2.98 + backward 8.71: 4.95 TFLOP, 423 TFLOP/s) and llama3-1b B2 at T 8192 83.59 ms
  // (22.88 + 60.71: 52.8 TFLOP, 632 TFLOP/s) fit 680 * T / (T + 622).
  c.attention_tflops_max = 680;
  c.attention_half_seq = 622;
  // HBM: llama3-1b's optimizer phase, 9.6 ms for 30 bytes x 1.236e9 parameters (PERF), is
  // 3.86 TB/s; AdamW reads w, g, m, v and writes w, m, v and the bf16 copy: 30 bytes.
  c.hbm_gb_s = 3860;
  c.optimizer_bytes_per_param = 30;
  // Elementwise: gpt350m's RMSNorm (3.8 ms) and RoPE backward (1.2) at the profile's 2.7 TB/s
  // (H100) are 33.5 bytes per layer, column and token; its cross-entropy (1.2 ms over 16,384 x
  // 50,304 logits) 3.9 bytes per logit.
  c.elementwise_bytes = 34;
  c.logits_bytes = 3.9;
  // Memory: what the device tool's H200 lets a process take (~139.8 GiB of 141 GB). The
  // overhead is the mean of what memory_estimate leaves out of gpt350m B16's 19.69 GiB (VF)
  // and llama3-1b B2's 42.42 GiB (PERF): 0.06 and 0.05 GiB.
  c.capacity_gib = 139.8;
  c.overhead_gib = 0.05;
  // NVLink (4x H200 of one host, NCCL 2.28). Latencies assumed (NCCL's simple-protocol ring:
  // ~8 us to launch, ~2 us a ring step on NVLink); the bandwidths then follow from
  // forge-dist-bench's collectives-alone times for gpt350m (VF): 26 bf16 all-reduces of the
  // units in 3.82 ms -> 327 GB/s; fsdp's 26 fp32 reduce-scatters and 52 bf16 all-gathers in
  // 12.0 ms -> 198 GB/s.
  c.nvlink = {327, 198, 8, 2, false};
  // InfiniBand 400 Gb/s, one NIC per GPU (the HGX H100/H200 reference node): 50 GB/s line
  // rate, ~90% as NCCL's bus bandwidth; ~5 us a ring step over the network. Assumed, not
  // measured here: replace with forge-calibrate's figures from a real cluster.
  c.ib400 = {45, 45, 12, 5, false};
  // Ethernet 100 Gb/s, one NIC per node: 12.5 GB/s line rate, ~80% reached over TCP/RoCE,
  // ~15 us a step. Assumed, as above.
  c.eth100 = {10, 10, 20, 15, true};
  // Overlap, from the same 4x H200 gpt350m runs (VF): ddp (bf16 gradients) had 3.82 ms of
  // collectives and 3.16 exposed; the last (the embedding's, 0.49 ms) cannot overlap, so
  // (3.16 - 0.49) / (3.82 - 0.49) = 0.80 of the rest still cost. fsdp: 6.0 of 12.0 ms exposed,
  // 1.32 of it the units that cannot overlap (the root units' gathers, the first block's, the
  // embedding's reduce-scatter): (6.0 - 1.32) / (11.58 - 1.32) = 0.46.
  c.gradient_exposed_fraction = 0.80;
  c.sharded_exposed_fraction = 0.46;
  return c;
}

// H100 80GB HBM3: the same step rates (700 W and power-limited like the H200: PERF's H100
// profile of gpt350m B16, ~77 ms, is within 2% of the H200's 75.5), HBM at the 2.7 TB/s that
// profile measured for AdamW, 80 GB, NVLink 4 as the H200.
PlanCalibration H100() {
  PlanCalibration c = H200();
  c.device = "NVIDIA H100 80GB HBM3";
  c.source = "built-in (H100)";
  c.hbm_gb_s = 2700;
  c.capacity_gib = 79.1;
  return c;
}

// The keys of the "compute" section, each a field of PlanCalibration; zero_ok where 0 means
// something (no half-width: a flat rate; FP8 adding no bytes).
struct ComputeKey {
  const char* name;
  double PlanCalibration::*field;
  bool zero_ok;
};
constexpr ComputeKey kComputeKeys[] = {
    {"gemm_tflops_max", &PlanCalibration::gemm_tflops_max, false},
    {"gemm_half_width", &PlanCalibration::gemm_half_width, true},
    {"fp8_gemm_speedup", &PlanCalibration::fp8_gemm_speedup, false},
    {"attention_tflops_max", &PlanCalibration::attention_tflops_max, false},
    {"attention_half_seq", &PlanCalibration::attention_half_seq, true},
    {"hbm_gb_s", &PlanCalibration::hbm_gb_s, false},
    {"elementwise_bytes", &PlanCalibration::elementwise_bytes, false},
    {"fp8_elementwise_bytes", &PlanCalibration::fp8_elementwise_bytes, true},
    {"logits_bytes", &PlanCalibration::logits_bytes, false},
    {"optimizer_bytes_per_param", &PlanCalibration::optimizer_bytes_per_param, false}};

// The "links" section: one LinkCalibration per Link.
constexpr std::pair<const char*, LinkCalibration PlanCalibration::*> kLinkKeys[] = {
    {"nvlink", &PlanCalibration::nvlink},
    {"ib400", &PlanCalibration::ib400},
    {"eth100", &PlanCalibration::eth100}};

std::string Lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// Reads the keys of one JSON object into doubles/bools, refusing unknown keys and bad values.
class Reader {
 public:
  explicit Reader(std::string what) : what_(std::move(what)) {}

  Status Object(const Json& j, const std::string& path) const {
    if (!j.is_object()) return Error(path, "expected an object");
    return Status::Ok();
  }
  Status Keys(const Json& j, const std::string& path, const std::set<std::string>& known) const {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!known.count(it.key())) {
        std::string list;
        for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
        return Error(path.empty() ? it.key() : path + "." + it.key(),
                     "unknown key (known: " + list + ")");
      }
    }
    return Status::Ok();
  }
  // A number > 0 (>= 0 when zero_ok).
  Status Number(const Json& j, const std::string& path, const char* key, double* out,
                bool zero_ok = false) const {
    if (!j.contains(key)) return Status::Ok();
    const Json& v = j.at(key);
    const std::string p = path.empty() ? key : path + "." + key;
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0 ||
        (!zero_ok && v.get<double>() == 0))
      return Error(p, zero_ok ? "expected a number >= 0" : "expected a number > 0");
    *out = v.get<double>();
    return Status::Ok();
  }
  Status Fraction(const Json& j, const std::string& path, const char* key, double* out) const {
    FORGE_RETURN_IF_ERROR(Number(j, path, key, out, true));
    if (*out > 1) return Error(path + "." + key, "expected a fraction in [0, 1]");
    return Status::Ok();
  }
  Status Bool(const Json& j, const std::string& path, const char* key, bool* out) const {
    if (!j.contains(key)) return Status::Ok();
    if (!j.at(key).is_boolean()) return Error(path + "." + key, "expected true or false");
    *out = j.at(key).get<bool>();
    return Status::Ok();
  }
  Status Error(const std::string& path, const std::string& msg) const {
    return Status::Invalid(what_ + ": " + path + ": " + msg);
  }

 private:
  std::string what_;
};

Status ReadLink(const Reader& r, const Json& j, const std::string& path, LinkCalibration* l) {
  FORGE_RETURN_IF_ERROR(r.Object(j, path));
  FORGE_RETURN_IF_ERROR(r.Keys(j, path,
                               {"allreduce_gb_s", "reduce_scatter_gb_s", "base_latency_us",
                                "hop_latency_us", "per_node"}));
  FORGE_RETURN_IF_ERROR(r.Number(j, path, "allreduce_gb_s", &l->allreduce_gb_s));
  FORGE_RETURN_IF_ERROR(r.Number(j, path, "reduce_scatter_gb_s", &l->reduce_scatter_gb_s));
  FORGE_RETURN_IF_ERROR(r.Number(j, path, "base_latency_us", &l->base_latency_us, true));
  FORGE_RETURN_IF_ERROR(r.Number(j, path, "hop_latency_us", &l->hop_latency_us, true));
  return r.Bool(j, path, "per_node", &l->per_node);
}

Json LinkJson(const LinkCalibration& l) {
  return Json{{"allreduce_gb_s", l.allreduce_gb_s},
              {"reduce_scatter_gb_s", l.reduce_scatter_gb_s},
              {"base_latency_us", l.base_latency_us},
              {"hop_latency_us", l.hop_latency_us},
              {"per_node", l.per_node}};
}

}  // namespace

StatusOr<PlanCalibration> BuiltinCalibration(const std::string& gpu) {
  const std::string g = Lower(gpu);
  if (g == "h200") return H200();
  if (g == "h100") return H100();
  return Status::Invalid("--gpu: expected h200 or h100, got '" + gpu + "'");
}

StatusOr<PlanCalibration> ParseCalibration(const std::string& json_text, const std::string& what,
                                           PlanCalibration c) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const std::exception& e) {
    return Status::Invalid(what + ": not valid JSON: " + e.what());
  }
  const Reader r(what);
  if (!j.is_object()) return Status::Invalid(what + ": expected a JSON object");
  FORGE_RETURN_IF_ERROR(r.Keys(j, "",
                               {"format", "device", "peak_bf16_tflops", "compute", "memory",
                                "links", "overlap", "measured"}));
  if (j.contains("format") &&
      (!j["format"].is_string() || j["format"].get<std::string>() != "forge-calibration/1"))
    return r.Error("format", "expected \"forge-calibration/1\"");
  if (j.contains("device")) {
    if (!j["device"].is_string()) return r.Error("device", "expected a string");
    c.device = j["device"].get<std::string>();
  }
  FORGE_RETURN_IF_ERROR(r.Number(j, "", "peak_bf16_tflops", &c.peak_bf16_tflops));
  if (j.contains("compute")) {
    const Json& s = j["compute"];
    FORGE_RETURN_IF_ERROR(r.Object(s, "compute"));
    std::set<std::string> known;
    for (const ComputeKey& k : kComputeKeys) known.insert(k.name);
    FORGE_RETURN_IF_ERROR(r.Keys(s, "compute", known));
    for (const ComputeKey& k : kComputeKeys)
      FORGE_RETURN_IF_ERROR(r.Number(s, "compute", k.name, &(c.*k.field), k.zero_ok));
  }
  if (j.contains("memory")) {
    const Json& s = j["memory"];
    FORGE_RETURN_IF_ERROR(r.Object(s, "memory"));
    FORGE_RETURN_IF_ERROR(r.Keys(s, "memory", {"capacity_gib", "overhead_gib"}));
    FORGE_RETURN_IF_ERROR(r.Number(s, "memory", "capacity_gib", &c.capacity_gib));
    FORGE_RETURN_IF_ERROR(r.Number(s, "memory", "overhead_gib", &c.overhead_gib, true));
  }
  if (j.contains("links")) {
    const Json& s = j["links"];
    FORGE_RETURN_IF_ERROR(r.Object(s, "links"));
    std::set<std::string> known;
    for (const auto& [name, _] : kLinkKeys) known.insert(name);
    FORGE_RETURN_IF_ERROR(r.Keys(s, "links", known));
    for (const auto& [name, link] : kLinkKeys) {
      if (s.contains(name))
        FORGE_RETURN_IF_ERROR(ReadLink(r, s[name], std::string("links.") + name, &(c.*link)));
    }
  }
  if (j.contains("overlap")) {
    const Json& s = j["overlap"];
    FORGE_RETURN_IF_ERROR(r.Object(s, "overlap"));
    FORGE_RETURN_IF_ERROR(
        r.Keys(s, "overlap", {"gradient_exposed_fraction", "sharded_exposed_fraction"}));
    FORGE_RETURN_IF_ERROR(
        r.Fraction(s, "overlap", "gradient_exposed_fraction", &c.gradient_exposed_fraction));
    FORGE_RETURN_IF_ERROR(
        r.Fraction(s, "overlap", "sharded_exposed_fraction", &c.sharded_exposed_fraction));
  }
  c.source = what;
  return c;
}

StatusOr<PlanCalibration> LoadCalibration(const std::string& path, PlanCalibration base) {
  auto text = ReadSmallFile(path);
  if (!text.ok()) return Status::Invalid("--calibration " + path + ": " + text.status().message());
  return ParseCalibration(*text, path, std::move(base));
}

std::string CalibrationToJson(const PlanCalibration& c) {
  Json j;
  j["format"] = "forge-calibration/1";
  j["device"] = c.device;
  j["peak_bf16_tflops"] = c.peak_bf16_tflops;
  for (const ComputeKey& k : kComputeKeys) j["compute"][k.name] = c.*k.field;
  j["memory"] = Json{{"capacity_gib", c.capacity_gib}, {"overhead_gib", c.overhead_gib}};
  for (const auto& [name, link] : kLinkKeys) j["links"][name] = LinkJson(c.*link);
  j["overlap"] = Json{{"gradient_exposed_fraction", c.gradient_exposed_fraction},
                      {"sharded_exposed_fraction", c.sharded_exposed_fraction}};
  return j.dump(2) + "\n";
}

}  // namespace forge::plan
