#include "cli/plan_command.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/flags.h"
#include "plan/plan_calibration.h"
#include "plan/plan_model.h"

namespace forge {
namespace {

using Json = nlohmann::ordered_json;

FlagParser PlanFlags() {
  FlagParser f("forge plan", "CONFIG",
               "Predicts step time, tokens/s, MFU and peak memory per GPU of CONFIG's training "
               "step in each\nparallel mode (ddp, zero1, zero2, fsdp, hsdp) on N GPUs, at N = 1, "
               "2, 4, ... up to N, and names the\nmode to run. The cost model runs on measured "
               "rates: built-in ones for H200 / H100, or a\ncalibration file from forge-calibrate.");
  f.Value("--gpus", "N", "GPUs of the run, 1 to 1024 (required)");
  f.Value("--gpus-per-node", "G", "GPUs per node (default 8)");
  f.Value("--link", "nvlink|ib400|eth100",
          "the link between nodes (default ib400: 400 Gb/s InfiniBand per GPU)");
  f.Value("--calibration", "FILE", "measured rates (forge-calibrate's JSON) over the built-in");
  f.Value("--gpu", "h200|h100", "the built-in calibration to start from (default h200)");
  f.Value("--shard-group", "S",
          "hsdp's ranks per shard group (default: parallel.shard_group_size of an hsdp config, "
          "else the GPUs of a node)");
  f.Value("--micro-batch", "B", "overrides batch.micro_batch");
  f.Value("--global-batch", "B", "overrides batch.global_batch");
  f.Bool("--json", "print JSON instead of tables");
  f.Require("--gpus");
  f.Positional(1);
  return f;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "forge plan: %s\n", s.message().c_str());
  return 1;
}

Json PredictionJson(const plan::ModePrediction& p) {
  Json j;
  j["mode"] = plan::ModeName(p.mode);
  j["gpus"] = p.gpus;
  if (p.step_ms <= 0) {
    j["applicable"] = false;
    j["note"] = p.note;
    return j;
  }
  j["accum_steps"] = p.accum_steps;
  j["global_batch"] = p.global_batch;
  if (p.shard_group > 0) j["shard_group"] = p.shard_group;
  j["step_ms"] = p.step_ms;
  j["compute_ms"] = p.compute_ms;
  j["compute_parts_ms"] = Json{{"gemm", p.gemm_ms},
                               {"attention", p.attention_ms},
                               {"elementwise", p.elementwise_ms},
                               {"recompute", p.recompute_ms},
                               {"optimizer", p.optimizer_ms}};
  j["comm_ms"] = p.comm_ms;
  j["comm_gather_ms"] = p.gather_ms;
  j["comm_exposed_ms"] = p.exposed_ms;
  j["tokens_per_s_per_gpu"] = p.tokens_per_s_per_gpu;
  j["tokens_per_s"] = p.tokens_per_s;
  j["mfu"] = p.mfu;
  j["peak_mem_gib"] = p.peak_gib;
  j["peak_mem_parts_gib"] = Json{{"weights", p.weights_gib},     {"gradients", p.gradients_gib},
                                 {"moments", p.moments_gib},     {"activations", p.activations_gib},
                                 {"workspace", p.workspace_gib}, {"overhead", p.overhead_gib}};
  j["fits"] = p.fits;
  if (!p.note.empty()) j["note"] = p.note;
  return j;
}

std::string Thousands(double v) {
  std::string s = std::to_string(static_cast<long long>(v + 0.5));
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(size_t(i), ",");
  return s;
}

void PrintPlanTable(const plan::Plan& plan, double capacity) {
  std::printf("%-6s %9s %9s %9s %12s %14s %6s %9s %s\n", "mode", "step ms", "comm ms",
              "exposed", "tok/s/GPU", "tok/s total", "MFU", "peak GiB", "");
  for (size_t i = 0; i < plan.modes.size(); ++i) {
    const plan::ModePrediction& p = plan.modes[i];
    if (p.step_ms <= 0) {
      std::printf("%-6s (%s)\n", plan::ModeName(p.mode), p.note.c_str());
      continue;
    }
    std::string mark = int(i) == plan.recommended ? "<- recommended" : "";
    if (!p.fits) mark = "does not fit in " + std::to_string(int(capacity)) + " GiB";
    std::printf("%-6s %9.2f %9.2f %9.2f %12s %14s %5.1f%% %9.1f %s\n", plan::ModeName(p.mode),
                p.step_ms, p.comm_ms, p.exposed_ms, Thousands(p.tokens_per_s_per_gpu).c_str(),
                Thousands(p.tokens_per_s).c_str(), 100 * p.mfu, p.peak_gib, mark.c_str());
  }
}

// Each mode's peak memory per GPU by part (ModePrediction's; "other" is the overhead for what
// the estimate leaves out).
void PrintMemoryTable(const plan::Plan& plan) {
  std::printf("\npeak GiB per GPU by part\n%-6s %9s %9s %9s %11s %9s %6s %9s\n", "mode", "weights",
              "grads", "AdamW", "activations", "workspace", "other", "peak");
  for (const plan::ModePrediction& p : plan.modes) {
    if (p.step_ms <= 0) continue;
    std::printf("%-6s %9.1f %9.1f %9.1f %11.1f %9.1f %6.2f %9.1f\n", plan::ModeName(p.mode),
                p.weights_gib, p.gradients_gib, p.moments_gib, p.activations_gib, p.workspace_gib,
                p.overhead_gib, p.peak_gib);
  }
}

}  // namespace

