// Forge checkpoints: the one header the trainer includes.
//
// Layout (DESIGN.md, Checkpoints):
//   <root>/step_<N>/rank_<r>_of_<W>.shard   one per rank (shard_file.h: header + checksummed
//                                           sections: unit table, per unit master/m/v slices,
//                                           RNG, extra blobs)
//   <root>/step_<N>/manifest.json           written last (manifest.h); without it the directory
//                                           is not a checkpoint
// Every mode (ddp, zero1/2, fsdp) writes rank r's ShardOf of every unit, so any
// checkpoint loads on any world size.
//
// Save at step N (every rank):
//   if (auto spare = async.TakeSpare()) TakeFullBuffers(std::move(*spare), &master, &m, &v);
//   backend->GetParams(&master); backend->GetMoments(&m, &v);   // the stall: D2H into warm
//                                                               // host buffers
//   ShardState s = ShardStateFromFull(layout, rank, world, std::move(master), std::move(m),
//                                     std::move(v), trainer);   // ddp: no copy
//        (ZeRO/FSDP: fill s.units with the rank's own ShardOf slices instead)
//   async.Save(StepDir(root, N), std::move(s));      // returns at once; written in background
//   ... later (next save or end of run), on every rank:
//   ShardReport rep = async.Wait();                  // or WriteShard() synchronously
//   gather EncodeShardReport(rep) to rank 0; barrier
//   rank 0: CommitCheckpoint(StepDir(root, N), cfg, layout, reports);
//           ApplyRetention(root, cfg.checkpoint.keep_last, cfg.checkpoint.keep_every);
//
// Resume (before training):
//   ResumeChoice c = ResolveResume(cfg.checkpoint.resume, root);   // log c.warnings
//   if (!c.dir.empty()) LoadedShard l = LoadCheckpoint(c.dir, rank, world, &layout);
//      (ddp: LoadFullCheckpoint(c.dir, &layout) on every rank)
//   continue from l.state.trainer.step / data_cursor.
//
// Export: ExportSafetensors(master, layout, path, {dtype, ExportMetadata(cfg)}) or
//         ExportCheckpointSafetensors(checkpoint_dir, path, dtype).
#pragma once

#include "worker/checkpoint/async_checkpointer.h"
#include "worker/checkpoint/checkpoint_dir.h"
#include "worker/checkpoint/checkpoint_loader.h"
#include "worker/checkpoint/checkpoint_state.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/model/shard_layout.h"
