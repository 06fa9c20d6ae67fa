// Data plans from specs and checkpoint records (data_plans.h).
#include "coordinator/data_plans.h"

#include "common/config.h"
#include "worker/checkpoint/manifest.h"
#include "worker/data/data_plan.h"

namespace forge::coord {

StatusOr<v1::DataPlan> StartPlan(const std::string& run_id, const std::string& spec_yaml) {
  FORGE_ASSIGN_OR_RETURN(RunConfig cfg, ParseRunConfig(spec_yaml, run_id + " spec"));
  v1::DataPlan p;
  p.set_run_id(run_id);
  std::vector<DataSourceConfig> sources = cfg.data.sources;
  if (sources.empty()) sources.push_back({cfg.data.dataset_dir, 1.0});
  for (size_t s = 0; s < sources.size(); ++s) {
    v1::DataSource* d = p.add_sources();
    d->set_dir(sources[s].dir);
    d->set_weight(sources[s].weight);
    d->set_stream(int64_t(s));
  }
  return p;
}

StatusOr<v1::DataPlan> CheckpointPlan(const std::string& run_id, const std::string& spec_yaml,
                                      const CheckpointRecord& c) {
  if (c.data.empty()) {
    FORGE_ASSIGN_OR_RETURN(v1::DataPlan p, StartPlan(run_id, spec_yaml));
    FORGE_ASSIGN_OR_RETURN(RunConfig cfg, ParseRunConfig(spec_yaml, run_id + " spec"));
    p.set_step(c.step);
    p.set_checkpoint(c.dir);
    auto m = ReadManifest(c.dir);
    if (m.ok()) {
      p.set_cursor(m->data_cursor);
      if (p.sources_size() == 1) {
        p.mutable_sources(0)->set_sequences(m->data_cursor);
        p.mutable_sources(0)->set_tokens(m->data_cursor * cfg.model.seq_len);
      }
    }
    return p;
  }
  FORGE_ASSIGN_OR_RETURN(DataUsage u, DecodeDataUsage(c.data, "checkpoint step_" +
                                                                  std::to_string(c.step)));
  v1::DataPlan p;
  p.set_run_id(run_id);
  p.set_step(c.step);
  p.set_checkpoint(c.dir);
  p.set_cursor(u.cursor);
  p.set_origin(u.origin);
  for (const SourceUsage& s : u.sources) {
    v1::DataSource* d = p.add_sources();
    d->set_dir(s.source.dir);
    d->set_weight(s.source.weight);
    d->set_stream(s.source.stream);
    d->set_base(s.source.base);
    d->set_sequences(s.sequences);
    d->set_tokens(s.tokens);
    d->set_epoch(s.epoch);
    d->set_epoch_sequences(s.epoch_sequences);
  }
  return p;
}

}  // namespace forge::coord