int RunPlanCommand(int argc, char** argv) {
  FlagParser flags = PlanFlags();
  if (int rc; flags.ParseOrExit(argc, argv, 2, &rc)) return rc;
  plan::Topology topo;
  for (Status s : {flags.GetInt("--gpus", &topo.gpus, 1, 1024),
                   flags.GetInt("--gpus-per-node", &topo.gpus_per_node, 1, 1024)})
    if (!s.ok()) return flags.UsageError(s);
  auto loaded = LoadRunConfig(flags.positional()[0]);
  if (!loaded.ok()) return Fail(loaded.status());
  RunConfig cfg = std::move(loaded).value();

  if (topo.gpus > topo.gpus_per_node && topo.gpus % topo.gpus_per_node != 0)
    return Fail(Status::Invalid("--gpus " + std::to_string(topo.gpus) +
                                " is not a whole number of nodes of --gpus-per-node " +
                                std::to_string(topo.gpus_per_node)));
  auto link = plan::LinkFromName(flags.Get("--link", "ib400"));
  if (!link.ok()) return Fail(link.status());
  topo.link = *link;
  // hsdp's group: --shard-group, else the config's parallel.shard_group_size when it runs hsdp,
  // else a node.
  if (cfg.parallel.mode == ParallelMode::kHsdp) topo.shard_group = cfg.parallel.shard_group_size;
  if (Status s = flags.GetInt("--shard-group", &topo.shard_group); !s.ok()) return Fail(s);
  if (flags.Has("--shard-group") && topo.shard_group < 1)
    return Fail(Status::Invalid("--shard-group: expected >= 1, got " + flags.Get("--shard-group")));
  if (Status s = flags.GetInt("--micro-batch", &cfg.batch.micro_batch); !s.ok()) return Fail(s);
  if (Status s = flags.GetInt("--global-batch", &cfg.batch.global_batch); !s.ok()) return Fail(s);
  if (cfg.batch.micro_batch < 1 || cfg.batch.global_batch < 1)
    return Fail(Status::Invalid("the micro and global batch must be >= 1"));

  auto cal = plan::BuiltinCalibration(flags.Get("--gpu", "h200"));
  if (!cal.ok()) return Fail(cal.status());
  if (flags.Has("--calibration")) {
    cal = plan::LoadCalibration(flags.Get("--calibration"), *cal);
    if (!cal.ok()) return Fail(cal.status());
  }

  const plan::Plan main_plan = plan::MakePlan(cfg, topo, *cal);
  std::vector<plan::Plan> scaling;
  for (int n : plan::ScalingPoints(topo.gpus)) {
    plan::Topology t = topo;
    t.gpus = n;
    scaling.push_back(plan::MakePlan(cfg, t, *cal));
  }
  const plan::ModePrediction* rec =
      main_plan.recommended >= 0 ? &main_plan.modes[main_plan.recommended] : nullptr;

  if (flags.Has("--json")) {
    Json out;
    out["config"] = flags.positional()[0];
    out["model"] = cfg.model.preset.empty() ? cfg.name : cfg.model.preset;
    out["micro_batch"] = cfg.batch.micro_batch;
    out["seq_len"] = cfg.model.seq_len;
    out["precision"] = PrecisionName(cfg.precision.compute);
    out["gpus"] = topo.gpus;
    out["gpus_per_node"] = topo.gpus_per_node;
    out["link"] = plan::LinkName(topo.link);
    out["calibration"] = cal->source;
    out["device"] = cal->device;
    out["recommended"] = rec ? Json(plan::ModeName(rec->mode)) : Json(nullptr);
    out["reason"] = main_plan.reason;
    Json modes = Json::array();
    for (const plan::ModePrediction& p : main_plan.modes) modes.push_back(PredictionJson(p));
    out["modes"] = modes;
    Json sc = Json::array();
    for (const plan::Plan& p : scaling) {
      Json row;
      row["gpus"] = p.topology.gpus;
      row["recommended"] =
          p.recommended >= 0 ? Json(plan::ModeName(p.modes[p.recommended].mode)) : Json(nullptr);
      Json ms = Json::array();
      for (const plan::ModePrediction& m : p.modes) ms.push_back(PredictionJson(m));
      row["modes"] = ms;
      sc.push_back(row);
    }
    out["scaling"] = sc;
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }

  std::printf("forge plan: %s (%s, micro-batch %d x %d tokens, %s) on %d GPU%s, %d per node, "
              "%s between nodes\ncalibration: %s (%s)\n\n",
              flags.positional()[0].c_str(),
              cfg.model.preset.empty() ? cfg.name.c_str() : cfg.model.preset.c_str(),
              cfg.batch.micro_batch, cfg.model.seq_len, PrecisionName(cfg.precision.compute),
              topo.gpus, topo.gpus == 1 ? "" : "s", std::min(topo.gpus_per_node, topo.gpus),
              plan::LinkName(topo.link), cal->source.c_str(), cal->device.c_str());
  PrintPlanTable(main_plan, cal->capacity_gib);
  std::vector<std::string> notes;  // each once (the batch note is every mode's)
  for (const plan::ModePrediction& p : main_plan.modes)
    if (!p.note.empty() && p.step_ms > 0 &&
        std::find(notes.begin(), notes.end(), p.note) == notes.end())
      notes.push_back(p.note);
  for (const std::string& n : notes) std::printf("  %s\n", n.c_str());
  PrintMemoryTable(main_plan);
  std::printf("\nrecommended: %s\n", main_plan.reason.c_str());

  std::printf("\ntokens/s per GPU by GPUs (- : does not fit; * : recommended)\n%6s", "GPUs");
  for (plan::Mode m : plan::AllModes()) std::printf(" %12s", plan::ModeName(m));
  std::printf("\n");
  for (const plan::Plan& p : scaling) {
    std::printf("%6d", p.topology.gpus);
    for (size_t i = 0; i < p.modes.size(); ++i) {
      const plan::ModePrediction& m = p.modes[i];
      std::string cell = m.step_ms <= 0 ? "n/a" : !m.fits ? "-" : Thousands(m.tokens_per_s_per_gpu);
      if (int(i) == p.recommended) cell += "*";
      std::printf(" %12s", cell.c_str());
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace forge
