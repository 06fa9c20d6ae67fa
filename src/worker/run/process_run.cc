#include "worker/run/process_run.h"

#include <cstdio>
#include <filesystem>
#include <string_view>

#include "worker/data/corpus.h"
#include "worker/data/dataset.h"
#include "worker/data/dataset_check.h"
#include "worker/data/sampler.h"
#include "worker/data/train_mixture.h"
#include "worker/infer/complete_text.h"
#include "worker/infer/model_source.h"
#include "worker/model/param_layout.h"
#include "worker/parallel/host_staged_comm.h"
#include "worker/parallel/hybrid_groups.h"
#include "worker/parallel/mpi_comm.h"
#include "worker/parallel/nccl_comm.h"
#include "worker/train/backend.h"
#include "worker/train/memory_estimate.h"
#include "worker/train/train_device.h"

namespace forge {

namespace {

bool WantsCuda(const RunConfig& cfg) {
  return cfg.train.backend == Backend::kCuda ||
         (cfg.train.backend == Backend::kAuto && CudaDeviceAvailable());
}

// GPU data parallelism: NCCL on this process's GPU (local rank, modulo the visible devices:
// under srun --gpus-per-task=1 each task sees one), its unique id from `rendezvous`, or MPI
// under an MPI launch, or TCP (MASTER_ADDR / MASTER_PORT) otherwise; the trainer's few host
// collectives go through the same communicator.
Status JoinNccl(const RunConfig& cfg, IdRendezvous* rendezvous, ProcessGroup* g) {
  std::unique_ptr<IdRendezvous> own;
  if (rendezvous == nullptr) {
    FORGE_ASSIGN_OR_RETURN(own, RendezvousForLaunch(g->launch, cfg.parallel.collective_timeout_s));
    rendezvous = own.get();
  }
  NcclCommOptions o;
  o.timeout_s = cfg.parallel.collective_timeout_s;
  const int devices = NcclVisibleDevices();
  if (devices < 1) return Status::Unavailable("NCCL data parallelism: no CUDA device visible");
  o.device = TrainingDeviceOrdinal(g->launch.local_rank, g->launch.world, devices);
  FORGE_ASSIGN_OR_RETURN(g->nccl, MakeNcclComm(g->launch.rank, g->launch.world, rendezvous, o));
  // The host collectives get their own communicator (own stream), so a step-boundary flag
  // exchange does not wait for the step's gradient collectives queued on the first. Its id
  // travels over the first (ncclCommSplit failed with an internal error on NCCL 2.28 here).
  FORGE_ASSIGN_OR_RETURN(std::unique_ptr<Comm> bootstrap, MakeHostStagedComm(g->nccl.get()));
  std::unique_ptr<IdRendezvous> over_first = MakeCommRendezvous(bootstrap.get());
  o.name = "forge-host";
  FORGE_ASSIGN_OR_RETURN(g->host_nccl,
                         MakeNcclComm(g->launch.rank, g->launch.world, over_first.get(), o));
  FORGE_ASSIGN_OR_RETURN(g->comm, MakeHostStagedComm(g->host_nccl.get()));
  return Status::Ok();
}

}  // namespace

StatusOr<ProcessGroup> JoinProcessGroup(const RunConfig& cfg, IdRendezvous* rendezvous) {
  ProcessGroup g;
  FORGE_ASSIGN_OR_RETURN(g.launch, DetectLaunch());
  if (cfg.parallel.ddp_allreduce == DdpAllReduce::kCopyEngine) ReserveCudaQueuesForCopyEngine();
  const bool cuda = WantsCuda(cfg);
  if (g.launch.kind == LaunchKind::kMpi) {
    FORGE_RETURN_IF_ERROR(InitMpi());
    MpiCommOptions o;
    o.timeout_s = cfg.parallel.collective_timeout_s;
    FORGE_ASSIGN_OR_RETURN(g.comm, MakeMpiComm(o));
    g.launch.rank = g.comm->rank();
    g.launch.world = g.comm->world();
    if (cuda && g.launch.world > 1) {
      g.comm.reset();
      FORGE_RETURN_IF_ERROR(JoinNccl(cfg, rendezvous, &g));
    }
  } else if (g.launch.world > 1) {
    if (cuda) {
      FORGE_RETURN_IF_ERROR(JoinNccl(cfg, rendezvous, &g));
      return g;
    }
    return Status::Unavailable(std::string("launched as rank ") + std::to_string(g.launch.rank) +
                               " of " + std::to_string(g.launch.world) + " by " +
                               LaunchKindName(g.launch.kind) +
                               " variables, but CPU data-parallel training runs over MPI: launch "
                               "with mpirun or srun --mpi=pmix");
  }
  return g;
}

StatusOr<ProcessGroup> JoinPlacedGroup(const RunConfig& cfg, const LaunchInfo& placed,
                                       IdRendezvous* rendezvous) {
  ProcessGroup g;
  g.launch = placed;
  if (placed.world <= 1) return g;
  if (!WantsCuda(cfg))
    return Status::Unavailable("placed as rank " + std::to_string(placed.rank) + " of " +
                               std::to_string(placed.world) +
                               " without a common launcher: that needs the cuda backend (NCCL); "
                               "CPU ranks train together over MPI only");
  if (rendezvous == nullptr)
    return Status::Invalid("JoinPlacedGroup: a rendezvous for the NCCL id is required");
  FORGE_RETURN_IF_ERROR(JoinNccl(cfg, rendezvous, &g));
  return g;
}

namespace {

bool SameCheckpoint(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return a.empty() && b.empty();
  std::error_code ec1, ec2;
  const auto ca = std::filesystem::weakly_canonical(a, ec1);
  const auto cb = std::filesystem::weakly_canonical(b, ec2);
  return !ec1 && !ec2 && ca == cb;
}

// The coordinator's plan for the point the run starts from must be the checkpoint's own.
Status CheckScheduledPlan(const DataPlan& scheduled, const DataUsage& saved,
                          const std::string& dir) {
  if (PlanOf(saved) == scheduled) return Status::Ok();
  std::string want, have;
  for (const DataPlanSource& s : scheduled.sources)
    want += " " + s.dir + "(stream " + std::to_string(s.stream) + ", base " +
            std::to_string(s.base) + ")";
  for (const SourceUsage& s : saved.sources)
    have += " " + s.source.dir + "(stream " + std::to_string(s.source.stream) + ", base " +
            std::to_string(s.source.base) + ")";
  return Status::Invalid("the coordinator's data plan (origin " +
                         std::to_string(scheduled.origin) + ":" + want + ") is not the one " +
                         dir + " recorded (origin " + std::to_string(saved.origin) + ":" + have +
                         ")");
}

}  // namespace

StatusOr<ProcessRunResult> TrainInProcessGroup(const RunConfig& cfg, ProcessGroup* group,
                                               TrainOptions opt) {
  const int rank = group->rank(), world = group->world();
  const bool leader = rank == 0;
  opt.comm = group->comm.get();
  ProcessRunResult out;

  FORGE_RETURN_IF_ERROR(CheckShardGroupSize(cfg.parallel, world));
  Backend want = cfg.train.backend;
  if (want == Backend::kAuto) want = CudaDeviceAvailable() ? Backend::kCuda : Backend::kCpu;
  if (world > 1 && group->nccl != nullptr) want = Backend::kCuda;
  // A model too large for this machine is refused here, before anything is allocated for it.
  if (want == Backend::kCuda)
    FORGE_RETURN_IF_ERROR(CheckTrainingMemory(cfg, want, world, CudaFreeDeviceMemoryBytes(),
                                              "the GPU's free memory"));
  else
    FORGE_RETURN_IF_ERROR(CheckTrainingMemory(cfg, want, world, HostAvailableMemoryBytes(),
                                              "this host's available memory"));

  std::vector<DataSourceConfig> sources = DataSources(cfg);
  if (opt.data_plan) {  // the coordinator's; "" names this worker's default dataset
    for (DataPlanSource& s : opt.data_plan->sources)
      if (s.dir.empty()) s.dir = DatasetDir(cfg);
    sources = PlanSources(*opt.data_plan);
  }
  auto mix = TrainMixture::Open(sources, cfg.model.seq_len, cfg.seed, cfg.data.epoch_shuffle != 0);
  if (!mix.ok()) return mix.status();
  const TokenDataset& first = mix->dataset(0);  // every source has its vocabulary
  const std::string dataset_dir = first.dir();
  {
    std::vector<DatasetForRun> check;
    for (int s = 0; s < mix->size(); ++s)
      check.push_back({&mix->dataset(s).manifest(), mix->dataset(s).dir()});
    FORGE_RETURN_IF_ERROR(
        CheckDatasetsForRun(check, cfg.model.vocab, cfg.data.tokenizer, DefaultDataDir()));
  }
  const TokenStream& val = first.split(Split::kVal);

  BatchProvider data;
  const int mb = cfg.batch.micro_batch;
  const int data_rank = DataRank(cfg.parallel, rank, world);  // hybrid_groups.h
  data.train = [&](int64_t cursor, int k, int32_t* in, int32_t* tgt) {
    return mix->FillTrainBatch(cursor, data_rank, world, mb, k, in, tgt);
  };
  data.val = [&](int64_t i, int32_t* in, int32_t* tgt) {
    return FillEvalBatch(val, cfg.model.seq_len, i, mb, in, tgt);
  };
  data.start = [&](const std::string& resumed, const DataUsage* saved, int64_t cursor,
                   std::vector<std::string>* notes) -> Status {
    if (opt.data_plan && SameCheckpoint(opt.data_plan_checkpoint, resumed)) {
      if (saved) FORGE_RETURN_IF_ERROR(CheckScheduledPlan(*opt.data_plan, *saved, resumed));
      return mix->SetPlan(*opt.data_plan);
    }
    FORGE_ASSIGN_OR_RETURN(DataPlan plan, PlanForResume(sources, saved, cursor, notes));
    return mix->SetPlan(plan);
  };
  data.usage = [&](int64_t cursor) { return mix->UsageAt(cursor); };

  std::unique_ptr<TrainBackend> backend;
  if (world > 1 && group->nccl != nullptr) {
    FORGE_ASSIGN_OR_RETURN(backend, MakeCudaBackend(cfg, group->nccl.get()));
  } else if (world > 1) {
    if (want == Backend::kCuda)
      return Status::Invalid("data-parallel cuda training needs the process group joined with "
                             "the cuda backend selected (JoinProcessGroup)");
    backend = MakeCpuBackend(cfg, group->comm.get());
  } else if (want == Backend::kCuda) {
    FORGE_ASSIGN_OR_RETURN(backend, MakeCudaBackend(cfg));
  } else {
    backend = MakeCpuBackend(cfg);
  }

  if (leader) {
    std::error_code ec;
    std::filesystem::create_directories(cfg.train.run_dir, ec);
    if (ec) return Status::IoError("cannot create run dir " + cfg.train.run_dir + ": " + ec.message());
    opt.metrics_path = cfg.train.run_dir + "/metrics.jsonl";  // the trainer truncates or trims
    out.metrics_path = opt.metrics_path;
  }

  // eval.samples: the run's tokenizer (data.tokenizer, else the dataset's), loaded now so a
  // missing one is an error before training rather than at the first eval.
  std::unique_ptr<Tokenizer> sample_tok;
  if (!cfg.eval.samples.empty()) {
    const std::string spec =
        cfg.data.tokenizer.empty() ? DatasetTokenizerSpec(dataset_dir) : cfg.data.tokenizer;
    if (spec.empty())
      return Status::Invalid("eval.samples: the dataset " + dataset_dir +
                             " names no tokenizer to encode the prompts with (set data.tokenizer)");
    auto t = LoadTokenizer(spec, DefaultDataDir());
    if (!t.ok()) return t.status().Annotate("eval.samples: loading the tokenizer " + spec);
    sample_tok = std::move(t).value();
    // Every id a prompt becomes must be the model's: checked now, not at the first eval.
    for (size_t i = 0; i < cfg.eval.samples.size(); ++i) {
      std::vector<int32_t> ids = {sample_tok->bos_id() >= 0 ? sample_tok->bos_id()
                                                            : sample_tok->eot_id()};
      sample_tok->EncodeOrdinary(cfg.eval.samples[i], &ids);
      for (int32_t id : ids)
        if (id < 0 || id >= cfg.model.vocab)
          return Status::Invalid("eval.samples[" + std::to_string(i) + "]: the tokenizer " + spec +
                                 " gives token id " + std::to_string(id) +
                                 ", outside the model's vocabulary of " +
                                 std::to_string(cfg.model.vocab));
    }
    const bool on_gpu = std::string_view(backend->name()) != "cpu";
    opt.eval_samples = [&cfg, &sample_tok, leader,
                        on_gpu](TrainBackend* b) -> StatusOr<std::vector<EvalSample>> {
      UnitBuffers params;
      FORGE_RETURN_IF_ERROR(b->GetParams(&params));  // collective where the weights are sharded
      if (!leader) return std::vector<EvalSample>{};
      std::unique_ptr<DecodeBackend> decoder;
      if (on_gpu) {
        FORGE_ASSIGN_OR_RETURN(decoder, MakeCudaDecodeBackend(cfg.model, params));
      } else {
        decoder = MakeCpuDecodeBackend(cfg.model, std::move(params));
      }
      GenerateOptions g;
      g.max_new_tokens = cfg.eval.sample_tokens;
      FORGE_ASSIGN_OR_RETURN(std::vector<TextCompletion> done,
                             CompleteTexts(decoder.get(), sample_tok.get(), cfg.eval.samples, g));
      std::vector<EvalSample> out;
      for (TextCompletion& c : done) out.push_back({std::move(c.prompt), std::move(c.completion)});
      return out;
    };
  }

  const UnigramBaseline base = ComputeUnigramBaseline(first);
  out.unigram_baseline = base.val_cross_entropy;
  const ParamLayout layout = MakeParamLayout(cfg.model);
  if (leader && opt.print_progress) {
    std::printf("forge: training %s (%.2fM params) on %s backend", cfg.name.c_str(),
                layout.total / 1e6, backend->name());
    // The CPU backend always computes in fp32; say what a device backend runs.
    if (std::string_view(backend->name()) != "cpu") {
      std::printf(" in %s", PrecisionName(cfg.precision.compute));
      if (cfg.precision.compute == Precision::kFp8)
        std::printf(" (%s scaling)", Fp8RecipeName(cfg.precision.fp8.recipe));
    }
    if (world > 1) std::printf(" x %d ranks (%s)", world, ParallelModeName(cfg.parallel.mode));
    if (mix->size() == 1) {
      std::printf(" | dataset %s: %.1fM train / %.2fM val tokens | unigram baseline %.4f\n",
                  dataset_dir.c_str(), first.split(Split::kTrain).size() / 1e6,
                  val.size() / 1e6, base.val_cross_entropy);
    } else {
      std::printf(" | %d data sources | val on %s: %.2fM tokens | unigram baseline %.4f\n",
                  mix->size(), dataset_dir.c_str(), val.size() / 1e6, base.val_cross_entropy);
      for (int s = 0; s < mix->size(); ++s)
        std::printf("forge:   source %d: %s, weight %g, %.1fM train tokens\n", s,
                    mix->dataset(s).dir().c_str(), sources[size_t(s)].weight,
                    mix->dataset(s).split(Split::kTrain).size() / 1e6);
    }
    std::fflush(stdout);
  }
  FORGE_ASSIGN_OR_RETURN(out.train, RunTraining(cfg, backend.get(), data, opt));
  return out;
}

}  // namespace forge
