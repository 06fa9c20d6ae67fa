// The sampling plan: which token sequences each rank reads at each step.
//
// Sequences. The train stream of N tokens is cut into S = floor((N - 1) / T) sequences of
// T + 1 tokens; sequence i covers tokens [i*T, i*T + T] (neighbours share one token), its
// inputs are the first T tokens and its targets the last T (inputs shifted by one).
//
// Order. Epoch e visits all S sequences once, in the order perm_e, a permutation of [0, S)
// chosen by (seed, stream, e) (permutation.h: a Fisher-Yates table up to 2^22 sequences, a
// keyed Feistel network above), or in order 0..S-1 when shuffling is off. `stream` tells the
// sources of a mixture apart (0 for a single dataset).
//
// Cursor. A source's cursor n (int64) counts the sequences consumed from it:
// n -> (epoch n / S, position n % S) -> sequence perm_epoch[position]. A source with fewer
// sequences than another simply reaches its next epoch sooner. With one source its cursor is
// the global cursor c below; with several, mixture.h says which source each global position
// draws from and how far each source's cursor has gone.
//
// Global cursor. c (int64) counts the sequences consumed by the run since it started. A step
// with global batch G consumes global positions c .. c+G-1 and advances c by G. The cursor does
// not depend on the world size, so a run resumes exactly on any number of ranks with the same
// global batch.
//
// Rank slices. With W ranks, micro-batch b and A = G / (W*b) accumulation micro-steps, rank r
// at micro-step k reads the b sequences
//     c + k*W*b + r*b + j,   j = 0 .. b-1
// i.e. the global batch is laid out micro-step-major, then rank, then row:
//     [ k=0: r0 (b) | r1 (b) | ... | r(W-1) (b) ][ k=1: r0 | r1 | ... ] ...
// The union over all (k, r) is exactly c .. c+G-1 for every W.
//
// Validation. A fixed, unshuffled order over the val split: eval batch i of b sequences is
// sequences (i*b + j) mod S_val, j = 0 .. b-1 (wrapping around the split).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "worker/data/dataset.h"
#include "worker/data/permutation.h"

namespace forge {

// Number of (T+1)-token sequences a stream of `num_tokens` holds: floor((N-1)/T), or 0.
int64_t NumSequences(int64_t num_tokens, int64_t seq_len);

// Maps one source's cursors to its sequence indices. Copyable and thread-safe (for sources of
// at most kShuffleTableMaxSequences the last epochs' tables are cached under a lock; computing
// one costs O(S); larger sources compute each lookup).
class SamplingPlan {
 public:
  // num_tokens: size of the train stream; shuffle=false visits sequences in order; stream: the
  // source's shuffle stream (StreamSeed).
  SamplingPlan(int64_t num_tokens, int64_t seq_len, uint64_t seed, bool shuffle,
               int64_t stream = 0);

  int64_t seq_len() const { return seq_len_; }
  int64_t num_sequences() const { return num_sequences_; }
  // Sequence index for cursor c >= 0 (num_sequences() must be > 0).
  int64_t SequenceAt(int64_t cursor) const;

 private:
  std::shared_ptr<const std::vector<uint32_t>> Permutation(int64_t epoch) const;

  struct Cache {  // the two most recent epochs' permutations; copies of a plan share it
    std::mutex mu;
    int64_t epoch[2] = {-1, -1};
    std::shared_ptr<const std::vector<uint32_t>> perm[2];
  };

  int64_t seq_len_;
  int64_t num_sequences_;
  uint64_t seed_;
  bool shuffle_;
  std::shared_ptr<Cache> cache_;
};

// Global sequence positions (cursor offsets) rank `rank` of `world` reads at micro-step
// `micro_step`: c + micro_step*world*micro_batch + rank*micro_batch + j.
int64_t SliceStart(int64_t cursor, int rank, int world, int micro_batch, int micro_step);

// Sequence `seq` of `ts` (seq_len + 1 tokens from seq * seq_len) as inputs and targets.
Status ReadSequence(const TokenStream& ts, int64_t seq, int64_t seq_len, int32_t* inputs,
                    int32_t* targets);

// Fills inputs/targets ([micro_batch, T] row-major int32) for one rank's micro-step of the
// global batch at `cursor`. Errors: bad rank/world/micro_batch, empty split.
Status FillTrainBatch(const TokenStream& train, const SamplingPlan& plan, int64_t cursor,
                      int rank, int world, int micro_batch, int micro_step, int32_t* inputs,
                      int32_t* targets);

// Fills eval batch `batch_index` (sequences (batch_index*micro_batch + j) mod S_val).
Status FillEvalBatch(const TokenStream& val, int64_t seq_len, int64_t batch_index,
                     int micro_batch, int32_t* inputs, int32_t* targets);

}  // namespace forge
