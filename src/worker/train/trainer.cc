#include "worker/train/trainer.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>

#include "common/human_format.h"
#include "worker/hf/hf_import.h"
#include "worker/model/init.h"
#include "worker/optim/lr_schedule.h"
#include "worker/parallel/comm.h"
#include "worker/parallel/hybrid_groups.h"
#include "worker/train/cuda_backend.h"
#include "worker/train/spike_guard.h"
#include "worker/train/trainer_checkpoint.h"

namespace forge {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// `s` as a JSON string literal; bytes that are not UTF-8 (model output may split a character)
// become U+FFFD.
std::string JsonText(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void WriteRecord(std::ofstream* out, const StepRecord& r) {
  if (!out || !out->is_open()) return;
  char buf[256];
  int n = std::snprintf(buf, sizeof buf,
                        "{\"step\":%ld,\"loss\":%.6f,\"grad_norm\":%.6f,\"lr\":%.6g,"
                        "\"tokens_per_s\":%.1f,\"step_seconds\":%.6f",
                        long(r.step), r.loss, r.grad_norm, r.lr, r.tokens_per_s,
                        r.step_seconds);
  *out << std::string(buf, n);
  if (r.val_loss >= 0.0f) {
    n = std::snprintf(buf, sizeof buf, ",\"val_loss\":%.6f", r.val_loss);
    *out << std::string(buf, n);
  }
  if (r.skipped_steps > 0) {
    n = std::snprintf(buf, sizeof buf, ",\"skipped_steps\":%ld", long(r.skipped_steps));
    *out << std::string(buf, n);
  }
  if (!r.samples.empty()) {
    nlohmann::json samples = nlohmann::json::array();
    for (const EvalSample& e : r.samples)
      samples.push_back({{"prompt", e.prompt}, {"completion", e.completion}});
    // Completions are model output: bytes that are not UTF-8 are replaced, not refused.
    *out << ",\"samples\":"
         << samples.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  if (r.loss_spikes > 0) {
    n = std::snprintf(buf, sizeof buf, ",\"loss_spikes\":%ld", long(r.loss_spikes));
    *out << std::string(buf, n);
  }
  if (r.loss_spike) {
    n = std::snprintf(buf, sizeof buf, ",\"loss_spike\":true,\"data_cursor\":%ld",
                      long(r.data_cursor));
    *out << std::string(buf, n);
  }
  if (r.rollback) {
    n = std::snprintf(buf, sizeof buf,
                      ",\"spike_rollbacks\":%ld,\"rollback_to_step\":%ld,\"skip_from\":%ld,"
                      "\"skip_to\":%ld",
                      long(r.spike_rollbacks), long(r.rollback_to_step), long(r.skip_from),
                      long(r.skip_to));
    *out << std::string(buf, n);
  }
  if (r.checkpoint_step >= 0) {
    n = std::snprintf(buf, sizeof buf,
                      ",\"checkpoint_step\":%ld,\"checkpoints_committed\":%d,"
                      "\"checkpoint_blocked_s\":%.6f,"
                      "\"checkpoint_write_s\":%.6f,\"checkpoint_bytes\":%llu,"
                      "\"checkpoint_bytes_per_s\":%.0f",
                      long(r.checkpoint_step), r.checkpoints_committed, r.checkpoint_blocked_s,
                      r.checkpoint_write_s,
                      static_cast<unsigned long long>(r.checkpoint_bytes),
                      r.checkpoint_bytes_per_s);
    *out << std::string(buf, n);
  }
  *out << "}\n";
  out->flush();
}

// A resumed run keeps the records up to the step it resumes from: what a crashed run logged
// after its last checkpoint is logged again by the continuation.
Status TrimMetrics(const std::string& path, int64_t max_step) {
  std::ifstream in(path);
  if (!in) return Status::Ok();  // nothing logged yet
  std::string kept, line;
  const std::string key = "{\"step\":";
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    if (std::atoll(line.c_str() + key.size()) <= max_step) kept += line + "\n";
  }
  in.close();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kept;
    if (!out) return Status::IoError("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Status::IoError("cannot rename " + tmp + " to " + path);
  return Status::Ok();
}

std::string FormatBytes(double bytes) {
  char buf[32];
  if (bytes >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6) std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  else std::snprintf(buf, sizeof buf, "%.1f kB", bytes / 1e3);
  return buf;
}

}  // namespace

StatusOr<float> Evaluate(const RunConfig& cfg, TrainBackend* backend, const BatchProvider& data,
                         Comm* comm) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->world() : 1;
  const int64_t tokens = int64_t{cfg.batch.micro_batch} * cfg.model.seq_len;
  std::vector<int32_t> in(tokens), tgt(tokens);
  FORGE_RETURN_IF_ERROR(backend->BeginEval());
  // Batch i's loss goes to slot i on the rank that evaluates it (the others hold +0.0), so
  // the all-reduce is exact and the mean is summed in batch order whatever the world size.
  std::vector<double> losses(std::max(0, cfg.eval.batches), 0.0);
  // Rank r evaluates batches r, r+W, ... With a collective EvalLoss every rank makes
  // ceil(batches / W) calls; the extra ones (on batch 0) are dropped.
  const int batches = std::max(0, cfg.eval.batches);
  const int calls = backend->EvalIsCollective() ? (batches + world - 1) / world
                                                : std::max(0, (batches - rank + world - 1) / world);
  for (int k = 0; k < calls; ++k) {
    const int i = rank + k * world;
    const bool mine = i < batches;
    FORGE_RETURN_IF_ERROR(
        data.val(mine ? i : 0, in.data(), tgt.data()).Annotate("validation batch"));
    float loss = 0.0f;
    FORGE_RETURN_IF_ERROR(backend->EvalLoss({in.data(), tgt.data()}, &loss));
    if (mine) losses[i] = loss;
  }
  if (comm && world > 1)
    FORGE_RETURN_IF_ERROR(AllReduceSumBlocking(comm, losses.data(), int64_t(losses.size()),
                                               DType::kF64, "validation losses"));
  double total = 0.0;
  for (double l : losses) total += l;
  return static_cast<float>(total / std::max(1, cfg.eval.batches));
}

StatusOr<TrainResult> RunTraining(const RunConfig& cfg, TrainBackend* backend,
                                  const BatchProvider& data, const TrainOptions& opt) {
  const ParamLayout layout = MakeParamLayout(cfg.model);
  const int world = opt.comm ? opt.comm->world() : 1;
  const bool leader = opt.comm == nullptr || opt.comm->rank() == 0;  // prints, writes metrics
  FORGE_RETURN_IF_ERROR(CheckShardGroupSize(cfg.parallel, world));
  const int64_t per_micro = int64_t{cfg.batch.micro_batch} * world;
  if (cfg.batch.global_batch % per_micro != 0)
    return Status::Invalid("batch.global_batch (" + std::to_string(cfg.batch.global_batch) +
                           ") must be a multiple of micro_batch * world_size (" +
                           std::to_string(per_micro) + ")");
  const int accum = static_cast<int>(cfg.batch.global_batch / per_micro);
  const int64_t total_steps = opt.max_steps >= 0 ? opt.max_steps : cfg.schedule.total_steps;
  const int64_t tokens_per_micro = int64_t{cfg.batch.micro_batch} * cfg.model.seq_len;
  const int64_t tokens_per_step = tokens_per_micro * accum * world;
  const int64_t every = cfg.checkpoint.every_steps;
  const bool may_save =
      every > 0 || opt.stop_requested != nullptr || opt.checkpoint_requested != nullptr;

  TrainResult result;
  ResumePoint start;
  if (may_save || !cfg.checkpoint.resume.empty()) {
    FORGE_ASSIGN_OR_RETURN(start, ResumeTraining(cfg, layout, backend, opt.comm, may_save));
  }
  result.resumed_from = start.dir;
  result.resumed_step = start.step;
  result.warnings = start.warnings;
  for (const std::string& w : start.warnings)
    if (leader) std::fprintf(stderr, "forge: warning: %s\n", w.c_str());
  if (start.dir.empty()) {
    UnitBuffers params;  // freed at once: a sharded backend keeps only its slice
    if (cfg.model.init_from.empty()) {
      InitParams(cfg.model, layout, cfg.seed, &params);
    } else {
      auto loaded = hf::LoadHfWeightsFor(cfg.model, cfg.model.init_from);
      if (!loaded.ok()) return loaded.status().Annotate("model.init_from " + cfg.model.init_from);
      params = std::move(loaded).value();
    }
    FORGE_RETURN_IF_ERROR(backend->SetParams(params));
  } else if (leader && opt.print_progress) {
    std::printf("resumed from %s: step %ld, data cursor %ld (saved by %d rank%s, %s)\n",
                start.dir.c_str(), long(start.step), long(start.data_cursor), start.source_world,
                start.source_world == 1 ? "" : "s", start.source_mode.c_str());
  }

  if (data.start) {
    std::vector<std::string> notes;
    FORGE_RETURN_IF_ERROR(data.start(start.dir, start.data ? &*start.data : nullptr,
                                     start.data_cursor, &notes)
                              .Annotate("data plan"));
    for (const std::string& n : notes) {
      result.warnings.push_back(n);
      if (leader) std::fprintf(stderr, "forge: warning: %s\n", n.c_str());
    }
  }

  std::vector<std::vector<int32_t>> inputs(accum, std::vector<int32_t>(tokens_per_micro));
  std::vector<std::vector<int32_t>> targets(accum, std::vector<int32_t>(tokens_per_micro));
  std::vector<MicroBatch> micro(accum);
  for (int k = 0; k < accum; ++k) micro[k] = {inputs[k].data(), targets[k].data()};

  std::ofstream metrics;
  if (leader && !opt.metrics_path.empty()) {
    if (!start.dir.empty()) FORGE_RETURN_IF_ERROR(TrimMetrics(opt.metrics_path, start.step));
    metrics.open(opt.metrics_path, start.dir.empty() ? std::ios::trunc : std::ios::app);
    if (!metrics) return Status::IoError("cannot open metrics file " + opt.metrics_path);
  }

  std::unique_ptr<TrainCheckpointer> ckpt;
  if (may_save)
    ckpt = std::make_unique<TrainCheckpointer>(cfg, layout, backend, opt.comm, opt.report_shard);
  // Step boundary: whether any rank was asked to stop (or to save), and whether the save in
  // flight (if any) is written on every rank. One tiny all-reduce, only when there is something
  // to agree on.
  bool save_now = false;
  auto agree = [&](bool* stop, bool* written) -> Status {
    const bool asked = opt.checkpoint_requested && opt.checkpoint_requested->exchange(false);
    double flags[3] = {opt.stop_requested && opt.stop_requested->load() ? 1.0 : 0.0,
                       ckpt && ckpt->writing() ? 1.0 : 0.0, asked ? 1.0 : 0.0};
    if (opt.comm && world > 1 &&
        (opt.stop_requested || opt.checkpoint_requested || (ckpt && ckpt->pending())))
      FORGE_RETURN_IF_ERROR(
          AllReduceSumBlocking(opt.comm, flags, 3, DType::kF64, "step boundary flags"));
    *stop = flags[0] > 0.0;
    *written = flags[1] == 0.0;
    save_now = flags[2] > 0.0;
    return Status::Ok();
  };

  result.steps = start.step;
  if (start.dir.empty()) {
    FORGE_ASSIGN_OR_RETURN(result.initial_val_loss, Evaluate(cfg, backend, data, opt.comm));
    if (leader && opt.print_progress)
      std::printf("step 0/%ld | val loss %.4f\n", long(total_steps), result.initial_val_loss);
  } else {
    result.initial_val_loss = -1.0f;
  }
  if (opt.stop_requested) {  // asked before the first step: nothing new to save
    bool stop = false, written = true;
    FORGE_RETURN_IF_ERROR(agree(&stop, &written));
    if (stop) {
      result.stopped = true;
      return result;
    }
  }

  double train_seconds = 0.0;
  double window_seconds = 0.0;
  int64_t window_steps = 0;
  double window_data_wait = 0.0;
  CudaTrainBackend* const cuda = dynamic_cast<CudaTrainBackend*>(backend);  // memory in records
  // Loss spikes (spike_guard.h): the guard's window and the data windows left out come back
  // with the checkpoint, so a resumed run decides and reads as the uninterrupted one.
  SpikeGuard guard(cfg.train);
  DataSkips skips;
  if (auto it = start.extra.find(kSpikeGuardBlob); it != start.extra.end()) {
    if (Status s = DecodeSpikeState(it->second, &guard, &skips); !s.ok()) {
      const std::string w = "resume from " + start.dir + ": " + s.ToString() +
                            "; spike statistics start afresh";
      result.warnings.push_back(w);
      if (leader) std::fprintf(stderr, "forge: warning: %s\n", w.c_str());
    }
  }
  bool guard_on = guard.enabled();
  if (guard_on && !backend->SkipsAboveLimits()) {
    guard_on = false;
    if (leader)
      std::fprintf(stderr,
                   "forge: note: the %s backend cannot skip a step before its update on a loss "
                   "spike; spike detection (train.spike_sigma) is off for this run\n",
                   backend->name());
  }
  auto spike_blobs = [&]() {
    std::map<std::string, std::string> b;
    b[kSpikeGuardBlob] = EncodeSpikeState(guard, skips);
    return b;
  };
  int64_t progress = start.step;  // TrainOptions::step_done
  int64_t non_finite_reported = 0;  // non-finite skipped steps already warned about
  int64_t cursor = start.data_cursor;  // global sequence index of the next global batch
  // Committed, not yet in a record (folded when more than one commits between two records).
  std::optional<CheckpointCommit> unreported;
  int unreported_count = 0;
  auto take_commits = [&]() {
    for (CheckpointCommit& c : ckpt->TakeCommits()) {
      result.checkpoints.push_back(c.step);
      result.checkpoint_blocked_s += c.blocked_s;
      for (const std::string& w : c.warnings) {
        result.warnings.push_back(w);
        if (leader) std::fprintf(stderr, "forge: warning: %s\n", w.c_str());
      }
      if (leader && opt.print_progress) {
        std::printf("checkpoint step_%ld: %s, training blocked %.3f s, written in %.3f s "
                    "(%s/s)%s\n",
                    long(c.step), FormatBytes(double(c.bytes)).c_str(), c.blocked_s, c.write_s,
                    FormatBytes(c.bytes_per_s()).c_str(),
                    c.removed.empty()
                        ? ""
                        : (", removed " + std::to_string(c.removed.size()) + " old").c_str());
        std::fflush(stdout);
      }
      if (unreported) {  // fold: the record reports the newest step and the summed costs
        c.blocked_s += unreported->blocked_s;
        c.write_s += unreported->write_s;
        c.bytes += unreported->bytes;
      }
      unreported = std::move(c);
      ++unreported_count;
    }
  };
  for (int64_t step = start.step + 1; step <= total_steps; ++step) {
    const auto t0 = Clock::now();
    cursor = skips.Apply(cursor);
    const int64_t step_cursor = cursor;
    for (int k = 0; k < accum; ++k)
      FORGE_RETURN_IF_ERROR(data.train(cursor, k, inputs[k].data(), targets[k].data())
                                .Annotate("training batch at cursor " + std::to_string(cursor)));
    window_data_wait += Seconds(t0, Clock::now());
    StepHyper hyper;
    hyper.lr = LearningRate(cfg.optimizer, cfg.schedule, step);
    hyper.step = step;
    if (guard_on) hyper.skip_above = guard.Limits();
    const float lr = hyper.lr;
    const bool last = step == total_steps;
    bool log = last || step == 1 || (cfg.train.log_every > 0 && step % cfg.train.log_every == 0);
    StepStats stats;
    // The guard judges every step, so with it on every step reports its loss and norm.
    FORGE_RETURN_IF_ERROR(backend->TrainStep(micro, hyper, log || guard_on, &stats)
                              .Annotate("step " + std::to_string(step)));
    cursor += cfg.batch.global_batch;
    const double dt = Seconds(t0, Clock::now());
    train_seconds += dt;
    window_seconds += dt;
    ++window_steps;
    ++progress;  // every run counts it: the ETA and the summary's tokens/s divide by it
    if (opt.step_done) opt.step_done->store(progress);

    StepRecord rec;
    rec.step = step;
    rec.lr = lr;
    rec.data_cursor = step_cursor;
    bool rollback = false, rolled_back = false;
    if (stats.valid) {
      rec.loss = stats.loss;
      rec.grad_norm = stats.grad_norm;
      if (step == 1) result.first_loss = stats.loss;
      result.final_train_loss = stats.loss;
      if (guard_on && guard.Observe(stats.loss, stats.grad_norm, hyper.skip_above, step,
                                    step_cursor) == StepVerdict::kSpike) {
        ++result.loss_spikes;
        rec.loss_spike = true;
        log = true;  // every spike gets a record
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      "loss spike at step %ld (data cursor %ld): loss %.4f, grad norm %.4g above "
                      "the limits %.4f / %.4g (mean + %g sigma over the last %d steps); update "
                      "skipped, %d in a row",
                      long(step), long(step_cursor), stats.loss, stats.grad_norm,
                      hyper.skip_above.loss, hyper.skip_above.grad_norm, guard.sigma(),
                      guard.window(), guard.in_row());
        rec.events.push_back(buf);
        if (leader) std::fprintf(stderr, "forge: warning: %s\n", buf);
        rollback = guard.RollbackDue();
      }
      // Skipped steps the guard did not call spikes had non-finite loss or gradients (counted
      // by the backend); say so once per logged window that had any, never silently.
      const int64_t non_finite = stats.skipped_steps - result.loss_spikes;
      if (non_finite > non_finite_reported) {
        if (leader) {
          std::fprintf(stderr,
                       "forge: warning: step %ld: %ld optimizer step(s) skipped since the last "
                       "log (loss or gradients not finite; weights left unchanged), %ld in all\n",
                       long(step), long(non_finite - non_finite_reported), long(non_finite));
        }
        non_finite_reported = non_finite;
      }
      result.skipped_steps = stats.skipped_steps;
    }
    rec.skipped_steps = result.skipped_steps;
    rec.loss_spikes = result.loss_spikes;

    if (rollback) {
      // spike_max_in_row spikes in a row: back to the last committed checkpoint (a save in
      // flight commits first), leaving out the data the spikes read. Every rank decides
      // alike (global loss and norm), so all of them get here at the same step.
      const int64_t from_step = step, first_step = guard.row_first_step();
      skips.Add(guard.row_from_cursor(), cursor);
      rec.rollback = true;
      rec.skip_from = guard.row_from_cursor();
      rec.skip_to = cursor;
      int64_t to_step = -1;
      std::string to_dir;
      if (ckpt) {
        if (ckpt->pending()) FORGE_RETURN_IF_ERROR(ckpt->Commit());
        take_commits();
        RunConfig latest = cfg;
        latest.checkpoint.resume = "latest";
        FORGE_ASSIGN_OR_RETURN(ResumePoint rp,
                               ResumeTraining(latest, layout, backend, opt.comm, true));
        if (!rp.dir.empty()) {
          for (const std::string& w : rp.warnings) {  // damaged checkpoints passed over
            result.warnings.push_back(w);
            if (leader) std::fprintf(stderr, "forge: warning: %s\n", w.c_str());
          }
          rolled_back = true;
          to_step = rp.step;
          to_dir = rp.dir;
          step = rp.step;  // the loop's ++step makes it the checkpoint's next step
          cursor = rp.data_cursor;
          // The statistics as of that checkpoint; the data windows left out are this run's.
          if (auto it = rp.extra.find(kSpikeGuardBlob); it != rp.extra.end()) {
            DataSkips theirs;
            (void)DecodeSpikeState(it->second, &guard, &theirs);
          }
        }
      }
      guard.ClearRow();
      ++result.spike_rollbacks;
      rec.spike_rollbacks = result.spike_rollbacks;
      rec.rollback_to_step = to_step;
      char buf[400];
      if (to_step >= 0)
        std::snprintf(buf, sizeof buf,
                      "%d loss spikes in a row (steps %ld-%ld): rolled back to checkpoint "
                      "step_%ld, leaving out data cursors [%ld, %ld)",
                      guard.max_in_row(), long(first_step), long(from_step),
                      long(to_step), long(rec.skip_from), long(rec.skip_to));
      else
        std::snprintf(buf, sizeof buf,
                      "%d loss spikes in a row (steps %ld-%ld): no committed checkpoint to roll "
                      "back to; going on past data cursors [%ld, %ld)",
                      guard.max_in_row(), long(first_step), long(from_step),
                      long(rec.skip_from), long(rec.skip_to));
      rec.events.push_back(buf);
      if (leader) std::fprintf(stderr, "forge: warning: %s\n", buf);
    }

    const bool eval = !rolled_back &&
                      (last || (cfg.eval.every_steps > 0 && step % cfg.eval.every_steps == 0));
    if (eval) {
      FORGE_ASSIGN_OR_RETURN(rec.val_loss, Evaluate(cfg, backend, data, opt.comm));
      result.final_val_loss = rec.val_loss;
      if (opt.eval_samples) {
        auto samples = opt.eval_samples(backend);
        if (!samples.ok()) return samples.status().Annotate("eval.samples at step " + std::to_string(step));
        if (leader) rec.samples = std::move(samples).value();
      }
    }

    bool stop = false;
    if (ckpt && !rolled_back) {  // a rollback's step boundary is the checkpoint it loaded
      bool written = false;
      // Part of the step's time: with a device backend this small collective is where the
      // host meets the other ranks (and may wait for its own GPU).
      const auto a0 = Clock::now();
      FORGE_RETURN_IF_ERROR(agree(&stop, &written));
      const double agree_s = Seconds(a0, Clock::now());
      train_seconds += agree_s;
      window_seconds += agree_s;
      if (ckpt->pending() && written) FORGE_RETURN_IF_ERROR(ckpt->Commit());
      if (stop || save_now || (every > 0 && (step % every == 0 || last))) {
        std::optional<DataUsage> usage;
        if (data.usage) usage = data.usage(cursor);
        FORGE_RETURN_IF_ERROR(ckpt->Save(step, cursor, std::move(usage), spike_blobs()));
        if (stop || last) FORGE_RETURN_IF_ERROR(ckpt->Commit());  // nothing left to overlap
      }
      take_commits();
    }

    if (log || eval || (stop && unreported && stats.valid)) {
      rec.step_seconds = window_seconds / double(window_steps);
      rec.tokens_per_s = double(tokens_per_step) * window_steps / window_seconds;
      rec.window_steps = window_steps;
      rec.data_wait_seconds = window_data_wait;
      if (cuda != nullptr) {
        rec.gpu_allocated_bytes = rec.gpu_reserved_bytes = cuda->allocated_bytes();
        rec.gpu_peak_bytes = cuda->peak_bytes();
      }
      window_seconds = 0.0;
      window_steps = 0;
      window_data_wait = 0.0;
      if (unreported) {
        rec.checkpoint_step = unreported->step;
        rec.checkpoints_committed = unreported_count;
        rec.checkpoint_blocked_s = unreported->blocked_s;
        rec.checkpoint_write_s = unreported->write_s;
        rec.checkpoint_bytes = unreported->bytes;
        rec.checkpoint_bytes_per_s = unreported->bytes_per_s();
        unreported.reset();
        unreported_count = 0;
      }
      rec.spike_rollbacks = result.spike_rollbacks;
      rec.initial_val_loss = result.initial_val_loss;
      WriteRecord(&metrics, rec);
      if (opt.on_step) opt.on_step(rec);
      if (leader && opt.print_progress) {
        const double eta = train_seconds / double(progress - start.step) *
                           double(std::max<int64_t>(0, total_steps - rec.step));
        std::printf("step %ld/%ld | loss %.4f | lr %.2e | %s tok/s | ETA %s", long(rec.step),
                    long(total_steps), rec.loss, rec.lr, FormatRate(rec.tokens_per_s).c_str(),
                    FormatDuration(eta).c_str());
        if (rec.val_loss >= 0.0f) std::printf(" | val loss %.4f", rec.val_loss);
        if (rec.loss_spike) std::printf(" | spike skipped");
        std::printf("\n");
        for (const EvalSample& e : rec.samples)  // JSON strings: one line each, whatever the text
          std::printf("sample | %s -> %s\n", JsonText(e.prompt).c_str(),
                      JsonText(e.completion).c_str());
        std::fflush(stdout);
      }
    }
    result.steps = step;
    if (stop) {
      result.stopped = true;
      break;
    }
  }
  result.seconds = train_seconds;
  const int64_t trained = progress - start.step;  // replayed steps count too
  if (trained == 0 && !result.stopped) {
    // Resumed a run that had already finished: still report where it stands, so running the
    // same command twice is harmless and says what the first one reached.
    FORGE_ASSIGN_OR_RETURN(result.final_val_loss, Evaluate(cfg, backend, data, opt.comm));
    if (leader && opt.print_progress)
      std::printf("run already complete at step %ld | val loss %.4f\n", long(result.steps),
                  result.final_val_loss);
  }
  result.tokens_per_s = train_seconds > 0 ? double(tokens_per_step) * trained / train_seconds : 0;
  return result;
}

}  // namespace forge
