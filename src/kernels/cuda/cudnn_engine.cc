// cuDNN engine configs as values: read out of heuristics results, written back into fresh
// engine / knob-choice / engine-config descriptors, and finalized into execution plans.
#include "kernels/cuda/cudnn_engine.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/owned_handles.h"

namespace forge::cuda {

namespace {

using Desc = cudnnBackendDescriptor_t;

// The descriptors it creates, destroyed on every path (last created first) unless released.
class DescList : public OwnedHandles<Desc, cudnnBackendDestroyDescriptor> {
 public:
  Status Create(cudnnBackendDescriptorType_t type, Desc* out) {
    *out = nullptr;
    FORGE_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, out));
    Own(*out);
    return Status::Ok();
  }
};

Status Unavailable(const std::string& what, cudnnStatus_t st) {
  return Status::Unavailable(what + ": " + cudnnGetErrorString(st) + " (" + LastCudnnError() +
                             ")");
}

// Whether a finalized engine descriptor lists `wanted` among its notes of one kind
// (numerical or behaviour notes: `attr`, element type `type`, at most kCount of them).
template <typename Note, int64_t kCount>
bool EngineHasNote(Desc engine, cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type,
                   Note wanted) {
  Note notes[kCount];
  int64_t n = 0;
  if (cudnnBackendGetAttribute(engine, attr, type, kCount, &n, notes) != CUDNN_STATUS_SUCCESS)
    return false;
  for (int64_t i = 0; i < std::min<int64_t>(n, kCount); ++i)
    if (notes[i] == wanted) return true;
  return false;
}

// Reads the global index and the notes of a finalized engine descriptor.
Status ReadEngine(Desc engine, int64_t* index, bool* nondeterministic, bool* runtime_compiled) {
  int64_t n = 0;
  FORGE_CUDNN_CHECK(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
                                             CUDNN_TYPE_INT64, 1, &n, index));
  *nondeterministic = EngineHasNote<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT>(
      engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
      CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC);
  *runtime_compiled = EngineHasNote<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT>(
      engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
      CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION);
  return Status::Ok();
}

// The value of a finalized engine config: its engine's index and notes, and its knobs.
Status DescribeConfig(Desc config, CudnnEngineChoice* choice, bool* nondeterministic,
                      bool* runtime_compiled) {
  DescList scratch;
  Desc engine;
  FORGE_RETURN_IF_ERROR(scratch.Create(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine));
  int64_t n = 0;
  FORGE_CUDNN_CHECK(cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine));
  FORGE_RETURN_IF_ERROR(ReadEngine(engine, &choice->engine, nondeterministic, runtime_compiled));

  // The result array must hold knob-choice descriptors created beforehand.
  std::vector<Desc> knobs(CUDNN_KNOB_TYPE_COUNTS);
  for (Desc& k : knobs) {
    FORGE_RETURN_IF_ERROR(scratch.Create(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &k));
  }
  int64_t count = 0;
  FORGE_CUDNN_CHECK(cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                             static_cast<int64_t>(knobs.size()), &count,
                                             knobs.data()));
  choice->knobs.clear();
  for (int64_t i = 0; i < std::min<int64_t>(count, int64_t(knobs.size())); ++i) {
    cudnnBackendKnobType_t type;
    int64_t value = 0;
    FORGE_CUDNN_CHECK(cudnnBackendGetAttribute(knobs[size_t(i)], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                                               CUDNN_TYPE_KNOB_TYPE, 1, &n, &type));
    FORGE_CUDNN_CHECK(cudnnBackendGetAttribute(knobs[size_t(i)], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE,
                                               CUDNN_TYPE_INT64, 1, &n, &value));
    choice->knobs.emplace_back(static_cast<int64_t>(type), value);
  }
  std::sort(choice->knobs.begin(), choice->knobs.end());
  return Status::Ok();
}

// Finalizes a plan for a finalized config; kUnavailable when the config cannot run.
Status FinalizePlanFor(cudnnHandle_t handle, Desc config, DescList* list, Desc* plan,
                       int64_t* workspace_bytes) {
  FORGE_RETURN_IF_ERROR(list->Create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, plan));
  // Deprecated, but the plan still wants the handle.
  FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                                             CUDNN_TYPE_HANDLE, 1, &handle));
  FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config));
  const cudnnStatus_t st = cudnnBackendFinalize(*plan);
  if (st != CUDNN_STATUS_SUCCESS) return Unavailable("execution plan", st);
  int64_t n = 0;
  FORGE_CUDNN_CHECK(cudnnBackendGetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                             CUDNN_TYPE_INT64, 1, &n, workspace_bytes));
  return Status::Ok();
}

}  // namespace

