// Whether ddp on the CUDA backend sums a tied embedding's gradient in two parts
// (cuda_data_parallel.h): the LM head's part, complete at the backward's start, all-reduced in
// block L-1's comm window, then every rank's lookup rows and token ids all-gathered at the
// backward's end and added (CudaModelHooks::lookup_grad), instead of the whole vocabulary's
// gradient all-reduced after the embedding backward, the one collective nothing is left to
// hide. The data-parallel layer at start-up and the memory estimate (so `forge plan` too) ask
// here, so they decide alike.
//
// The rows' all-gather becomes the step's tail in place of the whole gradient's all-reduce, so
// it is taken where it moves fewer bytes a rank: world x tokens rows of d bf16 against the
// vocabulary's V x d gradient at its element's bytes (2 where the sums run in bf16, else 4),
// twice over (a ring all-reduce sends each element out and brings its sum back). The rows'
// buffers grow with the world the same way (world x tokens x (2d + 28) bytes), so the rule
// also keeps them below the gradient's own size: llama3-1b (V 128256) at micro-batch 2 x 8192
// takes it up to 15 ranks with bf16 sums and 31 with fp32, gpt350m (V 50304) at 16 x 1024 up
// to 6 and 12.
//
// zero and fsdp reduce-scatter a tied embedding's whole gradient: the same split there (each
// rank adding the rows' elements in its slot) measured no faster on 2x H200 (docs/performance.md,
// "What the measurements decided"): the fp32 reduce-scatter of the LM head's part beside the
// backward's GEMMs costs what the shorter tail saves. hsdp's replica all-reduce follows each
// slot's reduce-scatter at once, before rows could be added.
//
// fsdp and hsdp with an untied embedding (FsdpLooksUpInSlots) have no LM-head part: the lookup
// is the whole gradient and the table is read only by the lookup. Both ends of the pass then
// move rows instead of the table: the forward sums every rank's lookup of all ranks' tokens in
// its own slot (world x tokens x d bf16, reduce-scattered) instead of gathering the bf16 table
// (vocabulary x d, the step's first collective, which nothing hides), and the backward
// all-gathers every rank's lookup rows and adds the elements of its slot instead of
// reduce-scattering the fp32 table's gradient (the step's last). Each end moves (world - 1) x
// tokens x d x 2 bytes a rank against (world - 1) / world x vocabulary x d x 2 (and x 4), so
// the rule takes it while world x tokens < vocabulary: llama3-8b (V 128256) at 1 x 8192 up to
// 15 ranks. The gathered table is then never allocated (vocabulary x d x 2 bytes less). hsdp
// does this inside its shard group (the world here), then all-reduces the embedding's gradient
// slot over the replicas as it does every unit's.
#pragma once

#include <cstdint>

#include "common/config.h"
#include "worker/parallel/mode_rules.h"

namespace forge {

// `world`: the ranks the gradient is summed over; `tokens`: a rank's micro-batch tokens. The
// embedding's rows are the padded vocabulary.
inline bool TakeLookupApart(const ModelConfig& m, const ModeRules& rules, GradReduce reduce,
                            int world, int64_t tokens) {
  if (!m.tie_embeddings || world < 2 || rules.sharded()) return false;
  const int64_t element = reduce == GradReduce::kBf16 ? 2 : 4;
  return int64_t{world} * tokens * 2 < int64_t{m.padded_vocab()} * element * 2;
}

// fsdp, or hsdp, sharding the parameters over `world` ranks (hsdp: its shard group) with an
// untied embedding: the lookup from the slots (see above). `tokens`: a rank's micro-batch tokens.
inline bool FsdpLooksUpInSlots(const ModelConfig& m, const ModeRules& rules, int world,
                               int64_t tokens) {
  if (m.tie_embeddings || world < 2 || !rules.shard_params) return false;
  return int64_t{world} * tokens < int64_t{m.padded_vocab()};
}

}  // namespace forge
