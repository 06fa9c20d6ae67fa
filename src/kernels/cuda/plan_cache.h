// A small persistent map of string keys to string values, kept as one JSON file, that records
// which library plan (cuDNN engine config, cuBLASLt algorithm, ...) a runner chose by timing
// for a given (GPU model, library version, operation, shape). The first process on a machine
// type times the candidates and records its choice; every later process reads the choice
// instead of timing again, so two runs pick the same plan and compute the same bits.
//
// Location (PlanCache::FromEnv): FORGE_PLAN_CACHE names the file; "off" disables the cache
// (runners then skip timing and take the library heuristic's first choice); unset or empty
// means $XDG_CACHE_HOME/forge/plans.json, else $HOME/.cache/forge/plans.json, else disabled.
//
// File: {"format": "forge-plan-cache-v1", "plans": {"<key>": "<value>", ...}}, keys sorted,
// meant to be read (and, with care, edited) by people. Writers take an exclusive flock on
// "<file>.lock" around read-modify-write, so concurrent writers (ranks of one job) lose no
// entries; the new contents go to a temporary file in the same directory that is renamed over
// the old one, so readers (who take no lock) see either the old or the new file, never a
// partial one. Where flock is unavailable the last rename wins.
#pragma once

#include <optional>
#include <string>

#include "common/status.h"

namespace forge::cuda {

class PlanCache {
 public:
  PlanCache() = default;  // disabled
  // path empty: disabled.
  explicit PlanCache(std::string path) : path_(std::move(path)) {}

  // The cache FORGE_PLAN_CACHE (or the default location) names; disabled for "off".
  static PlanCache FromEnv();

  bool enabled() const { return !path_.empty(); }
  const std::string& path() const { return path_; }

  // The value recorded for key; nullopt when absent or the file does not exist yet. A file
  // that is not a plan cache (bad JSON, wrong format) is an error naming the file.
  StatusOr<std::optional<std::string>> Get(const std::string& key) const;

  // Records key -> value, replacing an earlier value.
  Status Put(const std::string& key, const std::string& value) const;

  // Records key -> value unless key is already recorded, and returns the value recorded now:
  // of processes that tuned the same key at the same time, all adopt the first one's choice.
  StatusOr<std::string> PutIfAbsent(const std::string& key, const std::string& value) const;

 private:
  StatusOr<std::string> Update(const std::string& key, const std::string& value,
                               bool replace) const;

  std::string path_;
};

// Whether a CUDA profiler or checker is injected into this process (the variables Nsight
// Compute / Systems and compute-sanitizer set in their target). Under one, kernels are replayed or
// serialised, so timings say nothing about the real step: tuners must not time candidates
// or record a choice then (a choice recorded under ncu once made every later run use a 1.7x
// slower attention forward).
bool ProfilerAttached();

}  // namespace forge::cuda