std::string LastCudnnError() {
  char buf[1024] = {0};
  cudnnGetLastErrorString(buf, sizeof(buf));
  return buf;
}

std::string CudnnEngineChoice::ToString() const {
  std::string s = "engine=" + std::to_string(engine) + " knobs=";
  for (size_t i = 0; i < knobs.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(knobs[i].first) + ':' + std::to_string(knobs[i].second);
  }
  return s;
}

StatusOr<CudnnEngineChoice> ParseCudnnEngineChoice(const std::string& text) {
  const Status bad = Status::Invalid("cuDNN engine choice \"" + text +
                                     "\": want \"engine=<index> knobs=<type>:<value>,...\"");
  // Strict integers: digits with an optional leading minus, nothing else.
  auto parse_int = [](const std::string& s, int64_t* v) {
    if (s.empty() || s.size() > 19) return false;
    size_t i = (s[0] == '-') ? 1 : 0;
    if (i == s.size()) return false;
    for (size_t j = i; j < s.size(); ++j) {
      if (s[j] < '0' || s[j] > '9') return false;
    }
    *v = std::strtoll(s.c_str(), nullptr, 10);
    return true;
  };
  const std::string e = "engine=", k = " knobs=";
  const size_t knobs_at = text.find(k);
  if (text.rfind(e, 0) != 0 || knobs_at == std::string::npos) return bad;
  CudnnEngineChoice c;
  if (!parse_int(text.substr(e.size(), knobs_at - e.size()), &c.engine) || c.engine < 0) {
    return bad;
  }
  const std::string list = text.substr(knobs_at + k.size());
  if (!list.empty()) {
    std::stringstream items(list);
    std::string item;
    while (std::getline(items, item, ',')) {
      const size_t colon = item.find(':');
      int64_t type = 0, value = 0;
      if (colon == std::string::npos || !parse_int(item.substr(0, colon), &type) ||
          !parse_int(item.substr(colon + 1), &value) || type < 0 ||
          type >= CUDNN_KNOB_TYPE_COUNTS) {
        return bad;
      }
      c.knobs.emplace_back(type, value);
    }
    if (list.back() == ',') return bad;
  }
  std::sort(c.knobs.begin(), c.knobs.end());
  for (size_t i = 1; i < c.knobs.size(); ++i) {
    if (c.knobs[i].first == c.knobs[i - 1].first) return bad;  // a knob set twice
  }
  return c;
}

void CudnnPlan::Reset() {
  if (plan_) cudnnBackendDestroyDescriptor(plan_);
  plan_ = nullptr;
  for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  owned_.clear();
}

CudnnPlan::~CudnnPlan() { Reset(); }

CudnnPlan& CudnnPlan::operator=(CudnnPlan&& o) noexcept {
  if (this != &o) {
    Reset();
    plan_ = std::exchange(o.plan_, nullptr);
    owned_ = std::exchange(o.owned_, {});
    workspace_bytes_ = o.workspace_bytes_;
    choice_ = std::move(o.choice_);
    nondeterministic_ = o.nondeterministic_;
    runtime_compiled_ = o.runtime_compiled_;
  }
  return *this;
}

StatusOr<std::vector<Desc>> HeuristicEngineConfigs(Desc op_graph,
                                                   const std::vector<cudnnBackendHeurMode_t>& modes,
                                                   std::vector<Desc>* owned) {
  std::vector<Desc> configs;
  std::vector<CudnnEngineChoice> seen;
  for (size_t m = 0; m < modes.size(); ++m) {
    // One mode's query; a failure is fatal for the first mode only.
    auto query = [&](DescList* list, std::vector<Desc>* out) -> Status {
      Desc heur;
      FORGE_RETURN_IF_ERROR(list->Create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
      FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op_graph));
      FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE,
                                                 CUDNN_TYPE_HEUR_MODE, 1, &modes[m]));
      FORGE_CUDNN_CHECK(cudnnBackendFinalize(heur));
      int64_t count = 0;
      FORGE_CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                                 nullptr));
      // The result array must hold engine-config descriptors created beforehand.
      std::vector<Desc> results(static_cast<size_t>(std::max<int64_t>(count, 0)));
      for (Desc& c : results) {
        FORGE_RETURN_IF_ERROR(list->Create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &c));
      }
      int64_t returned = 0;
      if (count > 0) {
        FORGE_CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                                   &returned, results.data()));
      }
      results.resize(static_cast<size_t>(std::clamp<int64_t>(returned, 0, count)));
      *out = std::move(results);
      return Status::Ok();
    };
    DescList list;
    std::vector<Desc> results;
    const Status st = query(&list, &results);
    if (!st.ok()) {
      if (m == 0) return st;
      continue;
    }
    // Keep each new choice's config; the heuristics descriptor and duplicates go.
    std::vector<Desc> keep;
    for (Desc c : results) {
      CudnnEngineChoice choice;
      bool nondet = false, rtc = false;
      if (!DescribeConfig(c, &choice, &nondet, &rtc).ok()) continue;
      if (std::find(seen.begin(), seen.end(), choice) != seen.end()) continue;
      seen.push_back(std::move(choice));
      keep.push_back(c);
    }
    // Move the kept configs out of the list (which destroys the rest).
    std::vector<Desc> all = list.Release();
    for (Desc d : all) {
      if (std::find(keep.begin(), keep.end(), d) != keep.end()) {
        owned->push_back(d);
        configs.push_back(d);
      } else {
        cudnnBackendDestroyDescriptor(d);
      }
    }
  }
  return configs;
}

StatusOr<CudnnPlan> FinalizeCudnnPlan(cudnnHandle_t handle, Desc config) {
  CudnnPlan p;
  FORGE_RETURN_IF_ERROR(
      DescribeConfig(config, &p.choice_, &p.nondeterministic_, &p.runtime_compiled_));
  DescList list;
  Desc plan;
  FORGE_RETURN_IF_ERROR(FinalizePlanFor(handle, config, &list, &plan, &p.workspace_bytes_));
  list.Release();
  p.plan_ = plan;
  return p;
}

StatusOr<CudnnPlan> FinalizeCudnnPlan(cudnnHandle_t handle, Desc op_graph,
                                      const CudnnEngineChoice& choice) {
  CudnnPlan p;
  DescList list;
  const std::string what = "engine choice " + choice.ToString();
  // Any refusal while building from a value means "not usable here" (kUnavailable).
  auto set = [&](Desc d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                 int64_t count, const void* value) -> Status {
    const cudnnStatus_t st = cudnnBackendSetAttribute(d, name, type, count, value);
    if (st != CUDNN_STATUS_SUCCESS) return Unavailable(what + ": attribute", st);
    return Status::Ok();
  };
  auto finalize = [&](Desc d, const char* part) -> Status {
    const cudnnStatus_t st = cudnnBackendFinalize(d);
    if (st != CUDNN_STATUS_SUCCESS) return Unavailable(what + ": " + part, st);
    return Status::Ok();
  };

  Desc engine;
  FORGE_RETURN_IF_ERROR(list.Create(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine));
  FORGE_RETURN_IF_ERROR(
      set(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op_graph));
  FORGE_RETURN_IF_ERROR(
      set(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &choice.engine));
  FORGE_RETURN_IF_ERROR(finalize(engine, "engine"));
  int64_t index = 0;
  FORGE_RETURN_IF_ERROR(ReadEngine(engine, &index, &p.nondeterministic_, &p.runtime_compiled_));

  std::vector<Desc> knobs;
  for (const auto& [type_value, value] : choice.knobs) {
    Desc k;
    FORGE_RETURN_IF_ERROR(list.Create(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &k));
    const auto type = static_cast<cudnnBackendKnobType_t>(type_value);
    FORGE_RETURN_IF_ERROR(set(k, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &type));
    FORGE_RETURN_IF_ERROR(set(k, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &value));
    FORGE_RETURN_IF_ERROR(finalize(k, "knob"));
    knobs.push_back(k);
  }

  Desc config;
  FORGE_RETURN_IF_ERROR(list.Create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &config));
  FORGE_RETURN_IF_ERROR(
      set(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &engine));
  if (!knobs.empty()) {
    FORGE_RETURN_IF_ERROR(set(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                              CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(knobs.size()),
                              knobs.data()));
  }
  FORGE_RETURN_IF_ERROR(finalize(config, "engine config"));

  Desc plan;
  const Status planned = FinalizePlanFor(handle, config, &list, &plan, &p.workspace_bytes_);
  if (!planned.ok()) return planned.Annotate(what);
  // The plan comes out of the list: it is destroyed first, before what it was built from.
  std::vector<Desc> all = list.Release();
  all.pop_back();
  p.owned_ = std::move(all);
  p.plan_ = plan;
  // The plan's identity is the value it was built from (what a cache records and replays).
  p.choice_ = choice;
  return p;
}

}  // namespace forge::cuda
